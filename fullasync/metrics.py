"""Per-step metrics: computed from trained groups, printed as one line, appended to a JSONL file.

Owns: the staleness statistics of trained tokens, the step line on the console, and the sinks
(JSONL always; TensorBoard / Weights & Biases when installed and asked for).
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fullasync.types import TrajectoryGroup


def reward_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    rewards = [r for g in groups for r in g.rewards]
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return {"reward/mean": mean, "reward/std": std}


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


def generation_stats(groups: Sequence[TrajectoryGroup]) -> dict[str, float]:
    calls = [c for g in groups for t in g.trajectories for c in t.calls]
    return {
        "rollout/samples": float(sum(len(g.trajectories) for g in groups)),
        "rollout/output_tokens": float(sum(len(c.output_ids) for c in calls)),
        "rollout/resumed_calls": float(sum(1 for c in calls if c.num_resumes)),
        "rollout/resubmitted_tokens": float(sum(c.resubmitted_tokens for c in calls)),
    }


def format_line(step: int, metrics: Mapping[str, float]) -> str:
    def get(key: str, spec: str = ".3f") -> str:
        value = metrics.get(key)
        return "-" if value is None else format(value, spec)

    return (
        f"step {step:>4} | reward {get('reward/mean')} ± {get('reward/std')} | staleness mean "
        f"{get('staleness/mean', '.2f')} max {get('staleness/max', '.0f')} | queue {get('queue/size', '.0f')} "
        f"ahead {get('rollout/lead_batches', '.2f')} | "
        f"samples/s {get('perf/samples_per_s', '.1f')} | tok/s {get('perf/tokens_per_s', '.0f')} | "
        f"idle trainer {get('perf/trainer_idle_frac', '.2f')} rollout {get('perf/rollout_idle_frac', '.2f')} | "
        f"sync {get('weight_sync/total_s', '.3f')}s"
    )


class MetricsSink:
    """Writes each step's metrics to a JSONL file and to the optional loggers that were asked for."""

    def __init__(self, path: Path | None, tensorboard_dir: Path | None = None,
                 wandb_project: str | None = None) -> None:
        self.path = path
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")  # one file per run
        self._tensorboard = None
        self._wandb = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tensorboard = SummaryWriter(str(tensorboard_dir))
        if wandb_project:
            import wandb

            self._wandb = wandb.init(project=wandb_project)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps({"step": step, **metrics}) + "\n")
        if self._tensorboard is not None:
            for key, value in metrics.items():
                self._tensorboard.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(dict(metrics), step=step)

    def rewrite(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Start the JSONL file over with `history` (steps 1..N): a resumed run drops the steps after its checkpoint."""
        if self.path is not None:
            self.path.write_text("".join(json.dumps({"step": step, **metrics}) + "\n"
                                         for step, metrics in enumerate(history, start=1)))

    def close(self) -> None:
        if self._tensorboard is not None:
            self._tensorboard.close()
        if self._wandb is not None:
            self._wandb.finish()
