"""The typed seams of a run: the queue between rollouter and trainer, and the trainer as the loop sees it.

Owns: the `GroupQueue` and `Trainer` protocols and the queue's records (`QueueBatch`, `QueueStats`).
`fullasync.run.queue.MessageQueue` satisfies `GroupQueue` in process (the simulator uses it so, on its virtual
clock), and `RayGroupQueue` hosts it in a Ray actor. A `Trainer` is generic
in its batch type: the loop hands `train_step` what the same trainer's `build_batch` made (verl's
`TrainBatch` of tensors, the simulator's `SimulatedBatch` of token counts) and never looks inside.
Does not own: the queue's logic (`fullasync.run.queue`) or training (`fullasync.trainer`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from fullasync.contracts.weights import WeightsPayload
from fullasync.types import PROMPT_VERSION, TrajectoryGroup


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
    closed: bool = False  # the queue was closed: no group comes after these (the rows ran out)


@dataclass
class QueueStats:
    size: int
    total_put: int
    total_got: int
    dropped_too_stale: int
    put_per_s: float
    get_per_s: float


BatchT = TypeVar("BatchT")  # a trainer's own batch type


@runtime_checkable
class GroupQueue(Protocol):
    """Finished groups from the rollouter to the trainer (bounded; drops only too-stale groups, counted)."""

    async def put(self, group: TrajectoryGroup) -> None: ...

    async def get(self, count: int, trainer_version: int, max_staleness: int,
                  timeout_s: float | None = None) -> QueueBatch: ...
    # waits for `count` groups, or returns fewer on a drop, a `close`, a `wake`, or at `timeout_s` (None: no bound)

    async def close(self) -> None: ...  # no group comes after those queued (the rollouter's rows ran out)

    async def wake(self) -> None: ...  # the waiting get (or the next) returns now with what there is (a stop)

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

    async def restart(self) -> None: ...  # start again with the model it started with (a rank died); then load_state

    async def shutdown(self) -> None: ...
