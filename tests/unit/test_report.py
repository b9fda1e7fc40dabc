"""`fullasync report`: a run's curves and page from its metrics.jsonl, and a clear error where there is no run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fullasync.cli.report import ReportError, held_out_line, write_report

ROOT = Path(__file__).resolve().parents[2]


def write_run(directory: Path, steps: int, finished: bool) -> None:
    lines = []
    for step in range(1, steps + 1):
        metrics = {"step": step, "reward/mean": step / steps, "staleness/mean": 1.2, "staleness/max": 2.0,
                   "staleness/frac_gap_1": 0.8, "staleness/frac_gap_2": 0.2, "perf/samples_per_s": 7.0,
                   "queue/size": 3.0, "harness/turns/mean": 2.5}
        lines.append(json.dumps(metrics))
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if finished:
        (directory / "result.json").write_text(json.dumps({"steps": steps, "val_before": 0.1, "val_after": 0.5,
                                                           "row_outcomes": {"row-0": "trained"}}))


def test_the_report_draws_what_the_run_measured(tmp_path):
    write_run(tmp_path, steps=6, finished=True)
    page = write_report(tmp_path)
    assert page == tmp_path / "report" / "index.html"
    drawn = {p.name for p in page.parent.glob("*.png")}
    assert drawn == {"reward.png", "staleness.png", "staleness_histogram.png", "throughput.png", "queue.png",
                     "harness.png"}  # no idle or weight-push figure: the run did not record those
    text = page.read_text()
    assert all(f"<img src='{name}'" in text for name in drawn)
    assert "val_after" in text and "row-0" not in text  # the summary, not the per-row account


def test_a_distilled_runs_teacher_is_drawn_its_kl_its_scoring_and_its_lag(tmp_path):
    write_run(tmp_path, steps=3, finished=True)
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for step, metrics in enumerate(lines):
        metrics.update({"teacher/kl": 0.3 / (step + 1), "teacher/tokens_per_s": 1800.0, "teacher/lag_s": 1.1,
                        "teacher/groups_waiting": 4.0})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    drawn = {p.name for p in write_report(tmp_path).parent.glob("*.png")}
    assert {"teacher_kl.png", "teacher_scoring.png", "teacher_lag.png"} <= drawn


def test_a_run_still_going_is_reported_and_an_empty_directory_is_refused(tmp_path):
    write_run(tmp_path / "run", steps=2, finished=False)
    assert "has not finished" in write_report(tmp_path / "run").read_text()
    with pytest.raises(ReportError, match="metrics.jsonl does not exist"):
        write_report(tmp_path / "nothing")
    done = subprocess.run([sys.executable, "-m", "fullasync.cli", "report", str(tmp_path / "nothing")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and "pass the output_dir of a run" in done.stderr


def test_the_held_out_score_leads_the_page_and_a_fall_under_a_rising_reward_is_flagged(tmp_path):
    write_run(tmp_path, steps=6, finished=True)  # the training reward climbs 1/6 → 1
    validations = [{"step": 0, "score": 0.135, "stderr": 0.018}, {"step": 3, "score": 0.11, "stderr": 0.017},
                   {"step": 6, "score": 0.080, "stderr": 0.017}]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps(v) + "\n" for v in validations))
    text = write_report(tmp_path).read_text()
    headline = text.split("<h1>", 1)[1].split("</p>", 1)[0]
    assert "0.135 ± 0.018 (step 0) → 0.080 ± 0.017 (step 6): -0.055 ± 0.025 (-2.2 SE)" in headline
    assert "WARNING: the held-out score fell while the training reward rose (0.167 → 1.000)" in headline
    done = subprocess.run([sys.executable, "-m", "fullasync.cli", "report", str(tmp_path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0 and "WARNING: the held-out score fell" in done.stdout.splitlines()[0]
    rising = [{"step": 0, "score": 0.14, "stderr": 0.02}, {"step": 6, "score": 0.35, "stderr": 0.03}]
    assert "WARNING" not in held_out_line(rising, [{"reward/mean": 0.1}, {"reward/mean": 0.7}])
    assert held_out_line([], []).startswith("No held-out evaluation")
