"""Side by side with the peers' schedulers: samples/s of ours and of each peer policy at the same staleness bound.

Same simulated devices, same workload, same real control code (rollouter, client continuation,
weight sync, training loop); only the scheduling rules differ — admission, queue and what a weight
push does to generations in flight — each peer's written from its documentation and code in
`fullasync/sim/peers.py` (where the sources are cited):

    ours                     admission started ≤ (k + v + 1)·B, a running row counted by its unfinished
                             episodes, at most 1.5 × engine slots / n rows; queue hands over oldest
                             tokens first and drops groups older than k; push = ABORT + resubmit
    verl fully_async         ≤ R·(1 + s)·T rows per weight version (s = staleness_threshold = k, T = 1),
                             reset at each sync to the rows running or queued; drop-oldest queue;
                             partial_rollout on = ABORT + resubmit, off = generations finish first (WAIT)
    AReaL                    accepted + running ≤ (η + v + 1)·B (η = k), running rows counted whole,
                             at most B rows (its default); completion order, no drop; ABORT + resubmit
    SkyRL fully_async        the same aggregate bound with S = k, K = B·(S + 1) groups generating (its
                             example), a B·(S + 1) buffer; ABORT + resubmit
    one-step-off             (k = 1) slime / SkyRL: a whole batch generated while the previous one trains

For each workload (`long-tail`; `agentic`: multi-turn with tool latency) and bound k it runs every
policy on G generation devices and reports samples/s over the steady-state window, the ratio ours /
peer, the measured staleness of trained tokens (the peers' bounds are aggregate, not per token, so
their realised maximum can exceed k), rows dropped, and generation-device idle time. One run per
cell; the table goes into docs/benchmarks/peer-schedulers.md with the command and the machine's load average.

    .venv/bin/python bench/peer_schedulers.py [--bounds 1,2] [--workloads long-tail,agentic] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

from _report import command_line, report  # bench/ is on sys.path when run as a script

from fullasync.sim import peers
from fullasync.sim.harness import SimResult, SimSpec, simulate
from fullasync.sim.workload import PRESETS, Workload, analytic_bound

BEGIN, END = "<!-- peer-schedulers:begin -->", "<!-- peer-schedulers:end -->"
OURS = "ours (fullasync)"


def policies(k: int) -> list[peers.PeerPolicy | None]:
    """Every policy configured for staleness bound k (None: ours)."""
    rows: list[peers.PeerPolicy | None] = [
        None,
        peers.VerlFullyAsync(staleness_threshold=k, partial_rollout=True),
        peers.VerlFullyAsync(staleness_threshold=k, partial_rollout=False),
        peers.AReaLAsync(max_head_offpolicyness=k),
        peers.SkyRLFullyAsync(max_staleness_steps=k),
    ]
    if k == 1:
        rows.append(peers.OneStepOff())
    return rows


def _run(args: tuple[Workload, SimSpec]) -> SimResult:
    return simulate(*args)


def render(results: dict[tuple[str, int], list[SimResult]], workloads: dict[str, Workload], gen_devices: int,
           elapsed_s: float, load: tuple[float, ...]) -> str:
    spec = next(iter(results.values()))[0].spec
    lines = [
        f"G = {gen_devices} generation devices, N − G training, steps {spec.warmup_steps + 1}"
        f"–{spec.steps} measured. Whole run {elapsed_s:.0f} s of wall time; load average "
        f"at the start {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 cores shared).",
        "",
        "| workload | bound k | policy | samples/s | ours ÷ it | % of bound X(G) | mean staleness | max staleness "
        "| dropped rows | tokens thrown away | gen idle |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, k), runs in results.items():
        ours = runs[0]
        for r in runs:
            label = OURS if r.spec.peer is None else r.spec.label
            lines.append(
                f"| {name} | {k} | {label} | {r.samples_per_s:.2f} | {ours.samples_per_s / r.samples_per_s:.2f} "
                f"| {100 * r.samples_per_s / r.bound_samples_per_s:.0f} | {r.mean_staleness:.2f} | {r.max_staleness} "
                f"| {r.dropped_rows} | {100 * r.thrown_away_share:.1f} % | {r.gen_idle_fraction:.2f} |"
            )
    for name, workload in workloads.items():
        bound, best_g = analytic_bound(workload)
        lines.append("")
        lines.append(f"`{name}`: bound U = {bound:.2f} samples/s at G = {best_g}; {describe(workload)}.")
    lines += [
        "",
        "ours ÷ it: our samples/s over the policy's (> 1: ours is faster). % of bound: against X(G) of "
        "`fullasync/sim/workload.py`. Max staleness: the oldest trained token's trainer version − its version "
        "over the whole run (ours drops groups beyond k at hand-over; the peers' bounds are aggregate). "
        "Dropped rows: inside the window (ours: too stale, stopped while generating or at hand-over; verl: evicted "
        "by its drop-oldest queue). Tokens thrown away: what the engines decoded for those rows, as a share of all "
        "they decoded in the window. "
        "Gen idle: share of generation-device time idle or paused for a push.",
        "",
        "Ours, share of rows dropped as too stale in each tenth of the rows trained or dropped over the whole run, "
        "by the output tokens their episodes were to generate (shortest → longest):",
        "",
        "| workload | k | dropped share per length decile |",
        "|---|---|---|",
    ]
    for (name, k), runs in results.items():
        lines.append(f"| {name} | {k} | {' '.join(f'{share:.2f}' for share in runs[0].dropped_share_by_length)} |")
    return "\n".join(lines)


def render_realised(results: dict[tuple[str, int], list[SimResult]], ours: dict[tuple[str, int], SimResult]) -> str:
    """Each peer against ours configured with k = the peer's realised max staleness (the same worst case)."""
    lines = [
        "### At the same realised staleness",
        "",
        "The peers' bounds are aggregate, so some of their trained tokens are older than k; ours drops a group "
        "whose oldest token is older than k. Here each peer run is set against ours with k equal to the peer's "
        "realised max staleness — the same worst-case token age:",
        "",
        "| workload | policy (its k) | its samples/s | its max / mean staleness | ours at k = its max: samples/s "
        "| ours max / mean staleness | ours ÷ it |",
        "|---|---|---|---|---|---|---|",
    ]
    for (name, k), runs in results.items():
        for r in runs[1:]:
            mine = ours[name, r.max_staleness]
            lines.append(f"| {name} | {r.spec.label} ({k}) | {r.samples_per_s:.2f} | {r.max_staleness} / "
                         f"{r.mean_staleness:.2f} | {mine.samples_per_s:.2f} | {mine.max_staleness} / "
                         f"{mine.mean_staleness:.2f} | {mine.samples_per_s / r.samples_per_s:.2f} |")
    return "\n".join(lines)


def describe(w: Workload) -> str:
    text = (f"B = {w.batch_groups} × n = {w.group_size}, P = {w.prompt_tokens}, responses lognormal median "
            f"{w.median_length} σ = {w.length_sigma} cut at {w.cap}")
    if w.max_turns > 1:
        text += (f" per turn; turns lognormal median {w.turns_median:g} σ = {w.turns_sigma} (1–{w.max_turns}, "
                 f"E = {w.turn_moments()[0]:.1f}), {w.observation_tokens} tool-output tokens and a tool call of median "
                 f"{w.tool_latency_s:g} s (σ = {w.tool_latency_sigma}) between turns")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="long-tail,agentic")
    parser.add_argument("--bounds", default="1,2", help="staleness bounds k")
    parser.add_argument("--gen-devices", type=int, default=13, help="G (the long-tail bound's best split)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args()
    workloads = {name: PRESETS[name] for name in args.workloads.split(",")}
    cells = [(name, int(k)) for name in workloads for k in args.bounds.split(",")]
    jobs = [(name, k, SimSpec("fully_async", True, k, gen_devices=args.gen_devices, steps=args.steps,
                              warmup_steps=args.warmup, peer=policy))
            for name, k in cells for policy in policies(k)]
    load = os.getloadavg()
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        runs = list(pool.map(_run, [(workloads[name], spec) for name, _, spec in jobs]))
        results: dict[tuple[str, int], list[SimResult]] = {cell: [] for cell in cells}
        for (name, k, _), run in zip(jobs, runs, strict=True):
            results[name, k].append(run)
        # ours again at each peer's *realised* max staleness, where no run of ours has that bound yet
        realised = sorted({(name, r.max_staleness) for (name, _), rs in results.items() for r in rs[1:]}
                          - set(cells))
        extra = list(pool.map(_run, [(workloads[name], SimSpec("fully_async", True, k, gen_devices=args.gen_devices,
                                                                steps=args.steps, warmup_steps=args.warmup))
                                     for name, k in realised]))
    ours = {cell: rs[0] for cell, rs in results.items()} | dict(zip(realised, extra, strict=True))
    elapsed = time.perf_counter() - started
    command = command_line()
    section = "## Side by side with the peers' schedulers (simulated)\n\n" + render(
        results, workloads, args.gen_devices, elapsed, load) + "\n\n" + render_realised(results, ours) + (
        f"\n\nCommand: `{command}`")
    report(section, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
