"""The rollouter's books: one record per running row, and what became of every row and failed episode.

Owns: `RunningRow` (everything known of one row while its episodes generate: its episodes finished
and running, the oldest token version it holds, the share of its concurrency slot given back, whether
it is being stopped as too stale) and `RowLedger`, the one object that holds those records with the
outcome of every row taken from the dataset, the rows a checkpoint accounted for or had running, the
episode failures, and the time some row was generating. A row enters with `add` and leaves with
`finish`, which sets its outcome in the same call, so no invariant spans two collections. Also
what a checkpoint keeps of all this (`snapshot`/`restore`, as a `RolloutState`).
Does not own: tasks, admission or the queue (`Rollouter`), nor the checkpoint's format (`fullasync.run.checkpoint`).
"""

from __future__ import annotations

import asyncio
import enum
import time
import traceback
from collections import Counter, deque
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

from fullasync.client import RolloutClient
from fullasync.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    EngineDiedError,
    EngineResumeTimeoutError,
    FailureKind,
    InfraError,
    InvalidRequestError,
    PolicyOutputError,
)
from fullasync.rollout.state import RolloutState
from fullasync.types import ModelCall, Trajectory


def now() -> float:
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
class EpisodeFailure:
    row_id: str
    episode: int
    error: str
    traceback: str


def failure_kind(error: BaseException, fault: FailureKind | None) -> FailureKind:
    """Why an episode failed: what the harness raised, or what its client saw go wrong last (`Episode.fault`: an
    SDK error over the gateway hides the cause), or its own deadline; else the harness's own failure."""
    if isinstance(error, InfraError | EngineDiedError | EngineResumeTimeoutError):
        return FailureKind.INFRA
    if isinstance(error, PolicyOutputError):
        return FailureKind.MODEL
    if isinstance(error, InvalidRequestError) and error.code == CONTEXT_LENGTH_EXCEEDED:
        return FailureKind.LENGTH
    if fault is not None:
        return fault
    if isinstance(error, TimeoutError):
        return FailureKind.TIMEOUT
    return FailureKind.HARNESS


def failure_reason(error: BaseException) -> str:
    """A short, countable reason: the error class, and for a malformed request the field it named."""
    if isinstance(error, InvalidRequestError) and error.param:
        return f"InvalidRequestError({error.param})"
    return type(error).__name__


@dataclass
class FailureLog:
    """Episodes that raised or timed out: how many, by reason, and the most recent with their tracebacks."""

    count: int = 0
    reasons: Counter[str] = field(default_factory=Counter)  # failure_reason(error) -> episodes
    kinds: Counter[str] = field(default_factory=Counter)  # FailureKind value -> episodes
    infra_retries: int = 0  # episodes run again after an infrastructure failure
    recent: deque[EpisodeFailure] = field(default_factory=deque)

    def record(self, row_id: str, episode: int, error: BaseException, kind: FailureKind = FailureKind.HARNESS) -> bool:
        """Count `error` of `kind` (call from its `except` block: the traceback is read there); True if its reason
        is new."""
        self.count += 1
        self.kinds[kind.value] += 1
        reason = failure_reason(error)
        new = reason not in self.reasons
        self.reasons[reason] += 1
        self.recent.append(EpisodeFailure(row_id, episode, f"{type(error).__name__}: {error}", traceback.format_exc()))
        return new


def oldest_version(trajectory: Trajectory | None) -> int | None:
    """The oldest weight version of any token `trajectory` sampled (None: no token, or a failed episode)."""
    versions = [min(call.output_versions) for call in trajectory.calls if call.output_versions] if trajectory else []
    return min(versions, default=None)


@dataclass(frozen=True, slots=True)
class RowSize:
    """What a row generated by the time it stopped running (its finished episodes and, for a row stopped early,
    the calls its unfinished ones had completed; a call in progress is not counted): for the length-bias
    account of `rows.jsonl`."""

    episodes: int  # episodes that finished (with a trajectory or failed)
    calls: int  # model calls
    output_tokens: int
    resumed_calls: int  # calls interrupted by a push and continued


def _older(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


@dataclass(eq=False, slots=True)
class RunningRow:
    """One row while its episodes generate. A resumed row starts with the episodes its checkpoint kept.

    Its group is `finished` once every index 0..n-1 is there; `running` holds the clients of the
    episodes under way (their tokens so far are lost if the row is checkpointed now).
    """

    row_id: str
    row: Any
    finished: dict[int, Trajectory | None]  # episode index -> its trajectory (None: it failed)
    running: dict[int, RolloutClient] = field(default_factory=dict)  # episode index -> its client, while it runs
    task: asyncio.Task[None] | None = None  # the row's task, once admitted
    oldest_finished: int | None = None  # oldest token version of its finished episodes
    released: Fraction = Fraction(0)  # share of its concurrency slot that its ended episodes gave back
    stopping_stale: bool = False  # cancelled because its group could only be dropped
    holds_slot: bool = False  # stopped so: its admission slot is released at the next version, not when it ends
    unfinished_calls: list[ModelCall] = field(default_factory=list)  # completed calls of episodes that were stopped
    admitted_version: int = 0  # the trainer's version when the row was admitted

    def __post_init__(self) -> None:
        for trajectory in self.finished.values():
            self.oldest_finished = _older(self.oldest_finished, oldest_version(trajectory))

    def episode_started(self, index: int, client: RolloutClient) -> None:
        self.running[index] = client

    def episode_ended(self, index: int) -> None:
        """Episode `index` ended (finished, failed or cancelled): its client closes; its oldest token counts."""
        client = self.running.pop(index)
        client.close()
        if index not in self.finished:
            self.unfinished_calls += client.episode.calls
        self.oldest_finished = _older(self.oldest_finished, client.episode.oldest_version)

    def size(self) -> RowSize:
        calls = [c for t in self.finished.values() if t is not None for c in t.calls] + self.unfinished_calls
        calls += [c for client in self.running.values() for c in client.episode.calls]
        return RowSize(len(self.finished), len(calls), sum(len(c.output_ids) for c in calls),
                       sum(1 for c in calls if c.num_resumes))

    def priority(self) -> int:
        """Its episodes' engine priority (lower first): the oldest token version it holds, else the version it was
        admitted at — the row whose group the staleness bound will drop first is served first."""
        oldest = self.oldest_token_version()
        return self.admitted_version if oldest is None else oldest

    def oldest_token_version(self) -> int | None:
        """The oldest weight version of any token the row holds, finished or running episodes (None: none yet)."""
        oldest = self.oldest_finished
        for client in self.running.values():
            oldest = _older(oldest, client.episode.oldest_version)
        return oldest


class RowLedger:
    """The outcome of every row and the record of every running row; the rollouter is its only writer."""

    def __init__(self, keep_tracebacks: int) -> None:
        self.outcomes: dict[str, RowOutcome] = {}
        self._counts: Counter[RowOutcome] = Counter()  # of `outcomes`, kept as they change: read every step
        self.sizes: dict[str, RowSize] = {}  # what each row generated, set when it stops running
        self.running: dict[str, RunningRow] = {}
        self.trained_twice: list[str] = []  # must stay empty: a row's group is trained at most once
        self.failures = FailureLog(recent=deque(maxlen=keep_tracebacks))
        self.rows_stopped_stale = 0
        self._restored: set[str] = set()  # rows a checkpoint accounted for: skipped in the stream
        self._resumed: dict[str, dict[int, Trajectory | None]] = {}  # rows a checkpoint had running
        self._created = now()
        self._busy_since: float | None = None
        self._busy_s = 0.0

    # -- rows entering and leaving ---------------------------------------------------------

    def skip(self, row_id: str) -> bool:
        """True for a row the checkpoint accounted for (once); raises for a row id already taken."""
        if row_id in self._restored:
            self._restored.discard(row_id)
            return True
        if row_id in self.outcomes or row_id in self.running:
            raise ValueError(f"row id {row_id!r} appears twice; row ids must be unique")
        return False

    def add(self, row_id: str, row: Any) -> RunningRow:
        """The row starts running (with the episodes a checkpoint kept of it, if it had it running)."""
        record = RunningRow(row_id, row, dict(self._resumed.pop(row_id, {})))
        self.running[row_id] = record
        if self._busy_since is None:
            self._busy_since = now()
        return record

    def finish(self, record: RunningRow, outcome: RowOutcome | None) -> None:
        """The row stopped running and ended in `outcome` (None: it crashed the rollouter; the run fails)."""
        del self.running[record.row_id]
        self.sizes[record.row_id] = record.size()
        if outcome is not None:
            self.mark(record.row_id, outcome)
        if not self.running and self._busy_since is not None:
            self._busy_s += now() - self._busy_since
            self._busy_since = None

    def mark(self, row_id: str, outcome: RowOutcome) -> None:
        previous = self.outcomes.get(row_id)
        if outcome is RowOutcome.TRAINED and previous is RowOutcome.TRAINED:
            self.trained_twice.append(row_id)
        if previous is not None:
            self._counts[previous] -= 1
        self._counts[outcome] += 1
        self.outcomes[row_id] = outcome

    def unstarted_resumed(self) -> list[str]:
        """Rows the checkpoint had running that the stream has not reached (at its end: not in the dataset)."""
        return sorted(self._resumed)

    def stale_rows(self, oldest_allowed: int) -> list[RunningRow]:
        """Running rows holding a token older than `oldest_allowed`, not yet being stopped."""
        return [record for record in self.running.values() if not record.stopping_stale
                and (oldest := record.oldest_token_version()) is not None and oldest < oldest_allowed]

    def tasks(self) -> list[asyncio.Task[None]]:
        return [record.task for record in self.running.values() if record.task is not None]

    # -- accounts ----------------------------------------------------------------------------

    def row_records(self) -> list[dict[str, Any]]:
        """One record per row that stopped running in this process: its outcome and what it generated."""
        return [{"row_id": row_id, "outcome": self.outcomes[row_id].value, **asdict(size)}
                for row_id, size in self.sizes.items() if row_id in self.outcomes]

    def outcome_counts(self) -> dict[str, int]:
        """Rows per outcome (O(outcomes), not O(rows): the training loop reads it every step)."""
        return {outcome.value: count for outcome, count in self._counts.items() if count}

    def idle_fraction(self) -> float:
        """Share of the time since the ledger was made with no row generating."""
        busy = self._busy_s + (now() - self._busy_since if self._busy_since is not None else 0.0)
        return 1.0 - busy / max(now() - self._created, 1e-9)

    def snapshot(self, staleness: dict[str, float]) -> RolloutState:
        """The books now (no await in here: one consistent instant). A running row keeps its finished
        episodes; its unfinished ones are generated again on resume: their tokens so far are the
        `discarded_tokens` (completed calls; a call in progress is not counted)."""
        in_flight = {row_id: dict(episodes) for row_id, episodes in self._resumed.items()}  # not reached again yet
        in_flight.update((row_id, dict(record.finished)) for row_id, record in self.running.items())
        return RolloutState(
            admitted=len(self.outcomes.keys() | self.running.keys() | self._resumed.keys()),
            outcomes={row_id: outcome.value for row_id, outcome in self.outcomes.items()},
            episode_failures=self.failures.count, failure_reasons=dict(self.failures.reasons),
            failure_kinds=dict(self.failures.kinds), infra_retries=self.failures.infra_retries,
            in_flight=in_flight,
            kept_tokens=sum(t.num_output_tokens for eps in in_flight.values() for t in eps.values() if t is not None),
            discarded_tokens=sum(len(call.output_ids) for record in self.running.values()
                                 for client in record.running.values() for call in client.episode.calls),
            staleness=staleness,
        )

    def restore(self, state: RolloutState) -> None:
        """Take over `state`'s ledger and failure counts; its running rows wait to be reached in the stream."""
        self.outcomes = {row_id: RowOutcome(outcome) for row_id, outcome in state.outcomes.items()}
        self._counts = Counter(self.outcomes.values())
        self.failures.count = state.episode_failures
        self.failures.reasons = Counter(state.failure_reasons)
        self.failures.kinds = Counter(state.failure_kinds)
        self.failures.infra_retries = state.infra_retries
        self._restored = set(self.outcomes)
        self._resumed = {row_id: dict(episodes) for row_id, episodes in state.in_flight.items()}
