"""The room an engine's pushes need in /dev/shm, from the model's files alone, and the refusal when it is not there:
a push into a full tmpfs would die mid-copy (SIGBUS) instead of failing at the engine's start."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from fullasync.weights.shm import (
    CONTROL_BYTES,
    SharedMemoryTooSmallError,
    aligned,
    check_room,
    hand_off_bytes,
    model_layer_bytes,
    plan_buckets,
)


def test_the_room_a_push_needs_is_read_from_the_headers_and_bounds_the_buckets_it_makes(tmp_path):
    tensors = {"model.embed_tokens.weight": torch.zeros(1000, 64), "model.norm.weight": torch.zeros(64),
               **{f"model.layers.{i}.mlp.up_proj.weight": torch.zeros(128, 64) for i in range(3)},
               **{f"model.layers.{i}.input_layernorm.weight": torch.zeros(64) for i in range(3)}}
    save_file(dict(list(tensors.items())[:4]), str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(dict(list(tensors.items())[4:]), str(tmp_path / "model-00002-of-00002.safetensors"))
    fp32 = sorted(model_layer_bytes(tmp_path, torch.float32))
    layer = aligned(128 * 64 * 4) + aligned(64 * 4)
    assert fp32 == sorted([1000 * 64 * 4, aligned(64 * 4), layer, layer, layer])
    assert sorted(model_layer_bytes(tmp_path, torch.bfloat16)) == sorted(aligned(size // 2) for size in fp32)
    for bucket_bytes in (4096, 2 * layer, 2**20):  # a layer bigger than a bucket, two per bucket, all in one
        _, slot_bytes = plan_buckets(tensors, bucket_bytes)
        assert CONTROL_BYTES + 2 * slot_bytes <= hand_off_bytes(fp32, bucket_bytes)
    assert hand_off_bytes(fp32, 4096) == CONTROL_BYTES + 2 * 1000 * 64 * 4  # the embedding is a layer of its own
    (tmp_path / "pytorch").mkdir()
    (tmp_path / "pytorch" / "pytorch_model.bin").write_bytes(b"")
    assert model_layer_bytes(tmp_path / "pytorch", torch.float32) == []  # no headers to read: not checked


def test_an_engine_without_room_for_its_pushes_is_refused_with_how_to_give_it_more(tmp_path):
    check_room(4096, str(tmp_path))
    with pytest.raises(SharedMemoryTooSmallError, match=r"need \d+ MiB of .* --shm-size=16g"):
        check_room(2**60, str(tmp_path))
