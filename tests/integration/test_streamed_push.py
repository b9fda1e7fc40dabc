"""Streamed pushes on the real stack: two FSDP ranks of a VerlTrainer gather tensor by tensor and rank 0 broadcasts
buckets over gloo straight into a vLLM engine's worker, through vLLM's weight-transfer API."""

from __future__ import annotations

import asyncio

import pytest
import torch
from policy_weights import PolicyWeights

from fullasync.contracts.engine import PauseMode
from fullasync.contracts.weights import StreamedWeights, WeightsMovedOn
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.errors import EngineDiedError
from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup
from fullasync.weights.digests import digest
from fullasync.weights.sync import WeightSync
from fullasync.weights.transport import StreamTransport, weight_transport

TOLERANCE = 1e-4

pytestmark = pytest.mark.slow  # CI's slow tier: a trainer of two ranks and an engine of its own


@pytest.fixture(scope="module")
async def stack(ray_cluster, tiny_model_path):
    config = TrainerConfig(lr=1e-2, micro_batch_size=2, num_workers=2, call_timeout_s=120, correction="none",
                           weight_transport="stream")
    trainer = VerlTrainer(tiny_model_path, config)
    await trainer.start()
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=tiny_model_path))
    yield trainer, engine
    await engine.shutdown()
    await trainer.shutdown()


def _groups() -> list[TrajectoryGroup]:
    def call(prompt, output):
        return ModelCall(prompt, output, (-1.0,) * len(output), (0,) * len(output), FinishReason.STOP)

    return [TrajectoryGroup(f"g{g}", (Trajectory((call((17, 40 + g), (300 + g, 301)),), reward=1.0),
                                      Trajectory((call((17, 40 + g), (310 + g,)),), reward=0.0)))
            for g in range(2)]


async def test_the_engine_serves_exactly_the_trainers_weights_streamed_from_its_ranks(stack, tiny_model_path,
                                                                                     tokenizer):
    trainer, engine = stack
    transport = weight_transport(trainer.config.weight_transport, trainer)
    assert isinstance(transport, StreamTransport)
    sync = WeightSync([engine], version=await engine.version(), transport=transport)
    reference = PolicyWeights(tiny_model_path, sync)
    for _ in range(2):  # a push of what the trainer holds after each of two steps
        before = dict(await (await trainer.gather_weights()))
        await trainer.train_step(trainer.build_batch(_groups()), sync.version)
        weights = await trainer.export_weights()
        assert weights == StreamedWeights(trainer.step)  # nothing gathered for the push
        trained = dict(await (await trainer.gather_weights()))
        compared, wrong = await engine.check_weights(trained)
        assert compared > 0 and wrong  # the engine holds the weights before the step: the check can fail
        assert any(not torch.equal(before[name], trained[name]) for name in trained)

        timing = await sync.push(weights)

        assert timing.version == await engine.version() == await engine.served_version()  # vLLM's own label
        assert timing.phases["buckets"] >= 1 and timing.phases["checked_tensors"] > 0
        assert await engine.check_weights(trained) == (compared, [])
        checksums = [(name.rpartition(":")[2], held) for worker in await engine.vllm_weight_checksums()
                     for name, held in worker.items()]
        matched = [name for name, held in checksums if name in trained and held == digest(trained[name])]
        assert len(matched) >= len([name for name in trained if "norm" in name])  # every tensor vLLM keeps as bytes
        reference.current = trained
        await reference.assert_engine_serves_current(engine, tokenizer, "Streamed: 7 * 6 =", timing.version,
                                                     TOLERANCE)
        assert "stream_s" in trainer.timings


async def test_a_restart_takes_the_trainers_weights_only_while_it_still_holds_them(stack):
    trainer, _ = stack
    held = StreamedWeights(trainer.step)
    transport = StreamTransport(trainer)
    gathered = dict(await (await transport.materialize(held)))
    assert set(gathered) >= {"model.embed_tokens.weight", "lm_head.weight"}
    await trainer.train_step(trainer.build_batch(_groups()))
    with pytest.raises(WeightsMovedOn, match=f"not those of step {held.step}"):
        await transport.materialize(held)


async def test_an_engine_left_out_of_the_plan_or_retried_gets_a_push_of_its_own(stack, tiny_model_path):
    trainer, engine = stack
    transport = StreamTransport(trainer)
    version = await engine.version() + 1
    await transport.start_weight_update(StreamedWeights(trainer.step), version, [])  # planned for no engine
    timing = await transport.update_weights(engine, version, PauseMode.ABORT)
    await transport.finish_weight_update(version)
    assert timing.phases["checked_tensors"] > 0 and await engine.served_version() == version
    compared, wrong = await engine.check_weights(dict(await (await trainer.gather_weights())))
    assert compared > 0 and wrong == []


class DiesBeforeJoining:
    """An engine of the push's plan that fails before it takes part (its actor is gone)."""

    name = "ghost"
    workers = 1
    death = None

    async def install(self, weights, version, mode):
        raise EngineDiedError("engine ghost is dead: its actor is gone")


async def test_a_planned_engine_that_fails_before_joining_ends_the_broadcast_at_once_and_the_others_retry_alone(
        stack):
    trainer, engine = stack
    transport = StreamTransport(trainer, timeout_s=600.0)  # a member left waiting would wait this long
    version = await engine.version() + 1
    await transport.start_weight_update(StreamedWeights(trainer.step), version, [engine, DiesBeforeJoining()])
    joined, ghost = await asyncio.gather(transport.update_weights(engine, version, PauseMode.ABORT),
                                         transport.update_weights(DiesBeforeJoining(), version, PauseMode.ABORT),
                                         return_exceptions=True)
    assert isinstance(ghost, EngineDiedError)
    assert isinstance(joined, Exception) and "timed out" not in repr(joined).lower(), joined  # told, not timed out
    assert await engine.actor.is_paused.remote()  # a failed install serves nothing
    timing = await transport.update_weights(engine, version, PauseMode.ABORT)  # the retry: a push of its own
    await transport.finish_weight_update(version)
    assert timing.phases["checked_tensors"] > 0 and await engine.served_version() == version
    compared, wrong = await engine.check_weights(dict(await (await trainer.gather_weights())))
    assert compared > 0 and wrong == []


@pytest.mark.slow  # CI's slow tier: a second engine start after the kill
async def test_an_engine_killed_after_a_streamed_push_restarts_serving_the_trainers_weights(stack):
    import ray

    trainer, engine = stack
    sync = WeightSync([engine], version=await engine.version(), transport=StreamTransport(trainer),
                      restart_on_failure=True)
    await trainer.train_step(trainer.build_batch(_groups()), sync.version)
    timing = await sync.push(await trainer.export_weights())
    trained = dict(await (await trainer.gather_weights()))
    capacity = engine.kv_tokens
    ray.kill(engine.actor)
    engine.mark_dead("killed by the test")
    engine.kv_tokens = None
    assert await sync.restart_dead() == [engine.name]  # the trainer still holds the pushed version: gathered
    assert await engine.version() == timing.version == await engine.served_version()
    assert capacity and engine.kv_tokens == capacity  # the new actor's KV capacity, read again for the router
    compared, wrong = await engine.check_weights(trained)
    assert compared > 0 and wrong == []
