"""Models beside the policy that the run serves itself (`ServedModel`: a path instead of an endpoint): a judge, a
reward model or a teacher on vLLM engines of its own, frozen, supervised with the run.

Owns: `ServedModels` — starting each served model's engines (`launch_vllm_engines`, beside the policy's; never
pushed to), their supervision (`WeightSync.supervise` with restarts on and no pushes: an engine the watchdog
declares dead is restarted with the model's own weights; a call in flight waits for it and continues there,
`fullasync.client.continuation`), the `BesideClient` of each (its chat calls through a `RolloutService` of the
model's own tokenizer and engines: one client per call, closed after it, so nothing is kept or recorded), and
stopping them. A model whose engines cannot be restarted (`RESTART_ATTEMPTS` in a row) fails each later call at once
with `BesideModelError` — the episode's infrastructure failure, never a score. A teacher (role teacher) is served
the same way and scores the run's groups (its engines and `check` given to `fullasync.rollout.teacher`), once
`run_teacher` found it fit: served, as long a context as the policy's, the policy's tokenizer. Does not own: the
call's limits, retries and counts (`fullasync.client.beside`), the policy's engines (`fullasync.api`), the scoring
(`fullasync.rollout.teacher`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from openai.types.chat import ChatCompletion

from fullasync.client.beside import BesideClient, BesideModel, BesideModelError, ServedModel
from fullasync.client.rollout_client import ClientConfig, RolloutService
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.engines.vllm.handle import RayEngine
from fullasync.launch.model import resolve_model
from fullasync.launch.parts import RESTART_GRACE_S
from fullasync.models import load_tokenizer
from fullasync.weights.sync import WeightSync

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("fullasync")

RESTART_RETRY_S = 5.0  # a served model's restart that failed is tried again after this


def served_engine_config(name: str, spec: ServedModel, model_path: str, seed: int) -> VLLMEngineConfig:
    """The engines of the served model `name`: its directory, its name as the served one, its context, KV cache,
    precision and cores; everything else as a policy engine's. A teacher's context is one token longer (a scoring
    request generates one token after the sequence it scores) where the model has the positions."""
    context = spec.max_model_len
    if spec.role == "teacher":
        context = min(context + 1, model_positions(model_path) or context + 1)
    return VLLMEngineConfig(model_path=model_path, served_model_name=name, dtype=spec.dtype,
                            max_model_len=context, seed=seed, cpus=spec.cpus,
                            start_timeout_s=spec.start_timeout_s,
                            extra_engine_kwargs={"kv_cache_memory_bytes": spec.kv_cache_mb * 2**20})


def model_positions(model_path: str | Path) -> int | None:
    """The positions the model in `model_path` holds (config.json's max_position_embeddings); None: not said."""
    try:
        positions = json.loads((Path(model_path) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return None
    return int(positions) if isinstance(positions, (int, float)) else None


def served_gpu_blocks(specs: Mapping[str, ServedModel]) -> list[tuple[str, int]]:
    """What the served models' engines need on one node each (one GPU an engine), for the run's layout check."""
    return [(f"{name} engine {index}", 1) for name, spec in specs.items() for index in range(spec.engines)]


@dataclass
class ServedBackend:
    """A served model's chat calls: each through a client of the model's own `RolloutService`, closed after it."""

    name: str
    service: RolloutService
    sync: WeightSync

    async def create(self, **request: object) -> ChatCompletion:
        try:
            self.sync.check_engines()  # raises once its supervisor gave up on a restart
        except Exception as failure:  # the episode's infrastructure failure, at once
            raise BesideModelError(f"model {self.name!r} beside the policy: its engines could not be restarted "
                                   f"({failure})") from failure
        client = self.service.client()
        try:
            answer = await client.chat.completions.create(**request)
        finally:
            client.close()
        if not isinstance(answer, ChatCompletion):  # a stream: a judge's answer is read whole
            raise ValueError(f"model {self.name!r} beside the policy answers whole completions: drop stream=True")
        return answer

    def metrics(self) -> dict[str, float]:
        return {f"beside/{self.name}/restarts": float(self.sync.restarts)}

    async def close(self) -> None:
        return None


@dataclass
class _Served:
    engines: list[RayEngine]
    sync: WeightSync
    supervisor: asyncio.Task[None]


def run_teacher(models: Mapping[str, BesideModel], policy_path: str, max_model_len: int) -> str | None:
    """The name of the run's teacher (the model beside the policy whose role is teacher; None: no distillation),
    after checking it can score the policy's sequences: one of it and, served by the run, a context as long as the
    policy's, the policy's tokenizer and chat template (an endpoint's are asked of it, `check_endpoint_teacher`).
    Each refusal in one line, saying what to change."""
    teachers = [name for name, spec in models.items() if spec.role == "teacher"]
    if not teachers:
        return None
    if len(teachers) > 1:
        raise ValueError(f"models beside the policy {teachers} all have role teacher: distillation takes one")
    name, spec = teachers[0], models[teachers[0]]
    if not isinstance(spec, ServedModel):  # an endpoint: checked once it is asked (`check_endpoint_teacher`)
        return name
    if spec.max_model_len < max_model_len:
        raise ValueError(f"beside.{name}.max_model_len={spec.max_model_len} is shorter than the policy's "
                         f"engine.max_model_len={max_model_len}: the teacher scores whole trained sequences; set it "
                         f">= {max_model_len}")
    path = resolve_model(spec.path, setting=f"beside.{name}.path")
    positions = model_positions(path)
    if positions is not None and positions < max_model_len + 1:
        raise ValueError(f"beside.{name}.path={spec.path!r}: its model holds {positions} positions and scoring a "
                         f"sequence of engine.max_model_len={max_model_len} tokens takes {max_model_len + 1} (the one "
                         f"token a scoring request generates): set engine.max_model_len <= {positions - 1}")
    differs = tokenizer_difference(load_tokenizer(policy_path), load_tokenizer(path))
    if differs:
        raise ValueError(f"beside.{name}.path={spec.path!r}: its tokenizer is not the policy's ({differs}); "
                         "distillation scores the policy's own token ids: the teacher needs the same tokenizer "
                         "files and chat template")
    return name


def tokenizer_difference(policy: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase) -> str | None:
    """What differs between two tokenizers (vocabulary, special tokens, chat template); None: nothing."""
    ours, theirs = policy.get_vocab(), teacher.get_vocab()
    if ours != theirs:
        changed = sum(theirs.get(token) != index for token, index in ours.items())
        return f"vocabularies of {len(ours)} and {len(theirs)} tokens, {changed} of the policy's differ"
    if policy.all_special_tokens != teacher.all_special_tokens:
        return f"special tokens {policy.all_special_tokens} and {teacher.all_special_tokens}"
    if (policy.chat_template or "") != (teacher.chat_template or ""):
        return "different chat templates"
    return None


class ServedModels:
    """The run's served models by name: `await ServedModels.start(specs, seed)`, `clients`, `shutdown()`."""

    def __init__(self) -> None:
        self.clients: dict[str, BesideClient] = {}
        self._served: dict[str, _Served] = {}

    @classmethod
    async def start(cls, specs: Mapping[str, ServedModel], seed: int) -> ServedModels:
        """Start every served model's engines (all at once) and their supervisors; on a failure, what started is
        stopped and the failure raised."""
        served = cls()
        try:
            await asyncio.gather(*(served._start(name, spec, seed) for name, spec in specs.items()))
        except BaseException:
            await served.shutdown()
            raise
        return served

    async def _start(self, name: str, spec: ServedModel, seed: int) -> None:
        path = str(resolve_model(spec.path, setting=f"beside.{name}.path"))
        config = served_engine_config(name, spec, path, seed)
        engines = await launch_vllm_engines(config, spec.engines)
        sync = WeightSync(list(engines), version=0, restart_on_failure=True)
        supervisor = asyncio.create_task(sync.supervise(RESTART_RETRY_S), name=f"beside-{name}-supervisor")
        self._served[name] = _Served(engines, sync, supervisor)
        client_config = ClientConfig(model_name=name, max_model_len=spec.max_model_len,
                                     restart_wait_s=spec.start_timeout_s + RESTART_GRACE_S)
        service = RolloutService(engines, load_tokenizer(path), client_config)
        self.clients[name] = BesideClient(name, spec, ServedBackend(name, service, sync))
        log.info("model %r beside the policy (%s) served from %s on %d engine(s)", name, spec.role, path,
                 len(engines))

    def check(self, name: str) -> Callable[[], None]:
        """What raises once the served model `name`'s engines cannot be restarted (its supervisor gave up)."""
        return self._served[name].sync.check_engines

    def engines(self, name: str) -> list[RayEngine]:
        return self._served[name].engines

    def restarts(self, name: str) -> int:
        return self._served[name].sync.restarts

    async def shutdown(self) -> None:
        """Stop the supervisors and the engines; an engine that fails to stop is logged, the others still stop."""
        for served in self._served.values():
            served.supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await served.supervisor
        stopping = [engine.shutdown() for served in self._served.values() for engine in served.engines]
        for outcome in await asyncio.gather(*stopping, return_exceptions=True):
            if isinstance(outcome, Exception):
                log.warning("shutdown of a model beside the policy: %r", outcome)
        self._served.clear()
