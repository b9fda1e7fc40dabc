"""Staleness study: does fully async learn as well as sync, with and without the off-policy correction?

The built-in task (`fullasync train` defaults: 8 groups × 8 episodes per step), the same sample
budget for every run (`--steps` × 64 trained samples), and these configurations:

    sync                            on-policy baseline (correction auto → none)
    fully_async, max_staleness k    k ∈ {1, 4, 8}, partial rollouts on,
                                    × correction ∈ {none, auto (the default: decoupled PPO)}

each with `--seeds` seeds (engine sampling and trainer seeded alike). Every run is a fresh
`AsyncAgentTrainer(config).train()` in its own process — a new engine and trainer starting from
the warm policy — so no run inherits another's weights or Ray state. Held-out accuracy (mean
reward of 16 episodes per held-out row) is measured before training, every `--val-every` steps
and at the end; samples/s is trained samples over the training wall time (the periodic
validations, the same number in every run, included).

Results go to outputs/staleness_study/results.jsonl as each run ends (a rerun skips the runs
already there); the table docs/staleness_study.md and the plot docs/staleness_accuracy.png are
rewritten after every run, so an interrupted study still leaves what it measured. A benchmark,
not a test: nothing is asserted.

    .venv/bin/python bench/staleness_study.py --steps 40 --seeds 3        # the whole study
    .venv/bin/python bench/staleness_study.py --steps 40 --seeds 3 --report-only   # table and plot only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "outputs" / "staleness_study" / "results.jsonl"
TABLE = REPO / "docs" / "staleness_study.md"
PLOT = REPO / "docs" / "staleness_accuracy.png"
STALENESS = (1, 4, 8)


@dataclass(frozen=True)
class StudyConfig:
    mode: str
    max_staleness: int
    correction: str  # "auto" → the default rule (none for sync, decoupled when staleness > 0)

    @property
    def name(self) -> str:
        if self.mode == "sync":
            return "sync"
        label = "default" if self.correction == "auto" else self.correction
        return f"async k={self.max_staleness} {label}"


CONFIGS = [StudyConfig("sync", 0, "auto")] + [
    StudyConfig("fully_async", k, correction) for k in STALENESS for correction in ("none", "auto")
]


def run_one(spec: dict) -> dict:
    """One training run (in this process); returns what the table and the plot need."""
    from dataclasses import replace

    from fullasync.api import AsyncAgentTrainer
    from fullasync.config import RunConfig

    base = RunConfig()
    trainer = replace(base.trainer, correction=spec["correction"], seed=spec["seed"])
    config = RunConfig(
        mode=spec["mode"], max_staleness=spec["max_staleness"] if spec["mode"] != "sync" else -1,
        total_steps=spec["steps"], val_every=spec["val_every"], seed=spec["seed"], trainer=trainer,
        output_dir=str(REPO / "outputs" / "staleness_study" / spec["run_id"]),
    )
    started = time.perf_counter()
    result = AsyncAgentTrainer(config).train()
    samples_per_step = base.rollout.batch_size * base.rollout.n
    curve = [(0, result.val_before)]
    trained = 0
    for step in result.history[:-1]:  # the last step's accuracy is val_after
        trained += int(step["rollout/samples"])
        if "val/accuracy" in step:
            curve.append((trained, step["val/accuracy"]))
    curve.append((result.trained_samples, result.val_after))
    return {
        **spec, "correction_used": config.correction.value, "steps_done": result.steps,
        "val_before": result.val_before, "val_after": result.val_after, "curve": curve,
        "trained_samples": result.trained_samples, "samples_per_s": result.samples_per_s,
        "max_token_staleness": result.max_token_staleness, "samples_per_step": samples_per_step,
        "run_s": time.perf_counter() - started,
        "mean_staleness": statistics.fmean(s["staleness/mean"] for s in result.history),
        "kl_k3_mean": statistics.fmean(s.get("correction/kl_k3", 0.0) for s in result.history),
    }


def load_results(steps: int) -> list[dict]:
    """The recorded runs of `steps` steps (runs of other lengths are not comparable)."""
    if not RESULTS.exists():
        return []
    records = [json.loads(line) for line in RESULTS.read_text().splitlines() if line.strip()]
    return [r for r in records if r["steps"] == steps]


def run_study(args: argparse.Namespace) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    done = {r["run_id"] for r in load_results(args.steps) if "error" not in r}
    for seed in range(args.seeds):  # seed-major: an interrupted study has whole seeds
        for study in CONFIGS:
            run_id = f"{study.name.replace(' ', '_').replace('=', '')}_steps{args.steps}_seed{seed}"
            if run_id in done:
                continue
            spec = {"run_id": run_id, "name": study.name, "mode": study.mode, "max_staleness": study.max_staleness,
                    "correction": study.correction, "seed": seed, "steps": args.steps, "val_every": args.val_every}
            print(f"[study] {time.strftime('%H:%M:%S')} {run_id} ...", flush=True)
            record = run_in_subprocess(spec, args.run_timeout_s)
            with RESULTS.open("a") as out:
                out.write(json.dumps(record) + "\n")
            print(f"[study] {run_id}: " + (f"error {record['error']}" if "error" in record else
                  f"accuracy {record['val_before']:.3f} → {record['val_after']:.3f}, "
                  f"{record['samples_per_s']:.1f} samples/s, {record['run_s']:.0f} s"), flush=True)
            write_report(load_results(args.steps), args.command)


def run_in_subprocess(spec: dict, timeout_s: float) -> dict:
    """The run in a fresh Python process (its own Ray, engine and trainer); a failure is recorded, not raised."""
    out_file = RESULTS.parent / f"{spec['run_id']}.json"
    out_file.unlink(missing_ok=True)
    log = RESULTS.parent / f"{spec['run_id']}.log"
    command = [sys.executable, str(Path(__file__).resolve()), "--run-one", json.dumps(spec), "--out", str(out_file)]
    with log.open("w") as handle:
        try:
            code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, timeout=timeout_s,
                                  cwd=REPO).returncode
        except subprocess.TimeoutExpired:
            return {**spec, "error": f"timed out after {timeout_s:.0f} s (log: {log})"}
    if code != 0 or not out_file.exists():
        return {**spec, "error": f"exit code {code} (log: {log})"}
    return json.loads(out_file.read_text())


# --- report ---------------------------------------------------------------------------------------


def mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def within_noise(a: list[float], b: list[float]) -> tuple[float, float, bool]:
    """Difference of means, its standard error, and |difference| ≤ 2 standard errors."""
    difference = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return difference, math.nan, False
    error = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    return difference, error, abs(difference) <= 2 * error


def write_report(results: list[dict], command: str) -> None:
    ok = [r for r in results if "error" not in r]
    failed = [r for r in results if "error" in r]
    by_name = {c.name: [r for r in ok if r["name"] == c.name] for c in CONFIGS}
    sync = [r["val_after"] for r in by_name["sync"]]
    lines = [
        "# Staleness study: fully async vs sync, with and without the off-policy correction",
        "",
        "Written by `bench/staleness_study.py` (a benchmark, not a test). Reproduce with:",
        "",
        f"    {command}",
        "",
        "The built-in task (single-digit sums; warm-started tiny policy), 8 groups × 8 episodes per step,",
        "the same number of trained samples in every run, a fresh engine and trainer per run. `default` is",
        "the correction chosen when none is configured and staleness > 0 (decoupled PPO, AReaL's objective:",
        "clip against the recomputed proximal policy, weight by proximal/behaviour, weights above 5 zeroed);",
        "`none` is plain PPO clipped against the behaviour log-probs. Accuracy: mean reward of 16 episodes",
        "on each of the 11 held-out rows. samples/s: trained samples / training wall time (validations",
        "included), on a shared 2-core CPU machine.",
        "",
        "| configuration | correction used | seeds | accuracy before | final accuracy (mean ± std) "
        "| Δ vs sync | samples/s (mean ± std) | mean token staleness | mean KL k3 (behaviour ‖ current) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for config in CONFIGS:
        runs = by_name[config.name]
        if not runs:
            lines.append(f"| {config.name} | – | 0 | – | – | – | – | – | – |")
            continue
        before, _ = mean_std([r["val_before"] for r in runs])
        accuracy, accuracy_std = mean_std([r["val_after"] for r in runs])
        speed, speed_std = mean_std([r["samples_per_s"] for r in runs])
        delta = f"{accuracy - statistics.fmean(sync):+.3f}" if sync and config.name != "sync" else "–"
        lines.append(
            f"| {config.name} | {runs[0]['correction_used']} | {len(runs)} | {before:.3f} | "
            f"{accuracy:.3f} ± {accuracy_std:.3f} | {delta} | {speed:.2f} ± {speed_std:.2f} | "
            f"{statistics.fmean(r['mean_staleness'] for r in runs):.2f} | "
            f"{statistics.fmean(r['kl_k3_mean'] for r in runs):.4f} |"
        )
    lines += ["", f"![held-out accuracy vs trained samples]({PLOT.name})", ""]
    lines += verdict_lines(by_name, sync)
    if failed:
        lines += ["", "Runs that failed (not in the table):", ""]
        lines += [f"- {r['run_id']}: {r['error']}" for r in failed]
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text("\n".join(lines) + "\n")
    plot(by_name)


def verdict_lines(by_name: dict[str, list[dict]], sync: list[float]) -> list[str]:
    lines = ["Within noise means |Δ| ≤ 2 standard errors of the difference of means (Welch)."]
    for k in STALENESS:
        for label in ("default", "none"):
            runs = [r["val_after"] for r in by_name[f"async k={k} {label}"]]
            if len(runs) < 2 or len(sync) < 2:
                continue
            difference, error, ok = within_noise(runs, sync)
            lines.append(f"- k={k}, {label}: Δ = {difference:+.3f} ± {error:.3f} (s.e.) vs sync — "
                         + ("within noise of sync" if ok else "outside noise of sync"))
    return lines


def plot(by_name: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    colors = {1: "tab:blue", 4: "tab:orange", 8: "tab:red"}
    for name, runs in by_name.items():
        if not runs:
            continue
        points = sorted({samples for r in runs for samples, _ in r["curve"]})
        # runs validate at the same sample counts (same steps); average those present in every run
        common = [p for p in points if all(any(s == p for s, _ in r["curve"]) for r in runs)]
        means, stds = [], []
        for p in common:
            values = [next(a for s, a in r["curve"] if s == p) for r in runs]
            mean, std = mean_std(values)
            means.append(mean)
            stds.append(std)
        if name == "sync":
            style = {"color": "black", "linestyle": "-", "linewidth": 2.2}
        else:
            k = int(name.split("k=")[1].split()[0])
            style = {"color": colors[k], "linestyle": "-" if name.endswith("default") else "--"}
        axes.plot(common, means, marker="o", markersize=3, label=f"{name} (n={len(runs)})", **style)
        axes.fill_between(common, [m - s for m, s in zip(means, stds)], [m + s for m, s in zip(means, stds)],
                          color=style["color"], alpha=0.08)
    axes.set_xlabel("trained samples")
    axes.set_ylabel("held-out accuracy")
    axes.set_title("Built-in task: held-out accuracy vs samples (mean ± std over seeds)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(PLOT, dpi=120)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="train steps per run (× 64 samples)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per configuration")
    parser.add_argument("--val-every", type=int, default=10, help="validate every this many steps")
    parser.add_argument("--run-timeout-s", type=float, default=900.0, help="a run taking longer is recorded as failed")
    parser.add_argument("--report-only", action="store_true", help="rewrite table and plot from the results file")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results first")
    parser.add_argument("--run-one", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.command = (f".venv/bin/python bench/staleness_study.py --steps {args.steps} --seeds {args.seeds} "
                    f"--val-every {args.val_every}")
    if args.run_one:
        Path(args.out).write_text(json.dumps(run_one(json.loads(args.run_one))))
        return
    if args.report_only:
        write_report(load_results(args.steps), args.command)
        return
    if args.fresh and RESULTS.exists():
        RESULTS.unlink()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    run_study(args)
    write_report(load_results(args.steps), args.command)


if __name__ == "__main__":
    main()
