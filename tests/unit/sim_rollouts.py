"""Rows through a real rollouter on one simulated engine, on the virtual clock, to their ends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from fullasync.client import ClientConfig, RolloutService
from fullasync.rollout.generator import RolloutFn
from fullasync.rollout.rollouter import Rollouter, RolloutSettings
from fullasync.rollout.staleness import StalenessManager
from fullasync.run.queue import MessageQueue
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer
from fullasync.types import TrajectoryGroup

COST = DecodeCost(step_base_s=1e-4, step_per_seq_s=0.0, max_num_seqs=16, push_s=1e-3)


def rows_through_a_rollouter(rollout_fn: RolloutFn, settings: RolloutSettings,
                             rows: Iterable[tuple[str, object]]) -> tuple[Rollouter, list[TrajectoryGroup]]:
    """The rollouter once every row has ended (checked for a crash), and the groups it queued."""
    async def main() -> tuple[Rollouter, list[TrajectoryGroup]]:
        service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(),
                                 ClientConfig(model_name="policy", max_model_len=4096))
        queue = MessageQueue(1000)
        rollouter = Rollouter(rollout_fn, service, queue, StalenessManager(100, 2, 8, version=lambda: 0), settings)
        rollouter.start(rows)
        while not rollouter.exhausted:
            await asyncio.sleep(0.01)
        rollouter.check()
        return rollouter, await queue.snapshot()

    return run_virtual(main)
