"""MessageQueue: a bounded Ray actor between the rollouter and the trainer.

Owns: finished `TrajectoryGroup`s (handed over oldest tokens first, then in arrival order — or in
arrival order only, `hand_over="arrival"`, the earlier policy kept for comparison),
back-pressure (a `put` waits while the queue is full), and the staleness check at hand-over: a
group whose oldest token is older than
`trainer_version - max_staleness` is dropped, counted and reported with its row id. Nothing is
dropped for any other reason. A waiting `get` returns on events only: its groups are there, it dropped a group
(whoever reads it passes the drops on at once), the queue was closed (`close`: the rollouter's last group is in),
or `wake` (a stop). Does not own: admission (the rollouter) or training.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, TypeVar, cast

from fullasync.contracts.run import QueueBatch, QueueStats, oldest_allowed, oldest_version
from fullasync.types import TrajectoryGroup

if TYPE_CHECKING:
    from ray.actor import ActorHandle

T = TypeVar("T")

HAND_OVER_ORDERS = ("oldest", "arrival")


class MessageQueue:
    """Hosted as a Ray actor (`RayGroupQueue`, below), or in process; a `GroupQueue`."""

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
        self._closed = False  # no group comes after those queued (`close`)
        self._woken = False  # the waiting get (or the next one) returns now with what there is (`wake`)
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

    async def close(self) -> None:
        """No group comes after those queued (the rows ran out): gets hand over what there is at once."""
        async with self._changed:
            self._closed = True
            self._changed.notify_all()

    async def wake(self) -> None:
        """The waiting get returns now with what there is (or the next one, if none waits yet)."""
        async with self._changed:
            self._woken = True
            self._changed.notify_all()

    async def get(self, count: int, trainer_version: int, max_staleness: int,
                  timeout_s: float | None = None) -> QueueBatch:
        """Wait for `count` fresh-enough groups, handing over fewer at once when it drops a group as too stale, when
        the queue is closed or woken, or at `timeout_s` (None: no bound; 0: no wait).

        The groups with the oldest tokens go first (then arrival order): a long-tail group that
        finished after younger ones is trained before it grows too stale, instead of being dropped.
        """
        batch = QueueBatch(groups=[])
        oldest = oldest_allowed(trainer_version, max_staleness)

        def ready() -> bool:
            self._drop_too_stale(oldest, batch.dropped_row_ids)
            return len(self._groups) >= count or bool(batch.dropped_row_ids) or self._closed or self._woken

        async with self._changed:
            self._drop_too_stale(oldest, batch.dropped_row_ids)
            batch.ready = len(self._groups)
            if timeout_s != 0:
                try:
                    await asyncio.wait_for(self._changed.wait_for(ready), timeout_s)
                except TimeoutError:
                    pass  # hand over what there is; the caller decides whether to wait again
            self._drop_too_stale(oldest, batch.dropped_row_ids)
            self._woken = False
            batch.groups = self._hand_over(count)
            batch.closed = self._closed
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


class RayGroupQueue:
    """A `MessageQueue` in a Ray actor, seen as a `GroupQueue`; every call is bounded, but a get's wait (as long as
    the rollouts take; the actor's death ends it at once)."""

    def __init__(self, max_size: int, hand_over: str = "oldest", call_timeout_s: float = 120.0,
                 put_timeout_s: float = 3600.0) -> None:
        import ray

        actor = ray.remote(MessageQueue).options(num_cpus=0).remote(max_size, hand_over)
        self.actor = cast("ActorHandle[MessageQueue]", actor)  # Ray types `.remote()` as a handle or the class
        self.max_size = max_size
        self.call_timeout_s = call_timeout_s
        self.put_timeout_s = put_timeout_s  # a full queue waits for the trainer; this long means it is stuck

    async def _bounded(self, reply: Awaitable[T], what: str, timeout_s: float) -> T:
        try:
            return await asyncio.wait_for(reply, timeout_s)
        except TimeoutError:
            raise TimeoutError(f"message queue: {what} took longer than {timeout_s:.0f} s") from None

    async def put(self, group: TrajectoryGroup) -> None:
        await self._bounded(self.actor.put.remote(group), f"put of row {group.row_id} (queue full: is the trainer "
                            "making progress?)", self.put_timeout_s)

    async def get(self, count: int, trainer_version: int, max_staleness: int,
                  timeout_s: float | None = None) -> QueueBatch:
        if timeout_s is None:  # as long as the rollouts take: the actor's death ends it
            return await self.actor.get.remote(count, trainer_version, max_staleness, None)
        return await self._bounded(self.actor.get.remote(count, trainer_version, max_staleness, timeout_s), "get",
                                   timeout_s + self.call_timeout_s)

    async def close(self) -> None:
        await self._bounded(self.actor.close.remote(), "close", self.call_timeout_s)

    async def wake(self) -> None:
        await self._bounded(self.actor.wake.remote(), "wake", self.call_timeout_s)

    async def give_back(self, groups: list[TrajectoryGroup]) -> None:
        await self._bounded(self.actor.give_back.remote(groups), "give_back", self.call_timeout_s)

    async def stats(self) -> QueueStats:
        return await self._bounded(self.actor.stats.remote(), "stats", self.call_timeout_s)

    async def snapshot(self) -> list[TrajectoryGroup]:
        return await self._bounded(self.actor.snapshot.remote(), "snapshot", self.call_timeout_s)

    def shutdown(self) -> None:
        import ray

        ray.kill(self.actor)
