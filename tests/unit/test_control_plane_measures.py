"""What `bench/control_plane.py` relies on: the loop-work record and its lag replay, the driver/engine CPU
split, the simulated trainer's token count, and the vectorised record checks that replaced per-token loops
(same rules and messages as before). No timing is asserted."""

from __future__ import annotations

import asyncio
import math

import pytest

from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost
from fullasync.sim.harness import SimSpec, simulate
from fullasync.sim.loop_lag import LoopWork, percentile, replayed_lag
from fullasync.sim.trainer import TrainCost, sequence_tokens
from fullasync.sim.workload import Workload
from fullasync.types import FinishReason, ModelCall, TrainingSequence, Trajectory


def work(arrivals: list[float], cpu: list[float]) -> LoopWork:
    record = LoopWork()
    record.arrivals.extend(arrivals + [arrivals[-1]])
    stamp = 0.0
    for seconds in [0.0, *cpu]:
        stamp += seconds
        record.stamps.append(stamp)
    return record


def test_replay_queues_iterations_on_one_server_and_samples_the_backlog():
    # a 0.3 s burst at t = 0, then 0.05 s at t = 0.1 (queued behind it until 0.3), then nothing until 1.0
    record = work([0.0, 0.1, 1.0], [0.3, 0.05, 0.01])
    lags = replayed_lag(record, 0, 3, every_s=0.1)
    assert lags[:4] == pytest.approx([0.3, 0.25, 0.15, 0.05])  # free at 0.35 after the second iteration
    assert lags[4:] == pytest.approx([0.0] * (len(lags) - 4))
    assert percentile(lags, 1.0) == pytest.approx(0.3) and percentile([], 0.99) == 0.0
    assert replayed_lag(record, 2, 2, 0.1) == []


def test_work_a_run_hands_to_a_worker_thread_shares_the_lock_with_the_loop():
    # 0.2 s of worker-thread work at t = 0, a 0.05 s loop iteration at t = 0.1, switch interval 5 ms
    record = work([0.0, 0.1, 1.0], [0.2, 0.05, 0.01])
    record.offloaded[0] = 0.2
    lags = replayed_lag(record, 0, 3, every_s=0.1, switch_s=0.005)
    # t = 0: nothing of the loop's, one switch interval behind the worker; t = 0.1: the 0.05 s at half speed
    # (the worker still has 0.1 s), then a switch; t = 0.2: both half-served for 0.1 s, the worker has 0.05 s left
    assert lags[:4] == pytest.approx([0.005, 0.105, 0.005, 0.0])
    assert lags[4:] == pytest.approx([0.0] * (len(lags) - 4))
    whole = work([0.0, 0.1, 1.0], [0.2, 0.05, 0.01])  # the same work on the loop: 0.2 s behind it at t = 0
    assert replayed_lag(whole, 0, 3, every_s=0.1, switch_s=0.005)[:3] == pytest.approx([0.2, 0.15, 0.05])


def test_off_loop_runs_in_place_on_the_virtual_loop_and_records_its_cpu_as_a_workers():
    from fullasync.infra.offload import off_loop

    async def main() -> tuple[LoopWork, int]:
        record = asyncio.get_running_loop().record_work()
        await asyncio.sleep(1.0)
        total = await off_loop(sum, range(300_000))
        await asyncio.sleep(1.0)
        return record, total

    record, total = run_virtual(main)
    assert total == sum(range(300_000))
    [(iteration, cpu_s)] = record.offloaded.items()
    assert cpu_s > 0 and record.arrivals[iteration] == pytest.approx(1.0)
    assert record.stamps[iteration + 1] - record.stamps[iteration] >= cpu_s


def test_the_virtual_loop_records_each_iteration_at_its_simulated_time():
    async def main() -> LoopWork:
        record = asyncio.get_running_loop().record_work()
        for _ in range(3):
            await asyncio.sleep(10.0)
            sum(range(20000))  # some CPU inside an iteration
        return record

    record = run_virtual(main)
    assert record.mark() >= 3 and list(record.arrivals) == sorted(record.arrivals)
    assert record.arrivals[-1] == pytest.approx(30.0)
    assert all(b >= a for a, b in zip(record.stamps, record.stamps[1:]))


def test_a_simulated_run_splits_driver_and_engine_cpu_and_samples_the_lag():
    workload = Workload(name="tiny", devices=3, batch_groups=4, group_size=2, prompt_tokens=8, median_length=20,
                        decode=DecodeCost(max_num_seqs=4, push_s=0.2), train=TrainCost(1e-3, 0.2))
    result = simulate(workload, SimSpec("fully_async", True, 1, gen_devices=2, steps=4, warmup_steps=1,
                                        lag_sample_s=0.05))
    assert result.driver_cpu_s > 0 and result.engine_cpu_s > 0 and result.episodes > 0
    assert len(result.loop_lag_s) == pytest.approx(result.window_s / 0.05, abs=2) and result.loop_iterations > 0
    assert simulate(workload, SimSpec("fully_async", True, 1, gen_devices=2, steps=2, warmup_steps=1)).loop_lag_s == ()


def call(prompt: list[int], output: list[int], versions: list[int] | None = None,
         logprobs: list[float] | None = None) -> ModelCall:
    return ModelCall(tuple(prompt), tuple(output), tuple(logprobs or [-0.5] * len(output)),
                     tuple(versions if versions is not None else [0] * len(output)), FinishReason.STOP)


@pytest.mark.parametrize("logprobs", [[-0.5, math.nan, -1.0], [math.nan, -1.0], [-1.0, 0.1], [-1.0, math.inf],
                                      [-math.inf, math.inf]])
def test_model_call_rejects_a_bad_logprob_at_any_position(logprobs):
    with pytest.raises(ValueError, match="<= 0"):
        call([1], [2] * len(logprobs), logprobs=logprobs)


@pytest.mark.parametrize("versions, message", [([0, -1], ">= 0"), ([-1, 0], ">= 0"), ([1, 0], "non-decreasing"),
                                               ([0, 2, 1, 3], "non-decreasing")])
def test_model_call_version_checks_keep_their_precedence(versions, message):
    with pytest.raises(ValueError, match=message):
        call([1], [2] * len(versions), versions=versions)


def test_model_call_accepts_minus_infinity_and_lists():
    assert call([1], [2, 3], versions=[0, 0], logprobs=[-math.inf, 0.0]).output_logprobs[0] == -math.inf
    assert ModelCall((1,), (2, 3), [-0.1, -0.2], [1, 2], FinishReason.STOP).output_versions == [1, 2]


@pytest.mark.parametrize("mask, versions, message", [
    ((0, 2), (-1, 0), "only 0 and 1"),
    ((0, 1), (-1, -1), "sampled tokens carry"),  # a sampled token without a version
    ((0, 0), (-1, 3), "sampled tokens carry"),  # an inserted token with one
])
def test_training_sequence_checks(mask, versions, message):
    with pytest.raises(ValueError, match=message):
        TrainingSequence(token_ids=(1, 2), loss_mask=mask, logprobs=(0.0, 0.0), versions=versions, prompt_length=1)


def test_sequence_tokens_counts_what_to_sequences_builds():
    first, extends, other = call([1, 2, 3], [4, 5]), call([1, 2, 3, 4, 5, 9], [6]), call([7], [8, 8])
    for calls in ([first], [first, extends], [first, extends, other], [first, other, extends]):
        trajectory = Trajectory(tuple(calls), 1.0)
        assert sequence_tokens(trajectory) == sum(len(s.token_ids) for s in trajectory.to_sequences())
