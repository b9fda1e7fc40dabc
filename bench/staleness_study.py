"""Staleness study: does fully async learn as well as sync, with and without the off-policy correction?

The built-in task (`fullasync train` defaults: 8 groups × 8 episodes per step), the same sample
budget for every run (`--steps` × 64 trained samples), and thirteen configurations (CONFIGS):

    sync                            on-policy baseline (correction auto → none)
    fully_async, max_staleness k    k ∈ {1, 4, 8}, partial rollouts on, × correction ∈ {none,
                                    decoupled/recompute, decoupled/loglinear, gspo (the default)}

plus CANDIDATES, screened at k = 4 in search of a default and run only when named in `--configs`
(other corrections and knobs; `sync gspo` tells the objective's own effect from staleness tolerance),
each with `--seeds` seeds (engine sampling and trainer seeded alike). Every run starts from the
warm policy: a new trainer, and the engine reset to the warm weights (a weight push, which also
clears its prefix cache). One process per seed hosts Ray and that seed's engine (a vLLM start
costs about a minute on this machine) and runs the configurations on it through
`AsyncAgentTrainer(config).train_async(engines=[engine], trainer=trainer)`; the loop hands the
trainer the engine's weight version at each step, so the version gaps of the loglinear proximal
are exact. Held-out accuracy (mean reward of `--val-samples`
episodes per held-out row) is measured before training, every `--val-every` steps and at the
end; samples/s is trained samples over the training wall time (the periodic validations, the
same number in every run, included).

Results go to outputs/staleness_study/results.jsonl as each run ends (a rerun skips the runs
already there); the table docs/staleness_study.md and the plot docs/staleness_accuracy.png are
rewritten after every seed, so an interrupted study still leaves what it measured (a `## Notes`
section at the end of the page is kept). A benchmark, not a test: nothing is asserted.

    .venv/bin/python bench/staleness_study.py --steps 40 --seeds 3                # the whole study
    .venv/bin/python bench/staleness_study.py --steps 40 --seeds 3 --report-only  # table and plot only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fullasync.config.trainer import PROXIMAL_CORRECTIONS

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "outputs" / "staleness_study" / "results.jsonl"
TABLE = REPO / "docs" / "staleness_study.md"
PLOT = REPO / "docs" / "staleness_accuracy.png"
STALENESS = (1, 4, 8)
NOTES = "## Notes\n"  # a hand-written section of the table's page from this heading on is kept on rewrite


@dataclass(frozen=True)
class StudyConfig:
    mode: str
    max_staleness: int
    correction: str  # "auto" (sync: the default rule gives none) or an explicit correction
    proximal: str = "recompute"  # proximal source of decoupled
    knobs: tuple[tuple[str, object], ...] = ()  # further TrainerConfig fields, e.g. (("mini_batches", 4),)

    @property
    def name(self) -> str:
        correction = f"{self.correction}/{self.proximal}" if self.correction in PROXIMAL else self.correction
        if self.mode == "sync":
            label = "sync" if self.correction == "auto" else f"sync {correction}"
        else:
            label = f"async k={self.max_staleness} {correction}"
        return " ".join([label, *(f"{key}={value}" for key, value in self.knobs)])

    @property
    def is_default(self) -> bool:
        """Whether this is what `fullasync train` applies when no correction is configured."""
        from fullasync.config import RunConfig

        trainer = RunConfig().trainer
        if any(getattr(trainer, key) != value for key, value in self.knobs):
            return False
        if self.mode == "sync":
            return self.correction == "auto"
        default = RunConfig(mode="fully_async", max_staleness=self.max_staleness).resolved_trainer()
        return (self.correction == default.correction
                and (self.correction not in PROXIMAL or self.proximal == default.proximal))


PROXIMAL = {c.value for c in PROXIMAL_CORRECTIONS}  # corrections with a proximal policy: named with its source
CONFIGS = [StudyConfig("sync", 0, "auto")] + [
    StudyConfig("fully_async", k, correction, proximal)
    for k in STALENESS
    for correction, proximal in (("none", "recompute"), ("decoupled", "recompute"), ("decoupled", "loglinear"),
                                 ("gspo", "recompute"))
]
# Screened at staleness 4 in search of a default that holds there (`--configs` picks them by name).
CANDIDATES = [
    StudyConfig("sync", 0, "gspo"),  # is the default's gain over `none` staleness tolerance, or GSPO itself?
    StudyConfig("sync", 0, "auto", knobs=(("mini_batches", 4),)),
    StudyConfig("fully_async", 4, "decoupled", "recompute", (("mini_batches", 4),)),
    StudyConfig("fully_async", 4, "decoupled", "loglinear", (("mini_batches", 4),)),
    StudyConfig("fully_async", 4, "decoupled", "loglinear", (("mask_high", 2.0),)),
    StudyConfig("fully_async", 4, "token_tis", "loglinear", (("is_threshold", 1.0),)),
    StudyConfig("fully_async", 4, "token_mask", "loglinear", (("mask_low", 0.5), ("mask_high", 2.0))),
    StudyConfig("fully_async", 4, "token_rs", "loglinear"),
    StudyConfig("fully_async", 4, "token_rs", "loglinear", (("mask_high", 2.0),)),
    StudyConfig("fully_async", 4, "token_rs", "recompute"),
    StudyConfig("fully_async", 4, "cispo"),
    # decoupled PPO in its intended regime: several updates per step at a proportionally smaller lr
    StudyConfig("sync", 0, "auto", knobs=(("lr", 1.25e-4), ("mini_batches", 4))),
    StudyConfig("fully_async", 4, "decoupled", "recompute", (("lr", 1.25e-4), ("mini_batches", 4))),
    StudyConfig("fully_async", 4, "decoupled", "loglinear", (("lr", 1.25e-4), ("mini_batches", 4))),
    StudyConfig("fully_async", 4, "none", knobs=(("lr", 1.25e-4), ("mini_batches", 4))),
    StudyConfig("fully_async", 4, "gspo", knobs=(("lr", 1.25e-4), ("mini_batches", 4))),
]
CATALOGUE = CONFIGS + CANDIDATES


def run_config(spec: dict) -> object:
    """The RunConfig of one run: `fullasync train` defaults plus the study's mode, staleness, correction, seed."""
    from dataclasses import replace

    from fullasync.config import RunConfig

    base = RunConfig()
    return RunConfig(
        mode=spec["mode"], max_staleness=spec["max_staleness"] if spec["mode"] != "sync" else -1,
        total_steps=spec["steps"], val_every=spec["val_every"], val_samples_per_row=spec["val_samples"],
        seed=spec["seed"],
        trainer=replace(base.trainer, correction=spec["correction"], proximal=spec["proximal"], seed=spec["seed"],
                        **dict(spec.get("knobs", ()))),
        output_dir=str(REPO / "outputs" / "staleness_study" / spec["run_id"]),
    )


async def run_seed(specs: list[dict]) -> None:
    """The runs of one seed on one engine; each record is appended to RESULTS as its run ends."""
    import torch
    from transformers import AutoModelForCausalLM

    from fullasync.api import AsyncAgentTrainer
    from fullasync.engines.vllm import launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.launch.parts import engine_config
    from fullasync.weights.sync import WeightSync

    first = run_config(specs[0])
    model_path = AsyncAgentTrainer(first).model_path()
    warm = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).state_dict()
    init_ray()
    (engine,) = await launch_vllm_engines(engine_config(first, model_path))
    try:
        for spec in specs:
            await WeightSync([engine], version=await engine.version()).push(warm)  # back to the warm policy
            record = await run_one(spec, engine, model_path)
            with RESULTS.open("a") as out:
                out.write(json.dumps(record) + "\n")
            print(f"[study] {spec['run_id']}: " + (f"error {record['error']}" if "error" in record else
                  f"accuracy {record['val_before']:.3f} → {record['val_after']:.3f}, "
                  f"{record['samples_per_s']:.1f} samples/s, {record['run_s']:.0f} s"), flush=True)
    finally:
        await engine.shutdown()


async def run_one(spec: dict, engine: object, model_path: str) -> dict:
    """One training run on `engine` with a fresh trainer; a failure is recorded, not raised."""
    from fullasync.api import AsyncAgentTrainer
    from fullasync.trainer.verl_trainer import VerlTrainer

    config = run_config(spec)
    started = time.perf_counter()
    trainer = VerlTrainer(model_path, config.resolved_trainer())
    try:
        await trainer.start()
        result = await AsyncAgentTrainer(config).train_async(engines=[engine], trainer=trainer)
    except Exception as error:  # recorded in the results and shown in the report
        return {**spec, "error": repr(error)[:300]}
    finally:
        await trainer.shutdown()
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
        "max_token_staleness": result.max_token_staleness, "run_s": time.perf_counter() - started,
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
    for seed in range(args.seeds):  # seed-major: an interrupted study has whole seeds
        done = {r["run_id"] for r in load_results(args.steps) if "error" not in r}
        specs = []
        for study in CATALOGUE:
            if study.name not in args.configs if args.configs else study not in CONFIGS:
                continue
            label = study.name.replace(" ", "_").replace("=", "").replace("/", "-")
            run_id = f"{label}_steps{args.steps}_seed{seed}"
            if run_id not in done:
                specs.append({"run_id": run_id, "name": study.name, "mode": study.mode,
                              "max_staleness": study.max_staleness, "correction": study.correction,
                              "proximal": study.proximal, "knobs": list(study.knobs),
                              "seed": seed, "steps": args.steps, "val_every": args.val_every,
                              "val_samples": args.val_samples})
        if not specs:
            continue
        print(f"[study] {time.strftime('%H:%M:%S')} seed {seed}: {len(specs)} runs", flush=True)
        log = RESULTS.parent / f"seed{seed}_steps{args.steps}.log"
        command = [sys.executable, str(Path(__file__).resolve()), "--run-seed", json.dumps(specs)]
        with log.open("a") as handle:
            try:
                code = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO,
                                      timeout=args.run_timeout_s * len(specs)).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        finished = {r["run_id"] for r in load_results(args.steps)}
        with RESULTS.open("a") as out:  # runs the seed's process never reported
            for spec in specs:
                if spec["run_id"] not in finished:
                    out.write(json.dumps({**spec, "error": f"seed process ended ({code}); log: {log}"}) + "\n")
        write_report(load_results(args.steps), args.command)


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


SCHEDULE_KNOBS = ("lr", "mini_batches", "ppo_epochs")  # knobs that change sync too: its baseline shares them


def baseline(config: StudyConfig) -> str:
    """Name of the sync run a configuration is compared with: same update schedule."""
    return StudyConfig("sync", 0, "auto", knobs=tuple(kv for kv in config.knobs if kv[0] in SCHEDULE_KNOBS)).name


def write_report(results: list[dict], command: str) -> None:
    ok = [r for r in results if "error" not in r]
    failed = [r for r in results if "error" in r and r["run_id"] not in {o["run_id"] for o in ok}]
    shown = [c for c in CATALOGUE if c in CONFIGS or any(r["name"] == c.name for r in ok)]
    by_name = {c.name: [r for r in ok if r["name"] == c.name] for c in shown}
    lines = [
        "# Staleness study: fully async vs sync, with and without the off-policy correction",
        "",
        "Written by `bench/staleness_study.py` (a benchmark, not a test). Reproduce with:",
        "",
        f"    {command}",
        "",
        "The built-in task (single-digit sums; warm-started tiny policy), 8 groups × 8 episodes per step,",
        "the same number of trained samples in every run; every run starts from the warm policy (a fresh",
        "trainer; the seed's engine reset to the warm weights). Corrections: `none` is plain PPO clipped",
        "against the behaviour log-probs; `decoupled/<proximal>` is AReaL's decoupled PPO (clip against the",
        "proximal policy, weight by proximal/behaviour, weights above `mask_high` zeroed) with the proximal",
        "log-probs recomputed by a forward pass or interpolated by version gap (loglinear); `token_tis` and",
        "`token_mask` truncate or mask the per-token weight instead. Trailing `knob=value` are TrainerConfig",
        "fields changed from the built-in run's (`mini_batches`: optimizer updates per step).",
        "**(default)** marks what runs when no correction is configured (sync: `none`); Δ is against the",
        "sync run with the same update schedule.",
        f"Accuracy: mean reward of {ok[0]['val_samples'] if ok else '?'} episodes on each of the 11 held-out "
        "rows. samples/s: trained samples / training wall time (periodic validations included), on a",
        "shared 2-core CPU.",
        "",
        "| configuration | correction used | seeds | accuracy before | final accuracy (mean ± std) | worst seed "
        "| Δ vs sync | samples/s (mean ± std) | mean token staleness | mean KL k3 (behaviour ‖ current) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config in shown:
        runs = by_name[config.name]
        if not runs:
            lines.append(f"| {config.name} | – | 0 | – | – | – | – | – | – | – |")
            continue
        before, _ = mean_std([r["val_before"] for r in runs])
        accuracy, accuracy_std = mean_std([r["val_after"] for r in runs])
        speed, speed_std = mean_std([r["samples_per_s"] for r in runs])
        sync = [r["val_after"] for r in by_name.get(baseline(config), [])]
        delta = f"{accuracy - statistics.fmean(sync):+.3f}" if sync and config.mode != "sync" else "–"
        marker = " **(default)**" if config.is_default else ""
        lines.append(
            f"| {config.name}{marker} | {runs[0]['correction_used']} | {len(runs)} | {before:.3f} | "
            f"{accuracy:.3f} ± {accuracy_std:.3f} | {min(r['val_after'] for r in runs):.3f} | {delta} | "
            f"{speed:.2f} ± {speed_std:.2f} | "
            f"{statistics.fmean(r['mean_staleness'] for r in runs):.2f} | "
            f"{statistics.fmean(r['kl_k3_mean'] for r in runs):.4f} |"
        )
    lines += ["", f"![held-out accuracy vs trained samples]({PLOT.name})", ""]
    lines += verdict_lines(shown, by_name)
    if failed:
        lines += ["", "Runs that failed (not in the table):", ""]
        lines += [f"- {r['run_id']}: {r['error']}" for r in failed]
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    notes = TABLE.read_text().partition(NOTES)[2] if TABLE.exists() else ""
    TABLE.write_text("\n".join(lines) + "\n" + (f"\n{NOTES}{notes}" if notes else ""))
    plot([c for c in shown if c in CONFIGS or (c.mode == "sync" and not c.knobs)], by_name)  # screened ones: table


def verdict_lines(shown: list[StudyConfig], by_name: dict[str, list[dict]]) -> list[str]:
    lines = ["Within noise means |Δ| ≤ 2 standard errors of the difference of means (Welch)."]
    for config in shown:
        runs = [r["val_after"] for r in by_name[config.name]]
        sync = [r["val_after"] for r in by_name.get(baseline(config), [])]
        if config.mode == "sync" or len(runs) < 2 or len(sync) < 2:
            continue
        difference, error, ok = within_noise(runs, sync)
        marker = " (default)" if config.is_default else ""
        side = "above sync" if difference > 0 else "below sync"
        verdict = "within noise of sync" if ok else f"{side}, beyond noise"
        lines.append(f"- {config.name}{marker}: Δ = {difference:+.3f} ± {error:.3f} (s.e.) vs {baseline(config)} — "
                     + verdict)
    return lines


def plot(shown: list[StudyConfig], by_name: dict[str, list[dict]]) -> None:
    """One panel per staleness: its corrections against the sync baselines (mean ± std over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    staleness = sorted({c.max_staleness for c in shown if c.mode != "sync"}) or [0]
    figure, panels = plt.subplots(1, len(staleness), figsize=(5.2 * len(staleness), 4.8), sharey=True, squeeze=False)
    dashes = ["-", "--", "-.", ":", (0, (5, 1, 1, 1)), (0, (1, 3))]
    labels = [c.name.split(" ", 2)[-1] for c in shown if c.mode != "sync"]
    labels = list(dict.fromkeys(labels))
    colors = plt.get_cmap("tab10")
    for axes, k in zip(panels[0], staleness, strict=True):
        for config in [c for c in shown if c.mode == "sync" or c.max_staleness == k]:
            runs = by_name[config.name]
            if not runs:
                continue
            common, means, stds = curve(runs)
            if config.mode == "sync":
                style = {"color": "black" if config.correction == "auto" else "dimgray", "linewidth": 2.2,
                         "linestyle": "-" if config.correction == "auto" else ":"}
            else:
                index = labels.index(config.name.split(" ", 2)[-1])
                style = {"color": colors(index), "linestyle": dashes[index % len(dashes)],
                         "linewidth": 2.2 if config.is_default else 1.4}
            label = config.name.removeprefix(f"async k={k} ") + (" (default)" if config.is_default else "")
            axes.plot(common, means, marker="o", markersize=3, label=f"{label} (n={len(runs)})", **style)
            lower = [m - s for m, s in zip(means, stds, strict=True)]
            upper = [m + s for m, s in zip(means, stds, strict=True)]
            axes.fill_between(common, lower, upper, color=style["color"], alpha=0.07)
        axes.set_title(f"max_staleness {k}")
        axes.set_xlabel("trained samples")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7, loc="lower right")
    panels[0][0].set_ylabel("held-out accuracy")
    figure.suptitle("Built-in task: held-out accuracy vs trained samples (mean ± std over seeds)")
    figure.tight_layout()
    figure.savefig(PLOT, dpi=120)
    plt.close(figure)


def curve(runs: list[dict]) -> tuple[list[int], list[float], list[float]]:
    """Sample counts validated in every run, with the mean and std of accuracy there."""
    points = sorted({samples for r in runs for samples, _ in r["curve"]})
    common = [p for p in points if all(any(s == p for s, _ in r["curve"]) for r in runs)]
    means, stds = [], []
    for p in common:
        mean, std = mean_std([next(a for s, a in r["curve"] if s == p) for r in runs])
        means.append(mean)
        stds.append(std)
    return common, means, stds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="train steps per run (× 64 samples)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per configuration")
    parser.add_argument("--val-every", type=int, default=10, help="validate every this many steps")
    parser.add_argument("--val-samples", type=int, default=32, help="episodes per held-out row and validation")
    parser.add_argument("--run-timeout-s", type=float, default=600.0,
                        help="a seed's process is stopped after this many seconds per run it has to do")
    parser.add_argument("--configs", type=lambda text: [name.strip() for name in text.split(",")], default=[],
                        help='run only these configurations, by table name: "sync,async k=4 none"')
    parser.add_argument("--report-only", action="store_true", help="rewrite table and plot from the results file")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results first")
    parser.add_argument("--run-seed", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.command = (f".venv/bin/python bench/staleness_study.py --steps {args.steps} --seeds {args.seeds} "
                    f"--val-every {args.val_every} --val-samples {args.val_samples}")
    unknown = set(args.configs) - {c.name for c in CATALOGUE}
    if unknown:
        parser.error(f"--configs: unknown {sorted(unknown)}; the names are {[c.name for c in CATALOGUE]}")
    if args.run_seed:
        asyncio.run(run_seed(json.loads(args.run_seed)))
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
