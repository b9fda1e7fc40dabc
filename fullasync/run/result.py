"""What a run did: `LoopResult`, filled by the training loop step by step and completed from the rollouter's report.

Owns: the run's account (steps, accuracy before and after, row outcomes, failures, restarts, the history of step
metrics) and its JSON summary. Does not own: the metrics themselves (the loop and `observe.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fullasync.rollout.rollouter import RolloutReport
from fullasync.types import JsonValue


@dataclass
class LoopResult:
    """What a run did: steps, accuracy before/after, row outcomes, the worst staleness seen."""

    steps: int = 0
    val_before: float | None = None
    val_after: float | None = None
    val_failed_episodes: int = 0  # validation episodes that raised or timed out (each scored 0), over the run
    # every held-out evaluation: {"step": steps trained before it (0: before training), "score", "stderr", metrics}
    validations: list[dict[str, float]] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    row_outcomes: dict[str, str] = field(default_factory=dict)
    trained_rows_seen_twice: list[str] = field(default_factory=list)
    max_token_staleness: int = 0
    trained_samples: int = 0
    train_wall_s: float = 0.0
    episode_failures: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)  # e.g. {"InvalidRequestError(seed)": 12}
    failure_kinds: dict[str, int] = field(default_factory=dict)  # e.g. {"infra": 3, "model": 1} (FailureKind)
    infra_retries: int = 0  # episodes run again after an infrastructure failure
    history: list[dict[str, float]] = field(default_factory=list)
    interrupted: bool = False  # stopped by a signal (after saving a checkpoint, when checkpoints are on)
    resumed_from_step: int | None = None  # the checkpoint's step when the run was resumed
    failed_saves: int = 0  # checkpoints and model folders that could not be written (a full disk): the run went on
    trainer_restarts: int = 0  # times a trainer rank died and the trainer started again from a checkpoint
    trainer_restart_s: float = 0.0  # training time those restarts cost (start, load, steps trained again)

    @property
    def samples_per_s(self) -> float:
        return self.trained_samples / self.train_wall_s if self.train_wall_s else 0.0

    def account(self, report: RolloutReport) -> None:
        """The rows' part of the account, from the rollouter's final report (every row's outcome included)."""
        self.outcomes, self.row_outcomes = dict(report.outcome_counts), dict(report.row_outcomes)
        self.trained_rows_seen_twice = list(report.trained_twice)
        self.episode_failures, self.infra_retries = report.episode_failures, report.infra_retries
        self.failure_reasons, self.failure_kinds = dict(report.failure_reasons), dict(report.failure_kinds)

    def summary(self) -> dict[str, JsonValue]:
        """The run in a few JSON-ready numbers (what examples write to their summary.json)."""
        return {
            "train_wall_s": self.train_wall_s, "steps": self.steps, "rows": self.outcomes,
            "episode_failures": self.episode_failures, "failure_reasons": self.failure_reasons,
            "failure_kinds": self.failure_kinds, "infra_retries": self.infra_retries,
            "max_token_staleness": self.max_token_staleness,
            "resumed_calls": sum(step.get("rollout/resumed_calls", 0.0) for step in self.history),
            "interrupted": self.interrupted, "resumed_from_step": self.resumed_from_step,
            "failed_saves": self.failed_saves, "trainer_restarts": self.trainer_restarts,
            "trainer_restart_s": self.trainer_restart_s,
            "val_before": self.val_before, "val_after": self.val_after, **self.val_stderrs(),
            "validations": [dict(v) for v in self.validations],
        }

    def val_stderrs(self) -> dict[str, JsonValue]:
        """The standard errors of the first and the last evaluation (val_before's and val_after's)."""
        if not self.validations:
            return {}
        first, last = self.validations[0], self.validations[-1]
        return {"val_before_stderr": first.get("stderr") if first["step"] == 0 else None,
                "val_after_stderr": last.get("stderr") if self.val_after is not None else None}
