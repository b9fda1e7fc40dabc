"""One run, wired in one place: `assemble(...)` builds its components, `Run.execute(rows)` runs them.

Owns: the construction of the weight sync, the staleness manager (with this run's version as its source), the
queue (sized here, and only here), the rollouter and the training loop; the HTTP gateway when the harness uses
one (started and stopped by `Run.execute`; the rollouter gets only `OpenEpisode`, each episode's URL on it);
the start-up check of `rollout_fn`; supervising the training loop beside the rollouter (a rollouter crash ends
the run at once, naming the row); the order of a run (held-out validation with nothing generating, then
generation and training, then stopping generation) and the final account of every row; validation with
training generation paused; capturing the whole run into a checkpoint (rollouter first, then the queue, then
the trainer) and restoring one; a stop request (a signal) that checkpoints and returns. Does not own: starting
engines or the trainer (the caller does, and keeps them), the metrics sink, or any step logic (`loop.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullasync.client import RolloutClient, RolloutService
from fullasync.config import EngineSection, RolloutSection, RunConfig, shared_settings
from fullasync.contracts.engine import Engine, PauseMode
from fullasync.contracts.run import GroupQueue, Trainer
from fullasync.contracts.weights import WeightTransport
from fullasync.errors import EngineDiedError
from fullasync.gateway import Gateway
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.generator import EpisodeContext, OpenEpisode, as_generator
from fullasync.rollout.rollouter import Rollouter, RolloutFn, RolloutSettings, RowOutcome
from fullasync.rollout.staleness import GENERATE_AHEAD, RUNNING_COUNTS, StalenessManager
from fullasync.run import checkpoint
from fullasync.run.checkpoint import Checkpoint, CheckpointPolicy, SavedCheckpoint
from fullasync.run.export_note import write_export_note
from fullasync.run.loop import LoopResult, TrainingLoop
from fullasync.run.queue import HAND_OVER_ORDERS, MessageQueue, RayGroupQueue
from fullasync.run.validation import evaluate
from fullasync.weights.sync import WeightSync

log = logging.getLogger("fullasync")

VALIDATION_DRAIN_TIMEOUT_S = 600.0  # running rows must finish within this before validation starts


# Python's defaults: (700, 10, 10). A young collection traverses every container allocated since the last one
# and still alive; with thousands of episodes in flight most of them are (token lists of running calls). At
# 1,000,000 the episodes' objects die (by reference counting: an episode holds no cycle) before a collection sees
# them (bench/control_plane.py; the figures: docs/benchmarks/figures.md).
GC_THRESHOLDS = (1_000_000, 20, 100)


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """Tune the driver's cyclic garbage collector for thousands of live episodes, for the length of a run.

    On entry: collects, freezes every object alive after start-up (modules, tokenizers, engine handles) out of
    the collector's reach, and makes collections rarer (`GC_THRESHOLDS`). With the defaults, collections scale
    with the live episodes' objects and took half the driver's CPU at 8,192 concurrent episodes
    (bench/control_plane.py, docs/benchmarks/control-plane.md); almost all of a run's garbage is freed by reference
    counting anyway, and what is cyclic waits a little longer. On exit: the frozen objects return to the collector
    and the previous thresholds are restored, so a process that runs again (or does anything else) leaks nothing.
    Inside another block (an evaluation started by a program that runs one already) it changes nothing.
    """
    if gc.get_threshold() == GC_THRESHOLDS:  # inside another block: that one settled the heap and gives it back
        yield
        return
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*previous)
        gc.unfreeze()


@dataclass(frozen=True)
class RunSettings:
    """What the assembly needs to know of a run (from a `RunConfig`, or a simulation's spec). The settings a run
    has take their defaults from `RunConfig`; `restart_engines` is off unless asked for (a run asks with
    engine.restart_on_failure): an assembly on engines of its own (a simulation) supervises nothing."""

    max_staleness: int  # k of the admission bound and the queue's staleness check
    batch_size: int  # groups per train step
    total_steps: int  # 0 = until the rows run out
    rollout: RolloutSettings
    push_mode: PauseMode = PauseMode.ABORT
    val_every: int = RunConfig.val_every  # validate every this many steps (and always before and after)
    val_samples_per_row: int = RunConfig.val_samples_per_row
    admission: str = "episodes"  # how a running row counts toward max_running_rows (see StalenessManager)
    hand_over: str = "oldest"  # queue hand-over order (see MessageQueue)
    generate_ahead: str = RunConfig.generate_ahead  # adaptive lead or the bound's (see StalenessManager)
    bind_late: bool = RunConfig.bind_late  # a step takes its last groups when the trainer reaches them (TrainingLoop)
    queue_in_process: bool = False  # True: the queue lives in this process (the simulator's virtual clock)
    restart_engines: bool = False  # restart engines declared dead, with the current weights
    trainer_restarts: int = 0  # restarts of a trainer whose rank died, from the newest checkpoint (TrainingLoop)
    engine_probe_interval_s: float = EngineSection.probe_interval_s  # how often dead engines are looked for
    join_identical_requests: bool = RolloutSection.join_identical_requests  # the gateway's (fullasync.gateway.delivery)
    gateway_host: str = RolloutSection.gateway_host  # where the gateway binds; episodes' base URLs name it

    def __post_init__(self) -> None:
        if self.admission not in RUNNING_COUNTS:
            raise ValueError(f"admission={self.admission!r}; choose one of {RUNNING_COUNTS}")
        if self.hand_over not in HAND_OVER_ORDERS:
            raise ValueError(f"hand_over={self.hand_over!r}; choose one of {HAND_OVER_ORDERS}")
        if self.generate_ahead not in GENERATE_AHEAD:
            raise ValueError(f"generate_ahead={self.generate_ahead!r}; choose one of {GENERATE_AHEAD}")

    @classmethod
    def from_config(cls, config: RunConfig) -> RunSettings:
        """The rollouter's settings are the `rollout` section's fields that `RolloutSettings` declares."""
        return cls(
            max_staleness=config.staleness, batch_size=config.rollout.batch_size, total_steps=config.total_steps,
            rollout=RolloutSettings(**shared_settings(config.rollout, RolloutSettings)),
            push_mode=config.push_mode, generate_ahead=config.generate_ahead, bind_late=config.bind_late,
            val_every=config.val_every,
            val_samples_per_row=config.val_samples_per_row,
            restart_engines=config.engine.restart_on_failure, engine_probe_interval_s=config.engine.probe_interval_s,
            trainer_restarts=config.trainer.restart_on_failure,
            join_identical_requests=config.rollout.join_identical_requests,
            gateway_host=config.rollout.gateway_host,
        )

    @property
    def queue_capacity(self) -> int:
        """k + 1 batches, plus room for every running row, so draining for validation never blocks on a full queue."""
        return (self.max_staleness + 1) * self.batch_size + self.rollout.max_running_rows


class Run:
    """The components of one run; `execute(rows)` once."""

    def __init__(self, *, rollouter: Rollouter, queue: GroupQueue, weight_sync: WeightSync, service: RolloutService,
                 trainer: Trainer, settings: RunSettings, sink: MetricsSink, val_rows: Sequence[Any] | None,
                 checkpoints: CheckpointPolicy | None = None, gateway: Gateway | None = None) -> None:
        """`gateway`: the HTTP gateway the rollouter's `episode_context` opens episodes on (started by `execute`)."""
        self.rollouter = rollouter
        self.gateway = gateway
        self.queue = queue
        self.weight_sync = weight_sync
        weight_sync.observe(rollouter.on_version)  # admission follows the published version
        self.service = service
        self.trainer = trainer
        self.settings = settings
        self.sink = sink
        self.val_rows = list(val_rows) if val_rows else []
        self.checkpoints = checkpoints
        self.saved: list[SavedCheckpoint] = []  # the checkpoints this run wrote
        self._trainer_origin: Path | None = None  # the checkpoint a restarted trainer continues (None: the model)
        self._task: asyncio.Task | None = None
        self.loop = TrainingLoop(
            trainer=trainer, rollouter=rollouter, queue=queue, weight_sync=weight_sync,
            max_staleness=settings.max_staleness, batch_size=settings.batch_size, total_steps=settings.total_steps,
            val_every=settings.val_every, validate=self.validate_paused if self.val_rows else None, sink=sink,
            checkpoint=self.checkpoint if checkpoints is not None else None,
            checkpoint_every=checkpoints.every if checkpoints is not None else 0,
            save_model=self.save_model if checkpoints is not None and checkpoints.hf_every else None,
            save_model_every=checkpoints.hf_every if checkpoints is not None else 0,
            more_stats=self.component_stats, bind_late=settings.bind_late,
            # a restart trains again the steps since the newest checkpoint: only with checkpoints, which bound them
            restart_trainer=self.restart_trainer if checkpoints is not None and checkpoints.every else None,
            max_trainer_restarts=settings.trainer_restarts,
        )

    async def component_stats(self) -> dict[str, float]:
        """Counts of the router and the engines (KV) and of the gateway for each step's metrics."""
        return {**await self.service.router.kv_metrics(), **(self.gateway.stats() if self.gateway is not None else {})}

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

    async def checkpoint(self, pending: Sequence[Any] = ()) -> SavedCheckpoint | None:
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
        self.sink.rewrite(saved.loop.history)
        log.info("resumed from %s: step %d, weight version %d, %d queued groups, %d running rows continue",
                 saved.path, saved.loop.steps, saved.loop.version, len(saved.groups), len(saved.rollout.in_flight))

    async def execute(self, rows: Iterable[tuple[str, Any]], resume: Checkpoint | None = None) -> LoopResult:
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
            elif self.val_rows:
                result.val_before = await self.validate_paused()
            self.rollouter.start(rows)
            await self._train()
            await self.rollouter.stop()
            await self._hand_back_engines()
            report = self.rollouter.report()
            result.outcomes = dict(report.outcome_counts)
            result.row_outcomes = dict(report.row_outcomes)
            result.trained_rows_seen_twice = list(report.trained_twice)
            result.episode_failures = report.episode_failures
            result.failure_reasons = dict(report.failure_reasons)
            result.failure_kinds, result.infra_retries = dict(report.failure_kinds), report.infra_retries
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

    async def validate_paused(self) -> float:
        """Held-out score with training generation paused: stop admitting, let running rows finish, resume."""
        self.rollouter.pause_admission()
        try:
            await self.rollouter.wait_idle(VALIDATION_DRAIN_TIMEOUT_S)
            outcome = await evaluate(self.service, self.rollouter.run_harness, self.val_rows,
                                     self.settings.val_samples_per_row, self.settings.rollout.episode_timeout_s)
        finally:
            self.rollouter.resume_admission()
        self.loop.result.val_failed_episodes += outcome.failed
        steps = self.loop.result.steps
        when = "before training" if steps == 0 and self.loop.result.val_before is None else f"at step {steps}"
        log.info("held-out accuracy %s: %.3f", when, outcome.score)
        return outcome.score


async def assemble(*, engines: Sequence[Engine], trainer: Trainer, service: RolloutService, rollout_fn: RolloutFn,
                   settings: RunSettings, sink: MetricsSink, val_rows: Sequence[Any] | None = None,
                   checkpoints: CheckpointPolicy | None = None, transport: WeightTransport | None = None) -> Run:
    """Wire one run on engines and a trainer that the caller started (and will stop); `transport`: how pushes
    travel (default: the object store, `weights/transport.py`)."""
    generator = as_generator(rollout_fn)
    weight_sync = WeightSync(engines, mode=settings.push_mode, version=await serving_version(engines),
                             restart_on_failure=settings.restart_engines, transport=transport,
                             in_flight=service.router.load)
    # admission counts the versions of this run only (a resumed run: from its first run's start)
    staleness = StalenessManager(settings.max_staleness, settings.batch_size, settings.rollout.max_running_rows,
                                 version=lambda: weight_sync.version - weight_sync.start_version,
                                 count_running=settings.admission, generate_ahead=settings.generate_ahead)
    queue: GroupQueue = (MessageQueue(settings.queue_capacity, hand_over=settings.hand_over)
                         if settings.queue_in_process else RayGroupQueue(settings.queue_capacity, settings.hand_over))
    gateway = (Gateway(service, host=settings.gateway_host, join_retries=settings.join_identical_requests)
               if generator.uses_gateway else None)
    rollouter = Rollouter(generator, service, queue, staleness, settings.rollout,
                          episode_context=episodes_on(gateway) if gateway is not None else None)
    return Run(rollouter=rollouter, queue=queue, weight_sync=weight_sync, service=service, trainer=trainer,
               settings=settings, sink=sink, val_rows=val_rows, checkpoints=checkpoints, gateway=gateway)


async def serving_version(engines: Sequence[Engine]) -> int:
    """The newest version the engines serve, asked of every one not declared dead (engines handed over by a run
    that stopped may include one that died: the run restarts it, `WeightSync.supervise`); 0 when none answers."""
    answers = await asyncio.gather(*(e.version() for e in engines if e.death is None), return_exceptions=True)
    for answer in answers:
        if isinstance(answer, BaseException) and not isinstance(answer, EngineDiedError):
            raise answer
    return max((answer for answer in answers if isinstance(answer, int)), default=0)


def episodes_on(gateway: Gateway) -> OpenEpisode:
    """Each episode reachable at a base URL of its own on `gateway` while it runs (closed when it ends)."""

    @contextlib.contextmanager
    def open_episode(client: RolloutClient) -> Iterator[EpisodeContext]:
        episode = gateway.open_episode(client=client)
        try:
            yield EpisodeContext(episode.episode_id, client, episode.base_url, episode.api_key)
        finally:
            gateway.close_episode(episode)

    return open_episode
