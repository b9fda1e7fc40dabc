"""The weights seam: what one weight version is as it reaches an engine, and the transport that carries it.

Owns: `WeightsPayload` (the forms one version takes on its way to `Engine.install`), the `WeightTransport`
protocol (one push = `start_weight_update` → one `update_weights` per engine → `finish_weight_update`, the shape
of vLLM's weight-transfer API), `StreamedWeights` (a version the trainer's ranks stream rather than export) and
`StreamingTrainer` (what a streaming transport needs of the trainer).
Does not own: any transport (`fullasync.weights.transport`), the push's bookkeeping (`fullasync.weights.sync`).
Imports no component: stdlib and the records only (torch, Ray and the stream plan are named for the type checker).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

if TYPE_CHECKING:  # the contract loads without torch or Ray; only the type checker needs them
    import torch
    from ray import ObjectRef

    from fullasync.contracts.engine import Engine, InstallTiming, PauseMode
    from fullasync.weights.stream import StreamPlan

NamedTensors: TypeAlias = "Mapping[str, torch.Tensor]"
"""A model's weights by Hugging Face parameter name (`lm_head.weight` included when tied)."""

WeightsPayload: TypeAlias = "NamedTensors | ObjectRef[NamedTensors] | StreamPlan"
"""The weights of one version as they reach `Engine.install`: the mapping itself (in process, simulator), a
Ray object reference to it (the trainer's export: the tensors stay in Ray's object store and the driver never
holds them; Ray resolves the reference in the engine's actor), or the plan of a push the trainer's ranks stream
to the engine's workers while it installs (`weights/stream.py`)."""


@dataclass(frozen=True)
class StreamedWeights:
    """The trainer's weights after `step` steps, to be streamed by its ranks while the engines install them."""

    step: int


class WeightsMovedOn(RuntimeError):
    """The trainer no longer holds the weights asked for (it has stepped since)."""


@runtime_checkable
class WeightTransport(Protocol):
    """Carries one weight version to every engine of a push (see the module docstring for the order)."""

    async def start_weight_update(self, weights: WeightsPayload | StreamedWeights, version: int,
                                  engines: Sequence[Engine]) -> None:
        """Begin pushing `weights` as `version` to `engines` (before any engine is paused)."""
        ...

    async def update_weights(self, engine: Engine, version: int, mode: PauseMode) -> InstallTiming:
        """Install the started push on `engine`: pause it (`mode`), load, resume it once loaded (a failed load
        leaves it paused: `Engine.install`)."""
        ...

    async def finish_weight_update(self, version: int) -> None:
        """Every engine that took part holds `version`: release what the push held."""
        ...

    async def materialize(self, weights: WeightsPayload | StreamedWeights) -> WeightsPayload:
        """What an engine restarting with `weights` installs (`Engine.restart`)."""
        ...


class StreamingTrainer(Protocol):
    """What `StreamTransport` needs of the trainer (`VerlTrainer`)."""

    async def stream_plan(self, version: int, world_size: int, bucket_bytes: int, timeout_s: float
                          ) -> StreamPlan: ...

    async def stream_weights(self, plan: StreamPlan) -> dict[str, str]: ...

    async def gather_weights(self, step: int | None = None) -> WeightsPayload: ...
