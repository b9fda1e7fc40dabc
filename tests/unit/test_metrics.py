"""Per-step metrics: staleness of trained tokens, the JSONL file, the optional TensorBoard sink."""

from __future__ import annotations

import json

from fullasync.metrics import MetricsSink, format_line, generation_stats, token_staleness
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup


def test_token_staleness_counts_every_sampled_token():
    call = ModelCall((1,), (5, 6, 7, 8), (-0.1,) * 4, (3, 3, 4, 5), FinishReason.LENGTH, num_resumes=2,
                     resubmitted_tokens=5)
    groups = [TrajectoryGroup("r", (Trajectory((call,), 1.0),))]
    stats = token_staleness(groups, trainer_version=5)
    assert stats["staleness/max"] == 2 and stats["staleness/min"] == 0
    assert stats["staleness/mean"] == (2 + 2 + 1 + 0) / 4
    assert stats["staleness/frac_gap_2"] == 0.5 and stats["staleness/frac_gap_0"] == 0.25
    assert generation_stats(groups)["rollout/resubmitted_tokens"] == 5


def test_jsonl_and_tensorboard_sinks(tmp_path):
    sink = MetricsSink(tmp_path / "m.jsonl", tensorboard_dir=tmp_path / "tb")
    sink.write(1, {"reward/mean": 0.5})
    sink.write(2, {"reward/mean": 0.75})
    sink.close()
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.75}]
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tb").iterdir())
    assert "reward 0.750" in format_line(2, {"reward/mean": 0.75, "reward/std": 0.1})
