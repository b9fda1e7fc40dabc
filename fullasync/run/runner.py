"""One run and its settings: `Run.execute(rows)` runs the components `assemble` wired, in a run's order.

Owns: `RunSettings` (read from the config once: each field names its setting), the order of a run (held-out
validation with nothing generating, then generation and training, then stopping generation) and the final account
of every row; supervising the training loop beside the rollouter and the engines (a rollouter crash or a failed
engine ends the run at once, naming the row or the engine); starting and stopping the gateway; validation with
training generation paused; capturing the whole run into a checkpoint (rollouter first, then the queue, then the
trainer) and restoring one; a stop request (a signal) that checkpoints and returns; restarting the trainer as of the
newest checkpoint for the `HealingTrainer`. Does not own: building the components (`assemble.py`), starting
engines or the trainer (the caller does, and keeps them), the metrics sink, or any step logic (`loop.py`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from functools import reduce
from pathlib import Path
from typing import Any

from fullasync.config import EngineSection, RolloutSection, RunConfig, shared_settings
from fullasync.contracts.engine import PauseMode
from fullasync.contracts.run import GroupQueue, Trainer
from fullasync.gateway import Gateway
from fullasync.observe.metrics import MetricsSink, task_summary
from fullasync.rollout.rollouter import Rollouter, RolloutSettings, RowOutcome
from fullasync.rollout.staleness import GENERATE_AHEAD, RUNNING_COUNTS
from fullasync.run import checkpoint
from fullasync.run.batching import Batcher, BatchSettings
from fullasync.run.checkpoint import Checkpoint, CheckpointPolicy, SavedCheckpoint
from fullasync.run.export_note import write_export_note
from fullasync.run.healing import HealingTrainer
from fullasync.run.loop import LoopHooks, LoopSettings, TrainingLoop
from fullasync.run.queue import HAND_OVER_ORDERS, RayGroupQueue
from fullasync.run.result import LoopResult
from fullasync.run.validation import TASK_SCORE, Evaluator, evaluate
from fullasync.types import TrajectoryGroup
from fullasync.weights.sync import WeightSync

log = logging.getLogger("fullasync")

VALIDATION_DRAIN_TIMEOUT_S = 600.0  # running rows must finish within this before validation starts


def _at(path: str) -> dict[str, str]:
    """A `RunSettings` field's metadata: the `RunConfig` setting (a dotted path) it is read from."""
    return {"config": path}


@dataclass(frozen=True)
class RunSettings:
    """What the assembly needs to know of a run (from a `RunConfig`, or a simulation's spec). A field read from the
    config names its setting (`_at`): `from_config` reads them all, and the defaults are the config's. Those without
    one are the run's own choice: `restart_engines` is off unless asked for (a run asks with
    engine.restart_on_failure): an assembly on engines of its own (a simulation) supervises nothing."""

    max_staleness: int = field(metadata=_at("staleness"))  # k of the admission bound and the queue's check
    batch_size: int = field(metadata=_at("rollout.batch_size"))  # groups per train step
    total_steps: int = field(metadata=_at("total_steps"))  # 0 = until the rows run out
    rollout: RolloutSettings = field(default_factory=RolloutSettings)  # the `rollout` fields RolloutSettings declares
    push_mode: PauseMode = field(default=PauseMode.ABORT, metadata=_at("push_mode"))
    val_every: int = field(default=RunConfig.val_every, metadata=_at("val_every"))  # (and always before and after)
    val_samples_per_row: int = field(default=RunConfig.val_samples_per_row, metadata=_at("val_samples_per_row"))
    generate_ahead: str = field(default=RunConfig.generate_ahead, metadata=_at("generate_ahead"))  # StalenessManager
    bind_late: bool = field(default=RunConfig.bind_late, metadata=_at("bind_late"))  # run/batching.py
    restart_engines: bool = field(default=False, metadata=_at("engine.restart_on_failure"))  # with the current weights
    engine_probe_interval_s: float = field(default=EngineSection.probe_interval_s,
                                           metadata=_at("engine.probe_interval_s"))  # pause between restart attempts
    trainer_restarts: int = field(default=0, metadata=_at("trainer.restart_on_failure"))  # run/healing.py
    join_identical_requests: bool = field(default=RolloutSection.join_identical_requests,
                                          metadata=_at("rollout.join_identical_requests"))  # fullasync.gateway.delivery
    gateway_host: str = field(default=RolloutSection.gateway_host, metadata=_at("rollout.gateway_host"))
    admission: str = "episodes"  # how a running row counts toward max_running_rows (see StalenessManager)
    hand_over: str = "oldest"  # queue hand-over order (see MessageQueue)
    queue_in_process: bool = False  # True: the queue lives in this process (the simulator's virtual clock)

    def __post_init__(self) -> None:
        if self.admission not in RUNNING_COUNTS:
            raise ValueError(f"admission={self.admission!r}; choose one of {RUNNING_COUNTS}")
        if self.hand_over not in HAND_OVER_ORDERS:
            raise ValueError(f"hand_over={self.hand_over!r}; choose one of {HAND_OVER_ORDERS}")
        if self.generate_ahead not in GENERATE_AHEAD:
            raise ValueError(f"generate_ahead={self.generate_ahead!r}; choose one of {GENERATE_AHEAD}")

    @classmethod
    def from_config(cls, config: RunConfig) -> RunSettings:
        """Every field that names a setting, read from `config`; the rollouter's settings are the `rollout`
        section's fields that `RolloutSettings` declares."""
        # Any: each value is read by its dotted path (getattr), of the type its field declares
        named: dict[str, Any] = {f.name: reduce(getattr, f.metadata["config"].split("."), config)
                                 for f in fields(cls) if "config" in f.metadata}
        return cls(rollout=RolloutSettings(**shared_settings(config.rollout, RolloutSettings)), **named)

    @property
    def queue_capacity(self) -> int:
        """k + 1 batches, plus room for every running row, so draining for validation never blocks on a full queue."""
        return (self.max_staleness + 1) * self.batch_size + self.rollout.max_running_rows

    def loop_settings(self, checkpoints: CheckpointPolicy | None) -> LoopSettings:
        return LoopSettings(self.total_steps, self.batch_size, self.val_every,
                            checkpoints.every if checkpoints is not None else 0,
                            checkpoints.hf_every if checkpoints is not None else 0)


@dataclass(frozen=True)
class RunParts:
    """The components `assemble` wires for one run (`gateway`: the HTTP gateway the rollouter's episodes open on,
    started by `Run.execute`; None when the harness takes no base URL)."""

    rollouter: Rollouter
    queue: GroupQueue
    weight_sync: WeightSync
    trainer: Trainer
    gateway: Gateway | None = None


class Run:
    """The components of one run; `execute(rows)` once."""

    def __init__(self, parts: RunParts, settings: RunSettings, sink: MetricsSink,
                 val_rows: Sequence[object] | None = None, checkpoints: CheckpointPolicy | None = None,
                 evaluator: Evaluator | None = None) -> None:
        """`evaluator`: the held-out evaluation, in place of the harness's mean reward on `val_rows`."""
        self.rollouter, self.queue, self.gateway = parts.rollouter, parts.queue, parts.gateway
        self.weight_sync, self.trainer = parts.weight_sync, parts.trainer
        self.service = parts.rollouter.service
        self.weight_sync.observe(self.rollouter.on_version)  # admission follows the published version
        self.settings = settings
        self.sink = sink
        self.val_rows = list(val_rows) if val_rows else []
        self.evaluator = evaluator
        self.checkpoints = checkpoints
        self.saved: list[SavedCheckpoint] = []  # the checkpoints this run wrote
        self._trainer_origin: Path | None = None  # the checkpoint a restarted trainer continues (None: the model)
        self._task: asyncio.Task | None = None
        # a restart trains again the steps since the newest checkpoint: only with checkpoints, which bound them
        healing = HealingTrainer(self.trainer, self.restart_trainer if checkpoints is not None and checkpoints.every
                                 else None, settings.trainer_restarts)
        batching = BatchSettings(settings.batch_size, settings.max_staleness, settings.bind_late)
        batcher: Batcher[object] = Batcher(self.queue, batching, self.rollouter.last_chance_rows)
        batcher.observe(self.rollouter)  # it hears of drops and of each batch taken
        hooks = LoopHooks(validate=self.validate_paused if self.validates else None,
                          checkpoint=self.checkpoint if checkpoints is not None else None,
                          save_model=self.save_model if checkpoints is not None and checkpoints.hf_every else None,
                          more_stats=self.component_stats)
        self.loop = TrainingLoop(trainer=healing, batcher=batcher, rollouter=self.rollouter,
                                 weight_sync=self.weight_sync, sink=sink, settings=settings.loop_settings(checkpoints),
                                 hooks=hooks)

    async def component_stats(self) -> dict[str, float]:
        """Counts of the router and the engines (KV), of the gateway, of the models beside the policy and of the
        teacher's scoring for each step's metrics."""
        return {**await self.service.router.kv_metrics(), **(self.gateway.stats() if self.gateway is not None else {}),
                **self.service.beside_metrics(),
                **(self.rollouter.teacher.metrics() if self.rollouter.teacher is not None else {})}

    def request_stop(self, reason: str) -> None:
        """Stop soon (a signal): finish the step under way, checkpoint, return. A second request stops at once."""
        if self.loop.stop_requested and self._task is not None:
            log.warning("%s again: stopping now, without a checkpoint", reason)
            self._task.cancel()
            return
        saving = ", save a checkpoint" if self.checkpoints is not None else ""
        log.warning("%s: finishing the step under way%s and stopping (send it again to stop at once)", reason, saving)
        self.loop.request_stop()

    async def restart_trainer(self) -> str:
        """The trainer started again (a rank died) as of the newest complete checkpoint this run wrote or
        resumed; which one that was."""
        await self.trainer.restart()
        if self._trainer_origin is None:
            return "the model the run started with"
        await self.trainer.load_state(str(self._trainer_origin / "trainer"))
        return str(self._trainer_origin)

    def _not_written(self, error: Exception, what: str, where: Path) -> None:
        """A save failed: re-raise unless the file system refused it (full, over quota, read-only); then say why in
        one line, count it, and let the run go on (the next save tries again)."""
        cause = checkpoint.write_error(error)
        if cause is None:
            raise error
        self.loop.result.failed_saves += 1
        assert self.checkpoints is not None
        newest = checkpoint.latest_checkpoint(self.checkpoints.root)
        free = checkpoint.free_bytes(where.parent)
        log.error("%s not written: %s (%s free under %s); the newest complete checkpoint stays %s; the run goes on "
                  "and the next save tries again", what, cause.strerror or cause,
                  "?" if free is None else f"{free / 2**20:.1f} MiB", where.parent,
                  newest if newest is not None else "none (resume=auto would start over)")

    async def save_model(self, step: int) -> Path | None:
        """The policy after `step` as a Hugging Face folder (`CheckpointPolicy.hf_dir`), with the note that
        `fullasync export` writes (step, weight version, base model); None when the disk refused it."""
        assert self.checkpoints is not None  # save_model is handed to the loop only with a checkpoint policy
        target = self.checkpoints.hf_dir(step)
        began = time.perf_counter()
        try:
            await self.trainer.save_checkpoint(str(target))
            write_export_note(target, step=step, weight_version=self.weight_sync.version,
                              base_model=str(self.checkpoints.fingerprint.get("model.path", "")))
        except Exception as error:
            shutil.rmtree(target, ignore_errors=True)  # a half-written folder is not a model
            self._not_written(error, f"the policy at step {step} as a Hugging Face folder", target)
            return None
        log.info("policy at step %d saved as a Hugging Face folder: %s (%.1f s)", step, target,
                 time.perf_counter() - began)
        return target

    async def checkpoint(self, pending: Sequence[TrajectoryGroup] = ()) -> SavedCheckpoint | None:
        """Save the whole run now (`pending`: groups taken from the queue and not trained); None when the file
        system refused it (the newest complete checkpoint is left as it was)."""
        policy = self.checkpoints
        if policy is None:
            raise RuntimeError("this run has no checkpoint policy")
        rollout = self.rollouter.snapshot()  # first: a row finishing meanwhile shows up in the queue's snapshot
        groups = [*pending, *await self.queue.snapshot()]
        for group in groups:
            rollout.in_flight.pop(group.row_id, None)
            rollout.outcomes[group.row_id] = RowOutcome.QUEUED.value
        loop = self.loop.state(self.weight_sync.start_version)
        try:
            saved = await checkpoint.save(policy.root, save_trainer=self.trainer.save_state, loop=loop,
                                          rollout=rollout, groups=groups, fingerprint=policy.fingerprint,
                                          keep=policy.keep)
        except Exception as error:
            self._not_written(error, f"checkpoint of step {loop.steps}", checkpoint.step_dir(policy.root, loop.steps))
            return None
        self.saved.append(saved)
        self._trainer_origin = saved.path
        log.info("checkpoint %s: %.1f MB (trainer %.1f MB) in %.2f s; %d queued groups, %d running rows "
                 "(%d tokens kept, %d to generate again)", saved.path, saved.num_bytes / 2**20,
                 saved.trainer_bytes / 2**20, saved.seconds, len(groups), len(rollout.in_flight),
                 rollout.kept_tokens, rollout.discarded_tokens)
        return saved

    async def restore(self, saved: Checkpoint) -> None:
        """Continue `saved`: trainer state, weights at its version on the engines, queue, ledger, running rows."""
        if len(saved.groups) > self.settings.queue_capacity:
            raise ValueError(f"{saved.path} holds {len(saved.groups)} queued groups, more than this run's queue "
                             f"({self.settings.queue_capacity}): resume with the checkpoint's rollout settings")
        await self.trainer.load_state(str(saved.trainer_dir))
        self._trainer_origin = saved.path
        await self.weight_sync.restore(await self.trainer.export_weights(), saved.loop.version,
                                       saved.loop.first_version)
        self.loop.restore(saved.loop)
        for group in saved.groups:
            await self.queue.put(group)
        self.rollouter.restore(saved.rollout)
        self.sink.rewrite(saved.loop.history, saved.loop.validations)
        log.info("resumed from %s: step %d, weight version %d, %d queued groups, %d running rows continue",
                 saved.path, saved.loop.steps, saved.loop.version, len(saved.groups), len(saved.rollout.in_flight))

    async def execute(self, rows: Iterable[tuple[str, object]], resume: Checkpoint | None = None) -> LoopResult:
        """Validate (nothing generating yet), generate and train, stop generating, account for every row.

        With `resume`, the run continues that checkpoint instead of validating first. A run that ends without error
        hands its engines back serving its last version (with `restart_on_failure`, one that died in the last push
        and was not restarted yet is restarted first)."""
        result = self.loop.result
        self._task = asyncio.current_task()
        supervisor = asyncio.create_task(self.weight_sync.supervise(self.settings.engine_probe_interval_s),
                                         name="engine-supervisor")
        try:
            if self.gateway is not None:
                await self.gateway.start()
            await self.rollouter.open()
            if resume is not None:
                await self.restore(resume)
            elif self.validates:
                result.val_before = await self.validate_paused()
            self.rollouter.start(rows)
            await self._train()
            await self.rollouter.stop()
            await self._hand_back_engines()
            result.account(self.rollouter.report())
            return result
        finally:
            supervisor.cancel()
            await asyncio.wait([supervisor])
            try:
                await self.rollouter.close()
            finally:
                if self.gateway is not None:
                    await self.gateway.stop()
                if isinstance(self.queue, RayGroupQueue):
                    self.queue.shutdown()

    async def _hand_back_engines(self) -> None:
        """Restart an engine that died in the run's last push (the supervisor had no probe left to see it), so that
        the engines a caller handed in come back serving the run's last version; one that cannot is left dead, as
        the next run would find it (and restarts it), with a warning: the run's result stands."""
        if not self.weight_sync.restart_on_failure:
            return
        try:
            await self.weight_sync.restart_dead()
        except Exception as error:  # the run is over and saved: its result is not lost to a failed restart
            log.warning("an engine could not be restarted at the run's end (the next run restarts it): %r", error)

    async def _train(self) -> None:
        """The training loop with the rollouter's crash and the engines' failure watched beside it: either ends
        the loop at once and is raised (naming the row or the engine), instead of waiting for the loop to look."""
        training = asyncio.create_task(self.loop.run(), name="training-loop")
        failures = [asyncio.create_task(self.rollouter.wait_crashed(), name="rollouter-crash"),
                    asyncio.create_task(self.weight_sync.wait_failed(), name="engines-failed")]
        try:
            await asyncio.wait([training, *failures], return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (training, *failures):
                task.cancel()
            await asyncio.wait([training, *failures])
        for failure in failures:
            if failure.done() and not failure.cancelled():
                raise failure.result()
        training.result()

    @property
    def validates(self) -> bool:
        return bool(self.val_rows) or self.evaluator is not None

    async def validate_paused(self) -> float:
        """Held-out score with training generation paused: stop admitting, let running rows finish, resume. Each
        evaluation is recorded (`LoopResult.validations`, validation.jsonl, the loggers' `val/*`)."""
        self.rollouter.pause_admission()
        try:
            await self.rollouter.wait_idle(VALIDATION_DRAIN_TIMEOUT_S)
            if self.evaluator is not None:
                evaluation = await self.evaluator(self.service)
            else:
                evaluation = (await evaluate(self.service, self.rollouter.run_harness, self.val_rows,
                                             self.settings.val_samples_per_row,
                                             self.settings.rollout.episode_timeout_s)).evaluation()
        finally:
            self.rollouter.resume_admission()
        result = self.loop.result
        result.val_failed_episodes += evaluation.failed
        steps = result.steps
        result.validations.append({"step": float(steps), **evaluation.record()})
        self.sink.validation(steps, evaluation.record())
        when = "before training" if steps == 0 and result.val_before is None else f"at step {steps}"
        measure = "accuracy" if self.evaluator is None else "score"  # the built-in measure: the share of rewards won
        tasks = task_summary(evaluation.metrics, TASK_SCORE, ".3f", shown=len(evaluation.metrics))
        log.info("held-out %s %s: %.3f (± %.3f)%s", measure, when, evaluation.score, evaluation.stderr, tasks)
        return evaluation.score
