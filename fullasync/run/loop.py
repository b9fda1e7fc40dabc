"""The training loop: pull groups, train, push weights, repeat — while the rollouter keeps generating.

Owns: the order of one step (wait for a batch → train → export → push), when to checkpoint, save the model and
validate, the per-step metrics and the step line. It meets the queue through the `Batcher` (which publishes each
hand-over to the rollouter), the trainer through a `HealingTrainer` (a dead rank restarts behind it) and the
rollouter through `RolloutControl` only: what became of the rows it trained, and the report for the step's metrics.
Does not own: generation, storage, the update itself, the version's news (the weight sync tells its observers, the
rollouter among them), crashes elsewhere (the `Run` awaits them beside the loop), validation (the `Run` hands it a
`validate` that pauses generation) or the final row accounting (`Run`).

    while not done:
        groups = await batcher.next_batch(version)     # trainer idle while waiting
        trained = await batcher.train(trainer, groups, version)   # a last-chance step binds its tail late
        await weight_sync.push(await trainer.export_weights())   # version += 1; observers hear of it
        rollouter.on_trained(trained.groups)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol

from fullasync.contracts.run import BatchT, GroupQueue
from fullasync.infra.offload import drop_piecewise, loop_time, off_loop
from fullasync.observe.logs import progress
from fullasync.observe.metrics import MetricsSink, format_line
from fullasync.rollout.rollouter import RolloutReport
from fullasync.run.batching import Batcher
from fullasync.run.checkpoint import LoopState
from fullasync.run.healing import HealingTrainer
from fullasync.run.result import LoopResult
from fullasync.types import TrajectoryGroup
from fullasync.weights.sync import WeightPushTiming, WeightSync

step_log = logging.getLogger("fullasync.steps")


class RolloutControl(Protocol):
    """The rollouter as the loop sees it. New versions reach it from the weight sync and hand-overs from the batcher
    (it observes both), its crash from the `Run`: the loop only tells it which rows trained, and reads its report."""

    def on_trained(self, groups: Sequence[TrajectoryGroup]) -> None: ...

    def report(self, rows: bool = True) -> RolloutReport: ...  # rows=False: without the per-row outcomes


@dataclass(frozen=True)
class LoopSettings:
    total_steps: int  # 0 = until the rows run out
    batch_size: int  # groups per step (the metrics count the rollouter's lead in batches)
    val_every: int = 0  # validate every this many steps (with `LoopHooks.validate`; always after the last)
    checkpoint_every: int = 0  # `LoopHooks.checkpoint` every this many steps (0: only after the last, and on stop)
    save_model_every: int = 0  # `LoopHooks.save_model` every this many steps (0: never)


@dataclass(frozen=True)
class LoopHooks:
    """What the `Run` does at the loop's step boundaries. `checkpoint(pending)` saves the run (`pending`: groups taken
    from the queue, not trained; None back: it could not be written, the next one tries again); `save_model(step)`
    writes the policy for use elsewhere; `more_stats()`: counts of other components for each step's metrics."""

    validate: Callable[[], Awaitable[float]] | None = None
    checkpoint: Callable[[list[TrajectoryGroup]], Awaitable[object | None]] | None = None
    save_model: Callable[[int], Awaitable[object]] | None = None
    more_stats: Callable[[], Awaitable[Mapping[str, float]]] | None = None


class TrainingLoop(Generic[BatchT]):
    """The steps of one run, for a trainer whose batches are `BatchT` (the loop only passes them on)."""

    def __init__(self, *, trainer: HealingTrainer[BatchT], batcher: Batcher[BatchT], rollouter: RolloutControl,
                 weight_sync: WeightSync, sink: MetricsSink, settings: LoopSettings,
                 hooks: LoopHooks | None = None) -> None:
        self.trainer = trainer
        self.batcher = batcher
        self.rollouter = rollouter
        self.weight_sync = weight_sync
        self.sink = sink
        self.settings = settings
        self.hooks = hooks if hooks is not None else LoopHooks()
        self.result = LoopResult()
        self._tokens = 0.0
        self._checkpointed_step: int | None = None

    @property
    def queue(self) -> GroupQueue:
        return self.batcher.queue

    @property
    def stop_requested(self) -> bool:
        return self.batcher.stopping

    def request_stop(self) -> None:
        """Stop at the next step boundary (a step under way finishes; a batch being waited for is handed over as it
        is, for the checkpoint to keep), checkpoint, and return."""
        self.batcher.stop()

    def state(self, first_version: int) -> LoopState:
        r = self.result
        return LoopState(steps=r.steps, version=self.weight_sync.version, first_version=first_version,
                         trained_samples=r.trained_samples, train_wall_s=r.train_wall_s,
                         max_token_staleness=r.max_token_staleness, val_before=r.val_before,
                         val_failed_episodes=r.val_failed_episodes, output_tokens=self._tokens,
                         idle_s=self.batcher.idle_s, history=[dict(step) for step in r.history],
                         validations=[dict(v) for v in r.validations])

    def restore(self, state: LoopState) -> None:
        """Continue counting from a checkpoint's loop state (steps, history, clocks)."""
        r = self.result
        r.steps, r.trained_samples, r.train_wall_s = state.steps, state.trained_samples, state.train_wall_s
        r.max_token_staleness, r.val_before = state.max_token_staleness, state.val_before
        r.val_failed_episodes, r.history = state.val_failed_episodes, list(state.history)
        r.validations = [dict(v) for v in state.validations]
        r.resumed_from_step = state.steps
        self._tokens, self.batcher.idle_s, self._checkpointed_step = state.output_tokens, state.idle_s, state.steps

    async def run(self) -> LoopResult:
        """Train until `total_steps`, the rows run out or a stop is requested; checkpoint; validate at the end."""
        result, settings, hooks = self.result, self.settings, self.hooks
        started = loop_time() - result.train_wall_s  # a resumed run goes on counting its training time
        pending: list[TrajectoryGroup] = []
        while (settings.total_steps == 0 or result.steps < settings.total_steps) and not self.stop_requested:
            groups = await self.batcher.next_batch(self.weight_sync.version)
            if self.stop_requested:
                pending = groups  # not trained: the checkpoint keeps them with the queued groups
                break
            if not groups:
                break
            await self._step(groups, started)
            if _due(settings.checkpoint_every, result.steps):
                await self._checkpoint([], started)
            if hooks.save_model is not None and _due(settings.save_model_every, result.steps):
                await hooks.save_model(result.steps)
            if hooks.validate is not None and _due(settings.val_every, result.steps):
                accuracy = await hooks.validate()
                if result.history:
                    result.history[-1]["val/accuracy"] = accuracy
        result.train_wall_s = loop_time() - started
        if self.stop_requested:
            result.interrupted = True
            await self._checkpoint(pending, started)
        else:
            if settings.checkpoint_every and self._checkpointed_step != result.steps:
                await self._checkpoint([], started)
            if hooks.validate is not None:
                result.val_after = await hooks.validate()
        result.trainer_restarts, result.trainer_restart_s = self.trainer.restarts, self.trainer.restart_s
        return result

    async def _checkpoint(self, pending: list[TrajectoryGroup], started: float) -> None:
        save = self.hooks.checkpoint
        if save is None:
            return
        self.result.train_wall_s = loop_time() - started
        saved = await self.trainer.healed(lambda: save(pending))  # a rank that died while it wrote: heal, save again
        if saved is not None:
            self._checkpointed_step = self.result.steps
            self.trainer.checkpointed()

    async def _step(self, groups: list[TrajectoryGroup], started: float) -> None:
        """Train one batch, push its weights (the weight sync's observers learn the new version), report it."""
        version = self.weight_sync.version
        trained = await self.batcher.train(self.trainer, groups, version)
        push = await self.weight_sync.push(await self.trainer.export_weights())
        self.rollouter.on_trained(trained.groups)
        result = self.result
        result.steps += 1
        result.trained_samples += sum(len(g.trajectories) for g in trained.groups)
        result.trainer_restarts, result.trainer_restart_s = self.trainer.restarts, self.trainer.restart_s
        metrics = await trained.all_metrics()
        result.max_token_staleness = max(result.max_token_staleness, int(metrics["staleness/max"]))
        metrics.update(await self._run_metrics(push, started, metrics["rollout/output_tokens"]))
        self._tokens += metrics["rollout/output_tokens"]
        result.history.append(metrics)
        self.sink.write(result.steps, metrics)
        self.sink.samples(result.steps, trained.groups, version)
        total = self.settings.total_steps
        step_log.info(format_line(result.steps, metrics),
                      extra=progress("steps", result.steps, total) if total else None)
        await off_loop(drop_piecewise, trained.groups)  # the step's trajectories freed beside the loop

    async def _run_metrics(self, push: WeightPushTiming, started: float, new_tokens: float) -> dict[str, float]:
        """The run so far, after a step: queue, rollout, throughput, progress and the push's timing."""
        result = self.result
        stats = await self.queue.stats()
        report = self.rollouter.report(rows=False)  # every step: the per-row map grows with the run
        elapsed = loop_time() - started
        total = self.settings.total_steps
        metrics = {
            "version": float(push.version),
            "queue/size": float(stats.size),
            "queue/dropped_too_stale": float(stats.dropped_too_stale),
            "rollout/episode_failures": float(report.episode_failures),
            "perf/trainer_idle_frac": self.batcher.idle_s / max(elapsed, 1e-9),
            "perf/rollout_idle_frac": report.idle_fraction,
            "rollout/lead_batches": report.lead_rows / self.settings.batch_size,
            "perf/samples_per_s": result.trained_samples / elapsed,
            "perf/elapsed_s": elapsed,  # the training loop's wall time so far (score against wall-clock)
            "progress/total_steps": float(total),
            **({"progress/eta_s": elapsed / result.steps * (total - result.steps)} if total else {}),
            "perf/tokens_per_s": (self._tokens + new_tokens) / elapsed,
            "weight_sync/total_s": push.total_s,
            "weight_sync/pause_s": push.pause_s,
            "weight_sync/update_s": push.update_s,
            "weight_sync/starved_requests": float(push.starved),  # interrupted before a token (engine.starved_*)
            "weight_sync/starved_wait_s": push.starved_wait_s,
            "engines/restarts": float(self.weight_sync.restarts),
            "trainer/restarts": float(self.trainer.restarts),
            **{f"rows/{k}": float(v) for k, v in report.outcome_counts.items()},
            **{f"rollout/failures/{kind}": float(count) for kind, count in report.failure_kinds.items()},
            "rollout/infra_retries": float(report.infra_retries),
            **{f"rollout/curriculum/{pool}": float(rows) for pool, rows in report.curriculum_pools.items()},
        }
        if self.hooks.more_stats is not None:
            metrics.update(await self.hooks.more_stats())
        return metrics


def _due(every: int, steps: int) -> bool:
    """Whether a periodic action (every `every` steps; 0: never) falls after step `steps`."""
    return every > 0 and steps % every == 0
