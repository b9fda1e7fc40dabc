"""Checksums that prove an engine serves exactly the tensors pushed to it.

Owns: which tensors a push checks (`sampled_names`: every 1-D tensor — the norms and biases, a few per layer, so
a load broken off anywhere misses some — and one larger tensor, a different one each version, so successive
pushes cover them all), their SHA-256 digests as pushed (cast to the engine's dtype, as loading casts them) and
as the engine's model holds them after loading (`served_digests`, run on vLLM's worker), compared by
`mismatches`. Only tensors the engine
keeps under the pushed name and shape are compared (vLLM fuses q/k/v and gate/up projections; those are checked
through the unfused tensors around them). Does not own: when a check runs (`VLLMEngineActor.update_weights`) or
what a mismatch leads to (`fullasync.weight_sync`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch


def digest(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().data).hexdigest()


def sampled_names(tensors: Mapping[str, torch.Tensor], version: int) -> list[str]:
    """The tensors a push of `version` checks: every 1-D one, and the `version`-th of the others (in name order)."""
    names = sorted(tensors)
    small = [name for name in names if tensors[name].dim() <= 1]
    large = [name for name in names if tensors[name].dim() > 1]
    return small + ([large[version % len(large)]] if large else [])


Served = dict[str, tuple[tuple[int, ...], str, str]]  # name -> (shape, dtype, digest) as the engine holds it


def served_digests(names: Iterable[str]) -> Callable[[Any], Served]:
    """A function vLLM runs on its worker: shape, dtype and digest of each of `names` its model holds by that name."""
    wanted = set(names)

    def digests(worker: Any) -> Served:
        held = dict(worker.model_runner.get_model().named_parameters())
        return {name: (tuple(held[name].shape), str(held[name].dtype).removeprefix("torch."), digest(held[name]))
                for name in wanted if name in held}

    return digests


def mismatches(tensors: Mapping[str, torch.Tensor], served: Served) -> tuple[int, list[str]]:
    """How many tensors were comparable (held under the pushed name and shape), and those the engine holds otherwise
    than pushed (the pushed tensor cast to the engine's dtype, as loading casts it)."""
    # the worker's answer may cross vLLM's msgpack channel, which turns tuples into lists
    comparable = [name for name, (shape, _, _) in served.items() if tuple(shape) == tuple(tensors[name].shape)]
    wrong = [name for name in comparable
             if digest(tensors[name].to(getattr(torch, served[name][1]))) != served[name][2]]
    return len(comparable), sorted(wrong)
