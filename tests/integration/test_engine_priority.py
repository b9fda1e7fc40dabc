"""The engine serves waiting requests by `GenerateRequest.priority` (vLLM's priority scheduling; real engine, tiny
model): when every slot is taken, the slot freed next goes to the lowest value, not to the request that came first."""

from __future__ import annotations

import asyncio
import time

from fullasync.contracts.engine import GenerateRequest, SamplingOptions

LONG = 2000  # tokens (the shared engine's context is 2,048): the slot holders outlast the test; they are aborted


def request(request_id: str, max_tokens: int, priority: int) -> GenerateRequest:
    return GenerateRequest(request_id, (1, 2, 3), max_tokens, SamplingOptions(ignore_eos=True), priority=priority)


async def wait_running(engine, request_ids: list[str], timeout_s: float = 120.0) -> None:
    """Until each request has generated a token (it holds a slot)."""
    deadline = time.monotonic() + timeout_s
    while True:
        progress = await engine.in_flight_tokens()
        if all(progress.get(request_id, 0) > 0 for request_id in request_ids):
            return
        assert time.monotonic() < deadline, f"the slot holders did not all start in {timeout_s:.0f} s"
        await asyncio.sleep(0.05)


async def wait_waiting(engine, request_id: str, timeout_s: float = 60.0) -> None:
    """Until the engine holds the request (without a token: no slot is free)."""
    deadline = time.monotonic() + timeout_s
    while request_id not in (progress := await engine.in_flight_tokens()):
        assert time.monotonic() < deadline, f"{request_id} never reached the engine"
        await asyncio.sleep(0.01)
    assert progress[request_id] == 0, f"{request_id} found a free slot: every slot should be held"


async def test_a_freed_slot_goes_to_the_lowest_priority_value_not_to_the_first_come(engine):
    slots = engine.config.max_num_seqs
    holders = [request(f"prio-hold-{i}", LONG, 0) for i in range(slots)]  # every slot held
    holding = [asyncio.create_task(engine.generate(r)) for r in holders]
    ended: list[str] = []

    async def waiter(r: GenerateRequest) -> None:
        await engine.generate(r)
        ended.append(r.request_id)

    try:
        await wait_running(engine, [r.request_id for r in holders])
        young = asyncio.create_task(waiter(request("prio-young", 4, 7)))  # first come, a younger row's
        await wait_waiting(engine, "prio-young")
        old = asyncio.create_task(waiter(request("prio-old", 4, 2)))  # after it, an older row's
        await wait_waiting(engine, "prio-old")
        await engine.abort([holders[0].request_id])  # one slot frees, now that both wait: which one gets it?
        await asyncio.wait([young, old], return_when=asyncio.FIRST_COMPLETED, timeout=120)
    finally:
        await engine.abort([r.request_id for r in holders])
        await asyncio.gather(*holding, return_exceptions=True)
    await asyncio.wait_for(asyncio.gather(young, old), 120)
    assert ended == ["prio-old", "prio-young"]


async def test_the_engine_reports_its_prefix_cache_hits_usage_and_kv_capacity(engine):
    """vLLM's own counters (`kv_stats`, read from its stat loggers): a prompt asked twice is looked up twice and
    found the second time, whole blocks of it; the run's step metrics take them (`kv/prefix_hit_rate/<engine>`), and
    the router its capacity (`kv_tokens`)."""
    from fullasync.engines.router import engine_kv_metrics

    before = await engine.kv_stats()
    prompt = tuple(100 + i % 800 for i in range(600))
    for attempt in range(2):
        await engine.generate(GenerateRequest(f"kv-stats-{attempt}", prompt, max_tokens=2,
                                              sampling=SamplingOptions(seed=0)))
    deadline = time.monotonic() + 5.0
    while True:  # the counters come with the engine core's outputs, at most a step behind
        after = await engine.kv_stats()
        queried, hit = after.prefix_queries - before.prefix_queries, after.prefix_hits - before.prefix_hits
        if queried >= 2 * len(prompt) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert queried >= 2 * len(prompt) - 1
    assert len(prompt) // 2 <= hit < len(prompt)  # the second request's whole blocks, never its last token
    assert after.capacity_tokens > len(prompt) and 0.0 <= after.usage <= 1.0
    assert engine.kv_tokens == after.capacity_tokens  # read at start: the router admits by it
    metrics = await engine_kv_metrics([engine])
    assert 0.0 < metrics[f"kv/prefix_hit_rate/{engine.name}"] <= 1.0
    assert metrics["kv/recomputed_prefill_tokens"] == after.recomputed >= len(prompt)
