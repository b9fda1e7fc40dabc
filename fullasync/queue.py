"""MessageQueue: a bounded Ray actor between the rollouter and the trainer.

Owns: finished `TrajectoryGroup`s (handed over oldest tokens first, then in arrival order — or in
arrival order only, `hand_over="arrival"`, the earlier policy kept for comparison),
back-pressure (a `put` waits while the queue is full), and the staleness check at hand-over: a
group whose oldest token is older than
`trainer_version - max_staleness` is dropped, counted and reported with its row id. Nothing is
dropped for any other reason. Does not own: admission (the rollouter) or training.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fullasync.types import PROMPT_VERSION, TrajectoryGroup

HAND_OVER_ORDERS = ("oldest", "arrival")


def oldest_allowed(trainer_version: int, max_staleness: int) -> int:
    """The oldest token version a batch trained at `trainer_version` may hold: the staleness bound, in one place
    (the queue's check at hand-over, and the rollouter and training loop asking about a later batch)."""
    return trainer_version - max_staleness


def oldest_version(group: TrajectoryGroup) -> int:
    """`group.min_version` without a pass over every token: a call's versions never decrease
    (checked by `ModelCall`), so its first token is its oldest."""
    firsts = [c.output_versions[0] for t in group.trajectories for c in t.calls if c.output_versions]
    return min(firsts) if firsts else PROMPT_VERSION


@dataclass
class QueueBatch:
    """What one `get` hands over: groups to train, and row ids dropped as too stale on the way."""

    groups: list[TrajectoryGroup]
    dropped_row_ids: list[str] = field(default_factory=list)
    ready: int = 0  # fresh-enough groups waiting when the get began (admission's pacing reads it)


@dataclass
class QueueStats:
    size: int
    total_put: int
    total_got: int
    dropped_too_stale: int
    put_per_s: float
    get_per_s: float


class MessageQueue:
    """Hosted as a Ray actor (`fullasync.run.contracts.RayGroupQueue`), or in process; a `GroupQueue`."""

    def __init__(self, max_size: int, hand_over: str = "oldest") -> None:
        if max_size < 1:
            raise ValueError(f"MessageQueue max_size must be >= 1, got {max_size}")
        if hand_over not in HAND_OVER_ORDERS:
            raise ValueError(f"MessageQueue hand_over={hand_over!r}; choose one of {HAND_OVER_ORDERS}")
        self.max_size = max_size
        self.hand_over = hand_over
        self._groups: list[tuple[int, int, TrajectoryGroup]] = []  # (oldest version, arrival number, group)
        self._arrivals = 0
        self._changed = asyncio.Condition()
        self._total_put = 0
        self._total_got = 0
        self._dropped = 0
        self._started = time.monotonic()

    async def put(self, group: TrajectoryGroup) -> None:
        """Append `group`, waiting while the queue is full (back-pressure on the rollouter)."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._groups) < self.max_size)
            self._groups.append((oldest_version(group), self._arrivals, group))
            self._arrivals += 1
            self._total_put += 1
            self._changed.notify_all()

    async def give_back(self, groups: list[TrajectoryGroup]) -> None:
        """Return groups a `get` handed over and the trainer did not take (a step binding its last groups late
        keeps the oldest it was offered). They go back at once, past `max_size` if the rollouter filled the
        room meanwhile: the trainer must never wait on its own queue."""
        async with self._changed:
            for group in groups:
                self._groups.append((oldest_version(group), self._arrivals, group))
                self._arrivals += 1
            self._total_got -= len(groups)
            self._changed.notify_all()

    def _drop_too_stale(self, floor: int, dropped_row_ids: list[str]) -> None:
        if any(oldest < floor for oldest, _, _ in self._groups):
            for oldest, _, group in self._groups:
                if oldest < floor:
                    dropped_row_ids.append(group.row_id)
                    self._dropped += 1
            self._groups = [entry for entry in self._groups if entry[0] >= floor]

    def _hand_over(self, count: int) -> list[TrajectoryGroup]:
        """Remove and return up to `count` groups: oldest tokens first, then arrival order (or arrival only)."""
        if self.hand_over == "oldest":
            self._groups.sort(key=lambda entry: entry[:2])
        taken, self._groups = self._groups[:count], self._groups[count:]
        return [group for _, _, group in taken]

    async def get(self, count: int, trainer_version: int, max_staleness: int, timeout_s: float) -> QueueBatch:
        """Wait for `count` fresh-enough groups (or until `timeout_s`, returning what there is).

        The groups with the oldest tokens go first (then arrival order): a long-tail group that
        finished after younger ones is trained before it grows too stale, instead of being dropped.
        """
        batch = QueueBatch(groups=[])
        oldest = oldest_allowed(trainer_version, max_staleness)

        def ready() -> bool:
            self._drop_too_stale(oldest, batch.dropped_row_ids)
            return len(self._groups) >= count

        async with self._changed:
            self._drop_too_stale(oldest, batch.dropped_row_ids)
            batch.ready = len(self._groups)
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
            except TimeoutError:
                pass  # hand over what there is; the caller decides whether to wait again
            self._drop_too_stale(oldest, batch.dropped_row_ids)
            batch.groups = self._hand_over(count)
            self._total_got += len(batch.groups)
            self._changed.notify_all()
        return batch

    async def snapshot(self) -> list[TrajectoryGroup]:
        """The queued groups in hand-over order, left in place (what a checkpoint saves)."""
        async with self._changed:
            if self.hand_over == "oldest":
                self._groups.sort(key=lambda entry: entry[:2])
            return [group for _, _, group in self._groups]

    async def stats(self) -> QueueStats:
        elapsed = max(time.monotonic() - self._started, 1e-9)
        return QueueStats(
            size=len(self._groups),
            total_put=self._total_put,
            total_got=self._total_got,
            dropped_too_stale=self._dropped,
            put_per_s=self._total_put / elapsed,
            get_per_s=self._total_got / elapsed,
        )
