"""The router by KV (`EngineRouter.admit`): a new episode binds to the engine with the most room, its calls stay
there, a first call waits while no engine has room for it (and only a first call), an episode moves once when its
engine dies or is full and another has room for its context, a call counts its likely answer and a done call what
the cache holds, and `kv_aware=False` keeps the least-in-flight binding that never waits."""

from __future__ import annotations

import asyncio

from fullasync.client import ClientConfig, RolloutService
from fullasync.contracts.engine import GenerateRequest
from fullasync.engines.router import EngineRouter
from fullasync.errors import EngineDiedError
from fullasync.observe.metrics import format_line
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer

COST = DecodeCost(kv_blocks=100, block_size=16)  # 1,600 tokens per engine


async def generating(router: EngineRouter, *episodes: str, tokens: int = 1000) -> list[asyncio.Task]:
    """A long call in flight for each episode (on its engine, `tokens` decode steps): engines with one are busy,
    and only while every engine is busy may a first call wait for room (an idle one takes it)."""
    calls = [asyncio.create_task(router.generate(GenerateRequest(f"{episode}-long", (1, 2, 3), tokens), episode))
             for episode in episodes]
    await asyncio.sleep(0.01)
    return calls


def stop(calls: list[asyncio.Task]) -> None:
    for call in calls:
        call.cancel()


def test_new_episodes_spread_by_room_and_a_first_call_waits_until_an_episode_ends():
    async def main():
        engines = [SimulatedEngine(f"sim-{i}", COST) for i in range(2)]
        router = EngineRouter(engines)
        placed = [(await router.admit(f"e{i}", 600)).name for i in range(4)]
        held = [router.held(e.name) for e in engines]
        busy = await generating(router, "e0", "e1")
        fifth = asyncio.create_task(router.admit("e4", 600))  # 1,200 + 600 > 1,600 on either engine
        await asyncio.sleep(1.0)
        waited = (fifth.done(), router.kv_waits, router.waiting_for_kv)
        grown = await router.admit("e0", 1500)  # a bound episode's next call never waits, over capacity or not
        router.release("e1")  # sim-1 now holds 600: room
        engine = await asyncio.wait_for(fifth, 1.0)
        after = (router.waiting_for_kv, engine.name, router.held("sim-1"))
        stop(busy)
        for e in engines:
            await e.shutdown()
        return placed, held, waited, grown.name, after

    placed, held, waited, grown, after = run_virtual(main)
    assert placed == ["sim-0", "sim-1", "sim-0", "sim-1"] and held == [1200, 1200]
    assert waited == (False, 1, 1)
    assert grown == "sim-0"
    assert after == (0, "sim-1", 1200)


def test_the_router_reports_kv_waits_and_what_each_engine_holds_on_the_step_line():
    async def main():
        engines = [SimulatedEngine(f"sim-{i}", COST) for i in range(2)]
        router = EngineRouter(engines)
        for i in range(4):
            await router.admit(f"e{i}", 600)
        busy = await generating(router, "e0", "e1")
        fifth = asyncio.create_task(router.admit("e4", 600))
        await asyncio.sleep(1.0)
        waiting = router.stats()
        router.settle("e1", 550, 50)
        router.release("e1")
        await asyncio.wait_for(fifth, 1.0)
        stop(busy)
        for e in engines:
            await e.shutdown()
        return waiting, router.stats()

    waiting, after = run_virtual(main)
    assert waiting["kv/waits"] == waiting["kv/episodes_waiting"] == 1
    assert waiting["kv/held_tokens/sim-0"] == 1200 and waiting["kv/held_frac/sim-0"] == 1200 / 1600
    assert after["kv/waits"] == 1 and after["kv/episodes_waiting"] == 0 and after["kv/typical_context"] == 600
    line = format_line(3, {**after, "progress/total_steps": 10})
    assert "kv waits 1 now 0" in line
    assert "kv waits" not in format_line(3, {"kv/waits": 0.0})


def test_an_episode_stays_on_its_engine_and_moves_once_when_it_dies_and_an_oversized_one_runs_alone():
    async def main():
        engines = [SimulatedEngine(f"sim-{i}", COST) for i in range(2)]
        router = EngineRouter(engines)
        home = (await router.admit("e", 100)).name
        again = [(await router.admit("e", 100 + 50 * turn)).name for turn in range(1, 5)]
        engines[0 if home == "sim-0" else 1].death = EngineDiedError(f"engine {home} died")
        moved = (await router.admit("e", 400)).name
        still = (await router.admit("e", 450)).name
        busy = await generating(router, "e")
        huge = asyncio.create_task(router.admit("huge", 5000))  # larger than any cache: waits for an empty engine
        await asyncio.sleep(1.0)
        waiting = not huge.done()
        router.release("e")
        alone = (await asyncio.wait_for(huge, 1.0)).name
        stop(busy)
        for e in engines:
            await e.shutdown()
        return home, again, moved, still, router.moves, waiting, alone

    home, again, moved, still, moves, waiting, alone = run_virtual(main)
    assert again == [home] * 4 and moved != home and still == moved and moves == 1
    assert waiting and alone == moved  # the live engine, once it holds nothing else


def test_an_idle_engine_takes_a_first_call_that_would_wait_for_room_on_busy_ones():
    async def main():
        engines = [SimulatedEngine(f"sim-{i}", COST) for i in range(2)]
        router = EngineRouter(engines)
        for i in range(4):
            await router.admit(f"e{i}", 600)  # 1,200 on each engine: no room for 600 more
        busy = await generating(router, "e0")  # sim-0 busy, sim-1 idle (its episodes' tools run)
        taken = (await asyncio.wait_for(router.admit("e4", 600), 1.0)).name
        held = router.held("sim-1")
        more = await generating(router, "e1")  # now both are busy: the next first call waits
        sixth = asyncio.create_task(router.admit("e5", 600))
        await asyncio.sleep(1.0)
        waited = not sixth.done()
        stop(more)  # sim-1's call ends: idle again, it takes the held call
        woken = (await asyncio.wait_for(sixth, 1.0)).name
        stop(busy)
        for e in engines:
            await e.shutdown()
        return taken, held, waited, woken, router.kv_waits

    taken, held, waited, woken, waits = run_virtual(main)
    assert taken == "sim-1" and held == 1800 and waited and woken == "sim-1" and waits == 1


def test_an_episode_whose_engine_is_full_moves_once_to_an_engine_with_room_for_its_whole_context():
    async def main():
        engines = [SimulatedEngine(f"sim-{i}", COST) for i in range(2)]
        router = EngineRouter(engines)
        homes = [(await router.admit(f"e{i}", 500)).name for i in range(4)]  # sim-0 holds e0, e2; sim-1 e1, e3
        for i in range(4):
            router.settle(f"e{i}", 450, 50)  # the typical episode: 500
        crowded = (await router.admit("e0", 1200)).name  # 1,700 on sim-0 and no room for 1,200 on sim-1: stays
        router.release("e1")
        router.release("e3")
        moved = (await router.admit("e0", 1300)).name  # 1,800 on sim-0, sim-1 empty: moves
        held_after_move = (router.held("sim-0"), router.held("sim-1"))
        shrunk = (await router.admit("e0", 200)).name  # counted as the typical 500 on sim-1
        neighbours = [(await router.admit(name, 500)).name for name in ("e4", "e5", "e6")]
        for name in ("e2", "e4", "e6"):
            router.release(name)
        again = (await router.admit("e0", 1200)).name  # 1,700 on sim-1, sim-0 empty: it moved once already
        for e in engines:
            await e.shutdown()
        return homes, crowded, moved, held_after_move, shrunk, neighbours, again, router.moves

    homes, crowded, moved, held_after_move, shrunk, neighbours, again, moves = run_virtual(main)
    assert homes == ["sim-0", "sim-1", "sim-0", "sim-1"] and crowded == "sim-0"
    assert moved == "sim-1" and held_after_move == (500, 1300)
    assert shrunk == "sim-1" and neighbours == ["sim-0", "sim-1", "sim-0"]
    assert again == "sim-1" and moves == 1


def test_without_kv_routing_an_episode_binds_to_the_least_loaded_engine_and_never_waits():
    async def main():
        engines = [SimulatedEngine(f"sim-{i}", COST) for i in range(2)]
        router = EngineRouter(engines, kv_aware=False)
        names = [(await asyncio.wait_for(router.admit(f"e{i}", 1500), 1.0)).name for i in range(4)]
        for e in engines:
            await e.shutdown()
        return names, router.kv_waits

    names, waits = run_virtual(main)
    assert names == ["sim-0"] * 4 and waits == 0  # nothing in flight anywhere: the first engine each time


def test_the_client_holds_a_first_call_for_room_without_spending_its_episodes_deadline():
    """Two busy engines of 1,600 tokens; three episodes of 1,000: the third waits for the first to end, then runs."""
    async def main():
        engines = [SimulatedEngine(f"sim-{i}", DecodeCost(kv_blocks=100, block_size=16, step_base_s=0.01))
                   for i in range(2)]
        service = RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))
        loop = asyncio.get_running_loop()
        ends = {}
        busy = await generating(service.router, "a", "b", tokens=300)  # ~3 s on each engine

        async def episode(name: str, hold_s: float) -> None:
            client = service.client(name)
            await client.completions.create(model="policy", prompt=[hash(name) % 1000 + 1] * 900, max_tokens=100,
                                            extra_body={"ignore_eos": True})
            await asyncio.sleep(hold_s)  # its tool runs; its context stays counted
            client.close()
            ends[name] = loop.time()

        await asyncio.gather(episode("a", 1.0), episode("b", 50.0), episode("c", 0.0))
        stop(busy)
        for e in engines:
            await e.shutdown()
        return ends, service.router.kv_waits

    ends, waits = run_virtual(main)
    assert waits == 1 and ends["c"] > ends["a"]  # c ran only after a ended


def test_a_new_episode_counts_at_least_the_typical_ended_episodes_context():
    async def main():
        engines = [SimulatedEngine("sim-0", COST)]
        router = EngineRouter(engines)
        for tokens in (200, 600, 1000):  # an episode that grew: 600 on average over its calls
            await router.admit("grown", tokens)
            router.settle("grown", tokens - 50, 50)
        router.release("grown")
        await router.admit("new", 100)  # its first prompt is short; it will grow like the last one
        held = router.held("sim-0")
        await router.admit("new", 900)
        grown = router.held("sim-0")
        await engines[0].shutdown()
        return router.typical_context, held, grown

    typical, held, grown = run_virtual(main)
    assert typical == 600 and held == 600 and grown == 900


def test_a_call_counts_its_likely_answer_and_a_done_call_what_the_cache_holds():
    async def main():
        engines = [SimulatedEngine("sim-0", COST)]
        router = EngineRouter(engines)
        held = []
        await router.admit("a", 300, 2000)  # no answer seen yet: its whole budget
        held.append(router.held("sim-0"))
        router.settle("a", 300, 40)  # done: prompt and answer, while its tool runs
        held.append(router.held("sim-0"))
        await router.admit("b", 300, 2000)  # answers run ~40 tokens: 340
        held.append(router.held("sim-0"))
        await router.admit("a", 400, 2000)
        held.append(router.held("sim-0"))
        await engines[0].shutdown()
        return held, router.typical_answer

    held, answer = run_virtual(main)
    assert held == [2300, 340, 680, 780] and answer == 40
