"""A dead engine surfaces as an error that names it; the router balances and sticks per episode."""

from __future__ import annotations

import asyncio
import random

import pytest
import ray
from ray.exceptions import RayActorError

from fullasync.client import RolloutService
from fullasync.contracts.engine import GenerateRequest
from fullasync.engines.router import EngineRouter
from fullasync.engines.vllm import RayEngine, VLLMEngineActor, VLLMEngineConfig
from fullasync.errors import EngineDiedError


async def actor_gone(actor, deadline_s: float = 60.0) -> None:
    """Poll the raw actor handle (not through `RayEngine`, which would mark the engine dead) until it is gone."""
    async with asyncio.timeout(deadline_s):
        while True:
            try:
                await actor.num_in_flight.remote()
            except RayActorError:
                return
            await asyncio.sleep(0.05)


async def test_dead_engine_error_names_the_engine(ray_cluster, tiny_model_path, tokenizer):
    config = VLLMEngineConfig(model_path=tiny_model_path, call_timeout_s=30)
    actor = ray.remote(VLLMEngineActor).options(num_cpus=0).remote(config, "engine-doomed")
    engine = RayEngine(actor, "engine-doomed", config)
    assert await engine.num_in_flight() == 0  # alive before
    ray.kill(actor)
    await actor_gone(actor)  # the kill takes effect asynchronously: the call below must meet a dead actor
    client = RolloutService([engine], tokenizer).client()
    with pytest.raises(EngineDiedError, match="engine engine-doomed died"):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert client.episode.calls == []


class CountingEngine:
    """Edge fake: records which requests reached it (routing is what is under test)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.death = None
        self.workers = 1
        self.kv_tokens = None  # unknown: the router counts bound episodes
        self.seen: list[str] = []
        self.release = asyncio.Event()

    async def generate(self, request: GenerateRequest):
        self.seen.append(request.request_id)
        await self.release.wait()


async def test_router_binds_to_the_fewest_bound_episodes_then_the_least_loaded_and_is_sticky():
    engines = [CountingEngine("a"), CountingEngine("b")]
    router = EngineRouter(engines)
    request = GenerateRequest("r", (1,), 1)
    tasks = [asyncio.create_task(router.generate(request, episode)) for episode in ("e1", "e2", "e3", "e4")]
    await asyncio.sleep(0)
    assert [router.load("a"), router.load("b")] == [2, 2]
    assert router.pick("e1").name == "a" and router.pick("e2").name == "b" and router.pick("e3").name == "a"
    sticky = asyncio.create_task(router.generate(request, "e2"))
    await asyncio.sleep(0)
    assert router.load("b") == 3  # e2 stays on b although a is as loaded
    router.release("e2")  # ended: b holds one episode (e4), a two
    assert router.pick("e2").name == "b"
    for engine in engines:
        engine.release.set()
    await asyncio.gather(*tasks, sticky)
    assert [router.load("a"), router.load("b")] == [0, 0]


async def test_router_binds_to_a_live_engine_with_the_fewest_episodes_through_starts_ends_deaths_and_revivals():
    rng = random.Random(7)
    engines = [CountingEngine(f"e{i}") for i in range(9)]
    router = EngineRouter(engines)
    running: list[tuple[str, asyncio.Task]] = []
    for step in range(600):
        action = rng.random()
        if action < 0.05:
            victim = rng.choice(engines)
            victim.death = None if victim.death is not None else EngineDiedError(f"engine {victim.name} died")
        elif action < 0.5 and running:
            episode, task = running.pop(rng.randrange(len(running)))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            router.release(episode)  # the episode ended
        alive = [e for e in engines if e.death is None]
        if not alive:
            with pytest.raises(EngineDiedError):
                router.pick(f"new-{step}")
            continue
        bound = {e.name: sum(router.pick(episode) is e for episode, _ in running) for e in alive}  # moves the dead's
        picked = router.pick(f"new-{step}")
        assert picked.death is None
        fewest = min(bound.values())
        assert bound[picked.name] == fewest, step
        assert router.load(picked.name) == min(router.load(e.name) for e in alive if bound[e.name] == fewest), step
        running.append((f"new-{step}",
                        asyncio.create_task(router.generate(GenerateRequest("r", (1,), 1), f"new-{step}"))))
        await asyncio.sleep(0)
    for episode, task in running:
        task.cancel()
        router.release(episode)
    await asyncio.gather(*(task for _, task in running), return_exceptions=True)
    assert all(router.load(e.name) == 0 for e in engines) and not any(router.held(e.name) for e in engines)
