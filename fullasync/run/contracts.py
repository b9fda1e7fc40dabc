"""The typed seams of a run: the queue between rollouter and trainer, and the trainer as the loop sees it.

Owns: the `GroupQueue` and `Trainer` protocols, and `RayGroupQueue`, which hosts a `MessageQueue` in a
Ray actor and hides `.remote` behind the protocol, with a bound on every wait. `MessageQueue` itself
satisfies `GroupQueue` in process (the simulator uses it so, on its virtual clock). A `Trainer` is generic
in its batch type: the loop hands `train_step` what the same trainer's `build_batch` made (verl's
`TrainBatch` of tensors, the simulator's `SimulatedBatch` of token counts) and never looks inside.
Does not own: the queue's logic (`fullasync.queue`) or training (`fullasync.trainer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, cast, runtime_checkable

from fullasync.engines.protocol import WeightsPayload
from fullasync.queue import MessageQueue, QueueBatch, QueueStats
from fullasync.types import TrajectoryGroup

if TYPE_CHECKING:
    from ray.actor import ActorHandle

BatchT = TypeVar("BatchT")  # a trainer's own batch type
T = TypeVar("T")


@runtime_checkable
class GroupQueue(Protocol):
    """Finished groups from the rollouter to the trainer (bounded; drops only too-stale groups, counted)."""

    async def put(self, group: TrajectoryGroup) -> None: ...

    async def get(self, count: int, trainer_version: int, max_staleness: int, timeout_s: float) -> QueueBatch: ...

    async def give_back(self, groups: list[TrajectoryGroup]) -> None: ...  # handed over, not taken: back at once

    async def stats(self) -> QueueStats: ...

    async def snapshot(self) -> list[TrajectoryGroup]: ...  # the queued groups, left in place


@runtime_checkable
class Trainer(Protocol[BatchT]):
    """What the loop and the assembly need of a trainer (`VerlTrainer`, `SimulatedTrainer`).

    Its settings are its own (`VerlTrainer.config` is a `TrainerConfig`): neither the loop nor the assembly
    reads them.
    """

    async def start(self) -> None: ...

    def build_batch(self, groups: Sequence[TrajectoryGroup]) -> BatchT: ...

    @property
    def binds_late(self) -> bool: ...  # whether `train_step` can take the last part of its batch when it reaches it

    async def train_step(self, batch: BatchT, trainer_version: int | None = None,
                         late: Callable[[], Awaitable[BatchT]] | None = None) -> Mapping[str, float]: ...
    # `late`: the rest of the batch, asked for (once) after `batch` is worked through; one update over both

    async def export_weights(self) -> WeightsPayload: ...  # the current policy, for `WeightSync.push`

    async def save_checkpoint(self, path: str | None = None) -> str: ...  # the policy, as a HF directory

    async def save_state(self, path: str) -> None: ...  # everything a resumed run needs (weights, optimizer, RNG, step)

    async def load_state(self, path: str) -> None: ...

    async def shutdown(self) -> None: ...


class RayGroupQueue:
    """A `MessageQueue` in a Ray actor, seen as a `GroupQueue`; every call is bounded."""

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

    async def get(self, count: int, trainer_version: int, max_staleness: int, timeout_s: float) -> QueueBatch:
        return await self._bounded(self.actor.get.remote(count, trainer_version, max_staleness, timeout_s), "get",
                                   timeout_s + self.call_timeout_s)

    async def give_back(self, groups: list[TrajectoryGroup]) -> None:
        await self._bounded(self.actor.give_back.remote(groups), "give_back", self.call_timeout_s)

    async def stats(self) -> QueueStats:
        return await self._bounded(self.actor.stats.remote(), "stats", self.call_timeout_s)

    async def snapshot(self) -> list[TrajectoryGroup]:
        return await self._bounded(self.actor.snapshot.remote(), "snapshot", self.call_timeout_s)

    def shutdown(self) -> None:
        import ray

        ray.kill(self.actor)
