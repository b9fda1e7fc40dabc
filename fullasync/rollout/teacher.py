"""On-policy distillation's teacher: every trained sequence of a finished group scored by a frozen model.

Owns: `TeacherScorer` — each trajectory's training sequences (one per lineage, `Trajectory.to_sequences`) sent whole
to the teacher's engines as one prompt-scoring request each (`SamplingOptions.score_prompt`: the log-prob of every
token given the ones before, one forward pass, nothing sampled), the answers put back on the calls they came from
(`ModelCall.teacher_logprobs`, aligned with each call's output), each sequence scored once: a trajectory that carries
a teacher's log-probs already is refused. Scoring runs as a row's group is complete, before it is queued, while other
rows generate: never on the policy's engines. At most `max_concurrency` requests are at the teacher at once; a group
waiting for a place keeps its row's admission slot, so the teacher's lag holds generation back within the staleness
bound, never past it. An engine of the teacher that dies is waited for (its supervisor restarts it) and the request
sent again: a failure is the infrastructure's and is scored again, never a wrong signal; a teacher whose engines
cannot be restarted raises `TeacherError`, which stops the run. Its counts for each step's metrics (`teacher/...`).
A teacher behind an endpoint (`EndpointTeacher`: vLLM's OpenAI server, `/v1/completions` with `prompt_logprobs`)
takes an engine's place; `check_endpoint_teacher` refuses one whose tokenizer or context cannot score the policy's
sequences, before the run starts.
Does not own: serving the teacher (`fullasync.launch.beside`), the loss (`fullasync.trainer.batch.Distillation`),
the teacher KL of the trained tokens (`fullasync.observe.metrics`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import httpx
import openai

from fullasync.client.beside import TRANSIENT_STATUS
from fullasync.contracts.engine import GenerateRequest, GenerateResult, SamplingOptions
from fullasync.errors import EngineDiedError, EngineResumeTimeoutError, InfraError
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

SCORING = SamplingOptions(score_prompt=True, temperature=1.0)  # one token generated, thrown away


class TeacherError(InfraError):
    """The teacher could not score a sequence after its engines were restarted and its retries spent."""


class TeacherUnavailable(InfraError):
    """A teacher's endpoint did not answer a scoring request (refused, timed out, 429, 5xx): it is sent again."""


class ScoringEngine(Protocol):
    """What the scorer needs of a teacher's engine: a policy-style `Engine` (`RayEngine`) or an `EndpointTeacher`."""

    @property
    def name(self) -> str: ...

    @property
    def death(self) -> EngineDiedError | None: ...

    async def wait_serving(self) -> None: ...

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...


class EndpointTeacher:
    """A teacher behind an OpenAI-compatible endpoint that returns prompt log-probs (vLLM's OpenAI server): each
    scoring request is one `/completions` call of one token, the token ids as its prompt, `prompt_logprobs=0`."""

    death: EngineDiedError | None = None  # an endpoint is never declared dead: its failures are retried

    def __init__(self, name: str, base_url: str, model: str, api_key: str = "", timeout_s: float = 120.0) -> None:
        self.name, self.base_url, self.model = name, base_url, model
        self._sdk = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "none", max_retries=0, timeout=timeout_s)

    async def wait_serving(self) -> None:
        return None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        try:
            answer = await self._sdk.completions.create(model=self.model, prompt=list(request.prompt_ids), max_tokens=1,
                                                        temperature=1.0, extra_body={"prompt_logprobs": 0})
        except (openai.APIConnectionError, openai.APITimeoutError) as error:
            raise TeacherUnavailable(f"teacher {self.name!r} at {self.base_url}: {error!r}") from error
        except openai.APIStatusError as error:
            if error.status_code in TRANSIENT_STATUS:
                raise TeacherUnavailable(f"teacher {self.name!r} at {self.base_url}: {error!r}") from error
            raise TeacherError(f"teacher {self.name!r} at {self.base_url} refused a scoring request "
                               f"({error.status_code}): {error.message}") from error
        entries = getattr(answer.choices[0], "prompt_logprobs", None) if answer.choices else None
        if not isinstance(entries, list) or len(entries) != len(request.prompt_ids):
            raise TeacherError(f"teacher {self.name!r} at {self.base_url} answered without the prompt's log-probs: a "
                               "teacher endpoint must return `prompt_logprobs` (vLLM's OpenAI server does)")
        try:
            scored = tuple(float(entry[str(token)]["logprob"])
                           for token, entry in zip(request.prompt_ids[1:], entries[1:], strict=True))
        except (KeyError, TypeError, ValueError) as error:
            raise TeacherError(f"teacher {self.name!r} at {self.base_url}: its prompt log-probs do not hold the "
                               f"prompt's tokens ({error!r})") from error
        return GenerateResult(request.request_id, (), (), (), FinishReason.LENGTH, prompt_logprobs=scored)

    async def close(self) -> None:
        await self._sdk.close()


@dataclass
class TeacherStats:
    sequences: int = 0  # scored, each once
    tokens: int = 0  # in the scored sequences (the teacher's prefill)
    groups: int = 0
    retries: int = 0  # requests sent again after an engine of the teacher died under them
    busy_s: float = 0.0  # wall time with at least one request at the teacher
    lag_s: float = 0.0  # summed over groups: from the group's last episode to its scores
    waiting: int = 0  # groups being scored now


class TeacherScorer:
    """`await scorer.score_group(group)`: the group with every trained call's teacher log-probs."""

    def __init__(self, name: str, engines: Sequence[ScoringEngine], *, check: Callable[[], None] = lambda: None,
                 max_concurrency: int = 8, retries: int = 3, backoff_s: float = 0.5,
                 restart_wait_s: float = 600.0) -> None:
        """`check()`: raises once the teacher's engines cannot be restarted (its supervisor gave up)."""
        if not engines:
            raise ValueError(f"teacher {name!r} has no engines")
        self.name = name
        self.engines = list(engines)
        self.check = check
        self.retries = retries
        self.backoff_s = backoff_s
        self.restart_wait_s = restart_wait_s
        self.stats = TeacherStats()
        self._places = asyncio.Semaphore(max_concurrency)
        self._load = {id(engine): 0 for engine in self.engines}
        self._ids = itertools.count()
        self._busy = 0
        self._busy_since = 0.0

    async def score_group(self, group: TrajectoryGroup) -> TrajectoryGroup:
        started = time.monotonic()
        self.stats.waiting += 1
        try:
            trajectories = await asyncio.gather(*(self.score_trajectory(t) for t in group.trajectories))
        finally:
            self.stats.waiting -= 1
        self.stats.groups += 1
        self.stats.lag_s += time.monotonic() - started
        return dataclasses.replace(group, trajectories=tuple(trajectories))

    async def score_trajectory(self, trajectory: Trajectory) -> Trajectory:
        """`trajectory` with each call's `teacher_logprobs`: its lineages' sequences scored at once."""
        if any(call.teacher_logprobs for call in trajectory.calls):
            raise ValueError("this trajectory carries a teacher's log-probs already: each sequence is scored once")
        lineages = [(lineage, sequence) for lineage, sequence in zip(trajectory.lineages(), trajectory.to_sequences(),
                                                                     strict=True)
                    if sequence.num_trained_tokens]
        scores = await asyncio.gather(*(self.score(sequence.token_ids) for _, sequence in lineages))
        calls = list(trajectory.calls)
        for (lineage, _), scored in zip(lineages, scores, strict=True):
            aligned = (0.0, *scored)  # the first token has no context to be scored in
            for index in lineage:
                calls[index] = _scored(calls[index], aligned)
        self.stats.sequences += len(lineages)
        return dataclasses.replace(trajectory, calls=tuple(calls))

    async def score(self, token_ids: Sequence[int]) -> tuple[float, ...]:
        """The teacher's log-prob of each token of `token_ids` after the first, given the ones before it."""
        async with self._places:
            for attempt in range(self.retries + 1):
                engine = await self._serving_engine()
                request = GenerateRequest(f"{self.name}-score-{next(self._ids)}", tuple(token_ids), 1, SCORING)
                self._start(engine)
                try:
                    result = await engine.generate(request)
                except (EngineDiedError, EngineResumeTimeoutError, TimeoutError, TeacherUnavailable) as error:
                    if attempt == self.retries:
                        raise TeacherError(f"teacher {self.name!r} did not score a sequence of {len(token_ids)} "
                                           f"tokens after {attempt + 1} tries: {error!r}") from error
                    self.stats.retries += 1
                    await asyncio.sleep(self.backoff_s * 2 ** attempt)
                    continue
                finally:
                    self._end(engine)
                scored = result.prompt_logprobs
                if len(scored) != len(token_ids) - 1 or not all(math.isfinite(lp) and lp <= 0 for lp in scored):
                    raise TeacherError(f"teacher {self.name!r} answered {len(scored)} log-probs for "
                                       f"{len(token_ids) - 1} tokens, or some not finite")
                self.stats.tokens += len(token_ids)
                return scored
        raise AssertionError("unreachable: the last try returns or raises")

    async def _serving_engine(self) -> ScoringEngine:
        """The teacher's engine with the fewest requests of ours that is not dead; while all are, the first to
        come back (within `restart_wait_s`)."""
        self._check()
        serving = [engine for engine in self.engines if engine.death is None]
        if serving:
            return min(serving, key=lambda engine: self._load[id(engine)])
        waits = {asyncio.ensure_future(engine.wait_serving()): engine for engine in self.engines}
        done, pending = await asyncio.wait(waits, timeout=self.restart_wait_s, return_when=asyncio.FIRST_COMPLETED)
        for wait in pending:
            wait.cancel()
        self._check()
        if not done:
            raise TeacherError(f"teacher {self.name!r}: no engine of it came back within {self.restart_wait_s:.0f} s")
        return waits[done.pop()]

    def _check(self) -> None:
        try:
            self.check()
        except Exception as failure:
            raise TeacherError(f"teacher {self.name!r}: its engines could not be restarted ({failure})") from failure

    def _start(self, engine: ScoringEngine) -> None:
        self._load[id(engine)] += 1
        if not self._busy:
            self._busy_since = time.monotonic()
        self._busy += 1

    def _end(self, engine: ScoringEngine) -> None:
        self._load[id(engine)] -= 1
        self._busy -= 1
        if not self._busy:
            self.stats.busy_s += time.monotonic() - self._busy_since

    def metrics(self) -> dict[str, float]:
        """The run so far: sequences and tokens scored, tokens/s while scoring, mean lag per group, retries."""
        stats = self.stats
        busy = stats.busy_s + (time.monotonic() - self._busy_since if self._busy else 0.0)
        return {"teacher/sequences": float(stats.sequences), "teacher/tokens": float(stats.tokens),
                "teacher/tokens_per_s": stats.tokens / busy if busy > 0 else 0.0,
                "teacher/lag_s": stats.lag_s / max(stats.groups, 1), "teacher/retries": float(stats.retries),
                "teacher/groups_waiting": float(stats.waiting)}


PROBE_MESSAGES = ({"role": "system", "content": "Answer with the number only."},
                  {"role": "user", "content": "12 + 30 = ? Then: naïve café, 漢字 🙂 {\"a\": [1, 2]}"})
PROBE_TEXT = "def f(x):\n\treturn x ** 2  # naïve café 漢字 🙂 {\"a\": [1, 2]}\n"


async def check_endpoint_teacher(teacher: EndpointTeacher, policy: PreTrainedTokenizerBase, max_model_len: int,
                                 api_key: str = "", timeout_s: float = 30.0) -> None:
    """Refuse, in one line, a teacher endpoint that cannot score the policy's sequences: one that does not tokenize
    (vLLM's `/tokenize`), tokenizes a probe text or a probe chat otherwise than the policy's tokenizer and chat
    template, or has a shorter context than `max_model_len` + 1 (the one token a scoring request generates)."""
    root = teacher.base_url.rstrip("/").removesuffix("/v1")
    where = f"beside.{teacher.name} ({root})"
    probes: list[tuple[str, dict[str, object], list[int]]] = [
        ("its vocabulary", {"prompt": PROBE_TEXT, "add_special_tokens": False},
         list(policy.encode(PROBE_TEXT, add_special_tokens=False)))]
    if policy.chat_template:
        chat = policy.apply_chat_template(list(PROBE_MESSAGES), add_generation_prompt=True, tokenize=True,
                                          return_dict=False)
        probes.append(("its chat template", {"messages": list(PROBE_MESSAGES), "add_generation_prompt": True},
                       list(cast("list[int]", chat))))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as http:
        for what, body, ours in probes:
            try:
                answer = await http.post(f"{root}/tokenize", json={"model": teacher.model, **body})
                answer.raise_for_status()
                told = answer.json()
            except (httpx.HTTPError, ValueError) as error:
                raise ValueError(f"{where}: /tokenize did not answer ({error!r}); a teacher endpoint must be a vLLM "
                                 "OpenAI server (it tokenizes, for the check that its tokenizer is the policy's)"
                                 ) from None
            if told.get("tokens") != ours:
                raise ValueError(f"{where}: its tokenizer is not the policy's ({what} gives other token ids on a "
                                 "probe); distillation scores the policy's own token ids")
            if int(told.get("max_model_len", 0)) < max_model_len + 1:
                raise ValueError(f"{where}: its context ({told.get('max_model_len')}) is shorter than "
                                 f"engine.max_model_len + 1 = {max_model_len + 1}: serve it with a longer one")


def _scored(call: ModelCall, aligned: Sequence[float]) -> ModelCall:
    """`call` with the teacher's log-probs of its output: the positions after its prompt in its lineage's sequence
    (`aligned`: one per token of the sequence)."""
    start = len(call.prompt_ids)
    return dataclasses.replace(call, teacher_logprobs=tuple(aligned[start : start + len(call.output_ids)]))
