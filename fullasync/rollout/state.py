"""What a checkpoint keeps of the rollout side (`Rollouter.snapshot` writes it, `Rollouter.restore` reads it).

Plain data, no torch: the checkpoint format (`fullasync.run.checkpoint`) stores it as JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fullasync.types import JsonValue, Trajectory


@dataclass
class RolloutState:
    """The rollout side at one instant: what became of every row taken from the dataset so far."""

    admitted: int = 0  # rows the dispatcher took from the row stream (the dataset cursor, epochs included)
    outcomes: dict[str, str] = field(default_factory=dict)  # row ledger: row id -> RowOutcome value
    episode_failures: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)
    failure_kinds: dict[str, int] = field(default_factory=dict)  # FailureKind value -> episodes
    infra_retries: int = 0  # episodes run again after an infrastructure failure
    # finished episodes of running rows
    in_flight: dict[str, dict[int, Trajectory | None]] = field(default_factory=dict)
    kept_tokens: int = 0  # output tokens of the finished episodes of running rows (kept by the checkpoint)
    discarded_tokens: int = 0  # output tokens of the unfinished episodes of running rows (generated again)
    staleness: dict[str, float] = field(default_factory=dict)  # the admission counters when captured (a record)
    curriculum: dict[str, JsonValue] | None = None  # the row sampler's state (`Curriculum.state`), if rows are sampled
