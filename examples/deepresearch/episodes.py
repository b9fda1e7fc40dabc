"""Statistics of finished episodes: turns, lengths, and weight pushes seen mid-episode.

Owns: `EpisodeStats`, a sink the agent adapters call with every training trajectory, and its
summary — the turn-count histogram, output-length percentiles, and how many episodes a weight push
touched: `interrupted` (a generation was aborted by a push and resumed under the new weights) and
`spans_versions` (its tokens come from more than one weight version, e.g. a push during a tool call).
Does not own: the trainer's per-step metrics (fullasync's `metrics.jsonl` counts resumed calls).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullasync.types import Trajectory


@dataclass(frozen=True)
class EpisodeRecord:
    turns: int
    output_tokens: int
    total_tokens: int  # the episode's last context: prompt + everything generated and inserted
    resumed_calls: int  # model calls interrupted by a weight push and continued
    versions: tuple[int, ...]  # distinct weight versions that sampled its tokens
    reward: float
    f1: float

    @property
    def interrupted(self) -> bool:
        return self.resumed_calls > 0

    @property
    def spans_versions(self) -> bool:
        return len(self.versions) > 1


def record_of(trajectory: Trajectory) -> EpisodeRecord:
    calls = trajectory.calls
    return EpisodeRecord(
        turns=len(calls),
        output_tokens=sum(len(c.output_ids) for c in calls),
        total_tokens=len(calls[-1].all_ids),
        resumed_calls=sum(1 for c in calls if c.num_resumes),
        versions=tuple(sorted({v for c in calls for v in c.output_versions})),
        reward=trajectory.reward,
        f1=float(trajectory.metadata.get("f1", 0.0)),
    )


class EpisodeStats:
    """Collects training episodes (pass the instance as the agent's `on_episode`)."""

    def __init__(self, jsonl_path: Path | None = None) -> None:
        self.records: list[EpisodeRecord] = []
        self._file = jsonl_path.open("a", encoding="utf-8") if jsonl_path is not None else None

    def __call__(self, trajectory: Trajectory) -> None:
        record = record_of(trajectory)
        self.records.append(record)
        if self._file is not None:
            self._file.write(json.dumps({**record.__dict__, "metadata": dict(trajectory.metadata)}) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def summary(self) -> dict[str, Any]:
        records = self.records
        if not records:
            return {"episodes": 0}
        lengths = sorted(r.output_tokens for r in records)
        contexts = sorted(r.total_tokens for r in records)
        return {
            "episodes": len(records),
            "turns": dict(sorted(Counter(r.turns for r in records).items())),
            "share_3plus_turns": sum(r.turns >= 3 for r in records) / len(records),
            "output_tokens": {"mean": statistics.fmean(lengths), "p50": _percentile(lengths, 0.5),
                              "p90": _percentile(lengths, 0.9), "max": lengths[-1]},
            "context_tokens": {"mean": statistics.fmean(contexts), "p50": _percentile(contexts, 0.5),
                               "p90": _percentile(contexts, 0.9), "max": contexts[-1]},
            "interrupted_and_resumed": sum(r.interrupted for r in records),
            "spanning_weight_versions": sum(r.spans_versions for r in records),
            "share_push_mid_episode": sum(r.spans_versions or r.interrupted for r in records) / len(records),
        }


def _percentile(ordered: list[int], q: float) -> int:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
