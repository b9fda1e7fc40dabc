"""The training loop: pull groups, train, push weights, repeat — while the rollouter keeps generating.

Owns: the order of one step (wait for a batch → train → export → push → bump version), the
per-step metrics, validation with generation paused, and the final accounting of every row.
Does not own: generation (Rollouter), storage (MessageQueue), the update itself (VerlTrainer).

    while not done:
        groups = await queue.get(B, version, k)      # trainer idle while waiting
        metrics = await trainer.train_step(trainer.build_batch(groups))
        await weight_sync.push(await trainer.export_weights())   # version += 1
        rollouter.on_version()                        # admission may open
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fullasync.metrics import MetricsSink, format_line, generation_stats, reward_stats, token_staleness
from fullasync.rollout.rollouter import Rollouter, RowOutcome
from fullasync.rollout.staleness import StalenessManager
from fullasync.types import TrajectoryGroup
from fullasync.weight_sync import WeightSync

QUEUE_POLL_S = 2.0  # a queue wait returns at least this often, so a crashed rollouter is noticed


def _now() -> float:
    """The event loop's clock (`time.monotonic` on a normal loop; simulated time under fullasync.sim)."""
    return asyncio.get_running_loop().time()


@dataclass
class LoopResult:
    """What a run did: steps, accuracy before/after, row outcomes, the worst staleness seen."""

    steps: int = 0
    val_before: float | None = None
    val_after: float | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    row_outcomes: dict[str, str] = field(default_factory=dict)
    trained_rows_seen_twice: list[str] = field(default_factory=list)
    max_token_staleness: int = 0
    trained_samples: int = 0
    train_wall_s: float = 0.0
    episode_failures: int = 0
    failure_reasons: dict[str, int] = field(default_factory=dict)  # e.g. {"InvalidRequestError(seed)": 12}
    history: list[dict[str, float]] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.trained_samples / self.train_wall_s if self.train_wall_s else 0.0


class TrainingLoop:
    def __init__(self, *, trainer: Any, rollouter: Rollouter, queue: Any, weight_sync: WeightSync,
                 staleness: StalenessManager, batch_size: int, total_steps: int, val_every: int,
                 validate: Callable[[], Awaitable[float]] | None, sink: MetricsSink) -> None:
        self.trainer = trainer
        self.rollouter = rollouter
        self.queue = queue
        self.weight_sync = weight_sync
        self.staleness = staleness
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.val_every = val_every
        self.validate = validate
        self.sink = sink
        self.result = LoopResult()
        self._idle_s = 0.0
        self._tokens = 0.0

    async def run(self) -> LoopResult:
        result = self.result
        if self.validate is not None:
            result.val_before = await self.validate()
            print(f"[fullasync] held-out accuracy before training: {result.val_before:.3f}", flush=True)
        started = _now()
        while self.total_steps == 0 or result.steps < self.total_steps:
            groups = await self._next_batch()
            if not groups:
                break
            await self._step(groups, started)
            if self.validate is not None and self.val_every and result.steps % self.val_every == 0:
                await self._validate_paused()
        result.train_wall_s = _now() - started
        if self.validate is not None:
            result.val_after = await self._validate_paused()
        result.outcomes = dict(self.rollouter.outcome_counts())
        result.row_outcomes = {row_id: outcome.value for row_id, outcome in self.rollouter.outcomes.items()}
        result.trained_rows_seen_twice = list(self.rollouter.trained_twice)
        result.episode_failures = self.rollouter.episode_failures
        result.failure_reasons = dict(self.rollouter.failure_reasons)
        return result

    async def _next_batch(self) -> list[TrajectoryGroup]:
        """B groups fresh enough for the current version; fewer only when the rows ran out."""
        groups: list[TrajectoryGroup] = []
        version = self.weight_sync.version
        k = self.staleness.max_staleness
        waited = _now()
        while len(groups) < self.batch_size:
            self.rollouter.check()
            self.weight_sync.check_engines()  # a dead engine ends the run now, with its name
            exhausted = self.rollouter.exhausted  # read before the get: then nothing arrives after it
            got = await self.queue.get.remote(self.batch_size - len(groups), version, k,
                                              0.0 if exhausted else QUEUE_POLL_S)
            for row_id in got.dropped_row_ids:
                self.rollouter.mark(row_id, RowOutcome.TOO_STALE)
                self.staleness.release()
                self.rollouter.on_version()
            groups += got.groups
            if exhausted:
                break
        self._idle_s += _now() - waited
        return groups

    async def _step(self, groups: list[TrajectoryGroup], started: float) -> None:
        result = self.result
        version = self.weight_sync.version
        batch = self.trainer.build_batch(groups)
        metrics = dict(await self.trainer.train_step(batch, version))
        timing = await self.weight_sync.push(await self.trainer.export_weights())
        self.rollouter.on_version()
        for group in groups:
            self.rollouter.mark(group.row_id, RowOutcome.TRAINED)
        result.steps += 1
        result.trained_samples += sum(len(g.trajectories) for g in groups)
        metrics.update(reward_stats(groups))
        metrics.update(token_staleness(groups, version))
        metrics.update(generation_stats(groups))
        result.max_token_staleness = max(result.max_token_staleness, int(metrics["staleness/max"]))
        stats = await self.queue.stats.remote()
        elapsed = _now() - started
        metrics.update({
            "version": float(timing.version),
            "queue/size": float(stats.size),
            "queue/dropped_too_stale": float(stats.dropped_too_stale),
            "rollout/episode_failures": float(self.rollouter.episode_failures),
            "perf/trainer_idle_frac": self._idle_s / max(elapsed, 1e-9),
            "perf/rollout_idle_frac": self.rollouter.idle_fraction(),
            "perf/samples_per_s": result.trained_samples / elapsed,
            "perf/tokens_per_s": (self._tokens + metrics["rollout/output_tokens"]) / elapsed,
            "weight_sync/total_s": timing.total_s,
            "weight_sync/pause_s": timing.pause_s,
            "weight_sync/update_s": timing.update_s,
        })
        metrics.update({f"rows/{k}": float(v) for k, v in self.rollouter.outcome_counts().items()})
        self._tokens += metrics["rollout/output_tokens"]
        result.history.append(metrics)
        self.sink.write(result.steps, metrics)
        print(format_line(result.steps, metrics), flush=True)

    async def _validate_paused(self) -> float:
        """Validation with training rollouts paused: stop admitting, let running rows finish, resume."""
        self.rollouter.pause_admission()
        try:
            await self.rollouter.wait_idle(timeout_s=600.0)
            accuracy = await self.validate()
        finally:
            self.rollouter.resume_admission()
        if self.result.history:
            self.result.history[-1]["val/accuracy"] = accuracy
        print(f"[fullasync] step {self.result.steps}: held-out accuracy {accuracy:.3f}", flush=True)
        return accuracy
