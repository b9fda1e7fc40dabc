"""vLLM engines in Ray actors, seen through the `Engine` contract.

- `config.py`: `VLLMEngineConfig` (how one engine starts) and `EngineHealth` (what a probe reads).
- `sampling.py`: pure translation of our requests into vLLM's sampling parameters, and of its version spans.
- `actor.py`: `VLLMEngineActor`, vLLM's `AsyncLLM` in a Ray actor: generation, per-token versions, pause/resume.
- `install.py`: the actor's weight installs and their checks.
- `watchdog.py` / `handle.py`: `RayEngine`, the in-process handle: bounded calls, death, restart, stream fan-out.
- `launch.py`: `launch_vllm_engines`.

Does not own: routing (`fullasync.engines.router`) or when weights are pushed (`fullasync.weights.sync`).
May import: `contracts`, `config`, `weights`, `infra`, `observe`, `types`, `errors`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fullasync.engines.vllm.actor import VLLMEngineActor, engine_actor_options
    from fullasync.engines.vllm.config import VLLMEngineConfig
    from fullasync.engines.vllm.handle import RayEngine
    from fullasync.engines.vllm.launch import launch_vllm_engines

_LAZY = {
    "RayEngine": "fullasync.engines.vllm.handle",
    "VLLMEngineActor": "fullasync.engines.vllm.actor",
    "VLLMEngineConfig": "fullasync.engines.vllm.config",
    "engine_actor_options": "fullasync.engines.vllm.actor",
    "launch_vllm_engines": "fullasync.engines.vllm.launch",
}

__all__ = ["RayEngine", "VLLMEngineActor", "VLLMEngineConfig", "engine_actor_options", "launch_vllm_engines"]


def __getattr__(name: str) -> object:  # the names above, imported on first use: a module of this package
    if name not in _LAZY:              # (args.py, the config check) loads without vLLM, torch or Ray
        raise AttributeError(f"module 'fullasync.engines.vllm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
