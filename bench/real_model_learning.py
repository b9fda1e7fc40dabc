"""Learning run on a real model: SmolLM2-135M-Instruct on generated arithmetic word problems, fully async.

The task: one- and two-step word problems (sums, differences, products) over names, items and
numbers drawn from a seeded generator; a fixed held-out split never trained on. Reward 1.0 when the
last number of the reply is the answer. Training episodes sample at temperature 0.7; held-out
episodes decode greedily, one per row, so the held-out accuracy is a deterministic function of
the weights. The run: `fully_async` with partial rollouts (a push interrupts generations, which
resume under the new weights), max_staleness 2, GRPO with the default off-policy correction,
full fine-tuning in float32 (verl FSDP2 on CPU), through `AsyncAgentTrainer` like any user run.

Writes outputs/real_model_learning/ (metrics.jsonl, summary.json) and docs/real_model_learning.md
(table) + docs/real_model_learning.png (plot). A benchmark, not a test: nothing is asserted.

    .venv/bin/python bench/real_model_learning.py --steps 20
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import re
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "outputs" / "real_model_learning"
TABLE = REPO / "docs" / "real_model_learning.md"
PLOT = REPO / "docs" / "real_model_learning.png"
SYSTEM_PROMPT = "Solve the math word problem. Think briefly, then end with: Answer: <number>"
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kemi", "Liam")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "coins", "cookies", "cards", "shells", "toy cars")
NUMBER = re.compile(r"-?\d+")
KV_CACHE_BYTES = 512 * 2**20  # vLLM's KV cache: ~11k tokens of SmolLM2-135M


def word_problem(rng: random.Random) -> tuple[str, int]:
    """One problem and its answer; five shapes, small numbers (the 135M model has headroom, not zero)."""
    name, friend = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    shape = rng.randrange(5)
    a, b = rng.randint(3, 30), rng.randint(2, 20)
    if shape == 0:
        return f"{name} has {a} {item}. {friend} gives {name} {b} more. How many {item} does {name} have now?", a + b
    if shape == 1:
        a = a + b
        return f"{name} had {a} {item} and gave {b} of them to {friend}. How many {item} does {name} have left?", a - b
    if shape == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return f"There are {a} bags with {b} {item} in each bag. How many {item} are there in total?", a * b
    if shape == 3:
        return f"{name} has {a} {item} and {friend} has {b} {item}. How many {item} do they have together?", a + b
    c = rng.randint(1, a + b - 1)
    return (f"{name} has {a} {item}, buys {b} more, then gives {c} to {friend}. "
            f"How many {item} does {name} have now?"), a + b - c


def rows(count: int, seed: int) -> list[dict[str, Any]]:
    """`count` distinct problems from `seed` (distinct question texts)."""
    rng, seen, out = random.Random(seed), set(), []
    while len(out) < count:
        question, answer = word_problem(rng)
        if question not in seen:
            seen.add(question)
            out.append({"id": f"p{len(out)}", "question": question, "answer": answer})
    return out


def split(train_count: int, val_count: int, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Held-out rows first, training rows after; no question appears in both."""
    every = rows(train_count + val_count, seed)
    val = [dict(row, greedy=True) for row in every[:val_count]]
    return every[val_count:], val


def reward(text: str | None, answer: int) -> float:
    """1.0 iff the last integer in the reply is the answer."""
    numbers = NUMBER.findall((text or "").replace(",", ""))
    return 1.0 if numbers and int(numbers[-1]) == answer else 0.0


TEMPERATURE = {"train": 0.7}  # set from --temperature


async def rollout_fn(client: Any, row: dict[str, Any]) -> float:
    response = await client.chat.completions.create(
        model="policy", max_tokens=96, temperature=0.0 if row.get("greedy") else TEMPERATURE["train"],
        messages=[{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": row["question"]}])
    return reward(response.choices[0].message.content, row["answer"])


async def train(config: Any, train_rows: list[dict], val_rows: list[dict]) -> Any:
    """The run, on an engine started here with a KV cache sized for this model (the CPU default holds
    ~1,400 tokens of SmolLM2: 46 KB per token), otherwise exactly what `AsyncAgentTrainer.train()` does."""
    from fullasync.api import AsyncAgentTrainer
    from fullasync.engines.vllm import launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.launch.parts import engine_config

    run = AsyncAgentTrainer(config, rollout_fn=rollout_fn, train_dataset=train_rows, val_dataset=val_rows)
    init_ray(log_to_driver=False)
    sized = dataclasses.replace(engine_config(config, run.model_path()),
                                extra_engine_kwargs={"kv_cache_memory_bytes": KV_CACHE_BYTES})
    (engine,) = await launch_vllm_engines(sized)
    try:
        return await run.train_async(engines=[engine])
    finally:
        await engine.shutdown()


def run(args: argparse.Namespace) -> dict[str, Any]:
    from fullasync.config import RunConfig, TrainerConfig
    from fullasync.observe.logs import configure_logging

    train_rows, val_rows = split(args.train_rows, args.val_rows)
    TEMPERATURE["train"] = args.temperature
    config = RunConfig(mode="fully_async", partial_rollout=True, total_steps=args.steps, val_every=args.val_every,
                       val_samples_per_row=1, output_dir=str(OUTPUT), seed=args.seed,
                       trainer=TrainerConfig(lr=args.lr, micro_batch_size=8))
    config.model.path = "smollm2-135m-instruct"
    config.data.task, config.data.epochs = "", 1
    config.rollout.n, config.rollout.batch_size, config.rollout.max_running_rows = args.n, args.batch, 2 * args.batch
    config.engine.max_model_len = 1024
    config.rollout.episode_timeout_s = args.episode_timeout  # a loaded 2-core machine generates slowly
    config.resume, config.checkpoint.every = "never", 0  # every bench run starts from the pretrained weights
    configure_logging()
    started = time.perf_counter()
    result = asyncio.run(train(config, train_rows, val_rows))
    wall = time.perf_counter() - started
    history = result.history
    output_tokens = sum(step.get("rollout/output_tokens", 0.0) for step in history)
    trained_tokens = sum(step.get("num_trained_tokens", 0.0) for step in history)
    update_s = sum(step.get("update_time_s", 0.0) for step in history)
    summary = {
        "steps": result.steps, "val_before": result.val_before, "val_after": result.val_after,
        "interrupted": result.interrupted,
        "val_rows": len(val_rows), "train_rows": len(train_rows), "wall_s": wall, "train_wall_s": result.train_wall_s,
        "s_per_step": result.train_wall_s / max(result.steps, 1),
        "generation_tokens_per_s": output_tokens / result.train_wall_s if result.train_wall_s else 0.0,
        "train_tokens_per_s": trained_tokens / update_s if update_s else 0.0,
        "push_s_mean": sum(step.get("weight_sync/total_s", 0.0) for step in history) / max(len(history), 1),
        "max_token_staleness": result.max_token_staleness,
        "resumed_calls": sum(step.get("rollout/resumed_calls", 0.0) for step in history),
        "settings": vars(args),
    }
    (OUTPUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (OUTPUT / "history.json").write_text(json.dumps(history, indent=1) + "\n")
    return summary


def accuracy(value: float | None, rows: int = 0) -> str:
    """`value`, with its standard error over `rows` held-out rows when given (a binomial proportion)."""
    if value is None:
        return "n/a"
    return f"{value:.3f} ± {(value * (1 - value) / rows) ** 0.5:.3f}" if rows else f"{value:.3f}"


def report(summary: dict[str, Any], history: list[dict[str, float]], held_out: list[tuple[int, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [int(step["step"]) for step in history]
    figure, axis = plt.subplots(figsize=(7, 4))
    axis.plot(steps, [step.get("reward/mean", 0.0) for step in history], marker=".",
              label=f"training reward (T={summary['settings']['temperature']})")
    axis.plot([s for s, _ in held_out], [a for _, a in held_out], marker="o", label="held-out accuracy (greedy)")
    axis.set_xlabel("train step")
    axis.set_ylabel("fraction correct")
    axis.set_title("SmolLM2-135M-Instruct, arithmetic word problems, fully async")
    axis.legend()
    figure.tight_layout()
    figure.savefig(PLOT, dpi=100)
    lines = [
        "# Learning run: SmolLM2-135M-Instruct on arithmetic word problems",
        "",
        "Written by `bench/real_model_learning.py` (settings below); see docs/real_model.md for context.",
        "",
        *([f"**Interrupted after {summary['steps']} of {summary['settings']['steps']} steps: "
           "no final validation.**", ""] if summary.get("interrupted") else []),
        ("| held-out accuracy before | after | steps | s/step | generation tok/s | train tok/s | push s "
         "| max staleness | resumed calls |"),
        "|---|---|---|---|---|---|---|---|---|",
        (f"| {accuracy(summary['val_before'], summary['val_rows'])} "
         f"| {accuracy(summary['val_after'], summary['val_rows'])} | {summary['steps']} "
         f"| {summary['s_per_step']:.1f} "
         f"| {summary['generation_tokens_per_s']:.0f} | {summary['train_tokens_per_s']:.0f} "
         f"| {summary['push_s_mean']:.2f} | {summary['max_token_staleness']} | {summary['resumed_calls']:.0f} |"),
        "",
        "| step | reward mean | step s | trained tokens | push s |",
        "|---|---|---|---|---|",
        *(f"| {int(s['step'])} | {s.get('reward/mean', 0.0):.3f} | {s.get('step_time_s', 0.0):.1f} "
          f"| {s.get('num_trained_tokens', 0.0):.0f} | {s.get('weight_sync/total_s', 0.0):.2f} |" for s in history),
        "",
        f"Held-out accuracy by step: {', '.join(f'{s}: {accuracy(a)}' for s, a in held_out)} "
        f"(± is the standard error over the {summary['val_rows']} held-out rows, greedy decoding).",
        "",
        (f"Settings: `{json.dumps(summary['settings'])}`; {summary['train_rows']} training rows, "
         f"{summary['val_rows']} held-out rows; wall time {summary['wall_s']:.0f} s in all (start-up and validations "
         "included)."),
        "",
        "![learning curve](real_model_learning.png)",
        "",
    ]
    TABLE.write_text("\n".join(lines))


def validations(summary: dict[str, Any], history: list[dict[str, float]]) -> list[tuple[int, float]]:
    """(step, held-out accuracy): before training, every --val-every steps, and at the end."""
    found = {0: summary["val_before"]}
    found.update({int(step["step"]): step["val/accuracy"] for step in history if "val/accuracy" in step})
    found[summary["steps"]] = summary["val_after"]
    return sorted((step, value) for step, value in found.items() if value is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--n", type=int, default=8, help="episodes per problem (group size)")
    parser.add_argument("--batch", type=int, default=4, help="groups per train step")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--temperature", type=float, default=0.7,
                        help="training episodes' sampling temperature "
                             "(at 1.0 the 135M model is right ~3%% of the time)")
    parser.add_argument("--train-rows", type=int, default=400)
    parser.add_argument("--val-rows", type=int, default=60)
    parser.add_argument("--val-every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--episode-timeout", type=float, default=1800.0, help="seconds per episode (validation too)")
    parser.add_argument("--report-only", action="store_true", help="rewrite the docs from the last run's outputs")
    args = parser.parse_args()
    OUTPUT.mkdir(parents=True, exist_ok=True)
    summary = json.loads((OUTPUT / "summary.json").read_text()) if args.report_only else run(args)
    history = json.loads((OUTPUT / "history.json").read_text())
    report(summary, history, validations(summary, history))
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
