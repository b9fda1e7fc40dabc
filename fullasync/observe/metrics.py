"""Per-step metrics: computed from trained groups, printed as one line, appended to a JSONL file.

Owns: the staleness statistics of trained tokens, the step line on the console, and the sinks
(JSONL always; the loggers of `fullasync.observe.tracking` that the run asked for).
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fullasync.observe.samples import RolloutSamples
from fullasync.observe.tracking import Logger, close_loggers, sample_rows
from fullasync.types import TrajectoryGroup


def reward_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """The step's mean reward and its spread; per task too (`reward/task/<name>`) where rows name one (`row_task`);
    the episodes that tampered with their scorer's files (`reward/tampered`) where a harness reports it."""
    rewards = [r for g in groups for r in g.rewards]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    tasks = task_means(((group.metadata.get("task"), group.rewards) for group in groups), TASK_REWARD)
    tampered = [value for group in groups for trajectory in group.trajectories
                for name, value in trajectory.metadata.get(HARNESS_METRICS_KEY, ()) if name == TAMPERED]
    counted = {"reward/tampered": float(sum(value > 0 for value in tampered))} if tampered else {}
    return {"reward/mean": mean, "reward/std": std, **tasks, **counted}


TASK_REWARD = "reward/task/"  # a task's mean reward in the step (`reward/task/<name>`)
TASKS_SHOWN = 6  # tasks the step line names (the metrics keep every one)


def task_means(rewards: Iterable[tuple[object, Sequence[float]]], prefix: str) -> dict[str, float]:
    """The mean reward of each task named beside its rewards (a group's, a held-out row's), as `<prefix><name>`
    in name order; rewards beside no name (None) count for no task."""
    by_task: dict[str, list[float]] = {}
    for task, values in rewards:
        if isinstance(task, str):
            by_task.setdefault(task, []).extend(values)
    return {f"{prefix}{task}": sum(values) / len(values) for task, values in sorted(by_task.items()) if values}


def task_summary(metrics: Mapping[str, float], prefix: str, spec: str = ".2f", shown: int = TASKS_SHOWN) -> str:
    """` (name value name value …)` of the `<prefix><name>` metrics, the first `shown` of them; "" when none."""
    tasks = [(key.removeprefix(prefix), value) for key, value in metrics.items() if key.startswith(prefix)]
    if not tasks:
        return ""
    named = " ".join(f"{name} {value:{spec}}" for name, value in tasks[:shown])
    more = f" +{len(tasks) - shown} more" if len(tasks) > shown else ""
    return f" ({named}{more})"


HARNESS_METRICS_KEY = "harness_metrics"  # Trajectory.metadata key of the observations `RolloutClient.log` made
# a harness's `client.log(TAMPERED, 1.0)`: the episode changed a file its scorer relies on (restored before scoring);
# `reward/tampered` counts a step's such episodes
TAMPERED = "tampered"


def harness_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """The harness's own metrics over a step's episodes: every `client.log(name, value)` observation and every
    numeric (or bool) top-level field of `Trajectory.metadata`, as `harness/<name>/{mean,min,max,count}`."""
    values: dict[str, list[float]] = {}
    for group in groups:
        for trajectory in group.trajectories:
            for key, value in trajectory.metadata.items():
                if key == HARNESS_METRICS_KEY:
                    for name, observed in value:
                        values.setdefault(name, []).append(float(observed))
                elif isinstance(value, (int, float)) and math.isfinite(value):
                    values.setdefault(key, []).append(float(value))
    stats: dict[str, float] = {}
    for name, observed in sorted(values.items()):
        stats.update({f"harness/{name}/mean": sum(observed) / len(observed), f"harness/{name}/min": min(observed),
                      f"harness/{name}/max": max(observed), f"harness/{name}/count": float(len(observed))})
    return stats


def _count_sorted(values: Sequence[int], counts: Counter) -> None:
    """Add the counts of a non-decreasing sequence (a call's versions) in O(distinct · log n), not O(n)."""
    start = 0
    while start < len(values):
        end = bisect.bisect_right(values, values[start], start)
        counts[values[start]] += end - start
        start = end


def token_staleness(groups: Sequence[TrajectoryGroup], trainer_version: int) -> dict[str, float]:
    """trainer_version − token_version over every sampled token: mean, max and a histogram."""
    versions: Counter = Counter()
    for group in groups:
        for trajectory in group.trajectories:
            for call in trajectory.calls:
                _count_sorted(call.output_versions, versions)
    histogram = {trainer_version - version: count for version, count in versions.items()}
    total = sum(histogram.values())
    stats = {
        "staleness/mean": sum(gap * count for gap, count in histogram.items()) / total,
        "staleness/max": float(max(histogram)),
        "staleness/min": float(min(histogram)),
    }
    stats.update({f"staleness/frac_gap_{gap}": count / total for gap, count in sorted(histogram.items())})
    return stats


def teacher_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    """On-policy distillation's gap over the step's sampled tokens a teacher scored: `teacher/kl`, the mean of
    log p_behaviour − log p_teacher (the per-token reverse KL to the teacher, estimated on the policy's own samples);
    nothing when no teacher scored them."""
    gap, tokens = 0.0, 0
    for group in groups:
        for trajectory in group.trajectories:
            for call in trajectory.calls:
                if call.teacher_logprobs:
                    gap += math.fsum(call.output_logprobs) - math.fsum(call.teacher_logprobs)
                    tokens += len(call.output_ids)
    return {"teacher/kl": gap / tokens, "teacher/scored_tokens": float(tokens)} if tokens else {}


def generation_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    calls = [c for g in groups for t in g.trajectories for c in t.calls]
    resumed = [c for c in calls if c.num_resumes]
    return {
        "rollout/samples": float(sum(len(g.trajectories) for g in groups)),
        "rollout/output_tokens": float(sum(len(c.output_ids) for c in calls)),
        "rollout/resumed_calls": float(sum(1 for c in calls if c.num_resumes)),  # resubmitted by the client
        # calls a push landed in (however they went on): versions never decrease along a call
        "rollout/calls_across_pushes": float(sum(1 for c in calls if c.output_versions
                                                 and c.output_versions[0] != c.output_versions[-1])),
        "rollout/resubmitted_tokens": float(sum(c.resubmitted_tokens for c in calls)),
        # interrupted calls' tokens per piece between interruptions, and interruptions before a piece had a token
        # (pushes denser than the engine prefills again: `engine.starved_interruptions`)
        "rollout/tokens_between_interruptions": (
            sum(len(c.output_ids) for c in resumed) / sum(c.num_resumes + 1 for c in resumed) if resumed else 0.0),
        "rollout/starved_resumes": float(sum(c.starved_resumes for c in calls)),
    }


def step_stats(groups: Sequence[TrajectoryGroup], trainer_version: int) -> dict[str, float]:
    """What a train step reports of its groups: rewards, token staleness, generation and the harness's metrics
    (pure: the training loop computes it in a worker thread)."""
    return {**reward_stats(groups), **token_staleness(groups, trainer_version), **generation_stats(groups),
            **harness_stats(groups), **teacher_stats(groups)}


def format_line(step: int, metrics: Mapping[str, float]) -> str:
    def get(key: str, spec: str = ".3f") -> str:
        value = metrics.get(key)
        return "-" if value is None else format(value, spec)

    total = metrics.get("progress/total_steps")
    eta = metrics.get("progress/eta_s")
    of = f"/{total:.0f}" if total else ""
    remaining = f" | eta {_duration(eta)}" if eta is not None else ""
    places = metrics.get("batch/late_places")
    late = f" late {metrics.get('batch/late_joined', 0.0):.0f}/{places:.0f}" if places else ""
    restarts = metrics.get("trainer/restarts")
    healed = f" | trainer restarts {restarts:.0f}" if restarts else ""
    kv_waits = metrics.get("kv/waits")
    tasks = task_summary(metrics, TASK_REWARD)
    kv = f" | kv waits {kv_waits:.0f} now {metrics.get('kv/episodes_waiting', 0.0):.0f}" if kv_waits else ""
    return (
        f"step {step:>4}{of} | reward {get('reward/mean')} ± {get('reward/std')}{tasks} | staleness mean "
        f"{get('staleness/mean', '.2f')} max {get('staleness/max', '.0f')} | queue {get('queue/size', '.0f')} "
        f"ahead {get('rollout/lead_batches', '.2f')}{late} | "
        f"samples/s {get('perf/samples_per_s', '.1f')} | tok/s {get('perf/tokens_per_s', '.0f')} | "
        f"idle trainer {get('perf/trainer_idle_frac', '.2f')} rollout {get('perf/rollout_idle_frac', '.2f')} | "
        f"sync {get('weight_sync/total_s', '.3f')}s{kv}{healed}{remaining}"
    )


def _duration(seconds: float) -> str:
    """`1h02m`, `3m05s` or `42s`."""
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class MetricsSink:
    """Writes each step's metrics to a JSONL file and to the loggers the run asked for (`tracking.py`)."""

    def __init__(self, path: Path | None, loggers: Sequence[Logger] = (),
                 rollout_samples: RolloutSamples | None = None) -> None:
        """`loggers`: open logger runs (closed by `close`); `rollout_samples`: where decoded episodes of some steps
        go (`fullasync.observe.samples`), and from there to the loggers as tables; None: nowhere."""
        self.path = path
        self.validation_path = path.with_name("validation.jsonl") if path is not None else None
        self.loggers = list(loggers)
        self.rollout_samples = rollout_samples
        if path is not None and self.validation_path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")  # one file per run
            self.validation_path.write_text("")

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps({"step": step, **metrics}) + "\n")
        for logger in self.loggers:
            logger.log(metrics, step)

    def validation(self, step: int, record: Mapping[str, float]) -> None:
        """One held-out evaluation after `step` steps (0: before training) as a line of validation.jsonl, and to
        the loggers as `val/<name>`."""
        if self.validation_path is not None:
            with self.validation_path.open("a") as out:
                out.write(json.dumps({"step": step, **record}) + "\n")
        for logger in self.loggers:
            logger.log({f"val/{name}": value for name, value in record.items()}, step)

    def samples(self, step: int, groups: Sequence[TrajectoryGroup], trainer_version: int) -> None:
        """The step's episodes, decoded, when this step is one whose samples are kept."""
        if self.rollout_samples is not None and self.rollout_samples.due(step):
            records = self.rollout_samples.write(step, groups, trainer_version)
            if self.loggers:
                rows = sample_rows(records)
                for logger in self.loggers:
                    logger.log_samples(step, rows)

    def rewrite(self, history: Sequence[Mapping[str, float]], validations: Sequence[Mapping[str, float]] = ()) -> None:
        """Start the JSONL files over with `history` (steps 1..N) and `validations` (each with its step): a resumed
        run drops what came after its checkpoint."""
        if self.path is not None:
            self.path.write_text("".join(json.dumps({"step": step, **metrics}) + "\n"
                                         for step, metrics in enumerate(history, start=1)))
        if self.validation_path is not None:
            self.validation_path.write_text("".join(json.dumps({**record, "step": int(record["step"])}) + "\n"
                                                    for record in validations))

    def close(self) -> None:
        close_loggers(self.loggers)
