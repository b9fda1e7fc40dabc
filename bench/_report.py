"""What every benchmark does at its end: say how it was run, print its section and write it into its study's page
under docs/benchmarks/ between its markers (unless `--no-write`). And the learning sweeps' shared parts: one seed's
`fullasync train` and its held-out scores (`train_seed`), the sweep's table (`print_seed_gains`)."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
STUDIES = DOCS / "benchmarks"  # one page per study, listed by the index docs/benchmarks.md and by mkdocs.yml


def command_line() -> str:
    """How this benchmark was started: `python bench/<script>.py <arguments>`."""
    return " ".join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def run_note(started: float) -> str:
    """The command, its wall time since `started` (`time.perf_counter()`) and the load average at its end: what a
    figure depends on."""
    return (f"`{command_line()}` — {time.perf_counter() - started:.0f} s, load average {os.getloadavg()[0]:.2f} at "
            "the end")


def write_section(markdown: Path, section: str, begin: str, end: str) -> None:
    """Replace the block between `begin` and `end` in `markdown` with `section` (appended when absent)."""
    text = markdown.read_text() if markdown.exists() else f"# {markdown.stem}\n"
    block = f"{begin}\n{section}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    markdown.write_text(text)


def study_page(begin: str) -> Path:
    """The page under docs/benchmarks/ that holds the marker `begin`; where none does, a new page named after it
    (`<!-- name:begin -->` -> name.md), which the index's table and mkdocs.yml's nav must then list (the unit test
    tests/unit/test_bench_scripts.py and the strict docs build fail until they do)."""
    for page in sorted(STUDIES.glob("*.md")):
        if begin in page.read_text():
            return page
    return STUDIES / f"{begin.removeprefix('<!-- ').split(':')[0]}.md"


def report(section: str, begin: str, end: str, write: bool, page: Path | None = None) -> None:
    """Print `section`; with `write`, put it between the markers `begin` and `end` of `page` (by default the study
    page holding them)."""
    print(section)
    if write:
        write_section(page or study_page(begin), section, begin, end)


def print_seed_gains(records: list[dict]) -> None:
    """A learning sweep's table: each seed's held-out score before and after (records with `seed`, `before`,
    `before_se`, `after`, `after_se`, `wall_s`), its gain ± SE (sqrt(SE_before² + SE_after²)), then how many gains
    are ≥ 3 SE, the mean gain ± its SE over seeds and the worst."""
    import math
    import statistics

    gains = []
    print("seed  before          after           gain ± SE         wall s")
    for r in records:
        gain, se = r["after"] - r["before"], math.hypot(r["before_se"], r["after_se"])
        gains.append((gain, se))
        print(f"{r['seed']:>4}  {r['before']:.3f} ± {r['before_se']:.3f}  {r['after']:.3f} ± {r['after_se']:.3f}  "
              f"{gain:+.3f} ± {se:.3f} ({gain / se if se else math.inf:.1f} SE)  {r['wall_s']:.0f}")
    means = [g for g, _ in gains]
    spread = statistics.stdev(means) / math.sqrt(len(means)) if len(means) > 1 else float("nan")
    print(f"mean gain {statistics.mean(means):+.3f} ± {spread:.3f} over {len(means)} seeds; "
          f"{sum(g >= 3 * se for g, se in gains)} of {len(gains)} ≥ 3 SE; worst {min(means):+.3f}")


def train_seed(seed: int, argv: list[str], out: Path) -> dict:
    """One seed of a learning sweep: `fullasync train` with `argv` (its settings, writing to `out`), run from the
    repository, and its held-out scores from `out/result.json` (before, after, their SEs over the episodes), the
    episode failures and the wall time."""
    import json
    import subprocess

    started = time.monotonic()
    done = subprocess.run([str(Path(sys.executable).parent / "fullasync"), "train", *argv], cwd=ROOT,
                          env={**os.environ, "FULLASYNC_PLAIN": "1"}, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: fullasync train failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads((out / "result.json").read_text())
    return {"seed": seed, "steps": result["steps"], "before": result["val_before"],
            "before_se": result["val_before_stderr"], "after": result["val_after"],
            "after_se": result["val_after_stderr"], "episode_failures": result.get("episode_failures"),
            "wall_s": round(time.monotonic() - started, 1)}
