"""The streamed push's wire protocol between real processes: a root and the workers of two engines (one of them
tensor-parallel), over gloo on loopback."""

from __future__ import annotations

import multiprocessing
import threading
import time
from datetime import timedelta

import pytest
import torch

from fullasync.weights.digests import digest
from fullasync.weights.shm import group_key
from fullasync.weights.stream import (
    JOINED,
    PushAbandoned,
    StreamPlan,
    abandon,
    free_ports,
    plan_buckets,
    receive,
    send,
    until_listening,
)


def _model(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tensors = {"model.embed_tokens.weight": torch.randn(50, 8, generator=generator)}
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]  # tied: the same tensor
    for layer in range(4):
        prefix = f"model.layers.{layer}."
        tensors[prefix + "input_layernorm.weight"] = torch.randn(8, generator=generator)
        tensors[prefix + "mlp.up_proj.weight"] = torch.randn(16, 8, generator=generator).to(torch.bfloat16)
        tensors[prefix + "mlp.down_proj.weight"] = torch.randn(8, 16, generator=generator)
    tensors["model.norm.weight"] = torch.randn(8, generator=generator)
    return tensors


def _metadata(tensors: dict[str, torch.Tensor]) -> list[tuple[str, str, tuple[int, ...], str]]:
    """As the trainer's ranks describe what they send: a tensor that is the one before it shares its bytes."""
    metadata, previous = [], ("", None)
    for name, tensor in tensors.items():
        metadata.append((name, str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape),
                         previous[0] if tensor is previous[1] else ""))
        previous = (name, tensor)
    return metadata


def _plan(tensors: dict[str, torch.Tensor], world_size: int, version: int = 3, timeout_s: float = 90.0) -> StreamPlan:
    port, control_port = free_ports("127.0.0.1", 2)
    return StreamPlan("127.0.0.1", port, control_port, world_size, version,
                      plan_buckets(_metadata(tensors), bucket_bytes=1200), timeout_s=timeout_s)


def _receiver(plan: StreamPlan, rank: int, results: multiprocessing.Queue) -> None:
    loaded: list[tuple[int, str, torch.Tensor]] = []
    calls = iter(range(10**6))

    def load(tensors):
        call = next(calls)
        loaded.extend((call, name, tensor.clone()) for name, tensor in tensors)

    try:  # tensors do not cross the queue (torch shares them by file descriptors): their digests do
        kept = receive(plan, rank, load)
        results.put((rank, {name: (call, str(t.dtype), digest(t)) for call, name, t in loaded}, sorted(kept)))
    except Exception as error:  # reported to the test
        results.put((rank, repr(error), None))


def _run(plan: StreamPlan, yielded: list[tuple[str, torch.Tensor]]) -> tuple[object, dict]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=_receiver, args=(plan, rank, results)) for rank in range(1, plan.world_size)]
    for worker in workers:
        worker.start()
    try:
        sent: object = send(plan, iter(yielded))
    except ValueError as error:
        sent = error
    received = {}
    for _ in workers:
        rank, got, kept = results.get(timeout=120)
        received[rank] = (got, kept)
    for worker in workers:
        worker.join(timeout=60)
    return sent, received


def test_every_worker_of_every_engine_loads_every_tensor_bitwise_bucket_by_bucket():
    tensors = _model(seed=1)
    plan = _plan(tensors, world_size=4)  # the root, a one-worker engine, a two-worker engine
    assert len(plan.buckets) > 3
    seen: set[str] = set()
    for bucket in plan.buckets:  # whole layers: a layer's tensors never straddle two buckets
        layers = {group_key(e.name) for e in bucket}
        assert not layers & seen
        seen |= layers

    digests, received = _run(plan, list(tensors.items()))

    assert sorted(digests) == sorted(plan.sampled)  # the norms and one larger tensor
    assert "model.norm.weight" in plan.sampled and any(t.dim() > 1 and name in plan.sampled
                                                       for name, t in tensors.items())
    bucket_of = {entry.name: index for index, bucket in enumerate(plan.buckets) for entry in bucket}
    for rank in (1, 2, 3):
        got, kept = received[rank]
        assert kept == sorted(plan.sampled)
        assert set(got) == set(tensors)
        for name, (call, dtype, held) in got.items():
            assert call == bucket_of[name]  # loaded bucket by bucket, as each arrived
            assert dtype == str(tensors[name].dtype) and held == digest(tensors[name])


def test_a_sender_whose_tensors_disagree_with_the_plan_fails_naming_the_tensor_and_the_workers_give_up():
    tensors = _model(seed=2)
    plan = _plan(tensors, world_size=2, timeout_s=60.0)
    yielded = list(tensors.items())
    yielded[3] = (yielded[3][0], yielded[3][1][:-1])  # one row short of what the plan says
    error, received = _run(plan, yielded)
    assert isinstance(error, ValueError) and yielded[3][0] in str(error) and "the plan says" in str(error)
    got, kept = received[1]
    assert kept is None and isinstance(got, str)  # the worker's receive raised: it never serves a partial push
    # and at once, when the root closed the push's connections — not at the plan's 60-s timeout
    assert "by peer" in got and "Timed out" not in got, got  # "connection closed (or reset) by peer"


@pytest.mark.parametrize("bucket_bytes", [1, 10**9])
def test_buckets_hold_whole_layers_whatever_their_size(bucket_bytes):
    metadata = _metadata(_model(seed=3))
    buckets = plan_buckets(metadata, bucket_bytes)
    assert [e.name for bucket in buckets for e in bucket] == [name for name, _, _, _ in metadata]
    assert len(buckets) == (6 if bucket_bytes == 1 else 1)  # embeddings, four layers, the final norm: or all in one
    embedding, output = buckets[0][0], buckets[0][1]
    assert output.name == "lm_head.weight" and output.offset == embedding.offset  # tied: the bytes go once


def test_a_tensor_the_plan_ties_to_an_earlier_one_must_be_that_tensor():
    tensors = _model(seed=4)
    plan = _plan(tensors, world_size=2, timeout_s=5.0)
    yielded = list(tensors.items())
    yielded[1] = ("lm_head.weight", yielded[1][1] + 1)  # untied after all
    error, received = _run(plan, yielded)
    assert isinstance(error, ValueError) and "lm_head.weight shares an earlier tensor's bytes" in str(error)
    assert isinstance(received[1][0], str)


def test_a_push_abandoned_before_every_engine_joined_ends_at_once_for_the_root_and_those_waiting():
    import torch.distributed as dist

    tensors = _model(seed=5)
    plan = _plan(tensors, world_size=3, timeout_s=60.0)  # rank 2 never comes (its engine failed first)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    worker = context.Process(target=_receiver, args=(plan, 1, results))
    worker.start()
    outcome: list[object] = []
    root = threading.Thread(target=lambda: outcome.append(_attempt(plan, list(tensors.items()))))
    root.start()
    until_listening(plan.address, plan.port, time.monotonic() + 60)  # the root's store is up
    store = dist.TCPStore(plan.address, plan.port, world_size=None, is_master=False, timeout=timedelta(seconds=60),
                          wait_for_workers=False)
    dist.PrefixStore(f"fullasync-push-{plan.version}", store).wait([f"{JOINED}1"])  # rank 1 has joined and waits
    abandon(plan)
    root.join(timeout=60)
    _, got, kept = results.get(timeout=60)
    worker.join(timeout=60)
    assert isinstance(outcome[0], PushAbandoned)
    assert kept is None and "Timed out" not in got and "timed out" not in got, got  # failed when the store closed


def _attempt(plan: StreamPlan, yielded: list[tuple[str, torch.Tensor]]) -> object:
    try:
        return send(plan, iter(yielded))
    except Exception as error:  # the outcome under test
        return error
