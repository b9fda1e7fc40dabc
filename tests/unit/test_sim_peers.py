"""The peers' scheduling rules as modelled in `fullasync.sim.peers`: admission, queues, push cadence, whole runs.

Each rule is checked against the formula its docstring cites; the whole-run tests drive the real
control code with each peer's components on the simulator's virtual clock (no real time, no timings).
"""

from __future__ import annotations

import asyncio

import pytest

from fullasync.contracts.engine import PauseMode
from fullasync.sim import peers
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost
from fullasync.sim.harness import SimSpec, simulate
from fullasync.sim.trainer import TrainCost
from fullasync.sim.workload import Workload
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup


def group(row_id: str, version: int = 0) -> TrajectoryGroup:
    call = ModelCall((1,), (2,), (-0.5,), (version,), FinishReason.STOP)
    return TrajectoryGroup(row_id, (Trajectory((call,), 1.0),))


def test_verl_admits_r_times_one_plus_s_per_sync_counting_what_is_still_running_or_queued():
    sync, queued = [0], [0]
    admission = peers.VerlAdmission(max_required=6, max_concurrent=10, syncs=lambda: sync[0], queued=lambda: queued[0])
    assert sum(admission.try_start() for _ in range(8)) == 6  # R·(1 + s)·T = 2 · 3 · 1
    for _ in range(4):  # four rows finish with a group: two still running
        admission.finish(produced_group=True)
    queued[0] = 1  # of the four, one is still queued when the trainer syncs
    sync[0] = 1
    assert sum(admission.try_start() for _ in range(8)) == 3  # 6 − (2 running + 1 queued)
    assert admission.staleness_samples == 6


def test_verl_stops_admitting_while_the_queue_is_full_and_caps_concurrency():
    queued = [6]
    admission = peers.VerlAdmission(max_required=6, max_concurrent=2, syncs=lambda: 0, queued=lambda: queued[0])
    assert not admission.try_start()
    queued[0] = 0
    assert [admission.try_start() for _ in range(3)] == [True, True, False]  # max_concurrent


async def test_verl_queue_drops_the_oldest_when_full_and_never_waits():
    queue = peers.DropOldestQueue(max_size=2)
    for row_id in "abc":
        await asyncio.wait_for(queue.put(group(row_id)), 1.0)
    batch = await queue.get(count=2, trainer_version=9, max_staleness=0, timeout_s=1.0)
    assert [g.row_id for g in batch.groups] == ["b", "c"]  # arrival order, no staleness drop at version 9
    assert batch.dropped_row_ids == ["a"]
    assert (await queue.stats()).dropped_too_stale == 1


async def test_fifo_queue_hands_over_in_arrival_order_without_a_staleness_drop():
    queue = peers.FifoQueue(max_size=4)
    for row_id, version in [("young", 3), ("old", 0)]:
        await queue.put(group(row_id, version))
    batch = await queue.get(count=2, trainer_version=5, max_staleness=1, timeout_s=1.0)
    assert [g.row_id for g in batch.groups] == ["young", "old"] and batch.dropped_row_ids == []


def test_one_step_off_starts_a_batch_when_the_previous_one_finished_and_its_weights_are_in():
    version = [0]
    admission = peers.BatchAdmission(batch_size=2, version=lambda: version[0])
    assert [admission.try_start() for _ in range(3)] == [True, True, False]  # batch 0 at once, whole
    admission.finish(produced_group=True)
    assert not admission.try_start()  # batch 0 not finished
    admission.finish(produced_group=True)
    assert [admission.try_start() for _ in range(3)] == [True, True, False]  # batch 1 with version 0
    admission.finish(produced_group=True)
    admission.finish(produced_group=True)
    assert not admission.try_start()  # batch 2 waits for version 1 (trained on batch 0)
    version[0] = 1
    assert admission.try_start()


def test_areal_and_skyrl_count_a_running_row_whole_under_the_aggregate_bound():
    class _Run:  # what `components` reads of a run
        class weight_sync:
            version, start_version, engines = 0, 0, [object()]

    admission, queue = peers.AReaLAsync(max_head_offpolicyness=1).components(_Run, batch=2)
    assert admission.max_running == 2 and not admission.by_episodes  # AReaL's default: consumer_batch_size
    assert [admission.try_start() for _ in range(3)] == [True, True, False]
    admission.episode_done(0.5)  # half a row's episodes done: it still counts whole
    assert not admission.try_start()
    admission, queue = peers.SkyRLFullyAsync(max_staleness_steps=1).components(_Run, batch=2)
    assert queue.max_size == 4 and sum(admission.try_start() for _ in range(9)) == 4  # (S + v + 1)·B = 4
    with pytest.raises(ValueError, match="num_parallel_generation_workers"):
        peers.SkyRLFullyAsync(max_staleness_steps=1, num_parallel_generation_workers=5).components(_Run, batch=2)


def test_sync_every_pushes_every_t_th_step_while_the_version_counts_steps():
    class _Sync:
        version, pushes = 0, 0

        async def push(self, weights):
            self.version += 1
            self.pushes += 1

    async def main():
        sync = peers.SyncEvery(_Sync(), every=2)
        for _ in range(4):
            await sync.push({})
        return sync

    sync = run_virtual(main)
    assert (sync.version, sync.weight_sync.pushes, sync.syncs) == (4, 2, 2)


def test_push_modes_follow_partial_rollout():
    assert peers.VerlFullyAsync(1.0, partial_rollout=True).push_mode is PauseMode.ABORT
    assert peers.VerlFullyAsync(1.0, partial_rollout=False).push_mode is PauseMode.WAIT
    assert peers.VerlFullyAsync(0.0, partial_rollout=True).push_mode is PauseMode.WAIT  # partial needs s > 0
    assert peers.OneStepOff().push_mode is PauseMode.WAIT


TINY = Workload(name="tiny", devices=3, batch_groups=4, group_size=2, prompt_tokens=8, median_length=20,
                length_sigma=0.8, cap_multiple=4, decode=DecodeCost(max_num_seqs=4, push_s=0.2),
                train=TrainCost(per_token_device_s=1e-3, step_overhead_s=0.2))
AGENTIC_TINY = TINY.with_(name="tiny-agentic", turns_median=2.0, turns_sigma=0.5, max_turns=4, observation_tokens=5,
                          tool_latency_s=0.5, tool_latency_sigma=0.5)


@pytest.mark.parametrize("workload", [TINY, AGENTIC_TINY], ids=lambda w: w.name)
@pytest.mark.parametrize("policy", [
    None, peers.VerlFullyAsync(1.0), peers.VerlFullyAsync(1.0, partial_rollout=False),
    peers.VerlFullyAsync(0.5, trigger_parameter_sync_step=2), peers.AReaLAsync(1), peers.SkyRLFullyAsync(1),
    peers.OneStepOff(),
], ids=lambda p: "ours" if p is None else p.label)
def test_every_policy_runs_the_real_control_code_to_the_end(workload, policy):
    result = simulate(workload, SimSpec("fully_async", True, 1, gen_devices=2, steps=6, warmup_steps=1, peer=policy))
    assert result.total_samples == 6 * workload.samples_per_step  # B groups of n per step (T local steps of B / T)
    assert result.samples_per_s > 0 and result.episodes > 0
    if policy is None or isinstance(policy, peers.OneStepOff):
        assert result.max_staleness <= 1  # ours by the hand-over drop; one step off by construction
    if policy is not None and policy.push_mode is PauseMode.WAIT:
        assert result.resumed_calls == 0  # no generation is ever interrupted


def test_agentic_episodes_take_several_turns_that_train_as_one_sequence():
    assert {AGENTIC_TINY.turns(f"row-{i}/0") for i in range(50)} >= {1, 2, 3}
    result = simulate(AGENTIC_TINY, SimSpec("fully_async", True, 1, gen_devices=2, steps=4, warmup_steps=1))
    per_sample = result.tokens / result.samples
    assert per_sample < AGENTIC_TINY.prompt_tokens + AGENTIC_TINY.max_turns * (AGENTIC_TINY.cap + 5)
    assert per_sample > AGENTIC_TINY.prompt_tokens + AGENTIC_TINY.mean_length() * 1.2  # more than one turn's output
