"""What a step trains: its batch taken from the queue, and its last groups bound late.

Owns: reading the queue for the trainer (`Batcher.next_batch`: B groups fresh enough for the version, fewer only
when the rows ran out or a stop is asked for), the trainer's idle time while it waits, and late binding (a step
whose batch is the last chance for rows still running takes its last groups when the trainer reaches them:
`late_places`, `train`). Each hand-over is published to observers (`observe`: the rollouter frees the admission
slots of dropped rows and stops rows only the batch just taken could train), as the weight sync publishes versions:
the loop relays nothing between queue and rollouter.

A queue read waits for events, not on a clock: it returns when its groups are there, when it dropped a group as too
stale (the observers hear of it at once), when the rows ended (the rollouter closes the queue after its last group),
or when a stop wakes it (`stop`; what it had taken comes back with it, nothing is lost).
Does not own: the queue (`queue.py`), the staleness bound (`contracts.run.oldest_allowed`) or the update.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol

from fullasync.contracts.run import BatchT, GroupQueue, QueueBatch, oldest_allowed, oldest_version
from fullasync.infra.offload import loop_time, off_loop
from fullasync.observe.metrics import step_stats
from fullasync.run.healing import HealingTrainer
from fullasync.types import TrajectoryGroup


class HandOverObserver(Protocol):
    """Hears what became of the queue's groups (the rollouter)."""

    def on_handed_over(self, got: QueueBatch, asked: bool) -> None: ...  # a get's drops (asked: a batch's first get)

    def on_batch_taken(self, version: int) -> None: ...  # rows that only the batch just taken could train stop


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


@dataclass(frozen=True)
class BatchSettings:
    batch_size: int  # groups per step
    max_staleness: int  # k: a batch at version v takes groups whose oldest token is at least v − k
    bind_late: bool = True  # a last-chance step takes its last groups when the trainer reaches them


class Batcher(Generic[BatchT]):
    """The trainer's side of the queue (see the module)."""

    def __init__(self, queue: GroupQueue, settings: BatchSettings, last_chance: Callable[[int], int]) -> None:
        """`last_chance(version)`: rows still running that only the batch at `version` can train."""
        self.queue = queue
        self.settings = settings
        self.last_chance = last_chance
        self.idle_s = 0.0  # time the trainer waited for its batches
        self._observers: list[HandOverObserver] = []
        self._stopping = asyncio.Event()

    def observe(self, observer: HandOverObserver) -> None:
        self._observers.append(observer)

    def stop(self) -> None:
        """A batch being waited for is handed over with what it holds now (none after)."""
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    async def next_batch(self, version: int) -> list[TrajectoryGroup]:
        """B groups fresh enough for `version`; fewer only when the rows ran out or a stop was asked for."""
        groups: list[TrajectoryGroup] = []
        waited = loop_time()
        asked = True  # the first get answers the trainer's request (admission paces by what it found)
        size = self.settings.batch_size
        while len(groups) < size and not self.stopping:
            got = await self._get(size - len(groups), version)
            self._handed_over(got, asked)
            asked = False
            groups += got.groups
            if got.closed:  # the rows ended: what the queue held is all there is
                break
        self.idle_s += loop_time() - waited
        return groups

    async def _get(self, count: int, version: int) -> QueueBatch:
        """One queue read that wakes on the queue's events (see the module), or on a stop."""
        get = asyncio.ensure_future(self.queue.get(count, version, self.settings.max_staleness, None))
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            done, _ = await asyncio.wait([get, stop], return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                await self.queue.wake()  # the get returns what it took: a checkpoint keeps it
            return await get
        finally:
            stop.cancel()

    def _handed_over(self, got: QueueBatch, asked: bool) -> None:
        for observer in self._observers:
            observer.on_handed_over(got, asked)

    def late_places(self, version: int, groups: list[TrajectoryGroup], binds_late: bool) -> int:
        """How many of this step's groups to take only when the trainer reaches them: as many as rows still
        running can be trained by no later batch, at most half the batch, and no more than the batch holds groups
        a later batch can still take (a held place can only go to a straggler if its group can wait). Those rows
        get the time the trainer spends on the first part to finish in, instead of being dropped at the next
        hand-over."""
        if not (self.settings.bind_late and binds_late) or len(groups) < 2:
            return 0
        next_batch_takes = oldest_allowed(version + 1, self.settings.max_staleness)
        can_wait = sum(oldest_version(g) >= next_batch_takes for g in groups)
        return min(self.last_chance(version), can_wait, len(groups) // 2)

    async def _bind_late(self, held: list[TrajectoryGroup], version: int) -> list[TrajectoryGroup]:
        """The step's last `len(held)` groups: the oldest of `held` and of what finished meanwhile (the rows
        that only this batch can train come first); the others go back to the queue for the next step."""
        got = await self.queue.get(len(held), version, self.settings.max_staleness, 0.0)
        self._handed_over(got, False)
        offered = sorted(held + got.groups, key=oldest_version)  # stable: the held ones came first
        taken, back = offered[: len(held)], offered[len(held):]
        if back:
            await self.queue.give_back(back)
        return taken

    async def train(self, trainer: HealingTrainer[BatchT], groups: list[TrajectoryGroup],
                    version: int) -> StepOutcome:
        """One update on `groups` at `version`; a step that binds late takes its last groups when the trainer
        reaches them (`late_places`)."""
        late = self.late_places(version, groups, trainer.binds_late)
        outcome = StepOutcome(groups, {"batch/late_places": float(late), "batch/late_joined": 0.0})

        def taken(final: list[TrajectoryGroup]) -> None:
            for observer in self._observers:
                observer.on_batch_taken(version)
            outcome.batch_stats = asyncio.ensure_future(off_loop(step_stats, final, version))  # beside the update

        if not late:
            taken(groups)
            batch = await off_loop(trainer.build_batch, groups)  # in proportion to the batch: off the loop
            outcome.metrics.update(await trainer.train_step(batch, version))
            return outcome
        groups.sort(key=oldest_version)  # each get hands over oldest first, but a batch may take several
        groups[:], held = groups[:-late], groups[-late:]  # the youngest wait

        async def take_late() -> BatchT:
            second = await self._bind_late(held, version)
            outcome.metrics["batch/late_joined"] = float(len({id(g) for g in second} - {id(h) for h in held}))
            groups.extend(second)
            taken(groups)
            return await off_loop(trainer.build_batch, second)

        batch = await off_loop(trainer.build_batch, groups)
        outcome.metrics.update(await trainer.train_step(batch, version, take_late))
        return outcome
