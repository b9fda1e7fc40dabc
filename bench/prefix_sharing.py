"""Shared prefixes computed once (`trainer.share_prefixes`) against the unshared path: train-step time and peak
memory, interleaved repeats in one run.

For each case two `VerlTrainer`s (verl FSDP2 on CPU, fp32, one rank, the same model and settings but
`share_prefixes`) start side by side, each makes a warm-up step on the case's batch, then they alternate
`--repeats` steps each on the same batch (plain, shared, plain, shared, ...). Reported per case: the tokens the step
trains on counted in full (every sequence's length, the unshared count) and what the shared path computed
(`prefix_distinct`), each path's mean step time and tokens/s on the full count, the ratio of tokens/s (the per-repeat
ratios beside it), each path's peak resident memory during its steps (`peak_memory_gb`, the highest) and the
largest relative difference of the two paths' losses over the repeats (both start from the same weights and make the
same updates, so they must agree).

Cases:
- group-16k: the tiny model (context raised to 20,480) — one group of 8 episodes on a 16,384-token prompt with
  512–2,048-token continuations; micro-batches by tokens (twice the longest sequence), log-probs in chunks,
  activations recomputed in the backward pass;
- group-4k: SmolLM2-135M-Instruct — one group of 8 on a 2,048-token prompt with 512–2,048-token continuations (at
  most 4,096 tokens), the same settings;
- built-in: the tiny model — the built-in task's batch shape (8 rows × 8 episodes; the rows' real prompts through
  the chat template, 25 tokens, below the 32 a shared prefix needs; answers of 8–24 tokens), the default
  micro-batches (4 sequences by count): what sharing costs where there is nothing to share (at least 10 repeats:
  its steps last ~1 s);
- lineages: the tiny model — 2 rows × 4 episodes on a 1,024-token prompt, each episode a first call of 256 tokens
  and two forks from it (128 inserted tokens then 256 sampled each: three lineages sharing their first 1,280
  tokens), micro-batches by tokens (4,096), log-probs in chunks.

    .venv/bin/python bench/prefix_sharing.py [--cases group-16k group-4k built-in lineages] [--repeats 3]
        [--no-write]

Writes its table into docs/benchmarks/prefix-sharing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from _report import report, run_note

from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

BEGIN, END = "<!-- prefix-sharing:begin -->", "<!-- prefix-sharing:end -->"
LONG = {"chunked_logprobs": True, "gradient_checkpointing": True}


@dataclass(frozen=True)
class Case:
    name: str
    model: str  # tiny, or a named pretrained model
    groups: Callable[[random.Random], list[TrajectoryGroup]]
    settings: dict[str, object]
    min_repeats: int = 0  # steps of ~1 s need more repeats than the run's to read a ratio through the noise


def sampled(rng: random.Random, prompt: tuple[int, ...], length: int) -> ModelCall:
    output = tuple(rng.randrange(100, 1000) for _ in range(length))
    return ModelCall(prompt, output, tuple(-rng.uniform(1, 4) for _ in output), (0,) * length, FinishReason.STOP)


def text(rng: random.Random, length: int) -> tuple[int, ...]:
    return tuple(rng.randrange(100, 1000) for _ in range(length))


def one_group(prompt_length: int, longest: int) -> Callable[[random.Random], list[TrajectoryGroup]]:
    def build(rng: random.Random) -> list[TrajectoryGroup]:
        prompt = text(rng, prompt_length)
        episodes = tuple(Trajectory((sampled(rng, prompt, rng.randrange(512, longest + 1)),), reward=float(i % 2))
                         for i in range(8))
        return [TrajectoryGroup("group", episodes)]
    return build


def built_in(rng: random.Random) -> list[TrajectoryGroup]:
    from fullasync.models import build_tiny_model, load_tokenizer
    from fullasync.tasks.arithmetic import ArithmeticTask, messages

    tokenizer = load_tokenizer(str(build_tiny_model()))
    rows = ArithmeticTask().rows("train")[:8]
    groups = []
    for index, row in enumerate(rows):
        prompt = tuple(tokenizer.apply_chat_template(messages(row), add_generation_prompt=True, tokenize=True,
                                                     return_dict=True)["input_ids"])
        episodes = tuple(Trajectory((sampled(rng, prompt, rng.randrange(8, 25)),), reward=float(i % 2))
                         for i in range(8))
        groups.append(TrajectoryGroup(f"row-{index}", episodes))
    return groups


def lineages(rng: random.Random) -> list[TrajectoryGroup]:
    groups = []
    for row in range(2):
        prompt = text(rng, 1024)
        episodes = []
        for i in range(4):
            first = sampled(rng, prompt, 256)
            context = prompt + first.output_ids
            forks = tuple(sampled(rng, context + text(rng, 128), 256) for _ in range(2))
            episodes.append(Trajectory((first, *forks), reward=float(i % 2)))
        groups.append(TrajectoryGroup(f"row-{row}", tuple(episodes)))
    return groups


CASES = {
    "group-16k": Case("group-16k", "tiny", one_group(16384, 2048),
                      {**LONG, "max_tokens_per_micro_batch": 2 * (16384 + 2048),
                       "hf_overrides": {"max_position_embeddings": 20480}}),
    "group-4k": Case("group-4k", "smollm2-135m-instruct", one_group(2048, 2048),
                     {**LONG, "max_tokens_per_micro_batch": 2 * 4096}),
    "built-in": Case("built-in", "tiny", built_in, {}, min_repeats=10),
    "lineages": Case("lineages", "tiny", lineages, {"chunked_logprobs": True, "max_tokens_per_micro_batch": 4096}),
}


async def measure(case: Case, repeats: int) -> dict[str, object]:
    """Both paths' step times, peak memory and losses on the case's batch, interleaved."""
    if case.model == "tiny":
        from fullasync.models import build_tiny_model
        model_path = str(build_tiny_model())
    else:
        from fullasync.models import build_pretrained_model
        model_path = str(build_pretrained_model(case.model))
    trainers = {shared: VerlTrainer(model_path, TrainerConfig(lr=1e-6, call_timeout_s=7200, worker_num_cpus=1,
                                                              padding_free="on", share_prefixes=shared,
                                                              **case.settings))  # type: ignore[arg-type]
                for shared in (False, True)}
    await asyncio.gather(*(trainer.start() for trainer in trainers.values()))
    try:
        batch = trainers[False].build_batch(case.groups(random.Random(0)))
        full = int(batch.attention_mask.sum())
        steps: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for step in range(repeats + 1):
            for shared, trainer in trainers.items():
                metrics = await trainer.train_step(batch, trainer_version=0)
                if step:  # the first is the warm-up
                    steps[shared].append(metrics)
                print(f"  {case.name} {'shared' if shared else 'plain'} step {step}: {metrics['step_time_s']:.1f} s, "
                      f"peak {metrics['peak_memory_gb']:.2f} GB", flush=True)
    finally:
        for trainer in trainers.values():
            with contextlib.suppress(Exception):
                await trainer.shutdown()
    times = {shared: [m["step_time_s"] for m in runs] for shared, runs in steps.items()}
    return {
        "repeats": repeats, "full": full, "distinct": int(steps[True][0]["prefix_distinct"]),
        "sequences": batch.num_sequences,
        "seconds": {shared: statistics.mean(t) for shared, t in times.items()},
        "ratios": [p / s for p, s in zip(times[False], times[True], strict=True)],
        "peak": {shared: max(m["peak_memory_gb"] for m in runs) for shared, runs in steps.items()},
        "loss_gap": max(abs(a["loss"] - b["loss"]) / max(abs(a["loss"]), 1e-12)
                        for a, b in zip(steps[False], steps[True], strict=True)),
    }


def render(results: dict[str, dict[str, object]], repeats: int, note: str) -> str:
    lines = ["## Shared prefixes in the trainer", "",
             f"Two trainers per case (one rank, fp32, the same settings but `trainer.share_prefixes`), a warm-up step "
             f"each, then {repeats} steps each (more where a case asks: its repeats column) alternating on the same "
             "batch (`bench/prefix_sharing.py`). Tokens/s "
             "counts every sequence in full (the unshared count); computed = what the shared path's decoder ran. "
             "Peak: the highest resident memory of the rank over its steps. Loss gap: the largest relative "
             "difference of the two paths' losses over the repeats.", "", note, "",
             "| case | repeats | sequences | tokens (full) | computed | plain tokens/s | shared tokens/s | "
             "speed-up (per repeat) | peak plain / shared | loss gap |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        seconds, peak, full = r["seconds"], r["peak"], r["full"]
        assert isinstance(seconds, dict) and isinstance(peak, dict) and isinstance(full, int)
        ratios = r["ratios"]
        assert isinstance(ratios, list)
        lines.append(f"| {name} | {r['repeats']} | {r['sequences']} | {full:,} | {r['distinct']:,} | "
                     f"{full / seconds[False]:,.0f} | "
                     f"{full / seconds[True]:,.0f} | {seconds[False] / seconds[True]:.2f}× "
                     f"({', '.join(f'{x:.2f}' for x in ratios)}) | {peak[False]:.2f} / {peak[True]:.2f} GB | "
                     f"{r['loss_gap']:.1e} |")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    from fullasync.infra.runtime import init_ray

    started = time.perf_counter()
    init_ray(num_cpus=2, log_to_driver=False)
    results = {}
    for name in args.cases:
        case = CASES[name]
        results[name] = await measure(case, max(args.repeats, case.min_repeats))
        print(f"{name}: {results[name]}", flush=True)
    report(render(results, args.repeats, run_note(started)), BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    asyncio.run(main(parser.parse_args()))
