"""A CPU platform for verl 0.9.1: gloo process groups, FSDP2 engines, no accelerator.

verl 0.9.1 has a platform registry (`verl.plugin.platform`) but no CPU entry: on a machine
without a GPU it falls back to "nvidia" and asks for nccl. `apply()` makes the current process
run verl on CPU:

1. registers `CPUPlatform` under the name "cpu" and selects it (`VERL_PLATFORM=cpu`); its device
   module is `CPU_DEVICE_MODULE`, which answers the `torch.cuda`-style calls verl makes (memory
   statistics, RNG state, synchronize) for the CPU;
2. registers verl's FSDP engines (`FSDPEngineWithLMHead`, `FSDPEngineWithValueHead`) for the
   device "cpu" (upstream registers them for "cuda" and "npu" only);
3. replaces `verl.utils.distributed.initialize_global_process_group_ray`, whose backend string
   "cpu:gloo,<device>:<backend>" names "cpu" twice on this platform, by a gloo initialisation
   that listens on loopback only: the rendezvous store on 127.0.0.1:$MASTER_PORT (whatever
   MASTER_ADDR says) and gloo's connections on the loopback interface. The CPU platform is one node.

It must run before any `verl.workers` module is imported, because those modules read the device
name at import time. Inside Ray workers that is arranged with `worker_env_vars()`, which makes
verl's own external-module hook (`VERL_USE_EXTERNAL_MODULES`, read in `verl/__init__.py`) import
this module as the first thing verl does.

Import-time behaviour: importing this module changes nothing, except when verl's external-module
hook imports it (this module is listed in `VERL_USE_EXTERNAL_MODULES`); that hook only imports,
so the module applies itself then. `apply()` is idempotent and checks the installed verl version
first (`VerlVersionError` for any other version). tests/integration/test_verl_cpu_patch.py checks every verl
name and signature this module relies on.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import socket
import sys
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
from torch.distributed.constants import default_pg_timeout

SUPPORTED_VERL_VERSION = "0.9.1"  # the verl release this module was written and tested against
PLATFORM_NAME = "cpu"  # the name registered in verl's PlatformRegistry and used in VERL_PLATFORM
MODULE_NAME = "fullasync_patches.verl_cpu"  # the import name verl's external-module hook is given
LOOPBACK = "127.0.0.1"  # gloo rendezvous address: the CPU platform runs on one node

# verl.workers.engine.fsdp.transformer_impl classes registered for the device "cpu", by model type
ENGINE_MODEL_TYPES = {"language_model": "FSDPEngineWithLMHead", "value_model": "FSDPEngineWithValueHead"}
ENGINE_BACKENDS = ("fsdp", "fsdp2")
# Modules that bind `initialize_global_process_group_ray` by name (`from ... import ...`).
PROCESS_GROUP_INIT = "initialize_global_process_group_ray"
PROCESS_GROUP_INIT_BINDERS = ("verl.utils.distributed", "verl.checkpoint_engine.base", "verl.workers.engine_workers")
PATCH_MARKER = "__fullasync_verl_cpu__"  # set on everything this module installs, for idempotence


class VerlVersionError(RuntimeError):
    """The installed verl is not the version this patch was written for."""


def check_verl_version() -> str:
    """Return the installed verl version, or raise `VerlVersionError` if it is not supported."""
    installed = importlib.metadata.version("verl")
    if installed != SUPPORTED_VERL_VERSION:
        raise VerlVersionError(
            f"fullasync_patches.verl_cpu was written for verl {SUPPORTED_VERL_VERSION}, but verl {installed} is "
            f"installed. Install verl=={SUPPORTED_VERL_VERSION}, or re-check what the patch touches "
            f"(tests/integration/test_verl_cpu_patch.py) and update SUPPORTED_VERL_VERSION."
        )
    return installed


def worker_env_vars() -> dict[str, str]:
    """Environment for a Ray worker that runs verl on CPU (use as `runtime_env["env_vars"]`).

    verl imports `fullasync_patches.verl_cpu` from its own `__init__` (external-module hook), so the
    platform exists before anything in verl asks for it; the module is importable in every worker because it is
    installed with fullasync (as `fullasync_patches`).
    """
    external = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m and m != MODULE_NAME]
    return {
        "VERL_PLATFORM": PLATFORM_NAME,
        "VERL_USE_EXTERNAL_MODULES": ",".join([MODULE_NAME, *external]),
    }


class CPUDeviceModule(types.ModuleType):
    """The `torch.<device>` namespace verl calls through `get_torch_device()`, for the CPU.

    Memory statistics are reported as 0 (there is no device memory), cache and synchronisation
    calls do nothing, RNG calls go to torch's CPU generator; anything else falls through to
    `torch.cpu` (Stream, Event, current_stream, ...).
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def empty_cache() -> None:
        return None

    @staticmethod
    def ipc_collect() -> None:
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        return None

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        return None

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        """(free, total) bytes of host memory."""
        import psutil

        memory = psutil.virtual_memory()
        return memory.available, memory.total

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        torch.manual_seed(seed)

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)


CPU_DEVICE_MODULE = CPUDeviceModule("verl_cpu_device")  # stateless; what CPUPlatform.device_module returns


class CPUPlatformMethods:
    """verl platform for the CPU: device "cpu", backend gloo, Ray resource "CPU" (mixed into PlatformBase)."""

    @property
    def device_name(self) -> str:
        return PLATFORM_NAME

    @property
    def vendor_name(self) -> str:
        return PLATFORM_NAME

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # never auto-detected: selected explicitly with VERL_PLATFORM=cpu

    def current_device(self) -> torch.device:
        # verl uses get_device_id() as a `.to(...)` target; an integer there would mean cuda:<n>
        return torch.device(PLATFORM_NAME)

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "VERL_CPU_VISIBLE_DEVICES"  # nothing to hide on a CPU; a name nobody else sets

    @contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        # verl's pools pass their per-worker accelerator share here; on CPU it is a CPU share
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def _build_platform_class(platform_base: type) -> type:
    """`CPUPlatform`: `CPUPlatformMethods` on verl's `PlatformBase` (imported only after the version check)."""
    metaclass = type(platform_base)  # ABCMeta: the class must implement every abstract method
    return metaclass("CPUPlatform", (CPUPlatformMethods, platform_base), {PATCH_MARKER: True, "__module__": __name__})


def _register_platform() -> None:
    from verl.plugin.platform import PlatformBase, PlatformRegistry

    registered = PlatformRegistry.get(PLATFORM_NAME)
    if registered is None or not getattr(registered, PATCH_MARKER, False):
        PlatformRegistry.register(platform=PLATFORM_NAME)(_build_platform_class(PlatformBase))


def _select_platform() -> None:
    """Make "cpu" this process's verl platform, or fail if verl already settled on another."""
    from verl.plugin.platform import get_platform

    requested = os.environ.get("VERL_PLATFORM", "").strip().lower()
    if requested and requested != PLATFORM_NAME:
        raise RuntimeError(
            f"VERL_PLATFORM={requested!r} is set, but fullasync_patches.verl_cpu.apply() selects {PLATFORM_NAME!r}; "
            f"unset VERL_PLATFORM or do not apply the CPU patch in this process"
        )
    os.environ["VERL_PLATFORM"] = PLATFORM_NAME
    current = get_platform()
    if not getattr(type(current), PATCH_MARKER, False):
        raise RuntimeError(
            f"verl already chose the platform {current.device_name!r} in this process; call "
            f"fullasync_patches.verl_cpu.apply() before anything imports verl.workers or calls get_platform()"
        )


def _gloo_process_group_init(original: Callable[..., None]) -> Callable[..., None]:
    """Wrap verl's process-group initialisation: gloo on loopback when the platform is the CPU."""

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second: int | None = None, backend: str | None = None) -> None:
        from verl.plugin.platform import get_platform

        if get_platform().device_name != PLATFORM_NAME or torch.distributed.is_initialized():
            return original(timeout_second=timeout_second, backend=backend)
        if backend not in (None, "gloo"):
            raise ValueError(f"the verl CPU platform supports only the gloo backend, got {backend!r}")
        rank, world_size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        timeout = timedelta(seconds=timeout_second) if timeout_second is not None else default_pg_timeout
        if sys.platform.startswith("linux"):
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # gloo's own connections on loopback too
        store = _loopback_store(rank, world_size, int(os.environ["MASTER_PORT"]), timeout)
        torch.distributed.init_process_group(
            backend="gloo", store=store, rank=rank, world_size=world_size, timeout=timeout
        )

    setattr(initialize_global_process_group_ray, PATCH_MARKER, True)
    return initialize_global_process_group_ray


def _loopback_store(rank: int, world_size: int, port: int, timeout: timedelta) -> torch.distributed.TCPStore:
    """The rendezvous store on 127.0.0.1:port (a TCPStore given only a host still listens on all interfaces)."""
    from verl.utils.distributed import create_tcp_store

    listener = None
    if rank == 0:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, port))
        listener.listen()
    return create_tcp_store(
        LOOPBACK, port, listen_socket=listener, world_size=world_size, is_master=rank == 0, timeout=timeout
    )


def _patch_process_group_init() -> None:
    import verl.utils.distributed as distributed

    current = distributed.initialize_global_process_group_ray
    patched = current if getattr(current, PATCH_MARKER, False) else _gloo_process_group_init(current)
    for module_name in PROCESS_GROUP_INIT_BINDERS:
        module = sys.modules.get(module_name)
        if module is not None:
            setattr(module, PROCESS_GROUP_INIT, patched)


def _register_engines() -> None:
    from verl.workers.engine import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl as engines

    for model_type, class_name in ENGINE_MODEL_TYPES.items():
        engine_class = getattr(engines, class_name)
        for backend in ENGINE_BACKENDS:
            if EngineRegistry._engines[model_type][backend].get(PLATFORM_NAME) is not engine_class:
                EngineRegistry.register(model_type=model_type, backend=backend, device=PLATFORM_NAME)(engine_class)


def apply() -> None:
    """Make this process run verl on CPU (see the module docstring). Idempotent.

    Call it before importing any `verl.workers` module; Ray workers get it through
    `worker_env_vars()`.
    """
    check_verl_version()
    _register_platform()
    _patch_process_group_init()
    _select_platform()
    _register_engines()


def _apply_when_imported_by_verl_hook() -> None:
    """verl's external-module hook only imports the listed modules; registering is our part."""
    requested = [name.strip() for name in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")]
    if MODULE_NAME in requested:
        apply()


_apply_when_imported_by_verl_hook()
