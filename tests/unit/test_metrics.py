"""Per-step metrics: staleness of trained tokens, the JSONL file, the TensorBoard logger, rollout samples."""

from __future__ import annotations

import json

from fullasync.observe.metrics import MetricsSink, format_line, generation_stats, token_staleness
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
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fullasync.observe.tracking import TrackingSettings, open_loggers

    settings = TrackingSettings(("tensorboard",), "p", "", False, tmp_path)
    sink = MetricsSink(tmp_path / "m.jsonl", open_loggers(settings, {"seed": 0}, resume=False))
    sink.write(1, {"reward/mean": 0.5})
    sink.write(2, {"reward/mean": 0.75})
    sink.close()
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "reward/mean": 0.5}, {"step": 2, "reward/mean": 0.75}]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward/mean")] == [(1, 0.5), (2, 0.75)]
    assert "reward 0.750" in format_line(2, {"reward/mean": 0.75, "reward/std": 0.1})


def test_the_step_line_shows_progress_and_the_time_left():
    line = format_line(3, {"progress/total_steps": 60.0, "progress/eta_s": 125.4, "rollout/lead_batches": 2.5})
    assert line.startswith("step    3/60 |") and line.endswith("| eta 2m05s") and "ahead 2.50" in line
    assert format_line(3, {}).startswith("step    3 |") and "eta" not in format_line(3, {})  # total_steps = 0
    assert "ahead 2.50 late 3/5 |" in format_line(3, {"rollout/lead_batches": 2.5, "batch/late_places": 5.0,
                                                       "batch/late_joined": 3.0})
    assert "late" not in format_line(3, {"batch/late_places": 0.0, "batch/late_joined": 0.0})  # the batch taken whole


def test_harness_metrics_aggregate_logged_values_and_numeric_metadata():
    from fullasync.observe.metrics import HARNESS_METRICS_KEY, harness_stats

    call = ModelCall((1,), (5,), (-0.1,), (0,), FinishReason.STOP)
    episodes = [Trajectory((call,), 1.0, {"turns": 3, "solved": True, "exit": "Submitted",
                                          HARNESS_METRICS_KEY: (("tool_errors", 2.0), ("tool_errors", 0.0))}),
                Trajectory((call,), 0.0, {"turns": 5, "solved": False, "nan": float("nan")})]
    stats = harness_stats([TrajectoryGroup("r", tuple(episodes))])
    assert stats["harness/turns/mean"] == 4 and stats["harness/turns/min"] == 3 and stats["harness/turns/max"] == 5
    assert stats["harness/solved/mean"] == 0.5 and stats["harness/turns/count"] == 2
    assert stats["harness/tool_errors/count"] == 2 and stats["harness/tool_errors/mean"] == 1.0
    assert not any("exit" in key or "nan" in key for key in stats)  # text and non-finite values are not metrics


def test_reward_tampered_counts_the_steps_episodes_that_edited_their_scorers_files():
    from fullasync.observe.metrics import HARNESS_METRICS_KEY, TAMPERED, reward_stats

    call = ModelCall((1,), (5,), (-0.1,), (0,), FinishReason.STOP)

    def episode(reward: float, *logged: float) -> Trajectory:
        return Trajectory((call,), reward, {HARNESS_METRICS_KEY: tuple((TAMPERED, value) for value in logged)})

    groups = [TrajectoryGroup("a", (episode(1.0, 1.0), episode(0.0, 0.0))),
              TrajectoryGroup("b", (episode(1.0, 1.0), episode(0.0)))]
    assert reward_stats(groups)["reward/tampered"] == 2.0 and reward_stats(groups)["reward/mean"] == 0.5
    assert reward_stats([TrajectoryGroup("a", (episode(1.0, 0.0),))])["reward/tampered"] == 0.0
    assert "reward/tampered" not in reward_stats([TrajectoryGroup("a", (episode(1.0),))])  # no harness reports it


def test_rollout_samples_are_decoded_per_call_every_nth_step(tmp_path):
    from fullasync.observe.samples import RolloutSamples

    class Letters:
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(ord("a") + i) for i in ids)

    sink = MetricsSink(None, rollout_samples=RolloutSamples(tmp_path / "rollouts", Letters(), every=2))
    first = ModelCall((0, 1), (2, 3), (-0.1, -0.2), (4, 5), FinishReason.STOP, num_resumes=1)
    second = ModelCall((0, 1, 2, 3, 7), (4,), (-0.3,), (6,), FinishReason.LENGTH)
    groups = [TrajectoryGroup("row-9", (Trajectory((first, second), 0.5, {"turns": 2}),))]
    sink.samples(1, groups, trainer_version=6)
    sink.samples(2, groups, trainer_version=6)
    assert [p.name for p in (tmp_path / "rollouts").iterdir()] == ["step_2.jsonl"]
    (episode,) = [json.loads(line) for line in (tmp_path / "rollouts" / "step_2.jsonl").read_text().splitlines()]
    assert episode["row_id"] == "row-9" and episode["reward"] == 0.5 and episode["metadata"] == {"turns": 2}
    assert [(c["prompt"], c["completion"]) for c in episode["calls"]] == [("ab", "cd"), ("abcdh", "e")]
    assert [(c["versions"], c["staleness"], c["resumed"]) for c in episode["calls"]] == [([4, 5], 2, 1),
                                                                                         ([6, 6], 0, 0)]
    assert episode["calls"][1]["finish_reason"] == "length" and episode["calls"][1]["prompt_tokens"] == 5


def test_held_out_evaluations_go_to_their_own_file_and_a_resumed_run_keeps_those_before_its_checkpoint(tmp_path):
    sink = MetricsSink(tmp_path / "metrics.jsonl")
    for step, score in ((0, 0.1), (2, 0.2), (4, 0.3)):
        sink.validation(step, {"score": score, "stderr": 0.01})
    lines = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert [(v["step"], v["score"]) for v in lines] == [(0, 0.1), (2, 0.2), (4, 0.3)]
    resumed = MetricsSink(tmp_path / "metrics.jsonl")  # a new run in the same directory starts both files over
    assert (tmp_path / "validation.jsonl").read_text() == ""
    resumed.rewrite([{"reward/mean": 0.5}] * 3, [{"step": 0.0, "score": 0.1}, {"step": 2.0, "score": 0.2}])
    lines = [json.loads(line) for line in (tmp_path / "validation.jsonl").read_text().splitlines()]
    assert lines == [{"step": 0, "score": 0.1}, {"step": 2, "score": 0.2}]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3
