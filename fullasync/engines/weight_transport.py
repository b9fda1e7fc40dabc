"""How one weight version travels from the trainer's export into every engine: the `WeightTransport` seam.

Owns: the transport protocol — one push is a transaction `start_weight_update(weights, version)` → one
`update_weights(engine, ...)` per engine → `finish_weight_update(version)`, the shape of vLLM's own
weight-transfer API (`start_weight_update` → `update_weights` → `finish_weight_update(weight_version)`) —
and `ObjectStoreTransport`, the transport of the CPU stack: the trainer's export is a Ray object reference,
each engine actor receives it from Ray's object store in its `install` call (one round trip per engine), and
hands it to its vLLM engine's workers through vLLM's own weight-transfer API (`start_weight_update` →
`update_weights` → `finish_weight_update(version)`) with the shared-memory backend registered in vLLM's factory
(`vllm_transfer.py`, buckets in `shm_weights.py`).
Does not own: when a push happens, which engines take part, or what a failed engine gets later
(`weight_sync.py`); pausing and resuming inside an engine (`Engine.install`).

A transport that streams from the trainer's ranks to the engines (NCCL or IPC on GPU) fits the same three
calls: `start_weight_update` opens the transfer on the sender's side, `update_weights` has one engine receive
and load it between its pause and resume, `finish_weight_update` closes the transfer once every engine holds
`version`. A push that fails never reaches `finish_weight_update`; the next `start_weight_update` begins afresh.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from fullasync.engines.protocol import Engine, InstallTiming, PauseMode, WeightsPayload


@runtime_checkable
class WeightTransport(Protocol):
    """Carries one weight version to every engine of a push (see the module docstring for the order)."""

    async def start_weight_update(self, weights: WeightsPayload, version: int) -> None:
        """Begin pushing `weights` as `version` (before any engine is paused)."""
        ...

    async def update_weights(self, engine: Engine, version: int, mode: PauseMode) -> InstallTiming:
        """Install the started push on `engine`: pause it (`mode`), load, resume it once loaded (a failed load
        leaves it paused: `Engine.install`)."""
        ...

    async def finish_weight_update(self, version: int) -> None:
        """Every engine that took part holds `version`: release what the push held."""
        ...


class ObjectStoreTransport:
    """Weights through Ray's object store to each engine actor, then shared memory to its engine core.

    The payload is passed as is to `Engine.install`: a Ray object reference travels as a reference (Ray resolves
    it in the actor, reading the tensors without a copy), a mapping of tensors (in process, the simulator) as
    itself. Nothing is copied here.
    """

    def __init__(self) -> None:
        self._pushing: tuple[WeightsPayload, int] | None = None  # the started push: weights and version

    async def start_weight_update(self, weights: WeightsPayload, version: int) -> None:
        self._pushing = (weights, version)

    async def update_weights(self, engine: Engine, version: int, mode: PauseMode) -> InstallTiming:
        if self._pushing is None or self._pushing[1] != version:
            raise RuntimeError(f"ObjectStoreTransport.update_weights(version={version}) without a started push of "
                               "that version: call start_weight_update first")
        return await engine.install(self._pushing[0], version, mode)

    async def finish_weight_update(self, version: int) -> None:
        self._pushing = None
