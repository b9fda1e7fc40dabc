"""The engine contract: token ids in; token ids, log-probs, per-token versions and finish reason out.

Owns: the request/result records and the `Engine` protocol every backend implements.
Does not own: any backend (see `vllm_engine.py`) or routing (see `router.py`).
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Protocol

from fullasync.types import FinishReason


class PauseMode(str, enum.Enum):
    """How a pause treats in-flight requests (vLLM's `pause_generation` modes)."""

    ABORT = "abort"  # return them at once with finish_reason "abort" and the tokens so far
    KEEP = "keep"  # freeze them; they continue after resume (tokens after resume carry the new version)
    WAIT = "wait"  # let them finish, admit nothing new


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling settings of one request, independent of any engine library."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    num_top_logprobs: int = 0  # alternatives per token to return besides the sampled one
    regex: str | None = None  # constrain the output to a regular expression (structured output)


@dataclass(frozen=True)
class GenerateRequest:
    """One generation: `max_tokens` new tokens at most after `prompt_ids`."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingOptions = field(default_factory=SamplingOptions)

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"GenerateRequest.max_tokens must be > 0, got {self.max_tokens}")
        if not self.prompt_ids:
            raise ValueError("GenerateRequest.prompt_ids is empty")


@dataclass(frozen=True)
class GenerateResult:
    """What one engine returned for one request; `output_*` arrays are aligned with `output_ids`.

    `output_versions[i]` is the engine's weight version when token i was produced. On
    `finish_reason == ABORT` the arrays hold the tokens produced before the interruption.
    `top_logprobs[i]` maps alternative token ids to log-probs (empty unless requested).
    """

    request_id: str
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    finish_reason: FinishReason
    stop_reason: int | str | None = None
    top_logprobs: tuple[dict[int, float], ...] = ()
    engine: str = ""

    def __post_init__(self) -> None:
        n = len(self.output_ids)
        if len(self.output_logprobs) != n or len(self.output_versions) != n:
            raise ValueError("GenerateResult arrays must be aligned with output_ids")
        if self.top_logprobs and len(self.top_logprobs) != n:
            raise ValueError("GenerateResult.top_logprobs must have one entry per output token")


@dataclass(frozen=True)
class TokenDelta:
    """Tokens a streaming generation produced since its previous delta (aligned arrays)."""

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    top_logprobs: tuple[dict[int, float], ...] = ()


class Engine(Protocol):
    """An inference engine as the client and the weight sync see it. All methods are async."""

    name: str

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    # Optional: engines that stream also offer
    #   def generate_stream(request) -> AsyncIterator[TokenDelta | GenerateResult]  (result last)

    async def abort(self, request_ids: list[str]) -> None: ...

    async def pause(self, mode: PauseMode) -> None: ...

    async def resume(self) -> None: ...

    async def wait_resumed(self, timeout_s: float) -> bool: ...

    async def update_weights(self, named_tensors: object, version: int) -> None: ...

    async def version(self) -> int: ...

    async def num_in_flight(self) -> int: ...


async def wait_until_set(event: asyncio.Event, timeout_s: float) -> bool:
    """True once `event` is set, False if `timeout_s` passes first (engines' `wait_resumed`)."""
    try:
        await asyncio.wait_for(event.wait(), timeout_s)
    except TimeoutError:
        return False
    return True
