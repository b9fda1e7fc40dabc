"""The simulated engine's KV cache (`fullasync.sim.kv.PrefixCache`): prefix hits by whole blocks, shared blocks
counted once, eviction of the least recently used free blocks (a request's tail before its prefix), refusal when
even eviction cannot make room, and no reuse across a weight push."""

from __future__ import annotations

import pytest

from fullasync.sim.kv import PrefixCache


def ids(tag: int, n: int) -> list[int]:
    """n token ids that no other tag's share (a distinct episode's context)."""
    return [tag * 100_000 + i for i in range(n)]


def test_an_episodes_next_call_finds_its_whole_blocks_cached_and_only_those():
    cache = PrefixCache(capacity=100, block_size=16)
    first = ids(1, 40)
    assert cache.admit("a", first, generate=10) == 0  # nothing cached yet
    assert cache.used == 4  # ceil(50 / 16): 2 full prompt blocks, the rest private
    cache.release("a", [*first, *[7] * 10])  # 50 tokens computed: 3 full blocks stay cached
    assert cache.used == 0 and cache.cached_free == 3
    following = [*first, *[7] * 10, *ids(2, 30)]  # the next call: context + answer + tool output
    assert cache.admit("b", following, generate=5) == 48  # 3 whole blocks; the 2 tokens past them are prefilled
    assert cache.counters.hit_tokens == 48 and cache.counters.queried_tokens == 40 + 80
    assert cache.counters.hit_rate == pytest.approx(48 / 120)


def test_a_prefix_matches_only_where_every_token_before_it_does():
    cache = PrefixCache(capacity=100, block_size=4)
    cache.admit("a", [1, 2, 3, 4, 5, 6, 7, 8], generate=0)
    cache.release("a", [1, 2, 3, 4, 5, 6, 7, 8])
    assert cache.cached_prefix_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8
    assert cache.cached_prefix_tokens([0, 2, 3, 4, 5, 6, 7, 8]) == 0  # second block equal, first not: no hit
    assert cache.cached_prefix_tokens([1, 2, 3, 4, 0, 6, 7, 8]) == 4


def test_samples_of_one_prompt_share_its_blocks_while_they_run():
    cache = PrefixCache(capacity=10, block_size=4)
    prompt = ids(1, 16)  # 4 full blocks
    assert cache.admit("s0", prompt, generate=4) == 0
    assert cache.admit("s1", prompt, generate=4) == 16  # computed by s0 a moment ago: shared
    assert cache.used == 4 + 1 + 1  # the prompt's blocks once, a generation block each
    assert cache.admit("s2", prompt, generate=20) is None  # 5 more blocks do not fit in 10
    assert cache.counters.refused == 1 and cache.used == 6  # a refusal changes nothing
    cache.release("s0", [*prompt, 7, 7, 7, 7])
    assert cache.used == 5 and cache.cached_free == 1  # s1 still holds the prompt; s0's generated block cached


def test_room_is_made_by_evicting_the_least_recently_used_tail_first():
    cache = PrefixCache(capacity=6, block_size=4)
    old, new = ids(1, 12), ids(2, 12)
    cache.admit("old", old, generate=0)
    cache.release("old", old)
    cache.admit("new", new, generate=0)
    cache.release("new", new)
    assert cache.cached_free == 6
    cache.admit("x", ids(3, 8), generate=0)  # needs 2 blocks: the old episode's last two go
    assert cache.counters.evicted_blocks == 2
    assert cache.cached_prefix_tokens(old) == 4  # its first block (its prefix) outlived its tail
    assert cache.cached_prefix_tokens(new) == 12  # the more recent episode kept every block


def test_a_request_larger_than_the_cache_is_refused_and_a_weight_push_ends_every_match():
    cache = PrefixCache(capacity=4, block_size=4)
    assert cache.admit("huge", ids(1, 17), generate=0) is None  # 5 blocks
    prompt = ids(2, 8)
    cache.admit("a", prompt, generate=0)
    cache.invalidate()  # a weight push while "a" runs
    cache.release("a", prompt)
    assert cache.used == 0 and cache.cached_free == 0  # computed under the old weights: not cached
    cache.admit("b", prompt, generate=0)
    cache.release("b", prompt)
    assert cache.cached_prefix_tokens(prompt) == 8  # cached again under the new weights
    cache.invalidate()
    assert cache.cached_prefix_tokens(prompt) == 0


def test_used_plus_cached_never_passes_the_capacity_under_churn():
    import random

    rng = random.Random(0)
    cache = PrefixCache(capacity=64, block_size=8)
    contexts = {e: ids(e, rng.randint(8, 64)) for e in range(12)}
    running: dict[str, list[int]] = {}
    for step in range(3000):
        if running and (rng.random() < 0.5 or len(running) > 6):
            request, prompt = running.popitem()
            produced = [7] * rng.randint(0, 16)
            cache.release(request, [*prompt, *produced])
            contexts[int(request.split("-")[0])] = [*prompt, *produced, *ids(50 + step % 7, 4)]
        else:
            episode = rng.randrange(12)
            prompt = contexts[episode][-200:]
            if cache.admit(f"{episode}-{step}", prompt, generate=16) is not None:
                running[f"{episode}-{step}"] = prompt
        if rng.random() < 0.01:
            cache.invalidate()
        assert cache.used + cache.cached_free <= cache.capacity
    assert cache.counters.hit_tokens > 0 and cache.counters.evicted_blocks > 0 and cache.counters.refused > 0


def test_a_simulated_engine_with_a_kv_cache_prefills_only_what_it_has_not_cached_and_queues_what_does_not_fit():
    import asyncio

    from fullasync.contracts.engine import GenerateRequest
    from fullasync.engines.router import engine_kv_metrics
    from fullasync.errors import InvalidRequestError
    from fullasync.sim.clock import run_virtual
    from fullasync.sim.engine import TOKEN_ID, DecodeCost, SimulatedEngine

    cost = DecodeCost(prefill_per_token_s=0.001, kv_blocks=8, block_size=16)

    async def main():
        engine = SimulatedEngine("sim-0", cost)
        first = await engine.generate(GenerateRequest("e/0", tuple(ids(1, 40)), max_tokens=24))  # 4 blocks
        following = (*ids(1, 40), *first.output_ids, *ids(2, 8))  # 72 tokens: 4 of them full blocks, all cached
        await engine.generate(GenerateRequest("e/1", following, max_tokens=8))
        prefilled, cached = engine.time.prefill_tokens, engine.time.cached_prompt_tokens
        reported = (await engine.kv_stats(), await engine_kv_metrics([engine]))
        # two requests of 5 blocks each: the second waits for the first's blocks (8 in all)
        loop = asyncio.get_running_loop()
        ends = {}

        async def timed(request):
            await engine.generate(request)
            ends[request.request_id] = loop.time()

        started = loop.time()
        await asyncio.gather(timed(GenerateRequest("a", tuple(ids(3, 64)), max_tokens=16)),
                             timed(GenerateRequest("b", tuple(ids(4, 64)), max_tokens=16)))
        with pytest.raises(InvalidRequestError, match="KV cache") as refused:
            await engine.generate(GenerateRequest("huge", tuple(ids(5, 120)), max_tokens=16))
        await engine.shutdown()
        return first, prefilled, cached, ends, started, refused.value.code, engine.kv.counters, reported

    first, prefilled, cached, ends, started, code, counters, (stats, metrics) = run_virtual(main)
    # what a vLLM engine reports, and the step metrics of it: 112 prompt tokens queried, 64 found
    assert (stats.prefix_queries, stats.prefix_hits, stats.recomputed, stats.capacity_tokens) == (112, 64, 48, 128)
    assert metrics == {"kv/usage/sim-0": stats.usage, "kv/prefix_hit_rate/sim-0": 64 / 112,
                       "kv/recomputed_prefill_tokens": 48.0}
    assert first.output_ids == (TOKEN_ID,) * 24
    assert cached == 64 and prefilled == 40 + (72 - 64)  # the second call prefilled its last 8 tokens only
    one = 64 * 0.001 + 16 * cost.step_s(1)  # a request alone: its prefill, then 16 decode steps
    assert ends["a"] - started == pytest.approx(one) and ends["b"] - started == pytest.approx(2 * one)  # in turn
    assert counters.refused >= 1 and code == "context_length_exceeded"
