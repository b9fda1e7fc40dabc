"""Rows through a real rollouter on one simulated engine, on the virtual clock, to their ends (or to a checkpoint)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from fullasync.client import ClientConfig, RolloutService
from fullasync.client.beside import BesideClient
from fullasync.rollout.generator import RolloutFn
from fullasync.rollout.rollouter import Rollouter, RolloutSettings
from fullasync.rollout.staleness import StalenessManager
from fullasync.rollout.state import RolloutState
from fullasync.run.queue import MessageQueue
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer
from fullasync.types import TrajectoryGroup

COST = DecodeCost(step_base_s=1e-4, step_per_seq_s=0.0, max_num_seqs=16, push_s=1e-3)


def _rollouter(rollout_fn: RolloutFn, settings: RolloutSettings,
               beside: Mapping[str, BesideClient] | None = None) -> tuple[Rollouter, MessageQueue]:
    service = RolloutService([SimulatedEngine("sim-0", COST)], SimTokenizer(),
                             ClientConfig(model_name="policy", max_model_len=4096), beside=beside)
    queue = MessageQueue(1000)
    return Rollouter(rollout_fn, service, queue, StalenessManager(100, 2, 8, version=lambda: 0), settings), queue


def rows_through_a_rollouter(rollout_fn: RolloutFn, settings: RolloutSettings, rows: Iterable[tuple[str, object]],
                             restore: RolloutState | None = None, beside: Mapping[str, BesideClient] | None = None,
                             ) -> tuple[Rollouter, list[TrajectoryGroup]]:
    """The rollouter (continuing `restore`, if given; its episodes' clients with the models `beside`) once every row
    has ended (checked for a crash), and the groups it queued."""
    async def main() -> tuple[Rollouter, list[TrajectoryGroup]]:
        rollouter, queue = _rollouter(rollout_fn, settings, beside)
        if restore is not None:
            rollouter.restore(restore)
        rollouter.start(rows)
        while not rollouter.exhausted:
            await asyncio.sleep(0.01)
        rollouter.check()
        return rollouter, await queue.snapshot()

    return run_virtual(main)


def checkpoint_midway(rollout_fn: RolloutFn, settings: RolloutSettings, rows: Iterable[tuple[str, object]],
                      after_outcomes: int) -> RolloutState:
    """The rollouter's checkpoint state once `after_outcomes` rows have ended (rows still running then), as the run
    takes it; the rollouter is stopped after."""
    async def main() -> RolloutState:
        rollouter, _ = _rollouter(rollout_fn, settings)
        rollouter.start(rows)
        while len(rollouter.outcomes) < after_outcomes or not rollouter.ledger.running:
            await asyncio.sleep(0.01)
        state = rollouter.snapshot()
        await rollouter.stop()
        rollouter.check()
        return state

    return run_virtual(main)
