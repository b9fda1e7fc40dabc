"""A step whose batch is the last chance for rows still generating takes its last groups when the trainer reaches
them (`TrainingLoop._late_places`, `_bind_late`).

Real: the training loop, the queue, the simulated trainer (time in proportion to tokens) on the virtual clock.
Edge fakes: a rollouter whose running rows are scripted (how many only the batch at a version can train) and a
weight sync that only moves the version. The groups arrive at chosen times, so which batch each one joins is decided
by the code under test, not by how fast anything runs.
"""

from __future__ import annotations

import asyncio

import pytest

from fullasync.contracts.weights import WeightsPayload
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.rollouter import RolloutReport
from fullasync.run.loop import QUEUE_WAIT_S, TrainingLoop
from fullasync.run.queue import MessageQueue
from fullasync.sim.clock import run_virtual
from fullasync.sim.trainer import SimulatedTrainer, TrainCost
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup
from fullasync.weights.sync import WeightPushTiming


def group(row_id: str, version: int, tokens: int = 4) -> TrajectoryGroup:
    call = ModelCall((1, 2, 3), (7,) * tokens, (-1.0,) * tokens, (version,) * tokens, FinishReason.STOP)
    return TrajectoryGroup(row_id, (Trajectory((call,), reward=1.0),))


class ScriptedRows:
    """Edge fake of the rollouter (`RolloutControl`): `last_chance[v]` rows running that only batch v can train."""

    exhausted = False

    def __init__(self, last_chance: dict[int, int]) -> None:
        self.last_chance = last_chance
        self.trained: list[list[str]] = []
        self.dropped: list[str] = []
        self.taken_at: list[tuple[int, float]] = []

    def on_trained(self, groups) -> None:
        self.trained.append([g.row_id for g in groups])

    def on_handed_over(self, got, asked: bool) -> None:
        self.dropped += got.dropped_row_ids

    def on_batch_taken(self, version: int) -> None:
        self.taken_at.append((version, asyncio.get_running_loop().time()))

    def last_chance_rows(self, version: int) -> int:
        return self.last_chance.get(version, 0)

    def report(self, rows: bool = True) -> RolloutReport:
        return RolloutReport(outcome_counts={}, row_outcomes={}, trained_twice=[], episode_failures=0,
                             failure_reasons={})


class VersionOnly:
    """Edge fake of `WeightSync`: a push moves the version and takes no time."""

    restarts = 0

    def __init__(self, version: int) -> None:
        self.version = version

    async def push(self, weights: WeightsPayload) -> WeightPushTiming:
        self.version += 1
        return WeightPushTiming(self.version, 0.0, 0.0, 0.0)


def run_steps(bind_late: bool, arrivals: list[tuple[float, TrajectoryGroup]], batch_size: int = 2):
    """k = 1, B = `batch_size`, trainer at version 1 holding A (version 0, 100 tokens: ~1 s of training) and B
    (version 1); one row with version-0 tokens is still running at the first step (`last_chance={1: 1}`)."""

    async def main():
        queue = MessageQueue(16)
        for ready in (group("A", 0, tokens=100), group("B", 1)):
            await queue.put(ready)
        rows = ScriptedRows({1: 1})
        loop = TrainingLoop(trainer=SimulatedTrainer(TrainCost(per_token_device_s=1e-2, step_overhead_s=0.1), 1),
                            rollouter=rows, queue=queue, weight_sync=VersionOnly(1), max_staleness=1,
                            batch_size=batch_size,
                            total_steps=2, val_every=0, validate=None, sink=MetricsSink(None), bind_late=bind_late)

        async def arrive():
            for at, finished in arrivals:
                await asyncio.sleep(at - asyncio.get_running_loop().time())
                await queue.put(finished)

        producer = asyncio.ensure_future(arrive())
        result = await loop.run()
        await producer
        return rows, result, await queue.stats(), [g.row_id for g in await queue.snapshot()]

    return run_virtual(main)


LATER = [(1.5, group("D", 1)), (1.6, group("E", 2))]


def test_a_last_chance_row_finishing_while_the_trainer_works_on_the_first_part_joins_its_batch():
    rows, result, stats, left = run_steps(True, [(0.5, group("C", 0)), *LATER])
    # C (version 0) finished at 0.5 s, while the trainer worked through A (~1 s): it takes B's place, B goes back
    assert rows.trained == [["A", "C"], ["B", "D"]] and rows.dropped == []
    assert rows.taken_at[0][0] == 1 and rows.taken_at[0][1] > 0.5  # the batch was complete only after C came
    assert result.max_token_staleness == 1 and result.trained_samples == 4
    assert [(step["batch/late_places"], step["batch/late_joined"]) for step in result.history] == [(1, 1), (0, 0)]
    assert left == ["E"] and (stats.total_put, stats.total_got) == (5, 4)  # B given back once, counted once


def test_taken_whole_the_same_row_is_dropped_at_the_next_hand_over():
    rows, result, _, left = run_steps(False, [(0.5, group("C", 0)), *LATER])
    assert rows.trained == [["A", "B"], ["D", "E"]] and rows.dropped == ["C"]
    assert [step["batch/late_places"] for step in result.history] == [0, 0]
    assert rows.taken_at[0] == (1, 0.0) and left == []


def test_a_last_chance_row_finishing_after_the_late_places_are_bound_is_still_dropped():
    rows, result, _, _ = run_steps(True, [(1.2, group("C", 0)), *LATER])  # after the first part (A: ~1.03 s)
    assert rows.trained == [["A", "B"], ["D", "E"]] and rows.dropped == ["C"]
    assert (result.history[0]["batch/late_places"], result.history[0]["batch/late_joined"]) == (1, 0)


def test_the_held_places_are_the_youngest_groups_when_the_batch_came_in_several_gets():
    # the first get hands over A (version 0) and B (version 1) when its wait (QUEUE_WAIT_S) ends; O (version 0)
    # completes the batch in a later get, so it comes after B. Held as the batch's tail, O would keep its place and
    # the last-chance row C, finishing while the trainer works through A, would be dropped: B is the group that can
    # wait
    later = [(at + 2.2, finished) for at, finished in [*LATER, (1.7, group("F", 2))]]  # step 2 has 3 either way
    rows, result, _, _ = run_steps(True, [(QUEUE_WAIT_S + 0.2, group("O", 0)), (QUEUE_WAIT_S + 0.7, group("C", 0)),
                                          *later], batch_size=3)
    assert sorted(rows.trained[0]) == ["A", "C", "O"] and rows.dropped == []
    assert (result.history[0]["batch/late_places"], result.history[0]["batch/late_joined"]) == (1, 1)
    assert "B" in rows.trained[1]


@pytest.mark.parametrize(("last_chance", "versions", "places"), [
    (0, [2, 3, 3, 3, 3, 3, 3, 3], 0),  # no row needs a place
    (5, [2, 3, 3, 3, 3, 3, 3, 3], 4),  # at most half the batch
    (3, [2, 3, 3, 3, 3, 3, 3, 3], 3),  # one per last-chance row
    (5, [2, 2, 2, 2, 2, 2, 3, 3], 2),  # only groups the next batch can take may give their place up
    (5, [2, 2, 2, 2, 2, 2, 2, 2], 0),  # every group is at its last chance itself
])
def test_late_places(last_chance, versions, places):
    loop = TrainingLoop(trainer=SimulatedTrainer(TrainCost(), 1), rollouter=ScriptedRows({3: last_chance}),
                        queue=MessageQueue(4), weight_sync=VersionOnly(3), max_staleness=1, batch_size=8,
                        total_steps=1, val_every=0, validate=None, sink=MetricsSink(None))
    groups = [group(f"g{i}", version) for i, version in enumerate(versions)]
    assert loop._late_places(3, groups) == places
    loop.bind_late = False
    assert loop._late_places(3, groups) == 0
