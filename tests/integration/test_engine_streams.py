"""Streams from a real vLLM engine through its one delta channel: every stream gets exactly its own tokens, in
order, whatever the channel gathered with them; a resubmitted request id never sees an earlier attempt's tokens;
a stream dropped mid-way frees its engine slot."""

from __future__ import annotations

import asyncio

from events import freeze_mid_generation

from fullasync.contracts.engine import GenerateRequest, GenerateResult, SamplingOptions, TokenDelta


def request(request_id: str, seed: int, max_tokens: int = 200) -> GenerateRequest:
    sampling = SamplingOptions(ignore_eos=True, seed=seed, num_top_logprobs=2)
    return GenerateRequest(request_id, (1, 2, 3 + seed % 50), max_tokens, sampling)


async def collect(stream) -> tuple[list[TokenDelta], GenerateResult]:
    items = [item async for item in stream]
    *deltas, result = items
    assert isinstance(result, GenerateResult) and all(isinstance(delta, TokenDelta) for delta in deltas)
    return deltas, result


def joined(deltas: list[TokenDelta]) -> tuple[tuple, tuple, tuple]:
    return (tuple(t for d in deltas for t in d.output_ids), tuple(lp for d in deltas for lp in d.output_logprobs),
            tuple(top for d in deltas for top in d.top_logprobs))


async def test_concurrent_streams_each_get_exactly_their_own_tokens(engine):
    streams = await asyncio.gather(*(collect(engine.generate_stream(request(f"s{i}", seed=i))) for i in range(16)))
    for deltas, result in streams:
        assert joined(deltas) == (result.output_ids, result.output_logprobs, result.top_logprobs)
        assert len(result.output_ids) == 200
    assert len({result.output_ids for _, result in streams}) > 1  # different seeds, different streams


async def stream_until_first_delta(engine, req: GenerateRequest) -> None:
    stream = engine.generate_stream(req)
    first = await anext(stream)
    assert isinstance(first, TokenDelta) and first.output_ids
    await stream.aclose()  # abandoned mid-generation: the engine aborts it


async def wait_idle(engine, timeout_s: float = 30.0) -> None:
    async with asyncio.timeout(timeout_s):
        while await engine.num_in_flight():
            await asyncio.sleep(0.05)


async def test_a_resubmitted_request_id_gets_only_its_own_attempts_tokens(engine):
    await stream_until_first_delta(engine, request("same", seed=1, max_tokens=400))
    deltas, result = await collect(engine.generate_stream(request("same", seed=2)))
    assert joined(deltas) == (result.output_ids, result.output_logprobs, result.top_logprobs)
    assert len(result.output_ids) == 200


async def test_a_request_id_resubmitted_while_its_first_call_runs_ends_both_calls_cleanly(engine):
    """The first call is still in flight (frozen) when the second call of the same id arrives, and ends (aborted)
    while the second waits: each call keeps its own bookkeeping, and the second runs to its end."""
    await wait_idle(engine)
    first = engine.generate_stream(request("twice", seed=1, max_tokens=1000))
    head = asyncio.create_task(anext(first))  # sends the request
    await freeze_mid_generation(engine, "twice", at_least=1, budget=1000)
    try:
        second = asyncio.create_task(collect(engine.generate_stream(request("twice", seed=2))))
        async with asyncio.timeout(30):
            while await engine.num_in_flight() < 2:  # both calls of "twice" in flight, the second not yet admitted
                await asyncio.sleep(0.01)
        assert (await head).output_ids
        await first.aclose()  # the first call ends while the second is in flight
        async with asyncio.timeout(30):
            while await engine.num_in_flight() > 1:
                await asyncio.sleep(0.01)
    finally:
        await engine.resume()
    deltas, result = await second
    assert joined(deltas) == (result.output_ids, result.output_logprobs, result.top_logprobs)
    assert len(result.output_ids) == 200
    await wait_idle(engine)


async def test_a_stream_delivers_while_its_request_runs_and_a_dropped_one_frees_its_slot(engine):
    await wait_idle(engine)
    stream = engine.generate_stream(request("dropped", seed=3, max_tokens=1000))
    first = asyncio.create_task(anext(stream))  # sends the request
    await freeze_mid_generation(engine, "dropped", at_least=1, budget=1000)  # paused (KEEP), the request mid-way
    try:
        assert (await first).output_ids  # streamed as generated: delivered while the request is frozen in flight
        assert await engine.num_in_flight() == 1
        await stream.aclose()  # only an abort takes a frozen request out of flight
        await wait_idle(engine)
    finally:
        await engine.resume()
