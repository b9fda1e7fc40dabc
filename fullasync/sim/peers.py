"""Other frameworks' scheduling policies, as admission, queue and push rules the simulator can plug in.

Owns: one frozen description per peer policy (`VerlFullyAsync`, `AReaLAsync`, `SkyRLFullyAsync`,
`OneStepOff`) and the few components that differ from ours — an admission rule (a
`StalenessManager` subclass), a queue (a `MessageQueue` subclass), and for verl's
`trigger_parameter_sync_step` a push every T-th step — and `install(run, policy)`, which puts them
in place of ours in an assembled `Run`. Everything else stays the real control code: the rollouter,
the client's continuation of interrupted generations, the weight sync, the training loop.
Does not own: our policy (`fullasync.rollout.staleness`, `fullasync.run.queue`), which is what a run
without a peer uses.

Each rule is written from the peer's documentation and code (paths below are in the peer's
repository, read in 2026; the rules are re-expressed here, not copied). Units: a *row* is one
prompt with its n episodes (verl's "sample", AReaL's rollout task of a group, SkyRL's "group").

- verl fully-async recipe (`docs/advance/fully_async.md`,
  `verl/experimental/fully_async_policy/fully_async_rollouter.py` (`set_max_required_samples`,
  `reset_staleness`, `_should_pause_generation`), `.../message_queue.py`, `.../fully_async_trainer.py`
  (`_fit_update_local_step`)): with R rows per local update and T = trigger_parameter_sync_step
  local updates per weight sync, at most `max_required = R·(1 + staleness_threshold)·T` rows are
  started per weight version, counting at each sync the rows still running or queued; admission
  also stops while the queue holds max_required rows, and at most
  `min(replicas × concurrent_samples_per_replica, max_required)` rows run at once. The queue is a
  deque of that size that drops its oldest row when a put finds it full, and hands rows over in
  arrival order with no staleness check. `partial_rollout=True` interrupts generations at a sync
  and continues them under the new weights (ABORT + resubmit, `verl/workers/rollout/llm_server.py`
  `FullyAsyncLLMServerClient`); False lets them finish first (WAIT, the docs' mode c).
- AReaL (`areal/infra/staleness_manager.py` `get_capacity`, `areal/api/cli_args.py`
  `InferenceEngineConfig`, `areal/infra/remote_inf_engine.py` `agenerate`): a task may start while
  `accepted + running ≤ (η + v + 1)·B` and `running < max_concurrent_rollouts` (default B), a
  running task counting whole until it finishes; results are consumed in completion order and are
  not dropped for staleness by default; interruptible generation = ABORT + resubmit.
- SkyRL fully async (`docs/content/docs/tutorials/fully_async.mdx`, `skyrl/train/fully_async_trainer.py`
  `_AsyncStalenessManager._compute_capacity_unlocked`): `accepted + running ≤ (S + step)·B` with
  step = v + 1 (the same aggregate bound), at most K = num_parallel_generation_workers groups
  generating (the example script's K = B·(S + 1)), an `asyncio.Queue` buffer of B·(S + 1) groups
  (a put waits while it is full), consumed in order, never dropped; ABORT + resubmit at a sync.
- One step off, slime (`train_async.py`) and SkyRL (`examples/train/async/async_trainer.py`):
  batch j + 1 is generated whole while batch j trains; the next generation starts only when the
  previous batch has finished and the new weights are in (no push ever meets a generation: WAIT).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import TYPE_CHECKING, cast

from fullasync.contracts.engine import PauseMode
from fullasync.contracts.weights import WeightsPayload
from fullasync.rollout.staleness import StalenessManager
from fullasync.run.queue import MessageQueue, QueueBatch
from fullasync.types import TrajectoryGroup
from fullasync.weights.sync import WeightPushTiming, WeightSync

if TYPE_CHECKING:
    from fullasync.run.runner import Run

# -- queues ----------------------------------------------------------------------------------------

class FifoQueue(MessageQueue):
    """Arrival order, back-pressure when full, and no staleness drop (AReaL, SkyRL, one-step-off)."""

    def __init__(self, max_size: int) -> None:
        super().__init__(max_size, hand_over="arrival")

    def _drop_too_stale(self, oldest_allowed: int, dropped_row_ids: list[str]) -> None:
        return None  # these frameworks train whatever they generated


class DropOldestQueue(FifoQueue):
    """verl's message queue: a put never waits; when full, the oldest queued row is dropped (and reported)."""

    def __init__(self, max_size: int) -> None:
        super().__init__(max_size)
        self.evicted: list[str] = []  # rows dropped since the last get, reported by it

    async def put(self, group: TrajectoryGroup) -> None:
        async with self._changed:
            if len(self._groups) >= self.max_size:
                _, _, oldest = self._groups.pop(0)
                self.evicted.append(oldest.row_id)
                self._dropped += 1
        await super().put(group)

    async def get(self, count: int, trainer_version: int, max_staleness: int,
                  timeout_s: float | None = None) -> QueueBatch:
        batch = await super().get(count, trainer_version, max_staleness, timeout_s)
        batch.dropped_row_ids += self.evicted
        self.evicted = []
        return batch

    def __len__(self) -> int:
        return len(self._groups)


# -- admission rules ---------------------------------------------------------------------------------

class VerlAdmission(StalenessManager):
    """verl: `started since the last sync (+ running and queued at it) < R·(1 + s)·T`, queue not full,
    running rows < max_concurrent. Rows count whole (`count_running="rows"`)."""

    def __init__(self, max_required: int, max_concurrent: int, syncs: Callable[[], int],
                 queued: Callable[[], int]) -> None:
        super().__init__(max_staleness=0, batch_size=1, max_running=max_concurrent, version=syncs,
                         count_running="rows")
        self.max_required = max_required
        self._queued = queued
        self._seen_sync = 0
        self.staleness_samples = 0  # verl's counter of the same name

    def _capacity(self) -> int:
        sync = self._version()
        if sync != self._seen_sync:  # reset_staleness(): what is still running or queued counts against the new version
            self._seen_sync = sync
            self.staleness_samples = int(self.counts.running) + self._queued()
        if self._queued() >= self.max_required:
            return 0
        room = math.floor(self.max_running - self.counts.running)
        return max(0, min(self.max_required - self.staleness_samples, room))

    def _admit(self) -> None:
        super()._admit()
        self.staleness_samples += 1


class BatchAdmission(StalenessManager):
    """One step off: rows of batch b (the b-th B rows) start once every row of batch b − 1 has finished
    and the trainer's version is ≥ b − 1; a whole batch is submitted at once."""

    def __init__(self, batch_size: int, version: Callable[[], int]) -> None:
        super().__init__(max_staleness=1, batch_size=batch_size, max_running=batch_size, version=version,
                         count_running="rows")
        self.admitted = 0
        self.finished = 0

    def _capacity(self) -> int:
        batch = self.admitted // self.batch_size
        if self.finished < batch * self.batch_size or self._version() < batch - 1:
            return 0
        return (batch + 1) * self.batch_size - self.admitted

    def _admit(self) -> None:
        super()._admit()
        self.admitted += 1

    def finish(self, produced_group: bool, running_share: Fraction | int = 1) -> None:
        super().finish(produced_group, running_share)
        self.finished += 1


class SyncEvery:
    """Pushes weights every `every`-th train step (verl's trigger_parameter_sync_step); between pushes
    the trainer's version still advances, so staleness is counted in optimizer steps."""

    def __init__(self, weight_sync: WeightSync, every: int) -> None:
        self.weight_sync = weight_sync
        self.every = every
        self.steps = 0
        self.syncs = 0

    def __getattr__(self, name: str) -> object:  # the rest of WeightSync's attributes, the wrapped one's
        return getattr(self.weight_sync, name)

    async def push(self, weights: WeightsPayload) -> WeightPushTiming:
        self.steps += 1
        if self.steps % self.every:
            self.weight_sync.version += 1  # trained, not pushed: the engines keep the weights they have
            return WeightPushTiming(self.weight_sync.version, 0.0, 0.0, 0.0)
        self.syncs += 1
        return await self.weight_sync.push(weights)


# -- the policies --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeerPolicy:
    """What every peer policy tells the harness; `install` swaps its components into an assembled run."""

    @property
    def label(self) -> str:
        raise NotImplementedError

    @property
    def push_mode(self) -> PauseMode:
        return PauseMode.ABORT

    @property
    def steps_per_sync(self) -> int:
        """Train steps per weight push (the harness runs this many steps per simulated step)."""
        return 1

    def bound(self) -> int:
        """The staleness bound the policy is configured for (versions), for the comparison table."""
        raise NotImplementedError

    def components(self, run: Run, batch: int) -> tuple[StalenessManager, MessageQueue]:
        raise NotImplementedError


def _run_version(run: Run) -> Callable[[], int]:
    sync = run.weight_sync
    return lambda: sync.version - sync.start_version


@dataclass(frozen=True)
class VerlFullyAsync(PeerPolicy):
    staleness_threshold: float
    partial_rollout: bool = True
    trigger_parameter_sync_step: int = 1
    concurrent_samples_per_replica: int = 16  # verl's default

    @property
    def label(self) -> str:
        return (f"verl fully_async s={self.staleness_threshold:g} T={self.trigger_parameter_sync_step} "
                f"partial={'on' if self.partial_rollout else 'off'}")

    @property
    def push_mode(self) -> PauseMode:
        return PauseMode.ABORT if self.partial_rollout and self.staleness_threshold > 0 else PauseMode.WAIT

    @property
    def steps_per_sync(self) -> int:
        return self.trigger_parameter_sync_step

    def bound(self) -> int:
        return math.ceil(self.staleness_threshold)

    def components(self, run: Run, batch: int) -> tuple[StalenessManager, MessageQueue]:
        """`batch`: rows per local update (R); the per-sync batch is R·T."""
        max_required = int(batch * (1 + self.staleness_threshold) * self.trigger_parameter_sync_step)
        queue = DropOldestQueue(max_required)
        replicas = len(run.weight_sync.engines)
        sync = run.loop.weight_sync
        syncs = (lambda: sync.syncs) if isinstance(sync, SyncEvery) else _run_version(run)
        admission = VerlAdmission(max_required, min(replicas * self.concurrent_samples_per_replica, max_required),
                                  syncs=syncs, queued=lambda: len(queue))
        return admission, queue


@dataclass(frozen=True)
class AReaLAsync(PeerPolicy):
    max_head_offpolicyness: int
    max_concurrent_rollouts: int = 0  # 0: AReaL's default, consumer_batch_size

    @property
    def label(self) -> str:
        return f"AReaL η={self.max_head_offpolicyness}"

    def bound(self) -> int:
        return self.max_head_offpolicyness

    def components(self, run: Run, batch: int) -> tuple[StalenessManager, MessageQueue]:
        concurrent = self.max_concurrent_rollouts or batch
        admission = StalenessManager(self.max_head_offpolicyness, batch, concurrent, _run_version(run),
                                     count_running="rows")
        return admission, FifoQueue(concurrent * 16)  # AReaL's default queue_size


@dataclass(frozen=True)
class SkyRLFullyAsync(PeerPolicy):
    max_staleness_steps: int
    num_parallel_generation_workers: int = 0  # 0: B·(S + 1), as in SkyRL's example script

    @property
    def label(self) -> str:
        return f"SkyRL fully_async S={self.max_staleness_steps}"

    def bound(self) -> int:
        return self.max_staleness_steps

    def components(self, run: Run, batch: int) -> tuple[StalenessManager, MessageQueue]:
        buffer = batch * (self.max_staleness_steps + 1)
        workers = self.num_parallel_generation_workers or buffer
        if not batch <= workers <= buffer:
            raise ValueError(f"SkyRL requires mini_batch_size ({batch}) <= num_parallel_generation_workers "
                             f"({workers}) <= mini_batch_size·(max_staleness_steps + 1) ({buffer})")
        admission = StalenessManager(self.max_staleness_steps, batch, workers, _run_version(run), count_running="rows")
        return admission, FifoQueue(buffer)


@dataclass(frozen=True)
class OneStepOff(PeerPolicy):
    @property
    def label(self) -> str:
        return "one-step-off (slime / SkyRL)"

    @property
    def push_mode(self) -> PauseMode:
        return PauseMode.WAIT

    def bound(self) -> int:
        return 1

    def components(self, run: Run, batch: int) -> tuple[StalenessManager, MessageQueue]:
        return BatchAdmission(batch, _run_version(run)), FifoQueue(2 * batch)


def install(run: Run, policy: PeerPolicy, batch: int) -> None:
    """Replace the admission rule, the queue and (verl, T > 1) the push cadence of an assembled `Run`.

    `assemble()` builds our components; it has no seam for others', so the swap happens here, before
    `run.execute`, on the simulator's runs only.
    """
    if policy.steps_per_sync > 1:
        # a stand-in, not a subclass: the loop reads `version`, `restarts` and `push`, the first two delegated
        run.loop.weight_sync = cast(WeightSync, SyncEvery(run.weight_sync, policy.steps_per_sync))
    admission, queue = policy.components(run, batch)
    run.rollouter.settings = replace(run.rollouter.settings, stop_stale_rows=False)  # they train those
    run.loop.batcher.settings = replace(run.loop.batcher.settings, bind_late=False)  # batches taken whole
    run.rollouter.staleness = admission
    run.queue = run.rollouter.queue = run.loop.batcher.queue = queue

