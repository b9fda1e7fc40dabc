"""A trainer that heals: a rank that dies costs minutes, not the run.

Owns: `HealingTrainer`, the `Trainer` the training loop talks to. Each of its calls that a dead rank breaks
(`TrainerWorkerDiedError`) restarts the trainer from the newest complete checkpoint (`restart`), trains again,
batch by batch, the steps since — it keeps their batches until the next checkpoint (`checkpointed`) — and then makes
the call again. Restarts back off (`RESTART_BACKOFF_S`), up to `max_restarts` in the run; past them, or without a
`restart`, the death is raised. Engines keep serving meanwhile, within the staleness bound; versions only grow (the
restarted lineage's first push is the next version); every row is trained once into the weights that go on.
Does not own: the checkpoints themselves (the `Run` writes them and says which is the newest) or the step's order
(`loop.py`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Generic, TypeVar

from fullasync.contracts.run import BatchT, Trainer
from fullasync.contracts.weights import WeightsPayload
from fullasync.errors import TrainerWorkerDiedError
from fullasync.infra.offload import loop_time
from fullasync.types import TrajectoryGroup

log = logging.getLogger("fullasync")

RESTART_BACKOFF_S = (1.0, 30.0)  # a trainer restart waits the first, doubled per restart of the run, at most the second

T = TypeVar("T")


class HealingTrainer(Generic[BatchT]):
    """`trainer` behind calls that survive a dead rank (see the module); `restarts` and `restart_s` count the cost."""

    def __init__(self, trainer: Trainer[BatchT], restart: Callable[[], Awaitable[str]] | None = None,
                 max_restarts: int = 0) -> None:
        """`restart()`: starts the trainer again as of the newest complete checkpoint and says which (None, or
        `max_restarts` 0: a dead rank ends the run)."""
        self.trainer = trainer
        self.restart = restart if max_restarts > 0 else None
        self.max_restarts = max_restarts
        self.restarts = 0  # times a rank died and the trainer started again
        self.restart_s = 0.0  # training time those restarts cost (start, load, steps trained again)
        self._since_checkpoint: list[tuple[BatchT, BatchT | None, int]] = []  # what a restart trains again

    @property
    def binds_late(self) -> bool:
        return self.trainer.binds_late

    def build_batch(self, groups: Sequence[TrajectoryGroup]) -> BatchT:
        return self.trainer.build_batch(groups)

    def checkpointed(self) -> None:
        """A checkpoint holds the steps so far: a restart starts from it and trains none of them again."""
        self._since_checkpoint.clear()

    async def train_step(self, batch: BatchT, version: int,
                         late: Callable[[], Awaitable[BatchT]] | None = None) -> Mapping[str, float]:
        """`Trainer.train_step`, again after a heal when a rank died in it; the step's batch (and its late part,
        taken once whatever the tries) is kept for a later restart until the next checkpoint."""
        rest: list[BatchT] = []

        async def late_once() -> BatchT:
            assert late is not None
            if not rest:
                rest.append(await late())
            return rest[0]

        metrics = await self.healed(lambda: self.trainer.train_step(batch, version,
                                                                    late_once if late is not None else None))
        if self.restart is not None:
            self._since_checkpoint.append((batch, rest[0] if rest else None, version))
        return metrics

    async def export_weights(self) -> WeightsPayload:
        return await self.healed(self.trainer.export_weights)

    async def healed(self, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, made again after a heal each time a rank dies in it (a checkpoint's save, an export)."""
        while True:
            try:
                return await call()
            except TrainerWorkerDiedError as error:
                await self._heal(error)

    async def _heal(self, error: TrainerWorkerDiedError) -> None:
        """Start the trainer again from the newest complete checkpoint and train again the steps since; a rank
        that dies meanwhile costs another restart. Raises `error` when restarts are off or used up."""
        while True:
            if self.restart is None or self.restarts >= self.max_restarts:
                raise error
            self.restarts += 1
            wait = min(RESTART_BACKOFF_S[0] * 2 ** (self.restarts - 1), RESTART_BACKOFF_S[1])
            log.error("%s; restarting the trainer in %.0f s (restart %d of %d) and training again the %d steps "
                      "since its newest checkpoint; engines keep serving", error, wait, self.restarts,
                      self.max_restarts, len(self._since_checkpoint))
            await asyncio.sleep(wait)
            began = loop_time()
            try:
                origin = await self.restart()
                for batch, rest, version in self._since_checkpoint:
                    await self.trainer.train_step(batch, version, None if rest is None else _ready(rest))
            except TrainerWorkerDiedError as again:
                error = again
                continue
            finally:
                self.restart_s += loop_time() - began
            log.warning("trainer restarted from %s and %d steps trained again in %.1f s; the run goes on",
                        origin, len(self._since_checkpoint), loop_time() - began)
            return


def _ready(batch: BatchT) -> Callable[[], Awaitable[BatchT]]:
    """A `late` that hands over a part taken before (a step trained again after a restart)."""

    async def late() -> BatchT:
        return batch

    return late
