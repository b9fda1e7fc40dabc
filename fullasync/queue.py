"""MessageQueue: a bounded Ray actor between the rollouter and the trainer.

Owns: finished `TrajectoryGroup`s in arrival order, back-pressure (a `put` waits while the queue
is full), and the staleness check at hand-over: a group whose oldest token is older than
`trainer_version - max_staleness` is dropped, counted and reported with its row id. Nothing is
dropped for any other reason. Does not own: admission (the rollouter) or training.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

from fullasync.types import TrajectoryGroup


@dataclass
class QueueBatch:
    """What one `get` hands over: groups to train, and row ids dropped as too stale on the way."""

    groups: list[TrajectoryGroup]
    dropped_row_ids: list[str] = field(default_factory=list)


@dataclass
class QueueStats:
    size: int
    total_put: int
    total_got: int
    dropped_too_stale: int
    put_per_s: float
    get_per_s: float


class MessageQueue:
    """Hosted as a Ray actor (`ray.remote(MessageQueue)`); all methods run on its event loop."""

    def __init__(self, max_size: int) -> None:
        if max_size < 1:
            raise ValueError(f"MessageQueue max_size must be >= 1, got {max_size}")
        self.max_size = max_size
        self._groups: deque[TrajectoryGroup] = deque()
        self._changed = asyncio.Condition()
        self._total_put = 0
        self._total_got = 0
        self._dropped = 0
        self._started = time.monotonic()

    async def put(self, group: TrajectoryGroup) -> None:
        """Append `group`, waiting while the queue is full (back-pressure on the rollouter)."""
        async with self._changed:
            await self._changed.wait_for(lambda: len(self._groups) < self.max_size)
            self._groups.append(group)
            self._total_put += 1
            self._changed.notify_all()

    async def get(self, count: int, trainer_version: int, max_staleness: int, timeout_s: float) -> QueueBatch:
        """Wait for `count` fresh-enough groups (or until `timeout_s`, returning what there is)."""
        batch = QueueBatch(groups=[])
        oldest_allowed = trainer_version - max_staleness

        def ready() -> bool:
            while self._groups and self._groups[0].min_version < oldest_allowed:
                batch.dropped_row_ids.append(self._groups.popleft().row_id)
                self._dropped += 1
            return len(self._groups) >= count - len(batch.groups)

        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
            except TimeoutError:
                pass  # hand over what there is; the caller decides whether to wait again
            while self._groups and len(batch.groups) < count:
                group = self._groups.popleft()
                if group.min_version < oldest_allowed:
                    batch.dropped_row_ids.append(group.row_id)
                    self._dropped += 1
                else:
                    batch.groups.append(group)
            self._total_got += len(batch.groups)
            self._changed.notify_all()
        return batch

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
