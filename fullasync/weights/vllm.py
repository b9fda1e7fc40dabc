"""The project's weight hand-offs as a backend of vLLM's own weight-transfer API.

Owns: `FullasyncTransferEngine`, the worker side of both hand-offs written as a vLLM `WeightTransferEngine`,
registered in vLLM's `WeightTransferEngineFactory` as `fullasync` (through the `vllm.general_plugins` entry point,
so every vLLM process — the engine core and each tensor-parallel worker — knows it). A push's update info names
one of them: `layout`, buckets the engine actor fills in shared memory (`weights/shm.py`, the object-store
transport), or `stream`, buckets the trainer's rank 0 broadcasts to the workers (`weights/stream.py`); a streamed
push leaves the sampled tensors it received on the worker (`received`) for the engine's check. Does not own: the
senders, the buckets or the protocols, nor when a push happens (`engines/vllm/`, `weights/sync.py`).

With it an engine takes a push as vLLM's API describes one: `start_weight_update` (vLLM's layer-wise reload
begins) → `update_weights` (every worker reads the buckets as they are filled and loads them; vLLM processes
each layer as soon as its last tensor arrived) → `finish_weight_update(weight_version)` (the reload is
finalised and the engine itself records the version it serves: `get_weight_version`). A GPU backend of the same
API (vLLM's `nccl` or `ipc`) fits the same three calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo

from fullasync.weights import stream as weight_stream
from fullasync.weights.shm import BucketLayout, WeightReceiver
from fullasync.weights.stream import StreamPlan

BACKEND = "fullasync"  # the name under which vLLM's factory knows this backend


def check_installed() -> None:
    """Raise, saying how to fix it, when vLLM processes would not find this backend (the entry point is missing)."""
    from importlib.metadata import entry_points

    if not any(point.value == f"{__name__}:register" for point in entry_points(group="vllm.general_plugins")):
        raise RuntimeError("fullasync's weight-transfer backend is not registered with vLLM in this environment: "
                           "reinstall fullasync (`make setup`, or `pip install -e .`); a stale fullasync.egg-info "
                           "directory in the working directory can hide the installed one — remove it")


def register() -> None:
    """The `vllm.general_plugins` entry point: make `fullasync` a weight-transfer backend (idempotent)."""
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    try:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "FullasyncTransferEngine")
    except ValueError:  # vLLM loads plugins once per process, but a process may also import this first
        pass


@dataclass
class FullasyncInitInfo(WeightTransferInitInfo):
    """Nothing to set up: each push says where its bytes come from in its update info."""


@dataclass
class FullasyncUpdateInfo(WeightTransferUpdateInfo):
    layout: dict[str, Any] = field(default_factory=dict)  # a push through shared memory: `BucketLayout.as_dict()`
    stream: dict[str, Any] = field(default_factory=dict)  # a streamed push: `StreamPlan.as_dict()`


class FullasyncTransferEngine(WeightTransferEngine[FullasyncInitInfo, FullasyncUpdateInfo]):
    """vLLM's worker side of a push (see the module docstring)."""

    init_info_cls = FullasyncInitInfo
    update_info_cls = FullasyncUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._receiver = WeightReceiver()  # keeps the file mapped between pushes
        self.received: dict[str, torch.Tensor] = {}  # the last streamed push's sampled tensors, as received

    def init_transfer_engine(self, init_info: FullasyncInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: FullasyncUpdateInfo) -> None:
        from vllm.distributed import get_tensor_model_parallel_rank

        # every rank of a tensor-parallel engine reads the whole model; vLLM's weight loaders keep its shard
        rank = get_tensor_model_parallel_rank()
        load_weights: Any = self.model.load_weights  # vLLM's models define it; nn.Module's typing does not know it
        if update_info.stream:
            plan = StreamPlan.from_dict(update_info.stream)
            self.received = {}
            self.received = weight_stream.receive(plan, plan.rank_offset + rank, load_weights)
        else:
            load_weights(self._receiver.tensors(BucketLayout.from_dict(update_info.layout), reader=rank))

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def shutdown(self) -> None:
        self._receiver.close()
