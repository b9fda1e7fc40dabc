"""fullasync: agent-harness-agnostic, fully asynchronous RL post-training of LLMs.

`AsyncAgentTrainer`, `RunConfig`, `CustomGenerator` and `Evaluation` are imported lazily so that `fullasync.types`
stays free of torch, vLLM and Ray.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["AsyncAgentTrainer", "CustomGenerator", "Evaluation", "RunConfig"]


def __getattr__(name: str) -> Any:
    if name == "AsyncAgentTrainer":
        from fullasync.api import AsyncAgentTrainer

        return AsyncAgentTrainer
    if name == "CustomGenerator":
        from fullasync.rollout.generator import CustomGenerator

        return CustomGenerator
    if name == "Evaluation":
        from fullasync.api import Evaluation

        return Evaluation
    if name == "RunConfig":
        from fullasync.config import RunConfig

        return RunConfig
    raise AttributeError(f"module 'fullasync' has no attribute {name!r}")
