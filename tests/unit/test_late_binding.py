"""A step whose batch is the last chance for rows still generating takes its last groups when the trainer reaches
them (`Batcher.late_places`, `Batcher.train`).

Real: the training loop, the queue, the simulated trainer (time in proportion to tokens) on the virtual clock.
Edge fakes: a rollouter whose running rows are scripted (how many only the batch at a version can train) and a
weight sync that only moves the version. The groups arrive at chosen times, so which batch each one joins is decided
by the code under test, not by how fast anything runs.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from fullasync.contracts.weights import WeightsPayload
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.rollouter import RolloutReport
from fullasync.run.batching import Batcher, BatchSettings
from fullasync.run.healing import HealingTrainer
from fullasync.run.loop import LoopSettings, TrainingLoop
from fullasync.run.queue import MessageQueue
from fullasync.sim.clock import run_virtual
from fullasync.sim.trainer import SimulatedTrainer, TrainCost
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup
from fullasync.weights.sync import WeightPushTiming


def group(row_id: str, version: int, tokens: int = 4) -> TrajectoryGroup:
    call = ModelCall((1, 2, 3), (7,) * tokens, (-1.0,) * tokens, (version,) * tokens, FinishReason.STOP)
    return TrajectoryGroup(row_id, (Trajectory((call,), reward=1.0),))


class ScriptedRows:
    """Edge fake of the rollouter (`RolloutControl`, and the batcher's observer): `last_chance[v]` rows running that
    only batch v can train."""

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


def loop_on(queue: MessageQueue, rows: ScriptedRows, version: int, batch_size: int, total_steps: int,
            bind_late: bool = True, cost: TrainCost | None = None) -> TrainingLoop:
    """The loop as a run wires it: k = 1, the batcher's hand-overs observed by `rows`."""
    batcher = Batcher(queue, BatchSettings(batch_size, 1, bind_late), rows.last_chance_rows)
    batcher.observe(rows)
    return TrainingLoop(trainer=HealingTrainer(SimulatedTrainer(cost or TrainCost(), 1)), batcher=batcher,
                        rollouter=rows, weight_sync=VersionOnly(version), sink=MetricsSink(None),
                        settings=LoopSettings(total_steps, batch_size))


def run_steps(bind_late: bool, arrivals: list[tuple[float, TrajectoryGroup]], batch_size: int = 2, shift: int = 0):
    """k = 1, B = `batch_size`, trainer at version 1 holding A (version 0, 100 tokens: ~1 s of training) and B
    (version 1); one row with version-0 tokens is still running at the first step (`last_chance={1: 1}`). `shift`
    adds to every version here (the trainer's, A's, B's, the last chance's; not to `arrivals`)."""

    async def main():
        queue = MessageQueue(16)
        for ready in (group("A", 0 + shift, tokens=100), group("B", 1 + shift)):
            await queue.put(ready)
        rows = ScriptedRows({1 + shift: 1})
        loop = loop_on(queue, rows, 1 + shift, batch_size, 2, bind_late,
                       TrainCost(per_token_device_s=1e-2, step_overhead_s=0.1))

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
    # versions one up (trainer at 2): X (version 0) arrives too stale at 2.0 s and wakes the first get, which hands
    # over A (version 1) and B (version 2) with the drop; O (version 1) completes the batch in a later get, so it
    # comes after B. Held as the batch's tail, O would keep its place and the last-chance row C, finishing while the
    # trainer works through A, would be dropped: B is the group that can wait
    later = [(at + 2.2, group(f.row_id, f.min_version + 1)) for at, f in [*LATER, (1.7, group("F", 2))]]
    rows, result, _, _ = run_steps(True, [(2.0, group("X", 0)), (2.2, group("O", 1)), (2.7, group("C", 1)), *later],
                                   batch_size=3, shift=1)
    assert sorted(rows.trained[0]) == ["A", "C", "O"] and rows.dropped == ["X"]
    assert (result.history[0]["batch/late_places"], result.history[0]["batch/late_joined"]) == (1, 1)
    assert "B" in rows.trained[1]


def test_a_get_waits_for_its_groups_and_wakes_on_a_drop_not_on_a_clock():
    """The batch's read returns when its groups are there or it dropped one (its observers hear of the drop at that
    instant), however long that takes: no read returns empty-handed on a timer."""

    async def main():
        queue = MessageQueue(16)
        rows = ScriptedRows({})
        handed: list[tuple[float, int, list[str]]] = []
        rows.on_handed_over = lambda got, asked: handed.append(  # type: ignore[method-assign]
            (asyncio.get_running_loop().time(), len(got.groups), got.dropped_row_ids))
        loop = loop_on(queue, rows, 3, 2, 1)

        async def arrive():
            for at, finished in [(40.0, group("stale", 1)), (95.0, group("P", 3)), (130.0, group("Q", 2))]:
                await asyncio.sleep(at - asyncio.get_running_loop().time())
                await queue.put(finished)

        producer = asyncio.ensure_future(arrive())
        result = await loop.run()
        await producer
        return handed, rows.trained, result

    handed, trained, result = run_virtual(main)
    assert handed == [(40.0, 0, ["stale"]), (130.0, 2, [])]  # nothing between: no read woke on a clock
    assert trained == [["Q", "P"]] and result.steps == 1


@pytest.mark.parametrize(("last_chance", "versions", "places"), [
    (0, [2, 3, 3, 3, 3, 3, 3, 3], 0),  # no row needs a place
    (5, [2, 3, 3, 3, 3, 3, 3, 3], 4),  # at most half the batch
    (3, [2, 3, 3, 3, 3, 3, 3, 3], 3),  # one per last-chance row
    (5, [2, 2, 2, 2, 2, 2, 3, 3], 2),  # only groups the next batch can take may give their place up
    (5, [2, 2, 2, 2, 2, 2, 2, 2], 0),  # every group is at its last chance itself
])
def test_late_places(last_chance, versions, places):
    batcher = loop_on(MessageQueue(4), ScriptedRows({3: last_chance}), 3, 8, 1).batcher
    groups = [group(f"g{i}", version) for i, version in enumerate(versions)]
    assert batcher.late_places(3, groups, binds_late=True) == places
    assert batcher.late_places(3, groups, binds_late=False) == 0  # a trainer that cannot take its batch in two parts
    batcher.settings = BatchSettings(8, 1, bind_late=False)
    assert batcher.late_places(3, groups, binds_late=True) == 0


class CountingRows(ScriptedRows):
    """Counts the calls into the rollouter made by the training loop's own module (the batcher's are its
    observers' and queries, published from `run/batching.py`)."""

    def __init__(self, last_chance: dict[int, int]) -> None:
        super().__init__(last_chance)
        self.from_loop: list[str] = []

    def __getattribute__(self, name: str):
        value = super().__getattribute__(name)
        if callable(value) and not name.startswith("_"):
            caller = sys._getframe(1).f_code.co_filename
            if caller.endswith(("run/loop.py", "run\\loop.py")):
                super().__getattribute__("from_loop").append(name)
        return value


def test_the_loop_makes_at_most_three_calls_into_the_rollouter_per_step():
    async def main():
        queue = MessageQueue(64)
        rows = CountingRows({1: 1, 2: 1})
        loop = loop_on(queue, rows, 1, 2, 4)

        async def arrive():
            for index in range(10):
                await asyncio.sleep(0.3)
                await queue.put(group(f"r{index}", 1 + index // 4))

        producer = asyncio.ensure_future(arrive())
        result = await loop.run()
        producer.cancel()
        return rows, result

    rows, result = run_virtual(main)
    assert result.steps == 4 and len(rows.trained) == 4  # the batcher's observer heard every hand-over meanwhile
    assert len(rows.from_loop) <= 3 * result.steps, rows.from_loop
    assert set(rows.from_loop) == {"on_trained", "report"}
