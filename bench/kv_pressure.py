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

`--engine sim`: simulated engines on a virtual clock (`fullasync.sim`: the block-granular prefix cache of
`fullasync.sim.kv`, LRU eviction tail first as vLLM), the real client and router; the default sizes stand for an 8B
model on 8 GPUs (see `GPU_LIKE`).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass, field

from _report import report, run_note

from fullasync.client import ClientConfig, RolloutService
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer

BEGIN, END = "<!-- kv-pressure:begin -->", "<!-- kv-pressure:end -->"


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


async def closed_loop(engines: list[SimulatedEngine], episodes: Episodes, concurrency: int, warmup_s: float,
                      window_s: float, seed: int, kv_routing: bool) -> Measured:
    """`concurrency` episodes at once for `warmup_s` + `window_s`; what the window saw."""
    service = RolloutService(engines, SimTokenizer(), ClientConfig(
        model_name="policy", max_model_len=episodes.final_context() + 64, kv_routing=kv_routing))
    loop = asyncio.get_running_loop()
    opens = loop.time() + warmup_s
    closes = opens + window_s
    measured = Measured(concurrency, window_s=window_s)
    marks: dict[str, tuple[int, int]] = {}

    def engine_totals() -> tuple[int, int]:
        return (sum(e.time.prefill_tokens + e.time.cached_prompt_tokens for e in engines),
                sum(e.time.cached_prompt_tokens for e in engines))

    async def mark_at(when: float, name: str) -> None:
        await asyncio.sleep(max(0.0, when - loop.time()))
        marks[name] = engine_totals()

    async def one_episode(slot: int, number: int) -> None:
        rng = random.Random(f"{seed}/{slot}/{number}")
        client = service.client(f"episode-{slot}-{number}/0")
        prompt = [rng.randrange(1000, 2**30) for _ in range(episodes.prompt_tokens)]
        began = loop.time()
        try:
            for turn in range(episodes.turns):
                if turn:
                    await asyncio.sleep(tool_latency(rng, episodes))
                    observation = [rng.randrange(1000, 2**30) for _ in range(episodes.observation_tokens)]
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
            return await closed_loop(made, episodes, concurrency, warmup_s, window_s, seed, kv_routing)
        finally:
            for engine in made:
                await engine.shutdown()

    return run_virtual(main)


def render(rows: list[tuple[Measured, Measured]], cost: DecodeCost, engines: int, episodes: Episodes,
           note: str) -> str:
    capacity_tokens = cost.kv_blocks * cost.block_size
    lines = [
        f"{note}. Simulated: {engines} engines, each a KV cache of {cost.kv_blocks:,} blocks of {cost.block_size} "
        f"({capacity_tokens:,} tokens), at most {cost.max_num_seqs} sequences, prefill "
        f"{1 / cost.prefill_per_token_s:,.0f} tokens/s, decode step {cost.step_base_s * 1000:.0f} ms + "
        f"{cost.step_per_seq_s * 1000:.1f} ms per sequence. Episodes: a {episodes.prompt_tokens:,}-token prompt, "
        f"{episodes.turns} calls of {episodes.answer_tokens} tokens, {episodes.observation_tokens:,} tokens of tool "
        f"output after each (median tool latency {episodes.tool_s:g} s, lognormal σ {episodes.tool_sigma:g}), "
        f"{episodes.final_context():,} tokens at the end. Each concurrency runs twice on the same seed: *today* "
        "(`rollout.kv_routing=false`: an episode binds to the engine with the fewest requests in flight at its first "
        "call, never waits) and *KV* (the default: it binds to the engine with the most KV room, counting the "
        "contexts of the episodes bound there, tool time included, and its first call waits while no engine has "
        "room).",
        "",
        "| episodes at once | contexts / KV held | tokens/s today | tokens/s KV | KV / today | hit rate today | "
        "hit rate KV | prefilled per call today | prefilled per call KV | first calls held (KV) | "
        "episode min today | episode min KV |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    mean_context = (episodes.prompt_tokens + episodes.final_context()) / 2
    for today, kv in rows:
        held = today.concurrency * mean_context / (engines * capacity_tokens)
        lines.append(f"| {today.concurrency} | {held:.2f} | {today.tokens_per_s:,.0f} | {kv.tokens_per_s:,.0f} | "
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
    parser.add_argument("--engine", choices=("sim",), default="sim")
    parser.add_argument("--engines", type=int, default=8)
    parser.add_argument("--concurrency", default="64,128,192,256,384,512")
    parser.add_argument("--warmup", type=float, default=600.0, help="virtual seconds before the window opens")
    parser.add_argument("--window", type=float, default=1800.0, help="virtual seconds measured")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    episodes = Episodes()
    rows = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        pair = tuple(simulate(GPU_LIKE, args.engines, episodes, concurrency, args.warmup, args.window, args.seed,
                              kv_routing) for kv_routing in (False, True))
        for name, row in zip(("today", "KV"), pair, strict=True):
            print(f"concurrency {concurrency} {name}: {row.tokens_per_s:,.0f} tokens/s, hit rate {row.hit_rate:.1%}, "
                  f"{row.recomputed_per_call:,.0f} prompt tokens prefilled per call, {row.kv_waits} first calls held "
                  f"[{time.perf_counter() - started:.0f} s]", flush=True)
        rows.append(pair)
    report(render(rows, GPU_LIKE, args.engines, episodes, run_note(started)), BEGIN, END, not args.no_write)


if __name__ == "__main__":
    main()
