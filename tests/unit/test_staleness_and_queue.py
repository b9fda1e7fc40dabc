"""Admission formula, its manager, and the queue's staleness drop and back-pressure (no Ray needed)."""

from __future__ import annotations

import asyncio

import pytest

from fullasync.rollout.staleness import StalenessManager, admission_capacity
from fullasync.run.queue import MessageQueue
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup


@pytest.mark.parametrize(
    "k, version, batch, started, running, max_running, expected",
    [
        (0, 0, 4, 0, 0, 100, 4),  # sync: one batch at a time
        (0, 0, 4, 4, 4, 100, 0),
        (0, 1, 4, 4, 0, 100, 4),  # after the push of v1 the next batch may start
        (2, 0, 4, 0, 0, 100, 12),  # (k + v + 1) · B
        (2, 3, 4, 20, 3, 100, 4),
        (2, 3, 4, 20, 3, 5, 2),  # concurrency binds first
        (1, 0, 4, 9, 0, 100, 0),  # never negative
    ],
)
def test_admission_capacity_formula(k, version, batch, started, running, max_running, expected):
    assert admission_capacity(k, version, batch, started, running, max_running) == expected


def test_manager_releases_slots_of_rows_without_groups():
    version = [0]
    manager = StalenessManager(max_staleness=0, batch_size=2, max_running=10, version=lambda: version[0])
    assert manager.try_start() and manager.try_start() and not manager.try_start()
    manager.finish(produced_group=False)  # a failed row frees its slot
    assert manager.try_start() and not manager.try_start()
    manager.finish(produced_group=True)
    manager.finish(produced_group=True)
    assert not manager.try_start()  # its groups still occupy the batch
    version[0] = 1
    assert manager.try_start()
    with pytest.raises(ValueError):
        StalenessManager(max_staleness=-1, batch_size=1, max_running=1, version=lambda: 0)


def group(row_id: str, versions: list[int]) -> TrajectoryGroup:
    call = ModelCall((1,), tuple(range(len(versions))), (-0.5,) * len(versions), tuple(versions), FinishReason.STOP)
    return TrajectoryGroup(row_id, (Trajectory((call,), 1.0),))


async def test_queue_drops_only_what_is_too_stale_and_counts_it():
    queue = MessageQueue(max_size=10)
    for row_id, versions in [("a", [0, 1]), ("b", [2, 2]), ("c", [1, 3]), ("d", [3])]:
        await queue.put(group(row_id, versions))
    batch = await queue.get(count=2, trainer_version=3, max_staleness=1, timeout_s=1.0)
    assert [g.row_id for g in batch.groups] == ["b", "d"]  # a and c hold tokens of version < 2
    assert batch.dropped_row_ids == ["a", "c"]
    stats = await queue.stats()
    assert (stats.size, stats.total_put, stats.total_got, stats.dropped_too_stale) == (0, 4, 2, 2)


async def test_queue_back_pressure_and_partial_get_on_timeout():
    queue = MessageQueue(max_size=1)
    await queue.put(group("a", [0]))
    blocked = asyncio.create_task(queue.put(group("b", [0])))
    await asyncio.sleep(0.05)
    assert not blocked.done()  # full: the producer waits
    first = await queue.get(count=1, trainer_version=0, max_staleness=0, timeout_s=1.0)
    await asyncio.wait_for(blocked, 1.0)
    assert [g.row_id for g in first.groups] == ["a"]
    partial = await queue.get(count=3, trainer_version=0, max_staleness=0, timeout_s=0.05)
    assert [g.row_id for g in partial.groups] == ["b"]


def test_adaptive_lead_moves_between_two_batches_and_the_bound():
    manager = StalenessManager(max_staleness=4, batch_size=4, max_running=100, version=lambda: 0,
                               generate_ahead="adaptive")
    assert manager.lead_rows == 8  # it starts at two batches: the one in training and the next
    assert sum(manager.try_start() for _ in range(10)) == 8  # held back by the lead, not by the bound (20)
    manager.on_batch_request(ready=1)  # held back and short of B + B/4 = 5 groups: grows by the shortfall
    assert manager.lead_rows == 12 and sum(manager.try_start() for _ in range(10)) == 4
    manager.on_batch_request(ready=2)
    assert manager.lead_rows == 15
    manager.on_batch_request(ready=0)  # short, but not held back since the last request: unchanged
    assert manager.lead_rows == 15
    for _ in range(3):
        while manager.try_start():
            pass
        manager.on_batch_request(ready=0)
    assert manager.lead_rows == 20 and manager.counts.started == 20  # never beyond the bound (k + 1)·B
    manager.on_batch_request(ready=17)  # 12 more than needed: shrinks by a quarter of that
    assert manager.lead_rows == 17
    for _ in range(10):
        manager.on_batch_request(ready=40)
    assert manager.lead_rows == 8  # never below two batches


def test_bound_lead_is_the_staleness_formula_and_ignores_requests():
    manager = StalenessManager(max_staleness=2, batch_size=4, max_running=100, version=lambda: 0)
    manager.on_batch_request(ready=100)
    assert manager.lead_rows == 12 and sum(manager.try_start() for _ in range(20)) == 12
    with pytest.raises(ValueError, match="generate_ahead"):
        StalenessManager(2, 4, 100, version=lambda: 0, generate_ahead="fast")
