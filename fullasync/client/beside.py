"""Models beside the policy that a harness or a reward calls (a judge, a reward model): frozen, never recorded,
never trained, never pushed to.

Owns: `RemoteModel` (an OpenAI-compatible endpoint, its name and role, its concurrency limit, retries and timeout),
`BesideClient` (its `chat.completions.create`, through the openai SDK: at most `max_concurrency` calls at once, a
429, a 5xx, a timeout or a refused connection tried again with exponential backoff, then `BesideModelError`, an
`InfraError`: the episode runs again, it is never scored 0), and its counts for each step's metrics
(`beside/<name>/calls`, `failures`, `retries`, `latency_s`). A call waits only on its own model's limit: the policy's
engines and the rollouter's admission never wait on it. Does not own: engines the run starts for such a model (not
built yet), or recording (a call here is no part of any trajectory).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import openai
from openai.types.chat import ChatCompletion

from fullasync.errors import InfraError

ROLES = ("judge", "reward_model", "teacher")
TRANSIENT_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})

log = logging.getLogger("fullasync")


class BesideModelError(InfraError):
    """A model beside the policy did not answer after its retries: the infrastructure's failure of the episode."""


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

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"a model beside the policy has a role of {list(ROLES)}, got {self.role!r}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL (e.g. http://127.0.0.1:8001/v1), got {self.base_url!r}")
        if self.max_concurrency < 1 or self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError("max_concurrency must be >= 1, retries and backoff_s >= 0, timeout_s > 0; got "
                             f"{self.max_concurrency}, {self.retries}, {self.backoff_s}, {self.timeout_s}")


def remote_models(settings: Mapping[str, Mapping[str, object]]) -> dict[str, RemoteModel]:
    """The run's `beside` setting (`beside.judge.base_url=...` on the command line: every value a string there)
    as models, each field read as the type `RemoteModel` declares; a ValueError names a field it cannot read."""
    declared = {field.name: field.type for field in dataclasses.fields(RemoteModel)}
    kinds: dict[str, type] = {"int": int, "float": float, "str": str}
    models = {}
    for name, given in settings.items():
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise ValueError(f"beside.{name}: {unknown} not a field of a model beside the policy; its fields: "
                             f"{sorted(declared)}")
        missing = [key for key in ("base_url", "model") if key not in given]
        if missing:
            raise ValueError(f"beside.{name} needs {' and '.join(missing)} (beside.{name}.base_url=http://.../v1 "
                             f"beside.{name}.model=<its model name>)")
        values: dict[str, int | float | str] = {}
        for key, value in given.items():
            kind = kinds[str(declared[key])]
            try:
                values[key] = kind(value)
            except (TypeError, ValueError):
                raise ValueError(f"beside.{name}.{key}={value!r} is not {kind.__name__}") from None
        models[name] = RemoteModel(**values)  # type: ignore[arg-type]
    return models


@dataclass
class BesideStats:
    calls: int = 0  # answered
    failures: int = 0  # given up on (BesideModelError)
    retries: int = 0
    latency_s: float = 0.0  # summed over answered calls, waits for a free place and retries included


class BesideClient:
    """One model beside the policy, OpenAI-style: `await client.chat.completions.create(messages=[...])`."""

    def __init__(self, name: str, spec: RemoteModel) -> None:
        api_key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        if spec.api_key_env and not api_key:
            raise ValueError(f"model {name!r} beside the policy: ${spec.api_key_env} is not set")
        self.name = name
        self.spec = spec
        self.stats = BesideStats()
        self._sdk = openai.AsyncOpenAI(base_url=spec.base_url, api_key=api_key or "none", max_retries=0,
                                       timeout=spec.timeout_s)
        self._places = asyncio.Semaphore(spec.max_concurrency)

    @property
    def chat(self) -> BesideClient:
        return self

    @property
    def completions(self) -> BesideClient:
        return self

    async def create(self, **request: object) -> ChatCompletion:
        """A chat completion from the model (`model` defaults to its own); BesideModelError once its retries are
        spent on transient failures. A request the endpoint refuses for itself (another 4xx) raises at once."""
        request.setdefault("model", self.spec.model)
        started = time.monotonic()
        async with self._places:
            for attempt in range(self.spec.retries + 1):
                try:
                    answer: ChatCompletion = await self._sdk.chat.completions.create(**request)  # type: ignore
                except (openai.APIConnectionError, openai.APITimeoutError, openai.APIStatusError) as error:
                    status = getattr(error, "status_code", None)
                    if status is not None and status not in TRANSIENT_STATUS:
                        raise
                    if attempt == self.spec.retries:
                        self.stats.failures += 1
                        raise BesideModelError(f"model {self.name!r} beside the policy ({self.spec.base_url}) did "
                                               f"not answer after {attempt + 1} tries: {error}") from error
                    self.stats.retries += 1
                    await asyncio.sleep(self.spec.backoff_s * 2 ** attempt)
                    continue
                self.stats.calls += 1
                self.stats.latency_s += time.monotonic() - started
                return answer
        raise AssertionError("unreachable: the last try returns or raises")

    def metrics(self) -> dict[str, float]:
        stats = self.stats
        return {f"beside/{self.name}/calls": float(stats.calls), f"beside/{self.name}/failures": float(stats.failures),
                f"beside/{self.name}/retries": float(stats.retries),
                f"beside/{self.name}/latency_s": stats.latency_s / max(stats.calls, 1)}

    async def close(self) -> None:
        await self._sdk.close()
