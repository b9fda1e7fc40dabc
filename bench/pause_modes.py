"""KEEP, ABORT and RECOMPUTE at a push, on the simulated long-tail workload (fully_async with partial rollout).

ABORT returns every in-flight request with its tokens so far; the client resubmits prompt + tokens
and the engine prefills them again under the new weights. KEEP freezes the requests in the engine
and continues them after the push over their old KV cache: no re-prefill, but every token they
sample afterwards reads KV computed by the old weights, so it counts with the old version (the
version of its KV; `fullasync/engines/vllm/`): a long request frozen across several pushes
ages like one that was never interrupted, and more groups are dropped as too stale. RECOMPUTE
(`partial_rollout_resume=engine`) freezes them and the engine prefills prompt + tokens again itself after the
push: ABORT's computation and versions, with nothing resubmitted.

For each max_staleness k and pause mode: samples/s and its share of the workload's bound, the share
of prefill tokens that are re-prefills, mean staleness of trained tokens, rows dropped as too stale
and the tokens they wasted. Real control code, simulated engines and trainer, virtual clock.

    .venv/bin/python bench/pause_modes.py [--preset long-tail] [--split 12] [--staleness 1,2,4]
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

from _report import command_line, report
from scheduling import token_fraction

from fullasync.sim.harness import SimResult, SimSpec, simulate
from fullasync.sim.workload import PRESETS, Workload, analytic_bound

BEGIN, END = "<!-- pause-modes:begin -->", "<!-- pause-modes:end -->"


def _run(args: tuple[Workload, SimSpec]) -> SimResult:
    return simulate(*args)


def render(workload: Workload, results: list[SimResult], command: str, elapsed: float) -> str:
    bound = analytic_bound(workload)[0]
    lines = [
        f"`{command}` — {elapsed:.0f} s, load average {os.getloadavg()[0]:.2f} at the end. Workload `{workload.name}`, "
        f"bound {bound:.2f} samples/s; G = {results[0].gen_devices} generation devices.",
        "",
        "| k | push | samples/s | % of bound (tokens) | re-prefill share | mean staleness | dropped rows | "
        "wasted tokens | resumed calls |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        prefill = r.engine.prefill_tokens
        # fresh prompts count at submission, prefills at admission: a few still queued at the end make KEEP's < 0
        reprefill = max(0.0, (prefill - r.fresh_prefill_tokens) / prefill) if prefill else 0.0
        lines.append(f"| {r.spec.run_config().staleness} | {r.spec.pause_mode} | {r.samples_per_s:.2f} | "
                     f"{token_fraction(workload, r, bound):.0%} | {reprefill:.1%} | {r.mean_staleness:.2f} | "
                     f"{r.dropped_rows} | "
                     f"{r.wasted_tokens} | {r.resumed_calls} |")
    lines += ["", "% of bound (tokens): trained tokens/s against the bound's tokens/s (as in the scheduling table). "
              "Re-prefill share: prefill tokens that were resubmitted (ABORT) or recomputed (RECOMPUTE) among all "
              "prefill tokens. "
              "Mean staleness: trainer version − the version of each trained token (KEEP: its KV's version)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="long-tail", choices=sorted(PRESETS))
    parser.add_argument("--split", type=int, default=12, help="generation devices G")
    parser.add_argument("--staleness", default="1,2,4")
    parser.add_argument("--steps", type=int, default=13)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    workload = PRESETS[args.preset]
    specs = [SimSpec("fully_async", True, int(k), gen_devices=args.split, steps=args.steps, warmup_steps=args.warmup,
                     pause_mode=mode) for k in args.staleness.split(",") for mode in ("abort", "recompute", "keep")]
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        results = list(pool.map(_run, [(workload, spec) for spec in specs]))
    command = command_line()
    section = (f"## Pause modes at a push: KEEP, ABORT, RECOMPUTE (simulated, `{workload.name}`)\n\n"
               + render(workload, results, command, time.perf_counter() - started))
    report(section, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    main()
