"""Inference engines behind the client: the router over them and vLLM in Ray actors (`engines/vllm/`).

- `router.py`: `EngineRouter`, the least-loaded live engine for each new call (a call stays where it began).
- `vllm/`: `RayEngine` and `launch_vllm_engines` (see its docstring).

Does not own: the `Engine` contract (`contracts/engine.py`), when weights are pushed or how they travel
(`weights`). May import: `contracts`, `config`, `infra`, `observe`, `weights`, `types`, `errors`.
"""

from fullasync.contracts.engine import Engine, GenerateRequest, GenerateResult, PauseMode, SamplingOptions

__all__ = ["Engine", "GenerateRequest", "GenerateResult", "PauseMode", "SamplingOptions"]
