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

from fullasync.engines.vllm.actor import VLLMEngineActor, engine_actor_options
from fullasync.engines.vllm.config import VLLMEngineConfig
from fullasync.engines.vllm.handle import RayEngine
from fullasync.engines.vllm.launch import launch_vllm_engines

__all__ = ["RayEngine", "VLLMEngineActor", "VLLMEngineConfig", "engine_actor_options", "launch_vllm_engines"]
