"""Control plane at scale: driver CPU per generated token and per episode, and event-loop lag, vs concurrency.

The real control code (rollouter, admission, client with its continuation of interrupted calls,
router, queue, weight sync, training loop — everything a run's driver process executes) drives
simulated engines and a simulated trainer on a virtual clock (`fullasync.sim`), so thousands of
concurrent episodes and hundreds of engines cost only the Python the driver really runs. For each
point (C concurrent episodes on E engines) it measures over the steady-state window:

    driver CPU      = process CPU time − the simulated engines' own event handling (`SimulatedEngine.cpu_s`)
    µs per token    = driver CPU / tokens generated in the window
    µs per episode  = driver CPU / episodes finished in the window
    driver load     = driver CPU / simulated seconds: the share of one core the driver needs to keep
                      up with the engines in real time (> 1: it cannot)
    loop lag p99    = 99th percentile over time of how long a callback that becomes ready waits,
                      replaying each loop iteration's measured CPU time at its simulated time
                      (`fullasync.sim.loop_lag`; work handed to a worker thread shares the
                      interpreter lock beside it), sampled every `--lag-every` simulated seconds

Workload: the `long-tail` response lengths (lognormal, median 256, σ 1, mean ≈ 401 tokens), P = 256,
n = 8; E engines with C / E sequences each, C / n rows running (`running_rows_per_capacity = 1`),
B = C / n groups per step (one step trains as many samples as are running), `fully_async` with
partial rollout at k = 2 (every push interrupts all C generations: the client resubmits them, or with
`--resume engine` each engine prefills its own again — `partial_rollout_resume`), a trainer fast enough never
to be the bottleneck. The simulated engines' CPU is subtracted; what
remains is the driver's, plus the simulator's `generate` bookkeeping (an upper bound).

Writes a table and a plot into docs/benchmarks/control-plane.md / control_plane.png there (the exact command is
recorded there); `--profile C,E` prints where one point's CPU goes instead.

    .venv/bin/python bench/control_plane.py [--points 64x16,1024x16,...] [--resume client,engine] [--workers 1]
"""

from __future__ import annotations

import argparse
import cProfile
import math
import os
import pstats
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from _report import STUDIES, command_line, report  # bench/ is on sys.path when run as a script

from fullasync.contracts.engine import PauseMode
from fullasync.sim.engine import DecodeCost
from fullasync.sim.harness import SimResult, SimSpec, simulate
from fullasync.sim.loop_lag import percentile
from fullasync.sim.trainer import TrainCost
from fullasync.sim.workload import LONG_TAIL, Workload

BEGIN, END = "<!-- control-plane:begin -->", "<!-- control-plane:end -->"
POINTS = "64x16,1024x16,1024x128,1024x512,8192x16,8192x128,8192x512"
WINDOW_TOKENS = 2_000_000  # measure at least this many generated tokens per point (more steps at low C)
WARMUP_STEPS = 1  # the first step fills the pipeline (every episode starts at once); not measured


@dataclass(frozen=True)
class Point:
    concurrency: int  # C: episodes generating at once
    engines: int  # E
    resume: str = "client"  # who resumes the generations a push interrupts (RunConfig.partial_rollout_resume)


def point_setup(point: Point, lag_every_s: float) -> tuple[Workload, SimSpec]:
    n = LONG_TAIL.group_size
    if point.concurrency % (n * point.engines) and point.concurrency % point.engines:
        raise ValueError(f"{point}: C must be a multiple of E")
    workload = LONG_TAIL.with_(
        name=f"control-plane C={point.concurrency} E={point.engines}", devices=point.engines + 1,
        batch_groups=point.concurrency // n, decode=DecodeCost(max_num_seqs=point.concurrency // point.engines),
        train=TrainCost(per_token_device_s=1e-6),
    )
    window_steps = max(2, math.ceil(WINDOW_TOKENS / (point.concurrency * LONG_TAIL.mean_length())))
    spec = SimSpec("fully_async", True, 2, gen_devices=point.engines, steps=WARMUP_STEPS + window_steps,
                   warmup_steps=WARMUP_STEPS,
                   running_rows_per_capacity=1.0, lag_sample_s=lag_every_s,
                   pause_mode=(PauseMode.ABORT if point.resume == "client" else PauseMode.RECOMPUTE).value)
    return workload, spec


def run_point(args: tuple[Point, float]) -> tuple[Point, SimResult]:
    point, lag_every_s = args
    return point, simulate(*point_setup(point, lag_every_s))


def row(point: Point, r: SimResult) -> dict[str, float]:
    tokens = r.engine.tokens
    return {
        "us_per_token": 1e6 * r.driver_cpu_s / tokens,
        "us_per_episode": 1e6 * r.driver_cpu_s / r.episodes,
        "lag_p50_ms": 1e3 * percentile(list(r.loop_lag_s), 0.50),
        "lag_p99_ms": 1e3 * percentile(list(r.loop_lag_s), 0.99),
        "lag_max_ms": 1e3 * max(r.loop_lag_s, default=0.0),
        "engine_share": r.engine_cpu_s / (r.driver_cpu_s + r.engine_cpu_s),
        "tokens": tokens,
        "episodes": r.episodes,
        "driver_cpu_s": r.driver_cpu_s,
        "lag_samples": len(r.loop_lag_s),
        "tokens_per_s": tokens / r.window_s,
        "load": r.driver_cpu_s / r.window_s,
        "iterations_per_episode": r.loop_iterations / r.episodes,
    }


def render(results: list[tuple[Point, SimResult]], command: str, elapsed_s: float, load: tuple[float, ...]) -> str:
    lines = [
        "Workload: `long-tail` lengths (E[L] = 401), P = 256, n = 8, `fully_async` + partial rollout k = 2, "
        f"C / E sequences per engine, B = C / n groups per step; window after {WARMUP_STEPS} warm-up step. "
        f"Whole run: {elapsed_s:.0f} s of wall time; load average at the start {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f} (2 cores shared).",
        "",
        "| C (episodes) | E (engines) | resumed by | driver µs / token | driver µs / episode | driver load (cores) "
        "| loop lag p50 ms | loop lag p99 ms | lag max ms | loop iterations / episode "
        "| simulated engines' share of CPU "
        "| tokens in window | simulated tok/s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for point, r in results:
        v = row(point, r)
        lines.append(
            f"| {point.concurrency} | {point.engines} | {point.resume} "
            f"| {v['us_per_token']:.2f} | {v['us_per_episode']:.0f} "
            f"| {v['load']:.2f} | {v['lag_p50_ms']:.2f} | {v['lag_p99_ms']:.1f} | {v['lag_max_ms']:.0f} "
            f"| {v['iterations_per_episode']:.1f} | {100 * v['engine_share']:.0f} % "
            f"| {v['tokens'] / 1e6:.2f} M | {v['tokens_per_s']:.0f} |"
        )
    lines += [
        "",
        "Driver CPU: process CPU time in the window less the simulated engines' own event handling. "
        "Driver load: driver CPU per simulated second (the cores it needs to keep pace in real time). "
        "Loop lag: each loop iteration's CPU time replayed at its simulated time on a single server (the loop), "
        "the work a run hands to a worker thread (the train batch, the step's statistics, the release of a trained "
        "batch) on the same interpreter lock beside it (half the lock each while both have work, one switch interval "
        "more for an event that becomes ready meanwhile), "
        f"the wait of an event becoming ready, sampled every {results[0][1].spec.lag_sample_s:g} simulated seconds "
        f"({min(row(p, r)['lag_samples'] for p, r in results)}+ samples per point); it includes the simulated "
        "engines' callbacks.",
        "",
        "![control-plane cost vs concurrency](control_plane.png)",
        "",
        f"Command: `{command}`",
    ]
    return "\n".join(lines)


def plot(results: list[tuple[Point, SimResult]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (cost, lag) = plt.subplots(1, 2, figsize=(11, 4.5))
    for engines, resume in sorted({(p.engines, p.resume) for p, _ in results}):
        points = sorted((p.concurrency, row(p, r)) for p, r in results if (p.engines, p.resume) == (engines, resume))
        xs = [c for c, _ in points]
        style, label = ("o-" if resume == "client" else "s--"), f"{engines} engines, resumed by {resume}"
        cost.plot(xs, [v["us_per_token"] for _, v in points], style, label=label)
        lag.plot(xs, [v["lag_p99_ms"] for _, v in points], style, label=label)
    cost.axhline(1.0, color="grey", linestyle=":", label="goal: 1 µs / token")
    concurrencies = sorted({p.concurrency for p, _ in results})
    for axis, title in ((cost, "driver CPU µs per generated token"), (lag, "event-loop lag p99 (ms, symlog)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(concurrencies, [str(c) for c in concurrencies])
        axis.set_xlabel("concurrent episodes C")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    cost.set_ylim(bottom=0)
    lag.set_yscale("symlog", linthresh=1.0)
    lag.set_ylim(bottom=0)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def profile(point: Point, lag_every_s: float, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    simulate(*point_setup(point, lag_every_s))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def parse_points(text: str, resumes: str = "client") -> list[Point]:
    return [Point(*(int(v) for v in item.split("x")), resume) for item in text.split(",")
            for resume in resumes.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", default=POINTS, help="CxE pairs: concurrent episodes x engines")
    parser.add_argument("--resume", default="client,engine",
                        help="who resumes interrupted generations, each point run with each: client | engine")
    parser.add_argument("--lag-every", type=float, default=0.05, help="simulated seconds between loop-lag samples")
    parser.add_argument("--workers", type=int, default=1, help="points run in parallel (CPU times are per process)")
    parser.add_argument("--profile", metavar="CxE", help="profile one point with cProfile and print the top functions")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    if args.profile:
        profile(parse_points(args.profile, args.resume.split(",")[0])[0], args.lag_every, 40)
        return
    load = os.getloadavg()
    started = time.perf_counter()
    if set(args.resume.split(",")) - {"client", "engine"}:
        parser.error(f"--resume {args.resume}: each must be client or engine")
    jobs = [(p, args.lag_every) for p in parse_points(args.points, args.resume)]
    if args.workers == 1:
        results = [run_point(job) for job in jobs]
    else:
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            results = list(pool.map(run_point, jobs))
    elapsed = time.perf_counter() - started
    command = command_line()
    section = ("## Control plane at scale (simulated engines, real driver code)\n\n"
               + render(results, command, elapsed, load))
    if not args.no_write:
        plot(results, STUDIES / "control_plane.png")
    report(section, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
