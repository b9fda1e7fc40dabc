"""Rollouter: streams dataset rows through `rollout_fn` n times each and queues the groups.

Owns: admission (through `StalenessManager`), running the episodes of a row concurrently with a
timeout, turning their results into a `TrajectoryGroup`, the zero-variance filter, and the
ledger of what became of every row (its only writer: the loop reports trained and dropped rows
through `on_trained` / `on_dropped`). An exception or timeout in `rollout_fn` is recorded with its
traceback and counted by reason; it never stops the run. A crash of the rollouter itself (the
dispatcher, or a row task failing outside the harness, e.g. `queue.put` on a dead queue) is kept and
re-raised by `check()`, naming the row. Does not own: engines, the queue's storage, training.

Components: a dispatcher task (admits rows in dataset order) and one task per running row.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import traceback
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from fullasync.client import RolloutClient, RolloutService
from fullasync.errors import InvalidRequestError
from fullasync.gateway import Gateway
from fullasync.rollout.generator import CustomGenerator, EpisodeContext
from fullasync.rollout.staleness import StalenessManager
from fullasync.rollout.state import RolloutState
from fullasync.types import Trajectory, TrajectoryGroup

log = logging.getLogger("fullasync")

RolloutFn = Callable[[RolloutClient, Any], Awaitable["float | Trajectory"]] | CustomGenerator


def _now() -> float:
    """The running event loop's clock (`time.monotonic` on a normal loop; simulated under fullasync.sim)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:  # constructed outside a loop
        return time.monotonic()


class RowOutcome(str, enum.Enum):
    """What became of a dataset row; every admitted row ends in exactly one of these."""

    QUEUED = "queued"  # its group is on the queue: trained or too_stale later; still queued if the run ends first
    TRAINED = "trained"
    FILTERED = "filtered"  # zero reward variance, filter on
    FAILED = "failed"  # every episode raised or timed out
    TOO_STALE = "too_stale"  # oldest token beyond max_staleness: dropped by the queue, or stopped while generating
    UNFINISHED = "unfinished"  # still generating when the run ended (total_steps reached); nothing was kept


@dataclass(frozen=True)
class RolloutSettings:
    """How the rollouter runs episodes."""

    n: int = 8  # episodes per row (the group size)
    max_running_rows: int = 16  # rows generating at once, each counted by its share of unfinished episodes
    episode_timeout_s: float = 300.0  # an episode running longer is cancelled and counted as failed
    filter_zero_variance: bool = False  # drop groups whose rewards are all equal (no GRPO signal)
    keep_tracebacks: int = 20  # most recent failure tracebacks kept for the report
    stop_stale_rows: bool = True  # stop a running row as soon as a token of it is too old for any later step


@dataclass(frozen=True)
class EpisodeFailure:
    row_id: str
    episode: int
    error: str
    traceback: str


def failure_reason(error: BaseException) -> str:
    """A short, countable reason: the error class, and for a malformed request the field it named."""
    if isinstance(error, InvalidRequestError) and error.param:
        return f"InvalidRequestError({error.param})"
    return type(error).__name__


@dataclass(frozen=True)
class RolloutReport:
    """The rollouter's account so far: the row ledger, failures by reason, and how busy it was."""

    outcome_counts: dict[str, int]
    row_outcomes: dict[str, str]
    trained_twice: list[str]  # must stay empty: a row's group is trained at most once
    episode_failures: int
    failure_reasons: dict[str, int]
    recent_failures: list[EpisodeFailure] = field(default_factory=list)
    idle_fraction: float = 0.0  # share of wall time with no row generating


class RolloutCrashedError(RuntimeError):
    """The rollouter itself failed (not a harness): the run cannot go on; the message names the row."""


def _fold_oldest(oldest: dict[str, int], row_id: str, version: int | None) -> None:
    """Keep in `oldest[row_id]` the older of what it holds and `version` (None: no token yet)."""
    if version is not None and version < oldest.get(row_id, version + 1):
        oldest[row_id] = version


class Rollouter:
    """Runs until the rows are exhausted or `stop()`; `wait_idle()` drains running rows."""

    def __init__(self, rollout_fn: RolloutFn, service: RolloutService, queue: Any, staleness: StalenessManager,
                 settings: RolloutSettings) -> None:
        """`queue`: a `fullasync.run.contracts.GroupQueue` (only `put` is used here)."""
        self.rollout_fn = rollout_fn
        self.service = service
        self.queue = queue
        self.staleness = staleness
        self.settings = settings
        self.gateway: Gateway | None = None
        self.outcomes: dict[str, RowOutcome] = {}
        self.trained_twice: list[str] = []  # must stay empty: a row's group is trained at most once
        self.episode_failures = 0
        self.failure_reasons: Counter = Counter()  # failure_reason(error) -> episodes
        self.recent_failures: deque[EpisodeFailure] = deque(maxlen=settings.keep_tracebacks)
        self._wake = asyncio.Event()  # set when capacity may have changed
        self._admitting = True
        self._row_tasks: dict[asyncio.Task, str] = {}  # running row task -> its row id
        self._crash: RolloutCrashedError | None = None
        self._dispatcher: asyncio.Task | None = None
        self._running_rows = 0
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self._created = _now()
        self._episodes: dict[str, dict[int, Trajectory | None]] = {}  # running row -> its finished episodes
        self._clients: dict[tuple[str, int], RolloutClient] = {}  # running episode -> its client
        self._restored: set[str] = set()  # rows a checkpoint accounted for: skipped in the stream
        self._resumed: dict[str, dict[int, Trajectory | None]] = {}  # rows a checkpoint had running
        self._row_oldest: dict[str, int] = {}  # running row -> oldest token version of its finished episodes
        self._stopping_stale: set[str] = set()  # running rows cancelled because their group could only be dropped
        self.rows_stopped_stale = 0

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Start what the harness needs: the HTTP gateway and a `CustomGenerator`'s set-up."""
        if isinstance(self.rollout_fn, CustomGenerator):
            if self.rollout_fn.uses_gateway:
                self.gateway = Gateway(self.service)
                await self.gateway.start()
            await self.rollout_fn.setup()

    async def close(self) -> None:
        """Stop episodes, then the generator's tear-down and the gateway."""
        await self.stop()
        try:
            if isinstance(self.rollout_fn, CustomGenerator):
                await self.rollout_fn.teardown()
        finally:
            if self.gateway is not None:
                await self.gateway.stop()

    def start(self, rows: Iterable[tuple[str, Any]]) -> None:
        """Begin dispatching `(row_id, row)` pairs; row ids must be unique over the run."""
        self._dispatcher = asyncio.create_task(self._dispatch(iter(rows)), name="rollouter-dispatch")

    async def stop(self) -> None:
        """Cancel the dispatcher and every running row (their rows end `unfinished`); crashes stay for `check()`."""
        tasks = [t for t in (self._dispatcher, *self._row_tasks) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    @property
    def exhausted(self) -> bool:
        """No more rows to admit and none running."""
        return self._dispatcher is not None and self._dispatcher.done() and not self._row_tasks

    def check(self) -> None:
        """Raise a crash of the dispatcher or of a row task (a fault, not a harness failure) instead of hanging."""
        if self._crash is not None:
            raise self._crash
        if self._dispatcher is not None and self._dispatcher.done() and not self._dispatcher.cancelled():
            error = self._dispatcher.exception()
            if error is not None:
                raise RolloutCrashedError(f"the rollouter's dispatcher crashed: {error!r}") from error

    def on_version(self) -> None:
        """The trainer's version advanced: more rows may be admissible, and rows already too stale stop."""
        if self.settings.stop_stale_rows:
            self._stop_stale_rows()
        self._wake.set()

    def _stop_stale_rows(self) -> None:
        """Cancel the running rows holding a token older than the queue accepts now: the bound only moves
        forward, so their groups could only be dropped; the engine slots they hold go to fresh rows."""
        oldest_allowed = self.staleness.version() - self.staleness.max_staleness
        oldest = dict(self._row_oldest)
        for (row_id, _), client in self._clients.items():
            _fold_oldest(oldest, row_id, client.episode.oldest_version)
        for task, row_id in list(self._row_tasks.items()):
            if oldest.get(row_id, oldest_allowed) < oldest_allowed and row_id not in self._stopping_stale:
                self._stopping_stale.add(row_id)
                self.rows_stopped_stale += 1
                task.cancel()

    def pause_admission(self) -> None:
        self._admitting = False

    def resume_admission(self) -> None:
        self._admitting = True
        self._wake.set()

    async def wait_idle(self, timeout_s: float) -> None:
        """Wait until no row is running (used to pause generation for validation)."""
        if self._row_tasks:
            _, pending = await asyncio.wait(list(self._row_tasks), timeout=timeout_s)
            if pending:
                raise TimeoutError(f"{len(pending)} row(s) still generating after {timeout_s:.0f} s: "
                                   f"{sorted(self._row_tasks[t] for t in pending)[:5]}")
        self.check()

    # -- what the loop reports, and what it reads ------------------------------------------

    def on_trained(self, groups: Sequence[TrajectoryGroup]) -> None:
        for group in groups:
            self._mark(group.row_id, RowOutcome.TRAINED)

    def on_dropped(self, row_ids: Sequence[str]) -> None:
        """The queue dropped these rows' groups as too stale: they will never train, their slots are free."""
        for row_id in row_ids:
            self._mark(row_id, RowOutcome.TOO_STALE)
            self.staleness.release()
        self._wake.set()

    def report(self) -> RolloutReport:
        busy = self._busy_s + (_now() - self._busy_since if self._busy_since is not None else 0.0)
        return RolloutReport(
            outcome_counts=dict(Counter(outcome.value for outcome in self.outcomes.values())),
            row_outcomes={row_id: outcome.value for row_id, outcome in self.outcomes.items()},
            trained_twice=list(self.trained_twice),
            episode_failures=self.episode_failures,
            failure_reasons=dict(self.failure_reasons),
            recent_failures=list(self.recent_failures),
            idle_fraction=1.0 - busy / max(_now() - self._created, 1e-9),
        )

    # -- checkpoint and resume ---------------------------------------------------------------

    def snapshot(self) -> RolloutState:
        """The rollout side now (no await: one consistent instant of the event loop).

        A running row keeps its finished episodes (a row whose group is still being put has all of
        them); its unfinished episodes are generated again on resume: their tokens so far are the
        `discarded_tokens` (completed calls; a call in progress is not counted).
        """
        in_flight = {row_id: dict(episodes) for row_id, episodes in self._episodes.items()}
        kept = sum(t.num_output_tokens for eps in in_flight.values() for t in eps.values() if t is not None)
        discarded = sum(len(call.output_ids) for client in self._clients.values() for call in client.episode.calls)
        counts = self.staleness.counts
        return RolloutState(
            admitted=len(self.outcomes.keys() | self._episodes.keys() | self._resumed.keys()),
            outcomes={row_id: outcome.value for row_id, outcome in self.outcomes.items()},
            episode_failures=self.episode_failures, failure_reasons=dict(self.failure_reasons),
            in_flight=in_flight, kept_tokens=kept, discarded_tokens=discarded,
            staleness={"started": counts.started, "running": float(counts.running)},
        )

    def restore(self, state: RolloutState) -> None:
        """Continue from `state` (before `start`): its ledger stands, its running rows run again first.

        Rows the ledger accounts for are skipped when the stream reaches them; a running row is
        admitted again when reached, with the episodes it had finished.
        """
        if self._dispatcher is not None:
            raise RuntimeError("Rollouter.restore() must come before start()")
        self.outcomes = {row_id: RowOutcome(outcome) for row_id, outcome in state.outcomes.items()}
        self.episode_failures = state.episode_failures
        self.failure_reasons = Counter(state.failure_reasons)
        self._restored = set(self.outcomes)
        self._resumed = {row_id: dict(episodes) for row_id, episodes in state.in_flight.items()}
        # rows trained or queued keep their admission slots (running rows take theirs again when admitted)
        self.staleness.restore(sum(o in (RowOutcome.TRAINED, RowOutcome.QUEUED) for o in self.outcomes.values()))

    def _mark(self, row_id: str, outcome: RowOutcome) -> None:
        if outcome is RowOutcome.TRAINED and self.outcomes.get(row_id) is RowOutcome.TRAINED:
            self.trained_twice.append(row_id)
        self.outcomes[row_id] = outcome

    # -- internals ---------------------------------------------------------------------------

    async def _dispatch(self, rows: Any) -> None:
        for row_id, row in rows:
            if row_id in self._restored:
                self._restored.discard(row_id)
                continue
            if row_id in self.outcomes or row_id in self._episodes:
                raise ValueError(f"row id {row_id!r} appears twice; row ids must be unique")
            finished = self._resumed.pop(row_id, {})
            while not (self._admitting and self.staleness.try_start()):
                self._wake.clear()
                await self._wake.wait()
            self._set_running(+1)
            self._episodes[row_id] = dict(finished)
            task = asyncio.create_task(self._run_row(row_id, row), name=f"row-{row_id}")
            self._row_tasks[task] = row_id
            task.add_done_callback(self._row_done)
        if self._resumed:
            raise ValueError(f"{len(self._resumed)} row(s) the checkpoint had running are not in the dataset "
                             f"(e.g. {sorted(self._resumed)[:3]}): resume with the dataset the run started with")

    def _row_done(self, task: asyncio.Task) -> None:
        """A row task ended: a crash (anything but a harness failure, which is data) becomes the run's error."""
        row_id = self._row_tasks.pop(task)
        if task.cancelled() or task.exception() is None or self._crash is not None:
            return
        error = task.exception()
        self._crash = RolloutCrashedError(f"row {row_id}: the rollouter failed outside the harness: {error!r}")
        self._crash.__cause__ = error
        log.error("row %s crashed the rollouter", row_id, exc_info=error)
        self._wake.set()

    def _set_running(self, delta: int) -> None:
        """Track rows generating; the time with none is the rollout idle time."""
        now = _now()
        self._running_rows += delta
        if self._running_rows > 0 and self._busy_since is None:
            self._busy_since = now
        elif self._running_rows == 0 and self._busy_since is not None:
            self._busy_s += now - self._busy_since
            self._busy_since = None

    async def _run_row(self, row_id: str, row: Any) -> None:
        produced = False
        finished = self._episodes[row_id]  # episodes done (a resumed row starts with those its checkpoint kept)
        share = Fraction(1, self.settings.n)
        for trajectory in finished.values():  # a resumed row's episodes finished before the checkpoint
            for call in trajectory.calls if trajectory is not None else ():
                _fold_oldest(self._row_oldest, row_id, min(call.output_versions, default=None))
        released = [share * len(finished)]  # share of the row's concurrency slot its finished episodes gave back
        self.staleness.episode_done(released[0])

        async def episode(index: int) -> None:
            try:
                finished[index] = await self._run_episode(row_id, index, row)
            finally:
                released[0] += share
                self.staleness.episode_done(share)
                self._wake.set()  # engine slots freed: another row may fit

        try:
            await asyncio.gather(*(episode(i) for i in range(self.settings.n) if i not in finished))
            trajectories = [finished[i] for i in sorted(finished) if finished[i] is not None]
            if not trajectories:
                self._mark(row_id, RowOutcome.FAILED)
            elif self.settings.filter_zero_variance and len({t.reward for t in trajectories}) == 1:
                self._mark(row_id, RowOutcome.FILTERED)
            else:
                group = TrajectoryGroup(row_id=row_id, trajectories=tuple(trajectories),
                                        metadata={"failed_episodes": self.settings.n - len(trajectories)})
                await self.queue.put(group)
                self._mark(row_id, RowOutcome.QUEUED)
                produced = True
        except asyncio.CancelledError:
            if not produced:
                self._mark(row_id, RowOutcome.TOO_STALE if row_id in self._stopping_stale else RowOutcome.UNFINISHED)
            raise
        finally:
            del self._episodes[row_id]
            self._row_oldest.pop(row_id, None)
            self._stopping_stale.discard(row_id)
            self.staleness.finish(produced_group=produced, running_share=1 - released[0])
            self._set_running(-1)
            self._wake.set()

    async def run_harness(self, client: RolloutClient, row: Any) -> Any:
        """One episode of the user's harness on `client` (a plain function, or a CustomGenerator)."""
        if not isinstance(self.rollout_fn, CustomGenerator):
            return await self.rollout_fn(client, row)
        if self.gateway is None:
            return await self.rollout_fn.generate(EpisodeContext(client.episode.id, client), row)
        episode = self.gateway.open_episode(client=client)
        try:
            return await self.rollout_fn.generate(
                EpisodeContext(episode.episode_id, client, episode.base_url, episode.api_key), row
            )
        finally:
            self.gateway.close_episode(episode)

    async def _run_episode(self, row_id: str, index: int, row: Any) -> Trajectory | None:
        client = self.service.client(f"{row_id}/{index}")
        self._clients[row_id, index] = client
        try:
            async with asyncio.timeout(self.settings.episode_timeout_s):  # in this task: no task per episode
                result = await self.run_harness(client, row)
            if isinstance(result, Trajectory):
                return result
            if isinstance(result, (int, float)) and not isinstance(result, bool):
                return client.trajectory(float(result))
            raise TypeError(f"rollout_fn must return a float reward or a Trajectory, got {type(result).__name__}")
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a harness failure is data, not a crash: record and go on
            self.episode_failures += 1
            reason = failure_reason(error)
            if reason not in self.failure_reasons:  # each kind once, with its message: the counts say how often
                log.warning("row %s episode %d failed (%s, counted, not trained): %s", row_id, index, reason, error)
            self.failure_reasons[reason] += 1
            self.recent_failures.append(
                EpisodeFailure(row_id, index, f"{type(error).__name__}: {error}", traceback.format_exc())
            )
            return None
        finally:
            del self._clients[row_id, index]
            client.close()
            _fold_oldest(self._row_oldest, row_id, client.episode.oldest_version)
