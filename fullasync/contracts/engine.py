"""The engine contract: token ids in; token ids, log-probs, per-token versions and finish reason out.

Owns: the request/result records, the weights payload an engine installs (`WeightsPayload`), and the
`Engine` protocol every backend implements: everything a caller (router, client, weight sync, run) does
with an engine is in it, so a backend that satisfies it needs no probing.
Does not own: any backend (see `engines/vllm/`), routing (see `router.py`) or how weights travel
(`weights/transport.py`).
"""

from __future__ import annotations

import asyncio
import enum
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, runtime_checkable

from fullasync.contracts.weights import WeightsPayload
from fullasync.errors import EngineDiedError, InvalidRequestError
from fullasync.types import FinishReason, JsonValue, check_aligned

STRUCTURED_KINDS = ("regex", "json", "choice", "json_object", "compact_json")
StructuredSpec: TypeAlias = "str | tuple[str, ...] | Mapping[str, JsonValue] | bool"
"""The spec of each structured kind: a regex, the choices, a JSON schema, or True for any JSON object.
`compact_json` is a JSON schema without free whitespace between tokens (the calls of a constrained `tool_choice`:
a policy that may pad JSON with whitespace can pad it until `max_tokens`)."""

class PauseMode(str, enum.Enum):
    """How a pause treats in-flight requests (vLLM's `pause_generation` modes)."""

    ABORT = "abort"  # return them at once with finish_reason "abort" and the tokens so far
    KEEP = "keep"  # freeze them; they continue after resume (tokens after resume carry the new version)
    RECOMPUTE = "recompute"  # freeze them and drop their KV cache; after resume the engine prefills each again
    # (prompt + tokens so far) under the new weights and goes on: what ABORT + a client's resubmission compute,
    # with nothing returned or resubmitted (vLLM: a "keep" pause that clears the cache, preempting what runs)
    WAIT = "wait"  # let them finish, admit nothing new


@dataclass(frozen=True)
class SamplingOptions:
    """Sampling settings of one request, independent of any engine library.

    Checked on construction (types and ranges), so no value an engine library could choke on
    gets this far: the client's request schema reports bad input first, this is the last guard.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) disables top-k
    min_p: float = 0.0  # 0 disables min-p
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    num_top_logprobs: int = 0  # alternatives per token to return besides the sampled one
    structured: tuple[str, StructuredSpec] | None = None  # output constraint (kind, spec), kind in STRUCTURED_KINDS
    # also return the log-prob of each prompt token after the first under the engine's weights (the model's raw
    # distribution, before temperature): `GenerateResult.prompt_logprobs`, how a teacher scores a sequence
    score_prompt: bool = False

    def __post_init__(self) -> None:
        for name, low, high in (("temperature", 0.0, math.inf), ("top_p", 1e-9, 1.0), ("min_p", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise InvalidRequestError(f"SamplingOptions.{name} must be a finite number in [{low}, {high}], "
                                          f"got {value!r}", param=name)
        for name in ("top_k", "num_top_logprobs"):
            value = getattr(self, name)
            if type(value) is not int or value < -1:
                raise InvalidRequestError(f"SamplingOptions.{name} must be an integer >= -1, got {value!r}", name)
        if self.seed is not None and (type(self.seed) is not int or not -(2**63) <= self.seed < 2**63):
            raise InvalidRequestError(f"SamplingOptions.seed must be an integer within 64 bits, got {self.seed!r}",
                                      param="seed")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise InvalidRequestError(f"SamplingOptions.stop must hold non-empty strings, got {self.stop!r}", "stop")
        if not all(type(t) is int and t >= 0 for t in self.stop_token_ids):
            raise InvalidRequestError("SamplingOptions.stop_token_ids must hold token ids >= 0", "stop_token_ids")
        if self.structured is not None and self.structured[0] not in STRUCTURED_KINDS:
            raise InvalidRequestError(f"SamplingOptions.structured kind must be one of {STRUCTURED_KINDS}, "
                                      f"got {self.structured[0]!r}", param="structured_outputs")


@dataclass(frozen=True)
class GenerateRequest:
    """One generation: `max_tokens` new tokens at most after `prompt_ids`."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_tokens: int
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    # lower is served first when an engine has more requests than slots (vLLM's priority scheduling): the row's
    # oldest token version, so the rows nearest the staleness bound get slots before younger ones
    priority: int = 0
    # pushes in a row that interrupted this generation's requests before they produced a token: an engine does not
    # let a push interrupt a request starved `starved_interruptions` times until it has a token (`VLLMEngineConfig`)
    starved: int = 0

    def __post_init__(self) -> None:
        if type(self.max_tokens) is not int or self.max_tokens <= 0:
            raise ValueError(f"GenerateRequest.max_tokens must be an integer > 0, got {self.max_tokens!r}")
        if type(self.starved) is not int or self.starved < 0:
            raise ValueError(f"GenerateRequest.starved must be an integer >= 0, got {self.starved!r}")
        if not self.prompt_ids:
            raise ValueError("GenerateRequest.prompt_ids is empty")
        if min(self.prompt_ids) < 0:
            raise InvalidRequestError(f"GenerateRequest.prompt_ids holds a negative id {min(self.prompt_ids)}",
                                      param="prompt")


@dataclass(frozen=True)
class GenerateResult:
    """What one engine returned for one request; `output_*` arrays are aligned with `output_ids`.

    `output_versions[i]` is the oldest weight version that computed anything token i was sampled from:
    the weights in force when it was sampled, or older when its context's KV cache was computed by older
    weights (a request frozen across a push with PauseMode.KEEP). It is what staleness bounds and
    proximal policies use. `output_weight_versions[i]` is the weights' version alone (empty: the same
    as `output_versions`). On `finish_reason == ABORT` the arrays hold the tokens produced before the
    interruption. `top_logprobs[i]` maps alternative token ids to log-probs (empty unless requested).
    """

    request_id: str
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    finish_reason: FinishReason
    stop_reason: int | str | None = None
    top_logprobs: tuple[dict[int, float], ...] = ()
    engine: str = ""
    output_weight_versions: tuple[int, ...] = ()
    prompt_logprobs: tuple[float, ...] = ()  # with `SamplingOptions.score_prompt`: one per prompt token but the first

    def __post_init__(self) -> None:
        check_aligned("GenerateResult", ("output_ids", self.output_ids),
                      {"output_logprobs": self.output_logprobs, "output_versions": self.output_versions},
                      {"output_weight_versions": self.output_weight_versions, "top_logprobs": self.top_logprobs})


@dataclass(frozen=True)
class TokenDelta:
    """Tokens a streaming generation produced since its previous delta (aligned arrays)."""

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    top_logprobs: tuple[dict[int, float], ...] = ()


@dataclass(frozen=True)
class InstallTiming:
    """Seconds one engine spent in each step of `Engine.install`, and finer phases of the update; how many requests
    the push interrupted before they produced a token since their admission or the push before (`starved`), and how
    long its pause waited for requests starved before to produce one (`starved_wait_s`, part of `pause_s`)."""

    pause_s: float
    update_s: float
    resume_s: float
    phases: dict[str, float] = field(default_factory=dict)  # engine-specific breakdown of update_s
    starved: int = 0
    starved_wait_s: float = 0.0


@dataclass(frozen=True)
class KVStats:
    """An engine's own KV counters over its life (`Engine.kv_stats()`; the router and the run's metrics skip an
    engine that answers None): prompt tokens looked up in its prefix cache and those found there (the
    rest were prefilled), the share of its KV blocks in use when asked, and its KV capacity in tokens."""

    prefix_queries: int
    prefix_hits: int
    usage: float
    capacity_tokens: int

    @property
    def recomputed(self) -> int:
        """Prompt tokens prefilled because the cache did not hold them."""
        return self.prefix_queries - self.prefix_hits


class Mortal:
    """`Engine.death` as state and as an event, for implementations to inherit: setting `death` (the error that
    declared the engine dead, or None when a restart revives it) wakes `wait_dead` at once — a death is heard when it
    is declared, not at somebody's next poll."""

    _death: EngineDiedError | None = None
    _events: tuple[asyncio.Event, asyncio.Event] | None = None  # (died, serving), made on first use

    @property
    def death(self) -> EngineDiedError | None:
        return self._death

    @death.setter
    def death(self, error: EngineDiedError | None) -> None:
        self._death = error
        died, serving = self._state_events()
        (serving if error is None else died).set()
        (died if error is None else serving).clear()

    def _state_events(self) -> tuple[asyncio.Event, asyncio.Event]:
        if self._events is None:
            self._events = (asyncio.Event(), asyncio.Event())
            self._events[1 if self._death is None else 0].set()
        return self._events

    async def wait_dead(self) -> EngineDiedError:
        """The error that declares this engine dead, as soon as it is declared (at once when it is dead now)."""
        while self._death is None:
            await self._state_events()[0].wait()
        return self._death

    async def wait_serving(self) -> None:
        """Return as soon as the engine is not dead (at once when it serves now; after a restart otherwise)."""
        while self._death is not None:
            await self._state_events()[1].wait()


@runtime_checkable
class Engine(Protocol):
    """An inference engine as the router, the client, the weight sync and the run see it.

    Implementations: `RayEngine` (vLLM in a Ray actor) and `SimulatedEngine` (fullasync.sim). Every method
    but `generate_stream` and `mark_dead` is a coroutine; `generate_stream` is an async generator whose last item
    is the whole `GenerateResult`; `mark_dead` is a plain call.
    """

    @property
    def name(self) -> str: ...

    @property
    def death(self) -> EngineDiedError | None: ...  # why the engine was declared dead; None while it serves

    @property
    def workers(self) -> int: ...  # processes holding its weights (tensor-parallel ranks): a streamed push reaches each

    @property
    def kv_tokens(self) -> int | None: ...  # its KV cache's capacity in tokens (None: unknown; the router's room)

    async def kv_stats(self) -> KVStats | None: ...  # its own KV counters (None: it keeps none)

    async def wait_dead(self) -> EngineDiedError: ...  # returns when it is declared dead (`Mortal`), with the error

    async def wait_serving(self) -> None: ...  # returns when it is not dead (a restart revived it)

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        """Token deltas as they are sampled, then the whole `GenerateResult` (with versions) last."""
        ...

    async def abort(self, request_ids: list[str]) -> None: ...

    async def pause(self, mode: PauseMode) -> None: ...

    async def resume(self) -> None: ...

    async def wait_resumed(self, timeout_s: float) -> bool: ...

    async def update_weights(self, weights: WeightsPayload, version: int) -> None:
        """Reload `weights` in place and label what follows with `version`; the engine must be paused."""
        ...

    async def install(self, weights: WeightsPayload, version: int, mode: PauseMode) -> InstallTiming:
        """pause(mode) → update_weights → resume, in one call; an update that fails leaves the engine paused (it
        serves nothing loaded in part) until an install succeeds or it is restarted."""
        ...

    def mark_dead(self, reason: str, last_request_id: str | None = None) -> None:
        """Declare the engine dead (`death`): its waiting and later calls fail naming it (and the last request it
        accepted, when known); a restart replaces it."""
        ...

    async def restart(self, weights: WeightsPayload | None, version: int) -> None:
        """Serve again after being declared dead: `weights` (None: the model's own) as `version`."""
        ...

    async def version(self) -> int: ...

    async def num_in_flight(self) -> int: ...

    async def in_flight_tokens(self) -> dict[str, int]:
        """Tokens generated so far by each in-flight request, by request id."""
        ...

    async def shutdown(self) -> None: ...


async def wait_until_set(event: asyncio.Event, timeout_s: float) -> bool:
    """True once `event` is set, False if `timeout_s` passes first (engines' `wait_resumed`)."""
    if event.is_set():  # the common case, after a push has resumed the engine: no waiter, no timer
        return True
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return False
    return True
