"""Learning parity on the deepresearch example: does fully async learn as well as sync, at which staleness?

Runs `python -m examples.deepresearch.train` (the real stack: vLLM engine, verl trainer, Ray; the
example's defaults otherwise) once per (cell, seed), with `seed=S trainer.seed=S` and the same number
of trained samples in every run (the example's `total_steps` × 64), and reads each run's
`summary.json` and `metrics.jsonl`. Cells (CELLS; `--cells` picks some):

    sync                  mode=sync (on-policy baseline)
    one_step_off          mode=one_step_off
    k1, k2, k4, k8        fully_async with partial rollouts at max_staleness k, the default correction (`auto`:
                          none, plain PPO against the behaviour policy) and the default admission
                          (`generate_ahead=adaptive`: staleness is a ceiling); k4 is the example's default
    k4_bound, k8_bound    the same, admission filling up to the bound (`generate_ahead=bound`, the earlier
                          default: every trained token at k when training is the bottleneck)
    *_gspo                the same cells with `trainer.correction=gspo`, the earlier default of `auto`

`--fresh` is the newcomer's sweep: every run of it reads one cache under outputs/learning_parity/fresh-cache/
that the first run builds from nothing (the world and the warmed-up starting policy), instead of the
user's cache; its cells are labelled "+fresh", and each run keeps its policy every 10 steps
(`<out>/hf/step_*`) for diagnosis.

`--busy` runs two busy loops (one per core, at the driver's niceness) beside every run, which changes
the generation/training speed ratio as a loaded machine does; its runs are separate cells ("+busy").

Length bias: each run writes `rows.jsonl` (every row's outcome and what it generated); the second table
pools a cell's seeds, sorts its rows by output tokens into deciles and gives each decile's share trained,
dropped as too stale, and with a call resumed after a push — whether staleness control trains the short
episodes and drops the long ones.

Resumable per (cell, seed), across machines: each finished run leaves a record in the repository
(bench/results/learning_parity/<cell>/seed<S>.json: what the tables need, and every row's outcome and
size), and a (cell, seed) with a record is not run again; the run itself writes to outputs/learning_parity/
<cell>/seed<S>/. Cells measured before records were kept stay in the table as they were written (their
lines are carried over from the page until a record of that cell exists). After every run the table
(held-out F1 before/after, gain mean ± SE over seeds with each seed's gain ± its SE over questions,
trained-token staleness, training wall time, trained samples/s, and a verdict against sync) is
rewritten into docs/learning_parity.md between its markers, and its figure (each cell's gains; the share of
each length decile trained) into docs/learning_parity.png.
A benchmark, not a test: nothing is asserted. Each run takes ~10–11 min on this machine idle (k2: 609–652 s),
about twice that with the cores shared (the first also builds the cached starting policy, ~10 min); the whole
study is hours — run it in the background.

    .venv/bin/python bench/learning_parity.py --cells k4 --seeds 0,1,2            # the default, 3 seeds
    .venv/bin/python bench/learning_parity.py --cells k4 --seeds 0,1,2 --busy     # the same, both cores busy
    .venv/bin/python bench/learning_parity.py --cells k4 --seeds 0-9 --fresh       # a newcomer's sweep, 10 seeds
    .venv/bin/python bench/learning_parity.py --report-only                       # table from what ran
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _timing import mean_se

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "outputs" / "learning_parity"
FRESH_CACHE = OUT / "fresh-cache"  # what `--fresh` runs share, built from nothing by the first of them
RECORDS = ROOT / "bench" / "results" / "learning_parity"
ROW_FIELDS = ("outcome", "output_tokens", "calls", "episodes", "resumed_calls")  # a record's rows, in this order
DOC = ROOT / "docs" / "learning_parity.md"
PLOT = ROOT / "docs" / "learning_parity.png"
BEGIN, END = "<!-- learning-parity:begin -->", "<!-- learning-parity:end -->"

_BASE: dict[str, list[str]] = {
    "sync": ["mode=sync", "max_staleness=-1"],
    "one_step_off": ["mode=one_step_off", "max_staleness=-1"],
    "k1": ["max_staleness=1"],
    "k2": ["max_staleness=2"],
    "k4": ["max_staleness=4"],
    "k8": ["max_staleness=8"],
    "k4_bound": ["max_staleness=4", "generate_ahead=bound"],
    "k8_bound": ["max_staleness=8", "generate_ahead=bound"],
}
CELLS: dict[str, list[str]] = {
    **_BASE,
    **{f"{name}_gspo": [*overrides, "trainer.correction=gspo"] for name, overrides in _BASE.items() if name != "sync"},
}


def _spin() -> None:
    while True:
        pass


def run_one(cell: str, seed: int, busy: bool, fresh: bool = False) -> Path:
    """One training run of the example (skipped when its summary exists); returns its output directory."""
    label = cell + ("+busy" if busy else "") + ("+fresh" if fresh else "")
    out = OUT / label / f"seed{seed}"
    if (RECORDS / label / f"seed{seed}.json").exists():
        return out
    if (out / "summary.json").exists():
        keep_record(label, seed, out, busy)
        return out
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "examples.deepresearch.train", *CELLS[cell], f"seed={seed}",
               f"trainer.seed={seed}", f"output_dir={out}"]
    environment = dict(os.environ)
    if fresh:
        command += ["save_checkpoint=true", "checkpoint.save_hf_every=10"]
        environment["FULLASYNC_CACHE_DIR"] = str(FRESH_CACHE)
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(2 if busy else 0)]
    for spinner in spinners:
        spinner.start()
    started = time.monotonic()
    print(f"[learning_parity] {label} seed {seed}: {' '.join(command[2:])}", flush=True)
    try:
        with open(out / "train.log", "w") as log:
            done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False, env=environment)
    finally:
        for spinner in spinners:
            spinner.terminate()
    print(f"[learning_parity] {label} seed {seed}: exit {done.returncode} after {time.monotonic() - started:.0f} s"
          f" (log {out / 'train.log'})", flush=True)
    if done.returncode == 0:
        keep_record(label, seed, out, busy)
    return out


def keep_record(label: str, seed: int, out: Path, busy: bool) -> None:
    """The finished run in `out` as a record in the repository (what `render` and `length_bias` read)."""
    run = read_run(out)
    if run is None:
        return
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "rows.jsonl").exists() else []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=False).stdout.strip()
    record = {**run, "cell": label, "seed": seed, "busy": busy, "commit": commit,
              "date": time.strftime("%Y-%m-%d", time.gmtime()), "row_fields": list(ROW_FIELDS),
              "rows": [[row[field] for field in ROW_FIELDS] for row in rows]}
    (RECORDS / label).mkdir(parents=True, exist_ok=True)
    (RECORDS / label / f"seed{seed}.json").write_text(json.dumps(record, separators=(",", ":")) + "\n")


def read_run(out: Path) -> dict[str, Any] | None:
    """What one finished run measured (None: not finished)."""
    path = out / "summary.json"
    if not path.exists():
        return None
    summary = json.loads(path.read_text())
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    samples = sum(step.get("rollout/samples", 0.0) for step in steps)
    return {
        "before": summary["heldout_before"]["f1"], "after": summary["heldout_after"]["f1"],
        "gain": summary["f1_gain"], "gain_se": summary["f1_gain_stderr"],
        "staleness": statistics.fmean(step["staleness/mean"] for step in steps) if steps else float("nan"),
        "train_s": summary["train_wall_s"], "samples_per_s": samples / max(summary["train_wall_s"], 1e-9),
        "steps": summary["steps"],
    }


def verdict(gains: list[float], reference: list[float]) -> str:
    """Against sync's gains: within noise when the difference of means is within 2 combined SEs."""
    if len(gains) < 2 or len(reference) < 2:
        return "—"
    (m, s), (r, t) = mean_se(gains), mean_se(reference)
    gap, se = m - r, math.hypot(s, t)
    return "within noise of sync" if abs(gap) <= 2 * se else f"{gap:+.3f} ± {se:.3f} vs sync"


def _order(label: str) -> tuple[int, str]:
    cell = label.split("+")[0]
    return (list(CELLS).index(cell) if cell in CELLS else 99, label)


def records() -> dict[str, list[dict[str, Any]]]:
    """Every kept run, by cell label (seeds in order)."""
    labels = sorted((p.name for p in RECORDS.iterdir() if p.is_dir()), key=_order) if RECORDS.exists() else []
    return {label: [json.loads(path.read_text()) for path in sorted((RECORDS / label).glob("seed*.json"))]
            for label in labels}


def earlier_lines(heading: str) -> dict[str, str]:
    """The page's current table lines under `heading` (the first table of the marked block for ""), by cell:
    how cells measured before records were kept stay in the table."""
    if not DOC.exists() or BEGIN not in DOC.read_text():
        return {}
    block = DOC.read_text().split(BEGIN, 1)[1].split(END, 1)[0]
    part = block.split("### ", 1)[0] if not heading else block.split(heading, 1)[1] if heading in block else ""
    lines = [line for line in part.splitlines() if line.startswith("| ") and not line.startswith("| cell ")]
    return {line.split("|")[1].strip(): line for line in lines}


def _seed_gains(line: str) -> list[float]:
    """Each seed's gain from a carried-over table line (its fifth column: "+0.276 ± 0.034, ...")."""
    return [gain for gain, _ in _seed_gains_with_se(line)]


def _seed_gains_with_se(line: str) -> list[tuple[float, float]]:
    return [(float(part.split("±")[0]), float(part.split("±")[1])) for part in line.split("|")[5].split(",")
            if "±" in part]


def _merged(fresh: dict[str, str], carried: dict[str, str]) -> list[str]:
    both = {**{label: line for label, line in carried.items() if label not in fresh}, **fresh}
    return [both[label] for label in sorted(both, key=_order)]


def render() -> str:
    head = ["| cell | seeds | held-out F1 before → after | gain, mean ± SE over seeds | each seed's gain ± SE "
            "| runs with gain ≥ 3 SE | trained staleness (mean) | training s | trained samples/s | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    results, carried = records(), earlier_lines("")
    reference = [r["gain"] for r in results.get("sync", [])] or _seed_gains(carried.get("sync", "| " * 6))
    fresh = {}
    for label, runs in results.items():
        gains = [r["gain"] for r in runs]
        gain, gain_se = mean_se(gains)
        fresh[label] = (
            f"| {label} | {len(runs)} | {statistics.fmean(r['before'] for r in runs):.3f} → "
            f"{statistics.fmean(r['after'] for r in runs):.3f} | {gain:+.3f}"
            + (f" ± {gain_se:.3f}" if len(runs) > 1 else " (one seed)") + " | "
            + ", ".join(f"{r['gain']:+.3f} ± {r['gain_se']:.3f}" for r in runs)
            + f" | {sum(r['gain'] >= 3 * r['gain_se'] for r in runs)} of {len(runs)} (worst {min(gains):+.3f}) "
            f"| {statistics.fmean(r['staleness'] for r in runs):.2f} "
            f"| {statistics.fmean(r['train_s'] for r in runs):.0f} "
            f"| {statistics.fmean(r['samples_per_s'] for r in runs):.2f} | "
            f"{'(reference)' if label == 'sync' else verdict(gains, reference)} |")
    return "\n".join(head + _merged(fresh, carried))


def finished_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A cell's rows over its seeds, shortest first, without those cut off by the end of a run (not by a policy)."""
    rows = [dict(zip(run["row_fields"], row, strict=True)) for run in runs for row in run["rows"]]
    return sorted((r for r in rows if r["outcome"] != "unfinished"), key=lambda r: r["output_tokens"])


def length_deciles(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [rows[len(rows) * d // 10:len(rows) * (d + 1) // 10] for d in range(10)]


def length_bias() -> str:
    """Per cell (seeds pooled): rows that stopped running, in deciles of output tokens, and the share of each
    decile trained, dropped as too stale, and with a call resumed after a push; and the model calls per
    episode of the rows generated vs trained (from each record's rows)."""
    head = ["| cell | rows | tokens per row: generated → trained (mean) | calls per episode: generated → trained "
            "| share trained per length decile (shortest → longest) | share dropped as too stale per decile "
            "| share with a resumed call per decile |",
            "|---|---|---|---|---|---|---|"]
    fresh = {}
    for label, runs in records().items():
        rows = finished_rows(runs)
        if len(rows) < 10:
            continue
        deciles = length_deciles(rows)

        def shares(test: Any, deciles: list[list[dict[str, Any]]] = deciles) -> str:
            return " ".join(f"{sum(map(test, part)) / len(part):.2f}" for part in deciles)

        def per_episode(part: list[dict[str, Any]]) -> str:
            return f"{sum(r['calls'] for r in part) / max(sum(r['episodes'] for r in part), 1):.2f}" if part else "—"

        trained = [r for r in rows if r["outcome"] == "trained"]
        fresh[label] = (
            f"| {label} | {len(rows)} | {statistics.fmean(r['output_tokens'] for r in rows):.0f} → "
            f"{statistics.fmean(r['output_tokens'] for r in trained) if trained else float('nan'):.0f} "
            f"| {per_episode(rows)} → {per_episode(trained)} "
            f"| {shares(lambda r: r['outcome'] == 'trained')} | {shares(lambda r: r['outcome'] == 'too_stale')} "
            f"| {shares(lambda r: r['resumed_calls'] > 0)} |")
    carried = {label: _widened(line) for label, line in earlier_lines("Length bias").items()}
    return "\n".join(head + _merged(fresh, carried))


def _widened(line: str) -> str:
    """A carried-over length-bias line from before the calls-per-episode column: that column left empty."""
    cells = line.split("|")
    return line if len(cells) == 9 else "|".join(cells[:4] + [" — "] + cells[4:])


def plot(path: Path = PLOT) -> None:
    """The figure beside the tables: each cell's held-out F1 gain (every seed with its SE over questions, the
    mean ± SE over seeds) and, per cell with records, the share of each length decile trained."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results, carried = records(), earlier_lines("")
    seeds = {label: [(r["gain"], r["gain_se"]) for r in runs] for label, runs in results.items()}
    seeds.update({label: _seed_gains_with_se(line) for label, line in carried.items() if label not in seeds})
    labels = sorted(seeds, key=_order)
    figure, (gains, bias) = plt.subplots(1, 2, figsize=(13, 4.8))
    for x, label in enumerate(labels):
        points = seeds[label]
        gains.errorbar([x + 0.08 * (i - (len(points) - 1) / 2) for i in range(len(points))], [g for g, _ in points],
                       yerr=[se for _, se in points], fmt="o", color="tab:gray", alpha=0.6, capsize=2)
        mean, se = mean_se([g for g, _ in points])
        gains.errorbar([x], [mean], yerr=[0 if math.isnan(se) else se], fmt="s", color="tab:blue", capsize=5, ms=8)
    if "sync" in seeds:
        gains.axhline(mean_se([g for g, _ in seeds["sync"]])[0], color="tab:green", ls="--", lw=1, label="sync mean")
        gains.legend(loc="lower left")
    gains.axhline(0, color="black", lw=0.5)
    gains.set_xticks(range(len(labels)), labels, rotation=35, ha="right")
    gains.set_ylabel("held-out F1 gain")
    gains.set_title("each seed ± SE over questions (grey), mean ± SE over seeds (blue)", fontsize=10)
    for label, runs in results.items():
        rows = finished_rows(runs)
        if len(rows) >= 10:
            bias.plot(range(1, 11), [sum(r["outcome"] == "trained" for r in part) / len(part)
                                     for part in length_deciles(rows)], marker=".", label=label)
    bias.set_xlabel("length decile of generated rows (output tokens, shortest → longest)")
    bias.set_ylabel("share trained")
    bias.set_ylim(0, 1.05)
    bias.legend(fontsize=8)
    bias.set_title("length bias: what gets trained")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def page() -> str:
    return render() + "\n\n### Length bias\n\n" + length_bias()


def write_doc(table: str) -> None:
    text = DOC.read_text() if DOC.exists() else "# Learning parity (deepresearch)\n\n" + BEGIN + "\n" + END + "\n"
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def seed_list(text: str) -> list[int]:
    """`0,1,2` or `0-9` (or both: `0-4,7`)."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        seeds += list(range(int(low), int(high or low) + 1))
    return seeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of {list(CELLS)}")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds or ranges: 0,1,2 or 0-9")
    parser.add_argument("--busy", action="store_true", help="two busy loops beside every run")
    parser.add_argument("--fresh", action="store_true", help="the runs share one cache built from nothing (+fresh)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    cells = args.cells.split(",")
    unknown = [cell for cell in cells if cell not in CELLS]
    if unknown:
        parser.error(f"unknown cell(s) {unknown}; choose from {list(CELLS)}")
    if not args.report_only:
        for seed in seed_list(args.seeds):
            for cell in cells:
                run_one(cell, seed, args.busy, args.fresh)
                write_doc(page())
                plot()
    table = page()
    write_doc(table)
    plot()
    print(table)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
