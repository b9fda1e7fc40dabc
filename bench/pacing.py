"""Staleness as a ceiling: admission that generates only as far ahead as keeps the trainer fed, before/after.

The real control code on simulated engines and trainer (`fullasync.sim`), as in `bench/scheduling.py`.
For each workload (`long-tail`, `agentic`), split of the devices into G generating and N − G training —
chosen so that generation is the bottleneck (G = 8), the two are near balance (G = 13, the long-tail
bound's best split) or training is the bottleneck (G = 15) — and staleness bound k ∈ {2, 4}, it runs
ours twice: `generate_ahead="bound"` (admission fills up to (k + 1)·B rows ahead of the trainer, the
earlier policy) and `generate_ahead="adaptive"` (the default: the lead moves between 2·B and the bound
by what the trainer finds ready at each batch request, `fullasync/rollout/staleness.py`). It reports
samples/s over the steady-state window and the ratio adaptive ÷ bound, the trained tokens' staleness
(mean, and the share at each gap: the histogram), rows dropped as too stale, trainer idle fraction and
the lead the adaptive run ended with. One run per cell (the clock is virtual, so a rerun gives the
same numbers); the table goes into docs/benchmarks/pacing.md with the command.

    .venv/bin/python bench/pacing.py [--workers 2]     # ~2 min
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

from _report import command_line, report  # bench/ is on sys.path when run as a script

from fullasync.sim.harness import SimResult, SimSpec, simulate
from fullasync.sim.workload import PRESETS, Workload, bound_terms

BEGIN, END = "<!-- pacing:begin -->", "<!-- pacing:end -->"
MODES = ("bound", "adaptive")


def _run(args: tuple[Workload, SimSpec]) -> SimResult:
    return simulate(*args)


def histogram(result: SimResult, k: int) -> str:
    shares = result.staleness_histogram
    return " / ".join(f"{100 * shares.get(gap, 0.0):.0f}" for gap in range(k + 1))


def render(cells: list[tuple[str, int, int]], results: dict[tuple[str, int, int, str], SimResult],
           workloads: dict[str, Workload], elapsed_s: float, load: tuple[float, ...]) -> str:
    first = next(iter(results.values())).spec
    lines = [
        f"Steps {first.warmup_steps + 1}–{first.steps} measured (the first {first.warmup_steps} fill the pipeline "
        f"and let the adaptive lead grow from two batches). Whole run {elapsed_s:.0f} s of wall time; load "
        f"average at the start {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}.",
        "",
        "| workload | G (bottleneck) | k | samples/s bound → adaptive | adaptive ÷ bound | mean staleness "
        "| % of trained tokens at gap 0 / 1 / … / k: bound → adaptive | dropped rows | trainer idle "
        "| adaptive lead at the end (batches) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, g, k in cells:
        bound, adaptive = results[name, g, k, "bound"], results[name, g, k, "adaptive"]
        limit = bound_terms(workloads[name], g).limited_by
        lines.append(
            f"| {name} | {g} ({limit}) | {k} | {bound.samples_per_s:.2f} → {adaptive.samples_per_s:.2f} "
            f"| {adaptive.samples_per_s / bound.samples_per_s:.3f} | {bound.mean_staleness:.2f} → "
            f"{adaptive.mean_staleness:.2f} | {histogram(bound, k)} → {histogram(adaptive, k)} "
            f"| {bound.dropped_rows} → {adaptive.dropped_rows} | {bound.trainer_idle_fraction:.2f} → "
            f"{adaptive.trainer_idle_fraction:.2f} | {adaptive.final_lead_batches:.2f} |")
    lines += [
        "",
        "G (bottleneck): generation devices, and which side the workload's bound says limits that split "
        "(`bound_terms(...).limited_by`). Trainer idle: share of the window not spent training (waiting for "
        "a batch, or in the push). Dropped rows: too stale, inside the window.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="long-tail,agentic")
    parser.add_argument("--splits", default="8,13,15", help="generation devices G")
    parser.add_argument("--bounds", default="2,4", help="staleness bounds k")
    parser.add_argument("--steps", type=int, default=22)
    parser.add_argument("--warmup", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    workloads = {name: PRESETS[name] for name in args.workloads.split(",")}
    cells = [(name, int(g), int(k)) for name in workloads for g in args.splits.split(",")
             for k in args.bounds.split(",")]
    jobs = [(cell, mode) for cell in cells for mode in MODES]
    specs = [(workloads[name], SimSpec("fully_async", True, k, gen_devices=g, steps=args.steps,
                                       warmup_steps=args.warmup, generate_ahead=mode))
             for (name, g, k), mode in jobs]
    load = os.getloadavg()
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(pool.map(_run, specs))
    results = {(*cell, mode): run for (cell, mode), run in zip(jobs, runs, strict=True)}
    command = command_line()
    section = ("## Staleness as a ceiling: adaptive lead vs the bound (simulated)\n\n"
               + render(cells, results, workloads, time.perf_counter() - started, load)
               + f"\n\nCommand: `{command}`")
    report(section, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
