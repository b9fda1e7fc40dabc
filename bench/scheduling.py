"""Scheduling efficiency: every mode and device split on a simulated workload, against its throughput bound.

The real control code (rollouter, admission, message queue, weight sync, client continuation,
training loop) drives simulated engines and a simulated trainer on a virtual clock
(`fullasync.sim`). For each mode — `sync`, `one_step_off`, `fully_async` without and with partial
rollout at max_staleness k ∈ {1, 2, 4} — and each split of the N devices into G generation and
N − G training devices, it measures over the steady-state window (after the warm-up steps):
samples/s, generation-device idle fraction, trainer idle fraction, mean token staleness, rows
dropped as too stale; and each run's fraction of the bound.

The bound (derived in `fullasync/sim/workload.py`), per train step of S = B·n samples:

    W_gen   = S · (E[L] · τ(m)/m + p · P)          device-seconds to generate a batch at full batch m
    t_train = o + c · S · (P + E[L]) / (N − G)
    X(G)    = S / (t_push + max(W_gen / G, t_train))     samples/s with G generation devices
    U       = max over G of X(G)                          the overlap limit of the workload

τ(b) = decode step time with b sequences, E[L] = mean response length, P = prompt length,
p = prefill time per token, c = training device-seconds per token, o = per-step overhead.
It assumes full decode batches at all times, no token generated in vain, and training hidden
entirely behind generation except for the push — each assumption only removes time.

Writes a table, the breakdown of where the best fully_async run's time went, and a plot into
docs/benchmarks/scheduling.md / scheduling.png there (the exact command is recorded there).

    .venv/bin/python bench/scheduling.py [--preset long-tail] [--splits 11,12,13,14] [--workers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _report import STUDIES, command_line, report

from fullasync.sim.harness import SimResult, SimSpec, simulate
from fullasync.sim.workload import PRESETS, Workload, analytic_bound, bound_terms, split_bound, sync_bound_without_tail

BEGIN, END = "<!-- scheduling:begin -->", "<!-- scheduling:end -->"


def sweep_specs(splits: list[int], steps: int, warmup: int) -> list[SimSpec]:
    specs = [SimSpec("sync", steps=steps, warmup_steps=warmup)]
    for g in splits:
        specs.append(SimSpec("one_step_off", gen_devices=g, steps=steps, warmup_steps=warmup))
        for partial in (False, True):
            for k in (1, 2, 4):
                specs.append(SimSpec("fully_async", partial, k, gen_devices=g, steps=steps, warmup_steps=warmup))
    return specs


def _run(args: tuple[Workload, SimSpec]) -> SimResult:
    return simulate(*args)


# -- before/after of the two admission and hand-over changes the sweep led to ------------------

VARIANTS = {  # (StalenessManager count_running, MessageQueue hand_over)
    "before: rows count whole until done, queue in arrival order": ("rows", "arrival"),
    "+ rows count by their unfinished episodes": ("episodes", "arrival"),
    "+ queue hands over oldest tokens first (now)": ("episodes", "oldest"),
}
ABLATION = [(13, 4), (13, 2), (14, 4), (14, 2)]  # (G, k), fully_async with partial rollout


def _run_variant(args: tuple[Workload, SimSpec, str]) -> SimResult:
    workload, spec, variant = args
    admission, hand_over = VARIANTS[variant]
    return simulate(workload, dataclasses.replace(spec, admission=admission, hand_over=hand_over))


def render_ablation(workload: Workload, results: dict[tuple[str, int, int], SimResult]) -> str:
    lines = ["| change | G | k | samples/s | % of X(G) (tokens) | dropped rows | mean staleness "
             "| gen decode tok/s per device |",
             "|---|---|---|---|---|---|---|---|"]
    for (variant, g, k), r in results.items():
        e = r.engine
        lines.append(f"| {variant} | {g} | {k} | {r.samples_per_s:.2f} "
                     f"| {100 * token_fraction(workload, r, r.bound_samples_per_s):.1f} | {r.dropped_rows} "
                     f"| {r.mean_staleness:.2f} | {e.tokens / max(e.decode_s + e.drain_s, 1e-9) :.0f} |")
    return "\n".join(lines)


def token_fraction(workload: Workload, result: SimResult, bound: float) -> float:
    """Throughput in trained tokens against the bound in tokens (insensitive to which lengths were trained)."""
    return result.tokens_per_s / (bound * (workload.prompt_tokens + workload.mean_length()))


def breakdown(workload: Workload, r: SimResult) -> list[tuple[str, float]]:
    """Where generation-device time went, as fractions of G × window (they add up to 1)."""
    d, e = workload.decode, r.engine
    total = e.total_s()
    full = d.seconds_per_token_at_capacity()
    wasted = r.wasted_tokens * full
    fresh_prefill = r.fresh_prefill_tokens * d.prefill_per_token_s
    reprefill = e.prefill_s - fresh_prefill
    drain_loss = e.drain_s - e.drain_tokens * full
    underfill = e.decode_s - (e.tokens - e.drain_tokens) * full
    useful = e.tokens * full - wasted
    parts = [
        ("decode of trained tokens at full batch (the bound's cost)", useful),
        ("prefill of fresh prompts (in the bound)", fresh_prefill),
        ("paused for weight pushes / idle while paused", e.paused_s),
        ("decode below full batch (admission, routing, tail)", underfill),
        ("long-tail drain before a push (WAIT), below full batch", drain_loss),
        ("re-prefill of resubmitted tokens after aborts", reprefill),
        ("decode of rows later dropped as too stale", wasted),
        ("idle: nothing to generate", e.idle_s),
    ]
    return [(name, max(0.0, value / total)) for name, value in parts]  # a float −0.0 reads as a loss


def trainer_breakdown(r: SimResult) -> list[tuple[str, float]]:
    parts = [("training", r.train_s), ("pausing engines for the push (drain under WAIT)", r.push_pause_s),
             ("installing weights", r.push_update_s)]
    parts.append(("waiting for a batch", r.window_s - sum(v for _, v in parts)))
    return [(name, value / r.window_s) for name, value in parts]


def render(workload: Workload, results: list[SimResult], command: str, elapsed_s: float) -> str:
    bound, best_g = analytic_bound(workload)
    sync = next(r for r in results if r.spec.mode == "sync")
    lines = [
        f"Workload `{workload.name}`: N = {workload.devices} devices, B = {workload.batch_groups} groups × n = "
        f"{workload.group_size}, P = {workload.prompt_tokens}, lengths lognormal median {workload.median_length} "
        f"σ = {workload.length_sigma} cut at {workload.cap} (E[L] = {workload.mean_length():.0f}), "
        f"τ(b) = {workload.decode.step_base_s * 1e3:g} ms + {workload.decode.step_per_seq_s * 1e3:g} ms·b, "
        f"m = {workload.decode.max_num_seqs}, p = {workload.decode.prefill_per_token_s * 1e6:g} µs/token, "
        f"c = {workload.train.per_token_device_s:g} device-s/token, o = {workload.train.step_overhead_s:g} s, "
        f"push {workload.decode.push_s:g} s. Window: steps {sync.spec.warmup_steps + 1}–{sync.spec.steps}.",
        "",
        f"Bound U = {bound:.2f} samples/s at G = {best_g} "
        f"(sync without any long tail would reach {sync_bound_without_tail(workload):.2f}). "
        f"Sweep took {elapsed_s:.0f} s of wall time on this machine.",
        "",
        "| mode | G / N−G | samples/s | % of X(G) | % of U | % of U (tokens) | gen idle | trainer idle "
        "| mean staleness | dropped rows | × sync |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        split_bound_value = r.bound_samples_per_s or sync_bound_without_tail(workload)
        lines.append(
            f"| {r.spec.label} | {r.gen_devices} / {r.train_devices}{' (shared)' if r.spec.mode == 'sync' else ''} "
            f"| {r.samples_per_s:.2f} | {100 * r.samples_per_s / split_bound_value:.0f} "
            f"| {100 * r.samples_per_s / bound:.0f} | {100 * token_fraction(workload, r, bound):.0f} "
            f"| {r.gen_idle_fraction:.2f} | {r.trainer_idle_fraction:.2f} | {r.mean_staleness:.2f} "
            f"| {r.dropped_rows} | {r.samples_per_s / sync.samples_per_s:.2f} |"
        )
    lines += [
        "",
        "gen idle: share of generation-device time with nothing decoding (idle, or paused for a push). "
        "trainer idle: share of the window the trainer is not training (waiting for a batch, or blocked in a push). "
        "% of X(G): against the bound of that split (sync: against the colocated bound without a tail). "
        "% of U (tokens): trained tokens/s against U · (P + E[L]) — insensitive to which lengths were trained "
        "(dropping long rows raises samples/s, not tokens/s). Mean staleness: trainer version − token version, "
        "averaged over trained tokens per step. Dropped rows: groups dropped as too stale inside the window.",
    ]
    best = {}
    for r in results:
        if r.samples_per_s > best.get(r.spec.label, r).samples_per_s or r.spec.label not in best:
            best[r.spec.label] = r
    lines += ["", "Best split per mode:", "",
              "| mode | best G | samples/s | % of U | % of U (tokens) | speedup over sync |",
              "|---|---|---|---|---|---|"]
    for label, r in best.items():
        lines.append(f"| {label} | {r.gen_devices} | {r.samples_per_s:.2f} | {100 * r.samples_per_s / bound:.1f} "
                     f"| {100 * token_fraction(workload, r, bound):.1f} "
                     f"| {r.samples_per_s / sync.samples_per_s:.2f}× |")
    top = max((r for r in results if r.spec.mode == "fully_async" and r.spec.partial_rollout),
              key=lambda r: r.samples_per_s)
    terms = bound_terms(workload, top.gen_devices)
    lines += [
        "",
        f"Where the time went — best `fully_async` with partial rollout ({top.spec.label}, G = {top.gen_devices}): "
        f"{top.samples_per_s:.2f} samples/s = {100 * top.samples_per_s / bound:.1f} % of U "
        f"(X(G) = {split_bound(workload, top.gen_devices):.2f}: per step the bound allows "
        f"t_gen = {terms.gen_s:.1f} s, t_train = {terms.train_s:.1f} s, push {terms.push_s:.1f} s; "
        f"{terms.limited_by} limits this split). "
        f"Mean trained response length {top.tokens / top.samples - workload.prompt_tokens:.0f} "
        f"vs E[L] = {workload.mean_length():.0f}.",
        "",
        "| generation devices (share of G × window) | |", "|---|---|",
    ]
    lines += [f"| {name} | {100 * share:.1f} % |" for name, share in breakdown(workload, top)]
    lines += ["", "| trainer (share of window) | |", "|---|---|"]
    lines += [f"| {name} | {100 * share:.1f} % |" for name, share in trainer_breakdown(top)]
    for label in ("one_step_off", "fully_async k=2"):
        if label in best:
            r = best[label]
            lines += ["", f"For contrast, `{label}` at G = {r.gen_devices}:", "",
                      "| generation devices | |", "|---|---|"]
            lines += [f"| {name} | {100 * share:.1f} % |" for name, share in breakdown(workload, r)]
    lines += ["", f"Control-plane CPU (real seconds of Python per 1000 trained samples, whole sweep): "
              f"{1000 * sum(r.cpu_s for r in results) / sum(r.total_samples for r in results):.2f} s.",
              "", "![samples/s per split](scheduling.png)", "", f"Command: `{command}`"]
    return "\n".join(lines)


def plot(workload: Workload, results: list[SimResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = sorted({r.gen_devices for r in results if r.spec.mode != "sync"})
    figure, axis = plt.subplots(figsize=(10, 5))
    grid = range(max(1, min(splits) - 1), workload.devices)
    axis.plot(list(grid), [split_bound(workload, g) for g in grid], "k--", label="bound X(G)")
    sync = next(r for r in results if r.spec.mode == "sync")
    axis.axhline(sync.samples_per_s, color="grey", linestyle=":", label=f"sync (all {workload.devices} devices)")
    labels = sorted({r.spec.label for r in results if r.spec.mode != "sync"})
    for label in labels:
        points = sorted((r.gen_devices, r.samples_per_s) for r in results if r.spec.label == label)
        style = "o-" if "partial" in label else ("s-" if label == "one_step_off" else "^--")
        axis.plot([g for g, _ in points], [s for _, s in points], style, label=label)
    axis.set_xlabel(f"generation devices G (training gets {workload.devices} − G)")
    axis.set_ylabel("trained samples / s (steady state)")
    axis.set_title(f"Scheduling efficiency, workload '{workload.name}'")
    axis.legend(fontsize=8, bbox_to_anchor=(1.01, 1.0), loc="upper left")
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="long-tail", choices=sorted(PRESETS))
    parser.add_argument("--splits", default="11,12,13,14", help="generation devices G to try")
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="processes running simulations in parallel")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    parser.add_argument("--no-ablation", action="store_true", help="skip the before/after runs of the control changes")
    args = parser.parse_args()
    workload = PRESETS[args.preset]
    specs = sweep_specs([int(g) for g in args.splits.split(",")], args.steps, args.warmup)
    ablation = [(variant, g, k) for g, k in ABLATION for variant in VARIANTS] if not args.no_ablation else []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        variant_runs = pool.map(_run_variant, [(workload, SimSpec("fully_async", True, k, gen_devices=g,
                                                                  steps=args.steps, warmup_steps=args.warmup), v)
                                               for v, g, k in ablation])
        results = list(pool.map(_run, [(workload, spec) for spec in specs]))
        ablation_results = dict(zip(ablation, variant_runs, strict=True))
    elapsed = time.perf_counter() - started
    command = command_line()
    section = (f"## Scheduling efficiency (simulated, `{workload.name}`)\n\n"
               + render(workload, results, command, elapsed))
    if ablation_results:
        section += ("\n\n### Before/after: admission by unfinished episodes, oldest-first hand-over\n\n"
                    "`fully_async` with partial rollout, "
                    f"max_running_rows = {SimSpec('fully_async').running_rows_per_capacity}"
                    " × engine slots / n, same workload and window; the earlier policies are chosen by constructor "
                    "arguments (`StalenessManager(count_running=\"rows\")`, `MessageQueue(hand_over=\"arrival\")`) "
                    "for the 'before' rows.\n\n" + render_ablation(workload, ablation_results))
    if not args.no_write:
        image = "scheduling.png" if workload.name == "long-tail" else f"scheduling-{workload.name}.png"
        plot(workload, results, STUDIES / image)
    report(section, BEGIN.replace("scheduling", f"scheduling-{workload.name}"),
           END.replace("scheduling", f"scheduling-{workload.name}"), write=not args.no_write)


if __name__ == "__main__":
    main()
