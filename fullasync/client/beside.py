"""Models beside the policy that a harness or a reward calls (a judge, a reward model): frozen, never recorded,
never trained, never pushed to.

Owns: `RemoteModel` (an OpenAI-compatible endpoint, its name and role, its concurrency limit, retries and timeout),
`ServedModel` (a model directory the run serves itself on engines of its own), `beside_models` (the `beside`
setting read as either), `BesideClient` (its `chat.completions.create`, through the openai SDK for an endpoint or
the run's own engines for a served model: at most `max_concurrency` calls at once, a 429, a 5xx, a timeout, a refused
connection or a dead engine tried again with exponential backoff, then `BesideModelError`, an `InfraError`: the
episode runs again, it is never scored 0), its `score` (a judge's answer read as a number, asked again when it
holds none, then `JudgeScoreError`), and its counts for each step's metrics (`beside/<name>/calls`, `failures`,
`retries`, `unscored`, `latency_s`). A call waits only on its own model's limit: the policy's engines and the
rollouter's admission never wait on it. Does not own: starting and supervising a served model's engines
(`fullasync.launch.beside`), or recording (a call here is no part of any trajectory).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import openai
from openai.types.chat import ChatCompletion

from fullasync.config import EngineSection
from fullasync.errors import EngineDiedError, EngineResumeTimeoutError, InfraError

ROLES = ("judge", "reward_model", "teacher")
TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})

log = logging.getLogger("fullasync")


class BesideModelError(InfraError):
    """A model beside the policy did not answer after its retries: the infrastructure's failure of the episode."""


class JudgeScoreError(BesideModelError):
    """A judge answered, but with no score that could be read, each of its `score_retries` + 1 times."""


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number written in `text` ("score: 7", "... so 0.8"), or None: `BesideClient.score`'s default."""
    found = NUMBER.findall(text)
    return float(found[-1]) if found else None


@dataclass(frozen=True)
class RemoteModel:
    """An OpenAI-compatible endpoint the run's harnesses and rewards may call (never recorded or trained)."""

    base_url: str  # e.g. http://127.0.0.1:8001/v1
    model: str  # the model name its requests carry
    role: str = "judge"  # judge, reward_model or teacher (`client.judge` is the model whose role is judge)
    api_key_env: str = ""  # the environment variable holding its API key ("" = none needed)
    max_concurrency: int = 8  # its calls at once; more wait for a free place, only on this model
    retries: int = 3  # calls again after a 429, a 5xx, a timeout or a refused connection
    backoff_s: float = 0.5  # the first wait before calling again; doubled each time
    timeout_s: float = 120.0  # one attempt at most
    score_retries: int = 2  # `score`: asks again after an answer with no readable score

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a model beside the policy has a role of {list(ROLES)}, got {self.role!r}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL (e.g. http://127.0.0.1:8001/v1), got {self.base_url!r}")
        if self.max_concurrency < 1 or min(self.retries, self.score_retries) < 0 or self.backoff_s < 0 \
                or self.timeout_s <= 0:
            raise ValueError("max_concurrency must be >= 1, retries, score_retries and backoff_s >= 0, timeout_s > 0; "
                             f"got {self.max_concurrency}, {self.retries}, {self.score_retries}, {self.backoff_s}, "
                             f"{self.timeout_s}")


@dataclass(frozen=True)
class ServedModel:
    """A frozen model the run serves itself on vLLM engines of its own (`fullasync.launch.beside`): started with the
    run, restarted when one dies, stopped with it; its calls never reach the policy's engines."""

    path: str  # a local HF model directory, a hub ID (org/name), builtin:arithmetic or a named model
    role: str = "judge"
    engines: int = 1  # engines serving it (calls go to the one with the most room)
    max_model_len: int = EngineSection.max_model_len  # its context (prompt + answer), as the policy's engines'
    kv_cache_mb: int = 256  # each engine's KV cache
    dtype: str = "float32"
    cpus: str = ""  # Linux CPU list its engines' processes are bound to ("" = every core)
    max_concurrency: int = 8
    retries: int = 3  # calls again after its engines died and did not come back within their restart
    backoff_s: float = 0.5
    timeout_s: float = 600.0  # one attempt at most, a wait for a restarting engine included
    start_timeout_s: float = 600.0  # an engine's start (and each restart) at most
    score_retries: int = 2  # `score`: asks again after an answer with no readable score

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a model beside the policy has a role of {list(ROLES)}, got {self.role!r}")
        if not self.path:
            raise ValueError("a served model beside the policy needs a path (a model directory or a named model)")
        if min(self.engines, self.max_model_len, self.kv_cache_mb, self.max_concurrency) < 1 \
                or min(self.retries, self.score_retries) < 0 or self.backoff_s < 0 \
                or min(self.timeout_s, self.start_timeout_s) <= 0:
            raise ValueError("engines, max_model_len, kv_cache_mb and max_concurrency must be >= 1, retries, "
                             "score_retries and backoff_s >= 0, timeout_s and start_timeout_s > 0; got "
                             f"{self.engines}, {self.max_model_len}, {self.kv_cache_mb}, {self.max_concurrency}, "
                             f"{self.retries}, {self.score_retries}, {self.backoff_s}, {self.timeout_s}, "
                             f"{self.start_timeout_s}")


BesideModel = RemoteModel | ServedModel


def beside_models(settings: Mapping[str, Mapping[str, object]]) -> dict[str, BesideModel]:
    """The run's `beside` setting (`beside.judge.base_url=...` on the command line: every value a string there)
    as models — an endpoint (`base_url` and `model`: `RemoteModel`) or a model the run serves (`path`:
    `ServedModel`) — each field read as the type its class declares; a ValueError names a field it cannot read."""
    models: dict[str, BesideModel] = {}
    for name, given in settings.items():
        if "path" in given and "base_url" in given:
            raise ValueError(f"beside.{name}: give either path (a model the run serves) or base_url (an endpoint), "
                             "not both")
        kind: type[RemoteModel] | type[ServedModel] = ServedModel if "path" in given else RemoteModel
        declared = {field.name: field.type for field in dataclasses.fields(kind)}
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise ValueError(f"beside.{name}: {unknown} not a field of {'a served' if kind is ServedModel else 'an'} "
                             f"model beside the policy; its fields: {sorted(declared)}")
        missing = [key for key in ("base_url", "model") if key not in given] if kind is RemoteModel else []
        if missing:
            raise ValueError(f"beside.{name} needs {' and '.join(missing)} (beside.{name}.base_url=http://.../v1 "
                             f"beside.{name}.model=<its model name>), or beside.{name}.path=<a model> for a model "
                             "the run serves itself")
        models[name] = kind(**{key: _typed(f"beside.{name}.{key}", value, str(declared[key]))
                               for key, value in given.items()})  # type: ignore[arg-type]
    return models


def _typed(setting: str, value: object, declared: str) -> int | float | str:
    kind: type = {"int": int, "float": float, "str": str}[declared]
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{setting}={value!r} is not {kind.__name__}") from None


class ChatBackend(Protocol):
    """Where a model beside the policy answers a chat call: its endpoint (the openai SDK) or the run's engines."""

    async def create(self, **request: object) -> ChatCompletion: ...

    def metrics(self) -> dict[str, float]: ...  # its own counts for the step's metrics (a served model's restarts)

    async def close(self) -> None: ...


class EndpointBackend:
    """An OpenAI-compatible endpoint through the openai SDK (its own retries off: `BesideClient` retries)."""

    def __init__(self, name: str, spec: RemoteModel) -> None:
        api_key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if spec.api_key_env and not api_key:
            raise ValueError(f"model {name!r} beside the policy: ${spec.api_key_env} is not set")
        self._sdk = openai.AsyncOpenAI(base_url=spec.base_url, api_key=api_key or "none", max_retries=0,
                                       timeout=spec.timeout_s)

    async def create(self, **request: object) -> ChatCompletion:
        return await self._sdk.chat.completions.create(**request)  # type: ignore[call-overload]

    def metrics(self) -> dict[str, float]:
        return {}

    async def close(self) -> None:
        await self._sdk.close()


@dataclass
class BesideStats:
    calls: int = 0  # answered
    failures: int = 0  # given up on (BesideModelError)
    retries: int = 0
    latency_s: float = 0.0  # summed over answered calls, waits for a free place and retries included
    unscored: int = 0  # `score`'s answers with no readable score (asked again, or JudgeScoreError)


class BesideClient:
    """One model beside the policy, OpenAI-style: `await client.chat.completions.create(messages=[...])`."""

    def __init__(self, name: str, spec: BesideModel, backend: ChatBackend | None = None) -> None:
        """`backend`: where the calls go (a `ServedModel` needs the one its engines give, `fullasync.launch.beside`);
        default: the `RemoteModel`'s endpoint."""
        if backend is None:
            if not isinstance(spec, RemoteModel):
                raise TypeError(f"model {name!r} beside the policy is served by the run: it needs its engines' "
                                "backend (fullasync.launch.beside.ServedModels)")
            backend = EndpointBackend(name, spec)
        self.name = name
        self.spec = spec
        self.stats = BesideStats()
        self.backend = backend
        self._places = asyncio.Semaphore(spec.max_concurrency)

    @property
    def chat(self) -> BesideClient:
        return self

    @property
    def completions(self) -> BesideClient:
        return self

    async def create(self, **request: object) -> ChatCompletion:
        """A chat completion from the model (`model` defaults to its own); BesideModelError once its retries are
        spent on transient failures (a served model's: its engines dead past their restart). A request the model refuses
        for itself (another 4xx; a served model's InvalidRequestError) raises at once."""
        request.setdefault("model", self.spec.model if isinstance(self.spec, RemoteModel) else self.name)
        started = time.monotonic()
        where = self.spec.base_url if isinstance(self.spec, RemoteModel) else f"served from {self.spec.path}"
        async with self._places:
            for attempt in range(self.spec.retries + 1):
                try:
                    answer = await asyncio.wait_for(self.backend.create(**request), self.spec.timeout_s)
                except (openai.APIConnectionError, openai.APITimeoutError, openai.APIStatusError, InfraError,
                        EngineDiedError, EngineResumeTimeoutError, TimeoutError) as error:
                    status = getattr(error, "status_code", None)
                    if status is not None and status not in TRANSIENT_STATUS:
                        raise
                    if isinstance(error, BesideModelError):  # its backend gave up already (a served model's engines)
                        self.stats.failures += 1
                        raise
                    if attempt == self.spec.retries:
                        self.stats.failures += 1
                        raise BesideModelError(f"model {self.name!r} beside the policy ({where}) did "
                                               f"not answer after {attempt + 1} tries: {error!r}") from error
                    self.stats.retries += 1
                    await asyncio.sleep(self.spec.backoff_s * 2 ** attempt)
                    continue
                self.stats.calls += 1
                self.stats.latency_s += time.monotonic() - started
                return answer
        raise AssertionError("unreachable: the last try returns or raises")

    async def score(self, messages: list[dict[str, str]], parse: Callable[[str], float | None] = last_number,
                    **request: object) -> float:
        """The score the model's answer to `messages` gives, read by `parse` (default: its last number); an answer
        with none (`parse` returned None or no finite number) is asked again up to the model's `score_retries`
        times (helps when it samples: temperature > 0), then JudgeScoreError, the infrastructure's failure of the
        episode (it runs again), never a reward."""
        text = ""
        for _ in range(self.spec.score_retries + 1):
            answer = await self.create(messages=messages, **request)
            text = answer.choices[0].message.content or ""
            score = parse(text)
            if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score):
                return float(score)
            self.stats.unscored += 1
        self.stats.failures += 1
        raise JudgeScoreError(f"model {self.name!r} beside the policy gave no readable score in "
                              f"{self.spec.score_retries + 1} answers (score_retries={self.spec.score_retries}); the "
                              f"last: {text[:200]!r}")

    def metrics(self) -> dict[str, float]:
        stats = self.stats
        return {f"beside/{self.name}/calls": float(stats.calls), f"beside/{self.name}/failures": float(stats.failures),
                f"beside/{self.name}/retries": float(stats.retries),
                f"beside/{self.name}/unscored": float(stats.unscored),
                f"beside/{self.name}/latency_s": stats.latency_s / max(stats.calls, 1), **self.backend.metrics()}

    async def close(self) -> None:
        await self.backend.close()
