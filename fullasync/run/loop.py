"""The training loop: pull groups, train, push weights, repeat — while the rollouter keeps generating.

Owns: the order of one step (wait for a batch → train → export → push), the per-step metrics and the step
line. It meets the rollouter only through `RolloutControl` (what became of the rows it was handed, trained
or dropped), the queue through `GroupQueue` and the trainer through `Trainer`; healing a trainer whose rank
died (`_heal`). Does not own: generation, storage, the update itself, the version's news (the weight sync tells
its observers, the rollouter among them), crashes elsewhere (the `Run` awaits them beside the loop),
validation (the `Run` hands it a `validate` that pauses generation) or the final row accounting (`Run`).

    while not done:
        groups = await queue.get(B, version, k)       # trainer idle while waiting
        metrics = await trainer.train_step(trainer.build_batch(groups), version)
        # (a last-chance step trains its oldest groups first and takes its last ones when it reaches them)
        await weight_sync.push(await trainer.export_weights())   # version += 1; observers hear of it
        rollouter.on_trained(groups)

A trainer rank that dies (`TrainerWorkerDiedError`) costs minutes, not the run: the trainer restarts from the
newest complete checkpoint (`restart_trainer`) and trains again, batch by batch, the steps since — the loop keeps
their batches until the next checkpoint — then the step under way goes on. Engines keep serving meanwhile, within
the staleness bound; versions only grow (the restarted lineage's first push is the next version); every row is
trained once into the weights that go on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol

from fullasync.contracts.run import BatchT, GroupQueue, QueueBatch, Trainer, oldest_allowed, oldest_version
from fullasync.errors import TrainerWorkerDiedError
from fullasync.infra.offload import drop_piecewise, off_loop
from fullasync.observe.logs import progress
from fullasync.observe.metrics import MetricsSink, format_line, step_stats
from fullasync.rollout.rollouter import RolloutReport
from fullasync.run.checkpoint import LoopState
from fullasync.types import JsonValue, TrajectoryGroup
from fullasync.weights.sync import WeightPushTiming, WeightSync

# A queue wait returns at least this often: the rows a get dropped as too stale free their admission slots (the
# rollouter hears of them when it returns), and rows that ran out while the trainer waited end the run. Crashes do
# not wait for it: the `Run` awaits the rollouter's and the weight sync's failures beside the loop.
QUEUE_WAIT_S = 2.0

step_log = logging.getLogger("fullasync.steps")
log = logging.getLogger("fullasync")
RESTART_BACKOFF_S = (1.0, 30.0)  # a trainer restart waits the first, doubled per restart of the run, at most the second


def _now() -> float:
    """The event loop's clock (`time.monotonic` on a normal loop; simulated time under fullasync.sim)."""
    return asyncio.get_running_loop().time()


class RolloutControl(Protocol):
    """The rollouter as the loop sees it. New versions reach it from the weight sync (it observes the sync), and
    its crash from the `Run`, which waits for it beside the loop: the loop only tells it what became of rows."""

    @property
    def exhausted(self) -> bool: ...  # no more rows to admit and none running

    def on_handed_over(self, got: QueueBatch, asked: bool) -> None: ...  # a get's drops (asked: a batch's first get)

    def on_batch_taken(self, version: int) -> None: ...  # rows that only the batch just taken could train stop

    def on_trained(self, groups: Sequence[TrajectoryGroup]) -> None: ...

    def last_chance_rows(self, version: int) -> int: ...  # running rows only the batch at `version` can train

    def report(self, rows: bool = True) -> RolloutReport: ...  # rows=False: without the per-row outcomes


@dataclass
class StepOutcome:
    """What one update did: the groups it trained (in order), its metrics, and the batch's statistics (computed
    beside the update, off the loop, once the batch is complete)."""

    groups: list[TrajectoryGroup]
    metrics: dict[str, float]
    batch_stats: asyncio.Future[dict[str, float]] | None = None

    async def all_metrics(self) -> dict[str, float]:
        if self.batch_stats is None:
            raise RuntimeError("the trainer never asked for the rest of its batch: a `train_step` given `late` must "
                               "await it once")
        return {**self.metrics, **await self.batch_stats}


@dataclass
class LoopResult:
    """What a run did: steps, accuracy before/after, row outcomes, the worst staleness seen."""

    steps: int = 0
    val_before: float | None = None
    val_after: float | None = None
    val_failed_episodes: int = 0  # validation episodes that raised or timed out (each scored 0), over the run
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
        }


class TrainingLoop(Generic[BatchT]):
    """The steps of one run, for a trainer whose batches are `BatchT` (the loop only passes them on)."""

    def __init__(self, *, trainer: Trainer[BatchT], rollouter: RolloutControl, queue: GroupQueue,
                 weight_sync: WeightSync, max_staleness: int, batch_size: int, total_steps: int, val_every: int,
                 validate: Callable[[], Awaitable[float]] | None, sink: MetricsSink,
                 checkpoint: Callable[[list[TrajectoryGroup]], Awaitable[object | None]] | None = None,
                 checkpoint_every: int = 0, save_model: Callable[[int], Awaitable[object]] | None = None,
                 save_model_every: int = 0, more_stats: Callable[[], Awaitable[Mapping[str, float]]] | None = None,
                 bind_late: bool = True, restart_trainer: Callable[[], Awaitable[str]] | None = None,
                 max_trainer_restarts: int = 0) -> None:
        """`checkpoint(pending)` saves the run (`pending`: groups taken from the queue, not trained; None back: it
        could not be written, the next one tries again); it runs every `checkpoint_every` steps (0: never
        periodically), after the last step, and on `request_stop()`.
        `save_model(step)` writes the policy for use elsewhere (a Hugging Face folder) every `save_model_every`
        steps. `more_stats()`: counts of other components for each step's metrics (the gateway's). `bind_late`: a
        step whose batch is the last chance for rows still running trains its oldest groups first and takes its
        last ones when the trainer reaches them (`_late_places`), where the trainer can (`Trainer.binds_late`).
        `restart_trainer()`: starts the trainer again as of the newest complete checkpoint (None: the one this run
        began with) and says which; up to `max_trainer_restarts` times a dead rank is healed (`_heal`)."""
        self.trainer = trainer
        self.rollouter = rollouter
        self.queue = queue
        self.weight_sync = weight_sync
        self.max_staleness = max_staleness
        self.batch_size = batch_size
        self.total_steps = total_steps
        self.val_every = val_every
        self.validate = validate
        self.sink = sink
        self.checkpoint = checkpoint
        self.checkpoint_every = checkpoint_every
        self.save_model = save_model
        self.save_model_every = save_model_every
        self.more_stats = more_stats
        self.bind_late = bind_late
        self.restart_trainer = restart_trainer if max_trainer_restarts > 0 else None
        self.max_trainer_restarts = max_trainer_restarts
        self._since_checkpoint: list[tuple[BatchT, BatchT | None, int]] = []  # what a restart trains again
        self.result = LoopResult()
        self.stop_requested = False
        self._idle_s = 0.0
        self._tokens = 0.0
        self._checkpointed_step: int | None = None

    def request_stop(self) -> None:
        """Stop at the next step boundary (a step under way finishes), checkpoint, and return."""
        self.stop_requested = True

    def state(self, first_version: int) -> LoopState:
        r = self.result
        return LoopState(steps=r.steps, version=self.weight_sync.version, first_version=first_version,
                         trained_samples=r.trained_samples, train_wall_s=r.train_wall_s,
                         max_token_staleness=r.max_token_staleness, val_before=r.val_before,
                         val_failed_episodes=r.val_failed_episodes, output_tokens=self._tokens, idle_s=self._idle_s,
                         history=[dict(step) for step in r.history])

    def restore(self, state: LoopState) -> None:
        """Continue counting from a checkpoint's loop state (steps, history, clocks)."""
        r = self.result
        r.steps, r.trained_samples, r.train_wall_s = state.steps, state.trained_samples, state.train_wall_s
        r.max_token_staleness, r.val_before = state.max_token_staleness, state.val_before
        r.val_failed_episodes, r.history = state.val_failed_episodes, list(state.history)
        r.resumed_from_step = state.steps
        self._tokens, self._idle_s, self._checkpointed_step = state.output_tokens, state.idle_s, state.steps

    async def run(self) -> LoopResult:
        """Train until `total_steps`, the rows run out or a stop is requested; checkpoint; validate at the end."""
        result = self.result
        started = _now() - result.train_wall_s  # a resumed run goes on counting its training time
        pending: list[TrajectoryGroup] = []
        while (self.total_steps == 0 or result.steps < self.total_steps) and not self.stop_requested:
            groups = await self._next_batch()
            if self.stop_requested:
                pending = groups  # not trained: the checkpoint keeps them with the queued groups
                break
            if not groups:
                break
            await self._step(groups, started)
            if self.checkpoint_every and result.steps % self.checkpoint_every == 0:
                await self._checkpoint([], started)
            if self.save_model is not None and self.save_model_every and result.steps % self.save_model_every == 0:
                await self.save_model(result.steps)
            if self.validate is not None and self.val_every and result.steps % self.val_every == 0:
                accuracy = await self.validate()
                if result.history:
                    result.history[-1]["val/accuracy"] = accuracy
        result.train_wall_s = _now() - started
        if self.stop_requested:
            result.interrupted = True
            if self.checkpoint is not None:
                await self._checkpoint(pending, started)
            return result
        if self.checkpoint_every and self._checkpointed_step != result.steps:
            await self._checkpoint([], started)
        if self.validate is not None:
            result.val_after = await self.validate()
        return result

    async def _checkpoint(self, pending: list[TrajectoryGroup], started: float) -> None:
        if self.checkpoint is None:
            return
        self.result.train_wall_s = _now() - started
        try:
            saved = await self.checkpoint(pending)
        except TrainerWorkerDiedError as error:  # a rank died while it wrote its part: heal, then save again
            await self._heal(error)
            saved = await self.checkpoint(pending)
        if saved is not None:
            self._checkpointed_step = self.result.steps
            self._since_checkpoint.clear()

    async def _next_batch(self) -> list[TrajectoryGroup]:
        """B groups fresh enough for the current version; fewer only when the rows ran out."""
        groups: list[TrajectoryGroup] = []
        version = self.weight_sync.version
        waited = _now()
        asked = True  # the first get answers the trainer's request (admission paces by what it found)
        while len(groups) < self.batch_size and not self.stop_requested:
            exhausted = self.rollouter.exhausted  # read before the get: then nothing arrives after it
            got = await self.queue.get(self.batch_size - len(groups), version, self.max_staleness,
                                       0.0 if exhausted else QUEUE_WAIT_S)
            self.rollouter.on_handed_over(got, asked)
            asked = False
            groups += got.groups
            if exhausted:
                break
        self._idle_s += _now() - waited
        return groups

    def _late_places(self, version: int, groups: list[TrajectoryGroup]) -> int:
        """How many of this step's groups to take only when the trainer reaches them: as many as rows still
        running can be trained by no later batch, at most half the batch, and no more than the batch holds groups
        a later batch can still take (a held place can only go to a straggler if its group can wait). Those rows
        get the time the trainer spends on the first part to finish in, instead of being dropped at the next
        hand-over."""
        if not (self.bind_late and self.trainer.binds_late) or len(groups) < 2:
            return 0
        next_batch_takes = oldest_allowed(version + 1, self.max_staleness)
        can_wait = sum(oldest_version(g) >= next_batch_takes for g in groups)
        return min(self.rollouter.last_chance_rows(version), can_wait, len(groups) // 2)

    async def _bind_late(self, held: list[TrajectoryGroup], version: int) -> list[TrajectoryGroup]:
        """The step's last `len(held)` groups: the oldest of `held` and of what finished meanwhile (the rows
        that only this batch can train come first); the others go back to the queue for the next step."""
        got = await self.queue.get(len(held), version, self.max_staleness, 0.0)
        self.rollouter.on_handed_over(got, asked=False)
        offered = sorted(held + got.groups, key=oldest_version)  # stable: the held ones came first
        taken, back = offered[: len(held)], offered[len(held):]
        if back:
            await self.queue.give_back(back)
        return taken

    async def _step(self, groups: list[TrajectoryGroup], started: float) -> None:
        """Train one batch, push its weights (the weight sync's observers learn the new version), report it."""
        version = self.weight_sync.version
        trained = await self._train(groups, version)
        while True:
            try:
                weights = await self.trainer.export_weights()
                break
            except TrainerWorkerDiedError as error:
                await self._heal(error)
        push = await self.weight_sync.push(weights)
        self.rollouter.on_trained(trained.groups)
        result = self.result
        result.steps += 1
        result.trained_samples += sum(len(g.trajectories) for g in trained.groups)
        metrics = await trained.all_metrics()
        result.max_token_staleness = max(result.max_token_staleness, int(metrics["staleness/max"]))
        metrics.update(await self._run_metrics(push, started, metrics["rollout/output_tokens"]))
        self._tokens += metrics["rollout/output_tokens"]
        result.history.append(metrics)
        self.sink.write(result.steps, metrics)
        self.sink.samples(result.steps, trained.groups, version)
        step_log.info(format_line(result.steps, metrics),
                      extra=progress("steps", result.steps, self.total_steps) if self.total_steps else None)
        await off_loop(drop_piecewise, trained.groups)  # the step's trajectories freed beside the loop

    async def _train(self, groups: list[TrajectoryGroup], version: int) -> StepOutcome:
        """One update on `groups` at `version`; a step that binds late takes its last groups when the trainer
        reaches them (`_late_places`)."""
        late = self._late_places(version, groups)
        outcome = StepOutcome(groups, {"batch/late_places": float(late), "batch/late_joined": 0.0})

        def taken(final: list[TrajectoryGroup]) -> None:
            self.rollouter.on_batch_taken(version)
            outcome.batch_stats = asyncio.ensure_future(off_loop(step_stats, final, version))  # beside the update

        if not late:
            taken(groups)
            batch = await off_loop(self.trainer.build_batch, groups)  # in proportion to the batch: off the loop
            outcome.metrics.update(await self._train_step(batch, version))
            return outcome
        groups.sort(key=oldest_version)  # each get hands over oldest first, but a batch may take several
        groups[:], held = groups[:-late], groups[-late:]  # the youngest wait

        async def take_late() -> BatchT:
            second = await self._bind_late(held, version)
            outcome.metrics["batch/late_joined"] = float(len({id(g) for g in second} - {id(h) for h in held}))
            groups.extend(second)
            taken(groups)
            return await off_loop(self.trainer.build_batch, second)

        batch = await off_loop(self.trainer.build_batch, groups)
        outcome.metrics.update(await self._train_step(batch, version, take_late))
        return outcome

    async def _train_step(self, batch: BatchT, version: int,
                          late: Callable[[], Awaitable[BatchT]] | None = None) -> Mapping[str, float]:
        """`trainer.train_step`, again after a heal when a rank died in it; the step's batch (and its late part,
        taken once whatever the tries) is kept for a later restart until the next checkpoint."""
        rest: list[BatchT] = []

        async def late_once() -> BatchT:
            assert late is not None
            if not rest:
                rest.append(await late())
            return rest[0]

        while True:
            try:
                metrics = await self.trainer.train_step(batch, version, late_once if late is not None else None)
                break
            except TrainerWorkerDiedError as error:
                await self._heal(error)
        if self.restart_trainer is not None:
            self._since_checkpoint.append((batch, rest[0] if rest else None, version))
        return metrics

    async def _heal(self, error: TrainerWorkerDiedError) -> None:
        """Start the trainer again from the newest complete checkpoint and train again the steps since; a rank
        that dies meanwhile costs another restart. Raises `error` when restarts are off or used up."""
        result = self.result
        while True:
            if self.restart_trainer is None or result.trainer_restarts >= self.max_trainer_restarts:
                raise error
            result.trainer_restarts += 1
            wait = min(RESTART_BACKOFF_S[0] * 2 ** (result.trainer_restarts - 1), RESTART_BACKOFF_S[1])
            log.error("%s; restarting the trainer in %.0f s (restart %d of %d) and training again the %d steps "
                      "since its newest checkpoint; engines keep serving", error, wait, result.trainer_restarts,
                      self.max_trainer_restarts, len(self._since_checkpoint))
            await asyncio.sleep(wait)
            began = _now()
            try:
                origin = await self.restart_trainer()
                for batch, rest, version in self._since_checkpoint:
                    await self.trainer.train_step(batch, version, None if rest is None else _ready(rest))
            except TrainerWorkerDiedError as again:
                error = again
                continue
            finally:
                result.trainer_restart_s += _now() - began
            log.warning("trainer restarted from %s and %d steps trained again in %.1f s; the run goes on",
                        origin, len(self._since_checkpoint), _now() - began)
            return

    async def _run_metrics(self, push: WeightPushTiming, started: float, new_tokens: float) -> dict[str, float]:
        """The run so far, after a step: queue, rollout, throughput, progress and the push's timing."""
        result = self.result
        stats = await self.queue.stats()
        report = self.rollouter.report(rows=False)  # every step: the per-row map grows with the run
        elapsed = _now() - started
        metrics = {
            "version": float(push.version),
            "queue/size": float(stats.size),
            "queue/dropped_too_stale": float(stats.dropped_too_stale),
            "rollout/episode_failures": float(report.episode_failures),
            "perf/trainer_idle_frac": self._idle_s / max(elapsed, 1e-9),
            "perf/rollout_idle_frac": report.idle_fraction,
            "rollout/lead_batches": report.lead_rows / self.batch_size,
            "perf/samples_per_s": result.trained_samples / elapsed,
            "perf/elapsed_s": elapsed,  # the training loop's wall time so far (score against wall-clock)
            "progress/total_steps": float(self.total_steps),
            **({"progress/eta_s": elapsed / result.steps * (self.total_steps - result.steps)} if self.total_steps
               else {}),
            "perf/tokens_per_s": (self._tokens + new_tokens) / elapsed,
            "weight_sync/total_s": push.total_s,
            "weight_sync/pause_s": push.pause_s,
            "weight_sync/update_s": push.update_s,
            "weight_sync/starved_requests": float(push.starved),  # interrupted before a token (engine.starved_*)
            "weight_sync/starved_wait_s": push.starved_wait_s,
            "engines/restarts": float(self.weight_sync.restarts),
            "trainer/restarts": float(result.trainer_restarts),
            **{f"rows/{k}": float(v) for k, v in report.outcome_counts.items()},
            **{f"rollout/failures/{kind}": float(count) for kind, count in report.failure_kinds.items()},
            "rollout/infra_retries": float(report.infra_retries),
        }
        if self.more_stats is not None:
            metrics.update(await self.more_stats())
        return metrics


def _ready(batch: BatchT) -> Callable[[], Awaitable[BatchT]]:
    """A `late` that hands over a part taken before (a step trained again after a restart)."""

    async def late() -> BatchT:
        return batch

    return late
