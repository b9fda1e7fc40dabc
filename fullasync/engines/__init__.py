"""Inference engines behind the client: the protocol, vLLM in Ray actors, and the router."""

from fullasync.contracts.engine import Engine, GenerateRequest, GenerateResult, PauseMode, SamplingOptions

__all__ = ["Engine", "GenerateRequest", "GenerateResult", "PauseMode", "SamplingOptions"]
