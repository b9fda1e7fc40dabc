"""The simulated engine honours the Engine protocol, and the real control code runs on it within bounds.

Everything runs on `VirtualClockLoop`, so simulated seconds cost no real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import weakref

import pytest

from fullasync.client import ClientConfig, RolloutService
from fullasync.contracts.engine import GenerateRequest, PauseMode
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimSpec, SimTokenizer, simulate
from fullasync.sim.trainer import TrainCost
from fullasync.sim.workload import Workload, analytic_bound, split_bound
from fullasync.types import FinishReason
from fullasync.weights.sync import WeightSync

STEADY = DecodeCost(step_base_s=0.01, step_per_seq_s=0.0, prefill_per_token_s=0.0, max_num_seqs=8, push_s=0.25)


def request(request_id: str, max_tokens: int = 100) -> GenerateRequest:
    return GenerateRequest(request_id=request_id, prompt_ids=(1, 2, 3), max_tokens=max_tokens)


def test_virtual_clock_runs_simulated_time_without_waiting():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600.0)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), 60.0)
        return loop.time()

    assert run_virtual(main) == pytest.approx(3660.0)


def test_abort_returns_the_tokens_so_far_with_their_version():
    async def main():
        engine = SimulatedEngine("e", STEADY)
        task = asyncio.create_task(engine.generate(request("a")))
        await asyncio.sleep(0.505)  # 50 decode steps of 10 ms
        await engine.pause(PauseMode.ABORT)
        result = await task
        assert await engine.wait_resumed(0.0) is False
        await engine.update_weights({}, version=1)
        await engine.resume()
        await engine.shutdown()
        return result, await engine.version()

    result, version = run_virtual(main)
    assert result.finish_reason is FinishReason.ABORT
    assert len(result.output_ids) == 50 and result.output_versions == (0,) * 50
    assert version == 1


def test_keep_freezes_and_labels_later_tokens_with_the_new_version():
    async def main():
        engine = SimulatedEngine("e", STEADY)
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(engine.generate(request("a")))
        await asyncio.sleep(0.305)
        await engine.pause(PauseMode.KEEP)
        await asyncio.sleep(5.0)  # frozen: no progress while paused
        await engine.update_weights({}, version=1)
        await engine.resume()
        result = await task
        await engine.shutdown()
        return result, loop.time()

    result, finished_at = run_virtual(main)
    assert result.finish_reason is FinishReason.LENGTH and len(result.output_ids) == 100
    assert result.output_weight_versions == (0,) * 30 + (1,) * 70
    assert result.output_versions == (0,) * 100  # tokens after the push still read the version-0 KV
    assert finished_at == pytest.approx(0.305 + 5.0 + 0.25 + 0.695, abs=0.011)


def test_recompute_freezes_prefills_again_after_the_push_and_labels_later_tokens_new():
    """What ABORT + a resubmission of prompt + 30 tokens would cost (one prefill of 33 tokens, then decoding on),
    with the request never leaving the engine; later tokens read KV the new weights computed."""
    prefilling = dataclasses.replace(STEADY, prefill_per_token_s=0.001)

    async def main():
        engine = SimulatedEngine("e", prefilling)
        loop = asyncio.get_running_loop()
        task = asyncio.create_task(engine.generate(request("a")))
        await asyncio.sleep(0.003 + 0.305)  # its prompt's prefill, then 30 decode steps
        await engine.pause(PauseMode.RECOMPUTE)
        await asyncio.sleep(5.0)  # frozen: no progress while paused
        await engine.update_weights({}, version=1)
        await engine.resume()
        result = await task
        await engine.shutdown()
        return result, loop.time(), engine.time

    result, finished_at, time = run_virtual(main)
    assert result.finish_reason is FinishReason.LENGTH and len(result.output_ids) == 100
    assert result.output_versions == (0,) * 30 + (1,) * 70 and result.output_weight_versions == ()
    assert time.recomputed_tokens == 3 + 30 and time.aborted_tokens == 0
    assert finished_at == pytest.approx(0.308 + 5.0 + 0.25 + 0.033 + 0.695, abs=0.011)


def test_a_freed_slot_goes_to_the_lowest_priority_value_first_in_arrival_order_among_equals():
    one_slot = dataclasses.replace(STEADY, max_num_seqs=1)

    async def main():
        engine = SimulatedEngine("e", one_slot)
        ended: list[str] = []

        async def run(request_id: str, priority: int, max_tokens: int) -> None:
            await engine.generate(GenerateRequest(request_id, (1, 2, 3), max_tokens, priority=priority))
            ended.append(request_id)

        tasks = [asyncio.create_task(run("holder", 0, 50))]
        await asyncio.sleep(0.1)  # the holder runs; the others wait for its slot, in this order
        for request_id, priority in (("young-1", 5), ("old", 1), ("young-2", 5), ("older", 0)):
            tasks.append(asyncio.create_task(run(request_id, priority, 5)))
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        await engine.shutdown()
        return ended

    assert run_virtual(main) == ["holder", "older", "old", "young-1", "young-2"]


def test_wait_drains_in_flight_requests_and_admits_nothing_new():
    async def main():
        engine = SimulatedEngine("e", STEADY)
        loop = asyncio.get_running_loop()
        first = asyncio.create_task(engine.generate(request("a")))
        await asyncio.sleep(0.2)
        await engine.pause(PauseMode.WAIT)  # returns once "a" has finished
        drained_at = loop.time()
        late = asyncio.create_task(engine.generate(request("b", 10)))
        await asyncio.sleep(1.0)
        assert not late.done()  # held while paused
        await engine.update_weights({}, version=1)
        await engine.resume()
        results = await first, await late
        await engine.shutdown()
        return results, drained_at

    (first, late), drained_at = run_virtual(main)
    assert drained_at == pytest.approx(1.0, abs=0.011)
    assert first.finish_reason is FinishReason.LENGTH and first.output_versions == (0,) * 100
    assert late.output_versions == (1,) * 10


def test_decode_cost_depends_on_the_batch():
    cost = DecodeCost(step_base_s=0.01, step_per_seq_s=0.01, prefill_per_token_s=0.0, max_num_seqs=4)

    async def main() -> list[float]:
        engine = SimulatedEngine("e", cost)
        loop = asyncio.get_running_loop()
        done = []

        async def one(i: int) -> None:
            await engine.generate(request(str(i), 10))
            done.append(loop.time())

        await asyncio.gather(*(one(i) for i in range(6)))  # 4 run at once, 2 wait for a slot
        await engine.shutdown()
        return done

    done = run_virtual(main)
    assert done[:4] == pytest.approx([0.5] * 4)  # 10 steps of τ(4) = 50 ms
    assert done[4:] == pytest.approx([0.8] * 2)  # then 10 steps of τ(2) = 30 ms


def test_client_resubmits_aborted_generations_to_the_requested_length():
    async def main():
        engines = [SimulatedEngine("e", STEADY)]
        service = RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))
        sync = WeightSync(engines, mode=PauseMode.ABORT)
        client = service.client("episode")
        task = asyncio.create_task(client.completions.create(
            model="policy", prompt=[1, 2, 3], max_tokens=300, extra_body={"ignore_eos": True}))
        for _ in range(3):
            await asyncio.sleep(0.7)
            await sync.push({})
        await task
        await engines[0].shutdown()
        return client.episode.calls[0]

    call = run_virtual(main)
    assert len(call.output_ids) == 300 and call.finish_reason is FinishReason.LENGTH
    assert call.num_resumes == 3 and call.resubmitted_tokens > 0
    assert call.output_versions[0] == 0 and call.output_versions[-1] == 3
    assert list(call.output_versions) == sorted(call.output_versions)


def test_a_finished_episode_is_freed_without_the_cyclic_collector():
    """A client, its episode and its recorded calls (every token tuple) go when the last reference does: a
    reference cycle would keep them until the collector runs, which a run's driver makes rare on purpose."""
    async def main():
        engines = [SimulatedEngine("e", STEADY)]
        service = RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))
        client = service.client("episode")
        ignore_eos = {"ignore_eos": True}
        await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=20, extra_body=ignore_eos)
        await client.completions.create(model="policy", prompt=[1, 2, 3, 4], max_tokens=5, extra_body=ignore_eos)
        assert client.chat.completions is not None  # the chat side holds no reference back either
        trajectory = client.trajectory(1.0)
        client.close()
        refs = [weakref.ref(client), weakref.ref(client.episode)]
        del client
        await engines[0].shutdown()
        return refs, trajectory

    gc.disable()
    try:
        refs, trajectory = run_virtual(main)
        assert [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()
    assert len(trajectory.calls) == 2 and len(trajectory.calls[0].output_ids) == 20  # what the trainer needs stays


TINY = Workload(name="tiny", devices=4, batch_groups=4, group_size=4, prompt_tokens=16, median_length=32,
                cap_multiple=8, decode=DecodeCost(max_num_seqs=8, push_s=0.2), train=TrainCost(1e-3, 0.1))


@pytest.mark.parametrize("mode, partial, k", [("sync", True, -1), ("one_step_off", True, -1),
                                              ("fully_async", False, 2), ("fully_async", True, 1)])
def test_a_short_simulated_run_trains_within_its_staleness_bound(mode, partial, k):
    result = simulate(TINY, SimSpec(mode, partial, k, gen_devices=2, steps=5, warmup_steps=1))
    bound = {"sync": 0, "one_step_off": 1}.get(mode, k)
    assert result.total_samples == 5 * 4 * 4
    assert result.max_staleness <= bound
    assert result.samples_per_s > 0 and 0.0 <= result.gen_idle_fraction <= 1.0
    if mode == "sync":
        assert result.max_staleness == 0 and result.resumed_calls == 0
    if partial and mode == "fully_async":
        assert result.engine.aborted_tokens > 0  # pushes interrupted generations, the client resumed them


def test_bound_uses_the_mean_of_the_capped_lengths():
    samples = [TINY.length(f"row-{i}/{j}") for i in range(500) for j in range(4)]
    assert sum(samples) / len(samples) == pytest.approx(TINY.mean_length(), rel=0.05)
    assert max(samples) <= TINY.cap
    bound, best = analytic_bound(TINY)
    assert bound == max(split_bound(TINY, g) for g in range(1, TINY.devices)) and 0 < best < TINY.devices


# -- control-code behaviour the scheduling benchmark led to ---------------------------------------


def test_a_row_counts_toward_concurrency_by_its_unfinished_episodes():
    from fractions import Fraction

    from fullasync.rollout.staleness import StalenessManager

    manager = StalenessManager(max_staleness=10, batch_size=100, max_running=1, version=lambda: 0)
    assert manager.try_start() and not manager.try_start()
    manager.episode_done(Fraction(1, 2))  # one of two episodes done: the row still holds half a slot
    assert not manager.try_start()
    manager.episode_done(Fraction(1, 2))
    manager.finish(produced_group=True, running_share=0)
    assert manager.try_start()


def test_queue_hands_over_the_oldest_groups_first():
    from fullasync.run.queue import MessageQueue
    from fullasync.types import ModelCall, Trajectory, TrajectoryGroup

    def group(row_id: str, first_version: int) -> TrajectoryGroup:
        call = ModelCall((1,), (7, 7), (-0.5, -0.5), (first_version, 4), FinishReason.STOP)
        return TrajectoryGroup(row_id, (Trajectory((call,), 1.0),))

    async def main():
        queue = MessageQueue(max_size=10)
        for row_id, version in [("young", 3), ("old", 1), ("middle", 2), ("old-too", 1), ("stale", 0)]:
            await queue.put(group(row_id, version))
        return await queue.get(count=3, trainer_version=3, max_staleness=2, timeout_s=1.0)

    batch = run_virtual(main)
    assert [g.row_id for g in batch.groups] == ["old", "old-too", "middle"]
    assert batch.dropped_row_ids == ["stale"]


def test_rows_whose_group_could_only_be_dropped_stop_generating_and_free_their_slots():
    spec = SimSpec("fully_async", True, 1, gen_devices=2, steps=8, warmup_steps=1)
    stopping, finishing = simulate(TINY, spec), simulate(TINY, dataclasses.replace(spec, stop_stale_rows=False))
    assert stopping.stopped_stale_rows > 0 and finishing.stopped_stale_rows == 0
    assert stopping.total_samples == finishing.total_samples == 8 * 4 * 4
    assert stopping.max_staleness <= 1 and finishing.max_staleness <= 1
    # the slots of rows that could only be dropped go to fresh rows (simulated time: deterministic)
    assert stopping.samples_per_s > finishing.samples_per_s
    for run in (stopping, finishing):  # the rows dropped are the long ones: the bound's length bias, measured
        shares = run.dropped_share_by_length
        assert len(shares) == 10 and sum(shares[:5]) == 0 < shares[-1]


def test_when_training_is_the_bottleneck_generation_runs_only_as_far_ahead_as_keeps_it_fed():
    # 3 of 4 devices generate for one slow trainer; the bound (k = 4) would keep 5 batches ahead of it
    slow_training = TINY.with_(train=TrainCost(4e-3, 0.1))
    spec = SimSpec("fully_async", True, 4, gen_devices=3, steps=16, warmup_steps=4)
    paced = simulate(slow_training, spec)
    filled = simulate(slow_training, dataclasses.replace(spec, generate_ahead="bound"))
    assert filled.trainer_idle_fraction < 0.1  # training-bound indeed
    assert filled.mean_staleness > 3.5 and paced.mean_staleness < 2.5  # fresher data ...
    assert paced.samples_per_s >= 0.97 * filled.samples_per_s  # ... at the same throughput
    assert paced.max_staleness <= 4 and paced.total_samples == filled.total_samples


def test_when_generation_is_the_bottleneck_pacing_changes_nothing():
    spec = SimSpec("fully_async", True, 4, gen_devices=1, steps=10, warmup_steps=2)  # one device generates
    paced, filled = simulate(TINY, spec), simulate(TINY, dataclasses.replace(spec, generate_ahead="bound"))
    assert paced.trainer_idle_fraction > 0.5  # generation-bound indeed
    assert paced.samples_per_s == pytest.approx(filled.samples_per_s, rel=0.02)
    assert paced.mean_staleness == pytest.approx(filled.mean_staleness, abs=0.1)
