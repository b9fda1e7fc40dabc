"""Rollouter: streams dataset rows through `rollout_fn` n times each and queues the groups.

Owns: admission (through `StalenessManager`), running the episodes of a row concurrently with a
timeout, turning their results into a `TrajectoryGroup`, the gates a group passes before it is queued (zero
variance, a reward range), stopping rows that
became too stale, and the tasks that do all this. What it knows of rows lives in one `RowLedger`
(`fullasync.rollout.ledger`): a record per running row and the outcome of every row; the rollouter is
its only writer (the loop reports trained and dropped rows through `on_trained` / `on_handed_over`).
An exception or timeout in `rollout_fn` is recorded with its traceback and counted by reason; it
never stops the run. A crash of the rollouter itself (the dispatcher, or a row failing outside the
harness, e.g. `queue.put` on a dead queue) ends every row at once and is kept: `check()` raises it
and `wait_crashed()` returns it, naming the row. Does not own: engines, the queue's storage, training,
or the HTTP gateway (`run/` starts it and injects `episode_context`, which gives each episode its URL).

Tasks, structured: one `rollouter` task runs a `TaskGroup` whose body is the dispatcher (it admits
rows in dataset order) and whose children are the row tasks; each row task runs its episodes in a
`TaskGroup` of its own. A crash anywhere cancels what runs beside it and ends the `rollouter` task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Protocol

from fullasync.client import RolloutClient, RolloutService
from fullasync.config import RolloutSection
from fullasync.contracts.run import QueueBatch, oldest_allowed
from fullasync.errors import FailureKind, FullasyncError
from fullasync.infra.offload import Pacer
from fullasync.observe.metrics import HARNESS_METRICS_KEY
from fullasync.rollout.curriculum import Curriculum
from fullasync.rollout.deadline import EpisodeDeadline
from fullasync.rollout.generator import OpenEpisode, RolloutFn, as_generator, run_harness
from fullasync.rollout.group_rewards import group_scored, rewarded
from fullasync.rollout.ledger import EpisodeFailure, RowLedger, RowOutcome, RunningRow, failure_kind, failure_reason
from fullasync.rollout.staleness import StalenessManager
from fullasync.rollout.state import RolloutState
from fullasync.rollout.teacher import TeacherScorer
from fullasync.types import JsonValue, Trajectory, TrajectoryGroup, row_task

# A push that frees a whole batch of admission (thousands of episodes at large scale) would start them all in one
# loop iteration and hold every engine reply and gateway request behind them; the dispatcher starts at most this
# many episodes per this interval (`Pacer`), so the loop serves what is waiting in between. Episodes wait for
# engine slots anyway. The rate is chosen so that admission takes under half a core and the loop keeps up with the
# replies beside it (bench/control_plane.py; the figures: docs/benchmarks/figures.md).
ADMISSION_BURST_EPISODES = 32
ADMISSION_REST_S = 0.015

__all__ = ["EpisodeFailure", "RolloutCrashedError", "RolloutFn", "RolloutReport", "RolloutSettings", "Rollouter",
           "RowOutcome", "failure_reason"]

log = logging.getLogger("fullasync")

class GroupSink(Protocol):
    """Where finished groups go (`fullasync.contracts.run.GroupQueue`; `put`, and `close` after the last one)."""

    async def put(self, group: TrajectoryGroup) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class RolloutSettings:
    """How the rollouter runs episodes. A run makes it from its `rollout` section (`RunSettings.from_config`: the
    fields both declare), where the settings a run has take their defaults and help from."""

    n: int = RolloutSection.n  # episodes per row (the group size)
    max_running_rows: int = RolloutSection.max_running_rows  # each row counted by its share of unfinished episodes
    episode_timeout_s: float = RolloutSection.episode_timeout_s
    filter_zero_variance: bool = RolloutSection.filter_zero_variance
    filter_reward_range: Sequence[float] = ()  # [low, high] of a group's mean reward, else turned back; () = none
    infra_retries: int = RolloutSection.infra_retries
    failure_reward: float = RolloutSection.failure_reward
    keep_tracebacks: int = 20  # most recent failure tracebacks kept for the report
    stop_stale_rows: bool = True  # stop a running row as soon as a token of it is too old for any later step

    def __post_init__(self) -> None:
        object.__setattr__(self, "filter_reward_range", tuple(self.filter_reward_range))  # the config's list


@dataclass(frozen=True)
class RolloutReport:
    """The rollouter's account so far: the row ledger, failures by reason, and how busy it was."""

    outcome_counts: dict[str, int]
    row_outcomes: dict[str, str]  # row id -> RowOutcome value; empty in a report asked for without rows
    trained_twice: list[str]  # must stay empty: a row's group is trained at most once
    episode_failures: int
    failure_reasons: dict[str, int]
    failure_kinds: dict[str, int] = field(default_factory=dict)  # FailureKind value -> episodes
    infra_retries: int = 0  # episodes run again after an infrastructure failure
    recent_failures: list[EpisodeFailure] = field(default_factory=list)
    idle_fraction: float = 0.0  # share of wall time with no row generating
    lead_rows: int = 0  # rows admission may run ahead of the finished steps now (StalenessManager.lead_rows)
    curriculum_pools: dict[str, int] = field(default_factory=dict)  # rows per pool of the curriculum, if any


class RolloutCrashedError(FullasyncError, RuntimeError):
    """The rollouter itself failed (not a harness): the run cannot go on; the message names the row."""


def with_logged(trajectory: Trajectory, logged: list[tuple[str, float]]) -> Trajectory:
    """`trajectory` with the metrics its harness logged through the client (`RolloutClient.log`) in its metadata."""
    if not logged:
        return trajectory
    earlier = tuple(trajectory.metadata.get(HARNESS_METRICS_KEY, ()))
    metadata = {**trajectory.metadata, HARNESS_METRICS_KEY: earlier + tuple(logged)}
    return dataclasses.replace(trajectory, metadata=metadata)


def _leaves(error: BaseException) -> Iterator[BaseException]:
    """The errors inside (nested) exception groups, in order; `error` itself if it is no group."""
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


class Rollouter:
    """Runs until the rows are exhausted or `stop()`; `wait_idle()` drains running rows."""

    def __init__(self, rollout_fn: RolloutFn, service: RolloutService, queue: GroupSink, staleness: StalenessManager,
                 settings: RolloutSettings, episode_context: OpenEpisode | None = None,
                 teacher: TeacherScorer | None = None) -> None:
        """`episode_context(client)`: what a `CustomGenerator` episode gets for its length (e.g. a base URL on
        the run's gateway); by default its in-process client only. `teacher`: scores each group before it is
        queued (on-policy distillation)."""
        self.generator = as_generator(rollout_fn)  # a plain function is wrapped here once (assemble did already)
        self.service = service
        self.queue = queue
        self.staleness = staleness
        self.settings = settings
        self.episode_context = episode_context
        self.teacher = teacher
        self.ledger = RowLedger(settings.keep_tracebacks)
        self._wake = asyncio.Event()  # set when capacity may have changed
        self._held_slots = 0  # admission slots of rows stopped while a batch trains, released at the next version
        self.curriculum: Curriculum | None = None  # the row sampler, when rows are sampled by their results
        self._saved_curriculum: dict[str, JsonValue] | None = None  # a restored checkpoint's, applied at start
        self._admitting = True
        self._task: asyncio.Task[None] | None = None  # the `rollouter` task: dispatcher and row tasks
        self._crash: RolloutCrashedError | None = None
        self._crashed = asyncio.Event()

    @property
    def outcomes(self) -> dict[str, RowOutcome]:
        """Row id -> what became of it, for every row taken from the dataset that has ended."""
        return self.ledger.outcomes

    @property
    def rows_stopped_stale(self) -> int:
        return self.ledger.rows_stopped_stale

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """A `CustomGenerator`'s set-up (the gateway it may use is started by the run, before)."""
        await self.generator.setup()

    async def close(self) -> None:
        """Stop episodes, then the generator's tear-down."""
        await self.stop()
        await self.generator.teardown()

    def start(self, rows: Iterable[tuple[str, object]]) -> None:
        """Begin dispatching `(row_id, row)` pairs; row ids must be unique over the run. A `Curriculum` is told each
        row's results as its outcome is recorded (and continues a restored checkpoint's sampling)."""
        self.curriculum = rows if isinstance(rows, Curriculum) else None
        if self._saved_curriculum is not None:
            if self.curriculum is None:
                raise ValueError("the checkpoint's rows were sampled by a curriculum: resume with the same "
                                 "data.curriculum")
            self.curriculum.restore(self._saved_curriculum)
        self._task = asyncio.create_task(self._run(iter(rows)), name="rollouter")

    async def stop(self) -> None:
        """Cancel the dispatcher and every running row (their rows end `unfinished`); crashes stay for `check()`."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.wait([self._task])

    @property
    def exhausted(self) -> bool:
        """No more rows to admit and none running."""
        return self._task is not None and self._task.done()

    def check(self) -> None:
        """Raise a crash of the dispatcher or of a row task (a fault, not a harness failure), if any."""
        if self._crash is not None:
            raise self._crash

    async def wait_crashed(self) -> RolloutCrashedError:
        """Return the rollouter's crash as soon as it happens (a supervisor awaits this beside the training loop)."""
        await self._crashed.wait()
        assert self._crash is not None
        return self._crash

    def on_version(self, version: int) -> None:
        """The trainer's version advanced to `version` (the rollouter observes the weight sync): the admission
        slots of rows stopped while the batch trained are free now, more rows may be admissible, and rows already
        too stale stop."""
        for _ in range(self._held_slots):
            self.staleness.release()
        self._held_slots = 0
        if self.settings.stop_stale_rows:
            self._stop_stale_rows(oldest_allowed(self.staleness.version(), self.staleness.max_staleness))
        self._wake.set()

    def on_batch_taken(self, version: int) -> None:
        """The batch trained at `version` is out of the queue: the next one trains at version + 1, so a running
        row holding a token older than version + 1 − k can only be dropped. It stops now, not a step later: its
        engine slots go to rows already admitted. Its admission slot stays taken until the version moves: a row
        started in its place now would sample at `version` and have a step less to finish in than one started
        after the push, and the rows so started were the next to be stopped (in the simulator, releasing at once
        threw away 11–17 % of the decoded tokens where holding throws away 7–16 %,
        `docs/benchmarks/peer-schedulers.md`)."""
        if self.settings.stop_stale_rows:
            self._stop_stale_rows(oldest_allowed(version + 1, self.staleness.max_staleness), hold_slots=True)

    def last_chance_rows(self, version: int) -> int:
        """Running rows that only the batch trained at `version` can take (a token of theirs is older than the
        next batch accepts): a step that binds its last groups late leaves them this many places."""
        return len(self.ledger.stale_rows(oldest_allowed(version + 1, self.staleness.max_staleness)))

    def _stop_stale_rows(self, oldest_allowed: int, hold_slots: bool = False) -> None:
        """Cancel the running rows holding a token older than `oldest_allowed`: the bound only moves forward,
        so their groups could only be dropped; the engine slots they hold go to other rows. `hold_slots`: their
        admission slots are released at the next version (`on_version`), not when they end."""
        for record in self.ledger.stale_rows(oldest_allowed):
            record.stopping_stale = True
            record.holds_slot = hold_slots
            self.ledger.rows_stopped_stale += 1
            if record.task is not None:
                record.task.cancel()

    def pause_admission(self) -> None:
        self._admitting = False

    def resume_admission(self) -> None:
        self._admitting = True
        self._wake.set()

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait until no row is running (used to pause generation for validation)."""
        tasks = self.ledger.tasks()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                running = sorted(record.row_id for record in self.ledger.running.values() if record.task in pending)
                raise TimeoutError(f"{len(pending)} row(s) still generating after {timeout_s:.0f} s: {running[:5]}")
        self.check()

    # -- what the loop reports, and what it reads ------------------------------------------

    def on_trained(self, groups: Sequence[TrajectoryGroup]) -> None:
        for group in groups:
            self.ledger.mark(group.row_id, RowOutcome.TRAINED)

    def on_handed_over(self, got: QueueBatch, asked: bool) -> None:
        """A queue get for the trainer returned. `asked`: it was a batch's first, and found `got.ready` groups
        waiting (admission adapts its lead to that). Rows whose groups it dropped as too stale will never train:
        their admission slots are free."""
        if asked:
            self.staleness.on_batch_request(got.ready)
        for row_id in got.dropped_row_ids:
            self.ledger.mark(row_id, RowOutcome.TOO_STALE)
            self.staleness.release()
        self._wake.set()

    def report(self, rows: bool = True) -> RolloutReport:
        """The account so far; `rows=False` leaves out the outcome of every row (`row_outcomes` empty), which grows
        with the run: the training loop reports every step without it."""
        ledger = self.ledger
        return RolloutReport(
            outcome_counts=ledger.outcome_counts(),
            row_outcomes={row_id: outcome.value for row_id, outcome in ledger.outcomes.items()} if rows else {},
            trained_twice=list(ledger.trained_twice),
            episode_failures=ledger.failures.count,
            failure_reasons=dict(ledger.failures.reasons), failure_kinds=dict(ledger.failures.kinds),
            infra_retries=ledger.failures.infra_retries,
            recent_failures=list(ledger.failures.recent),
            idle_fraction=ledger.idle_fraction(),
            lead_rows=self.staleness.lead_rows,
            curriculum_pools=self.curriculum.pool_sizes() if self.curriculum is not None else {},
        )

    # -- checkpoint and resume ---------------------------------------------------------------

    def snapshot(self) -> RolloutState:
        """The rollout side now (no await: one consistent instant of the event loop).

        A running row keeps its finished episodes (a row whose group is still being put has all of
        them); its unfinished episodes are generated again on resume: their tokens so far are the
        `discarded_tokens` (completed calls; a call in progress is not counted).
        """
        counts = self.staleness.counts
        state = self.ledger.snapshot({"started": counts.started, "running": float(counts.running)})
        state.curriculum = self.curriculum.state() if self.curriculum is not None else self._saved_curriculum
        return state

    def restore(self, state: RolloutState) -> None:
        """Continue from `state` (before `start`): its ledger stands, its running rows run again first.

        Rows the ledger accounts for are skipped when the stream reaches them; a running row is
        admitted again when reached, with the episodes it had finished.
        """
        if self._task is not None:
            raise RuntimeError("Rollouter.restore() must come before start()")
        self.ledger.restore(state)
        self._saved_curriculum = state.curriculum
        # rows trained or queued keep their admission slots (running rows take theirs again when admitted)
        holding = (RowOutcome.TRAINED, RowOutcome.QUEUED)
        self.staleness.restore(sum(outcome in holding for outcome in self.ledger.outcomes.values()))

    # -- internals ---------------------------------------------------------------------------

    async def _run(self, rows: Iterator[tuple[str, object]]) -> None:
        """The `rollouter` task: the dispatcher with the row tasks beside it; a crash of either is kept. When every
        row has ended the queue is closed: the trainer's read hands over the last groups without waiting for more."""
        try:
            async with asyncio.TaskGroup() as row_tasks:
                await self._dispatch(rows, row_tasks)
            await self.queue.close()
        except Exception as error:  # the run's error: kept for check() and wait_crashed(), the task ends
            crash = next((e for e in _leaves(error) if isinstance(e, RolloutCrashedError)), None)
            if crash is None:
                first = next(_leaves(error))
                crash = RolloutCrashedError(f"the rollouter's dispatcher crashed: {first!r}")
                crash.__cause__ = first
            log.error("%s", crash, exc_info=crash.__cause__)
            self._crash = crash
            self._crashed.set()

    async def _dispatch(self, rows: Iterator[tuple[str, object]], row_tasks: asyncio.TaskGroup) -> None:
        """Admit rows in dataset order, each as soon as admission allows it, and start its task; a burst of
        admissions is spread out (`ADMISSION_BURST_EPISODES`)."""
        pacer = Pacer(ADMISSION_BURST_EPISODES, ADMISSION_REST_S)
        for row_id, row in rows:
            if self.ledger.skip(row_id):
                continue
            try:
                self.generator.coming(row, self.settings.n)  # while it waits for room, its containers can start
            except Exception:  # what it prepares the episodes meet again: their failure is the one that counts
                log.warning("row %s: the generator's coming() failed", row_id, exc_info=True)
            await pacer.turn(self.settings.n)
            while not (self._admitting and self.staleness.try_start()):
                self._wake.clear()
                await self._wake.wait()
            record = self.ledger.add(row_id, row)
            record.admitted_version = self.staleness.version()
            record.task = row_tasks.create_task(self._run_row(record), name=f"row-{row_id}")
        left = self.ledger.unstarted_resumed()
        if left:
            raise ValueError(f"{len(left)} row(s) the checkpoint had running are not in the dataset "
                             f"(e.g. {left[:3]}): resume with the dataset the run started with")

    async def _run_row(self, record: RunningRow) -> None:
        """Run the row's unfinished episodes and hand its group on; its outcome is set as it leaves the ledger.

        A failure here is not the harness's (that is data): it becomes the run's error, naming the row."""
        share = Fraction(1, self.settings.n)
        record.released = share * len(record.finished)  # a resumed row's episodes finished before the checkpoint
        self.staleness.episode_done(record.released)
        outcome: RowOutcome | None = None
        try:
            async with asyncio.TaskGroup() as episodes:
                for index in range(self.settings.n):
                    if index not in record.finished:
                        episodes.create_task(self._episode(record, index, share), name=f"{record.row_id}/{index}")
            outcome = await self._hand_on(record)
        except asyncio.CancelledError:
            outcome = RowOutcome.TOO_STALE if record.stopping_stale else RowOutcome.UNFINISHED
            raise
        except Exception as error:
            cause = next(_leaves(error))
            raise RolloutCrashedError(f"row {record.row_id}: the rollouter failed outside the harness: "
                                      f"{cause!r}") from cause
        finally:
            self.ledger.finish(record, outcome)
            if self.curriculum is not None and outcome is not RowOutcome.UNFINISHED:  # an unfinished draw runs again
                self.curriculum.settle(record.row_id, record.rewards)
            held = outcome is RowOutcome.TOO_STALE and record.holds_slot
            self._held_slots += held
            self.staleness.finish(produced_group=outcome is RowOutcome.QUEUED or held,
                                  running_share=1 - record.released)
            self._wake.set()

    async def _hand_on(self, record: RunningRow) -> RowOutcome:
        """All episodes ended: queue the row's group, or say why there is none."""
        trajectories = [t for _, t in sorted(record.finished.items(), key=lambda item: item[0]) if t is not None]
        if not trajectories:
            return RowOutcome.FAILED
        scored = await group_scored(self.generator, record.row_id, record.row, trajectories,
                                    self.settings.episode_timeout_s, self.settings.infra_retries, self.ledger.failures)
        if scored is None:
            return RowOutcome.FAILED
        trajectories = list(scored)
        record.rewards = tuple(t.reward for t in trajectories)
        if self._turned_back(record.rewards):
            return RowOutcome.FILTERED
        task = row_task(record.row)
        group = TrajectoryGroup(row_id=record.row_id, trajectories=tuple(trajectories),
                                metadata={"failed_episodes": self.settings.n - len(trajectories),
                                          **({"task": task} if task else {})})
        if self.teacher is not None:  # the row keeps its admission slot meanwhile: the teacher's lag holds rows back
            group = await self.teacher.score_group(group)
        await self.queue.put(group)
        return RowOutcome.QUEUED

    def _turned_back(self, rewards: Sequence[float]) -> bool:
        """The gates a group passes before it is queued: its rewards not all equal (`filter_zero_variance`), its mean
        within `filter_reward_range`. A group turned back frees its row's admission slot: the next row replaces it."""
        if self.settings.filter_zero_variance and len(set(rewards)) == 1:
            return True
        if self.settings.filter_reward_range:
            low, high = self.settings.filter_reward_range
            return not low <= sum(rewards) / len(rewards) <= high
        return False

    async def _episode(self, record: RunningRow, index: int, share: Fraction) -> None:
        """One episode of the row, recorded on the row's record (its trajectory, or None if it failed). An episode
        that failed because of the infrastructure runs again, up to `infra_retries` times (counted)."""
        try:
            for attempt in range(self.settings.infra_retries + 1):
                client = self.service.client(f"{record.row_id}/{index}" + (f"#{attempt}" if attempt else ""))
                record.episode_started(index, client)
                client.episode.priority = record.priority
                try:
                    trajectory, kind = await self._run_episode(record.row_id, index, client, record.row)
                    again = kind is FailureKind.INFRA and attempt < self.settings.infra_retries
                    if not again:
                        record.finished[index] = trajectory
                finally:
                    record.episode_ended(index)
                if not again:
                    return
                self.ledger.failures.infra_retries += 1
                log.warning("row %s episode %d failed for the infrastructure: running it again (%d of %d)",
                            record.row_id, index, attempt + 1, self.settings.infra_retries)
        finally:
            record.released += share
            self.staleness.episode_done(share)
            self._wake.set()  # engine slots freed: another row may fit

    async def run_harness(self, client: RolloutClient, row: object) -> float | Trajectory:
        """One episode of the user's harness on `client` (a plain function, or a CustomGenerator)."""
        return await run_harness(self.generator, self.episode_context, client, row)

    async def _run_episode(self, row_id: str, index: int, client: RolloutClient,
                           row: object) -> tuple[Trajectory | None, FailureKind | None]:
        """The harness's result as a trajectory, and the kind of its failure if it failed (counted): a failure the
        policy caused (`FailureKind.trained`) is the calls it made with `failure_reward`; any other is None."""
        try:
            async with asyncio.timeout(self.settings.episode_timeout_s) as timeout:  # in this task: no task of its own
                deadline = EpisodeDeadline(timeout)
                client.episode.deadline_paused = deadline.suspended  # engine restarts do not count
                with deadline.scope():
                    result: object = await self.run_harness(client, row)  # the user's code: checked here
                    if isinstance(result, (int, float)) and not isinstance(result, bool):
                        result = client.trajectory(float(result))
                    if not isinstance(result, Trajectory):
                        raise TypeError(f"rollout_fn must return a float reward or a Trajectory, got "
                                        f"{type(result).__name__}")
                    trajectory = await rewarded(self.generator, client, row, result)
            return with_logged(trajectory, client.episode.logged), None
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a harness failure is data, not a crash: record and go on
            kind = failure_kind(error, client.episode.fault)
            trained = kind.trained and bool(client.episode.calls)
            if self.ledger.failures.record(row_id, index, error, kind):  # each reason once: the counts say how often
                fate = (f"trained with reward {self.settings.failure_reward}" if trained
                        else "run again" if kind is FailureKind.INFRA else "not trained")
                log.warning("row %s episode %d failed (%s, %s, counted, %s): %s", row_id, index, kind.value,
                            failure_reason(error), fate, error)
            if not trained:
                return None, kind
            metadata = {"failure": kind.value, "error": f"{type(error).__name__}: {error}"}
            return with_logged(client.trajectory(self.settings.failure_reward, metadata), client.episode.logged), kind
