"""`fullasync report OUTPUT_DIR`: a run's curves as PNG files and one HTML page, from what the run wrote.

Owns: reading `metrics.jsonl`, `validation.jsonl` (and `result.json`, when the run finished) of a run's output
directory; the held-out line the page and the command begin with (the held-out score first and last with standard
errors, and a warning when it fell while the training reward rose); drawing, over the steps: reward (with every
held-out evaluation and its standard error), staleness of the trained tokens (mean and max, and the share of tokens
at each gap), throughput (samples/s, tokens/s), idle fractions of the trainer and the rollout, the queue and how far
generation ran ahead, the weight push's time, and the harness's own metrics (`harness/*/mean`). Writes
`OUTPUT_DIR/report/*.png` and `OUTPUT_DIR/report/index.html` (images side by side with the run's summary), and the
sampled episodes' pages (`fullasync.cli.rollout_pages`, linked from it). Works on a run still going: it reads what
is there. Does not own: the metrics themselves (`fullasync.observe.metrics`).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from fullasync.cli.rollout_pages import write_rollout_pages
from fullasync.errors import FullasyncError


class ReportError(FullasyncError, ValueError):
    """The directory holds no run to report on; the message says what was looked for."""


def read_steps(output_dir: Path) -> list[dict[str, float]]:  # each line: the step and its metrics (MetricsSink)
    path = output_dir / "metrics.jsonl"
    if not path.exists():
        raise ReportError(f"{path} does not exist: pass the output_dir of a run (where metrics.jsonl is written)")
    steps = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not steps:
        raise ReportError(f"{path} has no step yet: the run has not finished its first train step")
    return steps


def read_validations(output_dir: Path) -> list[dict[str, float]]:
    """The run's held-out evaluations (validation.jsonl; step 0: before training), oldest first."""
    path = output_dir / "validation.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def held_out_line(validations: Sequence[Mapping[str, float]], steps: Sequence[Mapping[str, float]]) -> str:
    """What decides whether a run worked, in one line: the held-out score first and last with their standard
    errors, and whether it fell while the training reward rose."""
    if not validations:
        return "No held-out evaluation (pass val_dataset or evaluate_fn, or set data.val_dataset)."

    def score(v: Mapping[str, float]) -> str:
        return f"{v['score']:.3f}" + (f" ± {v['stderr']:.3f}" if "stderr" in v else "") + f" (step {v['step']})"

    first, last = validations[0], validations[-1]
    line = f"Held-out score {score(first)}"
    if len(validations) == 1:
        return line + "."
    gain = last["score"] - first["score"]
    se = (first.get("stderr", 0.0) ** 2 + last.get("stderr", 0.0) ** 2) ** 0.5
    line += f" → {score(last)}: {gain:+.3f}" + (f" ± {se:.3f} ({gain / se:+.1f} SE)" if se > 0 else "")
    rewards = [s["reward/mean"] for s in steps if "reward/mean" in s]
    if gain < 0 and len(rewards) >= 2 and rewards[-1] > rewards[0]:
        line += (f". WARNING: the held-out score fell while the training reward rose ({rewards[0]:.3f} → "
                 f"{rewards[-1]:.3f}): the policy learned something that does not carry over")
    return line + "."


def _series(steps: Sequence[Mapping[str, float]], key: str) -> tuple[list[float], list[float]]:
    points = [(s["step"], s[key]) for s in steps if key in s]
    return [p[0] for p in points], [p[1] for p in points]


def _figures(steps: Sequence[Mapping[str, float]]) -> dict[str, list[tuple[str, str]]]:
    """Figure name -> the (metric key, label) lines it draws; only metrics the run has."""
    present = {key for step in steps for key in step}
    gaps = sorted((k for k in present if k.startswith("staleness/frac_gap_")), key=lambda k: int(k.rsplit("_", 1)[1]))
    harness = sorted(k for k in present if k.startswith("harness/") and k.endswith("/mean"))
    wanted = {
        "reward": [("reward/mean", "reward (mean)")],
        "staleness": [("staleness/mean", "mean"), ("staleness/max", "max")],
        "staleness_histogram": [(k, f"gap {k.rsplit('_', 1)[1]}") for k in gaps],
        "throughput": [("perf/samples_per_s", "samples/s"), ("perf/tokens_per_s", "tokens/s")],
        "idle": [("perf/trainer_idle_frac", "trainer"), ("perf/rollout_idle_frac", "rollout")],
        "queue": [("queue/size", "groups queued"), ("rollout/lead_batches", "ahead (batches)")],
        "weight_push": [("weight_sync/total_s", "total s"), ("weight_sync/pause_s", "pause s")],
        "harness": [(k, k[len("harness/"):-len("/mean")]) for k in harness],
        "teacher_kl": [("teacher/kl", "log p_behaviour − log p_teacher (mean per trained token)")],
        "teacher_scoring": [("teacher/tokens_per_s", "tokens/s while scoring")],
        "teacher_lag": [("teacher/lag_s", "s per group (mean)"), ("teacher/groups_waiting", "groups being scored")],
    }
    return {name: [(k, label) for k, label in lines if k in present] for name, lines in wanted.items()
            if any(k in present for k, _ in lines)}


def write_report(output_dir: Path, report_dir: Path | None = None) -> Path:
    """Draw the run in `output_dir`; returns the HTML page's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = read_steps(output_dir)
    validations = read_validations(output_dir)
    report_dir = report_dir or output_dir / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    images = []
    for name, lines in _figures(steps).items():
        figure, axis = plt.subplots(figsize=(6, 3.6))
        if name == "staleness_histogram":
            xs = [s["step"] for s in steps]
            axis.stackplot(xs, *[[s.get(k, 0.0) for s in steps] for k, _ in lines], labels=[lbl for _, lbl in lines])
            axis.set_ylabel("share of trained tokens")
        else:
            for key, label in lines:
                axis.plot(*_series(steps, key), label=label)
            if name == "reward" and validations:
                axis.errorbar([v["step"] for v in validations], [v["score"] for v in validations],
                              yerr=[v.get("stderr", 0.0) for v in validations], marker="o", capsize=3,
                              label="held-out (± SE)")
        axis.set_title(name.replace("_", " "))
        axis.set_xlabel("step")
        axis.legend(fontsize=7)
        axis.grid(alpha=0.3)
        figure.tight_layout()
        figure.savefig(report_dir / f"{name}.png", dpi=90)
        plt.close(figure)
        images.append(f"{name}.png")
    result_path = output_dir / "result.json"
    summary = json.loads(result_path.read_text()) if result_path.exists() else {}
    shown = {k: v for k, v in summary.items()
             if not isinstance(v, (dict, list)) or k in ("rows", "failure_reasons", "failure_kinds")}
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(json.dumps(v))}</td></tr>"
                   for k, v in shown.items())
    last = steps[-1]
    rollouts = write_rollout_pages(output_dir, report_dir)
    sampled = ("<p>No sampled episodes yet (logging.samples_every).</p>" if rollouts is None else
               f"<p><a href='{rollouts.relative_to(report_dir)}'>The sampled episodes</a>: their calls, the "
               "tokens coloured by the weight version that sampled them.</p>")
    page = report_dir / "index.html"
    page.write_text(
        "<!doctype html><meta charset='utf-8'><title>fullasync run report</title>"
        f"<h1>{html.escape(str(output_dir))}</h1>"
        f"<p><b>{html.escape(held_out_line(validations, steps))}</b></p>"
        f"<p>{len(steps)} steps recorded; last step {last['step']}"
        f"{'' if summary else ' (no result.json: the run has not finished)'}.</p>" + sampled
        + (f"<table>{rows}</table>" if rows else "")
        + "".join(f"<img src='{name}' alt='{name}'>" for name in images) + "\n")
    return page
