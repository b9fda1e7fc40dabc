"""`RolloutClient`: an `openai.AsyncOpenAI` look-alike that is token-in/token-out underneath.

Owns: request validation (through `request_schema`, plus the limits that depend on tokens and
engines: context length, vocabulary, `top_logprobs`), prompt ids (template applied here, earlier turns reused exactly),
generation through the engine router with resumption across weight pushes, `openai` response
objects, and recording every call into the episode that made it.
Does not own: engines, routing, or what the episode's trajectory is used for.

`RolloutService` holds what all episodes share (tokenizer, router, settings); it hands out one
`RolloutClient` per episode. A call that fails records nothing. A caller that learns only later whether the
harness received a response (the gateway: a harness may disconnect) holds what a call records
(`RolloutClient.hold()`) and commits it once it was delivered; an undelivered call never enters the trajectory.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import math
import re
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from fullasync.client import chat_answers
from fullasync.client.answers import Answer, AnswerFormat
from fullasync.client.beside import BesideClient
from fullasync.client.chat_tokens import ChatTokenizer, TurnState, model_vocab_size
from fullasync.client.continuation import (
    ResumableCall,
    StitchedGeneration,
    generate_with_resume,
    stream_with_resume,
)
from fullasync.client.dialects.anthropic_messages import MessagesEndpoint
from fullasync.client.dialects.openai_responses import ResponsesEndpoint
from fullasync.client.dialects.token_in import TokensEndpoint
from fullasync.client.dialects.turns import Handles
from fullasync.client.episode import Episode, HeldCalls
from fullasync.client.messages import echoes_turn, normalize_messages, normalize_tools, same_assistant_turn
from fullasync.client.reasoning import ReasoningSplitter
from fullasync.client.request_schema import (
    Parsed,
    SamplingRequest,
    Schema,
    parse_chat,
    structured_output,
)
from fullasync.client.streaming import TokenStream, chat_stream
from fullasync.client.text_completions import TextCompletions
from fullasync.client.tool_parsers import constrained_choice, make_tool_parser, tool_choice_schema
from fullasync.client.wire_types import JSON, ChatMessage, ConstrainedChoice, Tool, json_schema
from fullasync.config import EngineSection, ModelSection, RolloutSection
from fullasync.contracts.engine import Engine, SamplingOptions, StructuredSpec
from fullasync.contracts.tokenizer import Tokenizer
from fullasync.engines.router import EngineRouter
from fullasync.errors import CONTEXT_LENGTH_EXCEEDED, FailureKind, InvalidRequestError, PolicyOutputError
from fullasync.types import ModelCall, Trajectory

log = logging.getLogger("fullasync")


@dataclass(frozen=True)
class ClientConfig:
    """Settings shared by every episode's client.

    A run makes it from its sections (`fullasync.launch.parts.client_config`); the settings a run has take their
    defaults from there (help: `fullasync.config.run`, docs/config.md), so a client made on its own fits engines made
    on their own (`VLLMEngineConfig`) in context length and `top_logprobs`."""

    model_name: str = ModelSection.served_name  # the name callers pass as `model`
    max_model_len: int = EngineSection.max_model_len  # the engines' context length (prompt + output)
    resume_timeout_s: float = RolloutSection.resume_timeout_s
    stream_interval: int = RolloutSection.stream_interval  # streamed calls: new tokens per chunk after the first
    max_answer_tokens: int = RolloutSection.max_answer_tokens  # every answer's cap; 0 = max_tokens and the context
    tool_parser: str = ModelSection.tool_parser
    reasoning_parser: str = ModelSection.reasoning_parser  # "" = none: thinking text stays in `content`
    max_top_logprobs: int = EngineSection.max_logprobs  # the engines' max_logprobs
    restart_wait_s: float = 0.0  # a call whose engines all died waits this long for one to be restarted
    kv_routing: bool = RolloutSection.kv_routing  # EngineRouter(kv_aware=...)
    # token ids the engines can sample: the model's embedding rows, which a padded embedding puts beyond
    # the tokenizer's last id; 0 = read config.json next to the tokenizer (else the tokenizer's length)
    vocab_size: int = 0


@dataclass
class CallRequest:
    """A validated call, ready to generate (`RolloutClient.prepare`)."""

    prompt_ids: list[int]
    max_tokens: int
    n: int
    sampling: SamplingOptions
    with_logprobs: bool
    token_ids: bool
    tokens_as_ids: bool = False  # log-prob entries name tokens `token_id:N` (vLLM's return_tokens_as_token_ids)


class RolloutService:
    """What all episodes share: the tokenizer, the engine router and the client settings."""

    def __init__(self, engines: Sequence[Engine], tokenizer: Tokenizer, config: ClientConfig = ClientConfig(),
                 beside: Mapping[str, BesideClient] | None = None) -> None:
        """`beside`: the clients of the models a harness or reward calls beside the policy (a judge), by name;
        never recorded."""
        self.beside = dict(beside or {})
        self.router = EngineRouter(engines, kv_aware=config.kv_routing)
        self.chat_tokens = ChatTokenizer(tokenizer)
        self.config = config
        self.tool_parser = make_tool_parser(config.tool_parser, tokenizer)
        self.reasoning = ReasoningSplitter(config.reasoning_parser, tokenizer) if config.reasoning_parser else None
        # an id the engine sampled is one it accepts back (padded embeddings sample beyond the tokenizer)
        model_rows = config.vocab_size or model_vocab_size(getattr(tokenizer, "name_or_path", "") or None)
        self.vocab_size = max(model_rows, len(tokenizer))
        # call ids: unique per service (and across services: a random prefix), cheaper than a uuid per call
        self.call_ids = map(f"{uuid.uuid4().hex[:8]}-{{}}".format, itertools.count())
        self._warned: set[str] = set()  # fields accepted but ignored, warned about once

    def accept(self, parsed: Parsed[Schema]) -> Schema:
        """The validated request, once its model is checked; warns once per ignored field."""
        self.accept_model(parsed.request.model)
        self.note_ignored(parsed.ignored)
        return parsed.request

    def accept_model(self, model: object) -> None:
        if model != self.config.model_name:
            raise InvalidRequestError(f"unknown model {model!r}; this client serves {self.config.model_name!r}",
                                      param="model")

    def note_ignored(self, names: Sequence[str]) -> None:
        """Warn once per request field accepted and ignored (the modules that read requests list them)."""
        for name in set(names) - self._warned:
            self._warned.add(name)
            log.warning("request field %r is accepted and ignored (see fullasync.client.request_schema and "
                        "fullasync.client.dialects)", name)

    def client(self, episode_id: str | None = None) -> RolloutClient:
        return RolloutClient(self, episode_id or uuid.uuid4().hex)

    def beside_metrics(self) -> dict[str, float]:
        """Each beside model's calls, failures, retries and mean latency, for the step's metrics."""
        return {key: value for model in self.beside.values() for key, value in model.metrics().items()}

    def answer_format(self, messages: list[ChatMessage], tools: list[Tool] | None,
                      constrained: ConstrainedChoice | None = None, template_kwargs: JSON | None = None
                      ) -> AnswerFormat:
        """How a chat call's output reads: its tools' parser, reasoning split off if the run has a parser for it
        and the prompt did not close the thinking section already."""
        kwargs = dict(template_kwargs or {})
        thinks = self.reasoning is not None and self.reasoning.thinks(
            self.chat_tokens.generation_prompt(messages, tools, kwargs))
        return AnswerFormat(self.chat_tokens, self.tool_parser if tools else None, tuple(tools or ()),
                            self.reasoning, thinks, constrained, kwargs)


_HELD: contextvars.ContextVar[HeldCalls | None] = contextvars.ContextVar("fullasync_held_calls", default=None)


class RolloutClient:
    """One episode's client: `client.chat.completions.create(...)`, `client.completions.create(...)`."""

    def __init__(self, service: RolloutService, episode_id: str) -> None:
        self.service = service
        self.episode = Episode(episode_id)
        self.handles = Handles()  # the reasoning of turns answered in the Responses and Anthropic dialects

    # Made per access rather than stored: a stored `_Chat(self)` would make every client a reference cycle,
    # so a finished episode (its calls, every token tuple) would wait for the cyclic collector to be freed.
    @property
    def chat(self) -> _Chat:
        return _Chat(self)

    @property
    def beside(self) -> Mapping[str, BesideClient]:
        """The run's models beside the policy by name (OpenAI-style, never recorded into this episode)."""
        return self.service.beside

    @property
    def judge(self) -> BesideClient:
        """The run's model whose role is judge: `await client.judge.chat.completions.create(messages=[...])`."""
        judges = [model for model in self.service.beside.values() if model.spec.role == "judge"]
        if len(judges) != 1:
            raise LookupError(f"client.judge needs exactly one model of role judge beside the policy, the run has "
                              f"{len(judges)}: pass AsyncAgentTrainer(beside={{'judge': RemoteModel(...)}}) (an "
                              "endpoint) or ServedModel(path) (served by the run), or use client.beside[name]")
        return judges[0]

    @property
    def completions(self) -> TextCompletions:
        return TextCompletions(self)

    @property
    def responses(self) -> ResponsesEndpoint:
        """The OpenAI Responses API over the chat path (`fullasync.client.dialects.openai_responses`)."""
        return ResponsesEndpoint(self)

    @property
    def messages(self) -> MessagesEndpoint:
        """Anthropic Messages over the chat path (`fullasync.client.dialects.anthropic_messages`)."""
        return MessagesEndpoint(self)

    @property
    def tokens(self) -> TokensEndpoint:
        """vLLM's token-in calls: `generate`, `tokenize`, `detokenize` (`fullasync.client.dialects.token_in`)."""
        return TokensEndpoint(self)

    def trajectory(self, reward: float, metadata: Mapping[str, object] | None = None) -> Trajectory:
        """The episode's recorded calls (`Episode.settled_calls`) as a `Trajectory` with `reward`."""
        return Trajectory(calls=tuple(self.episode.settled_calls()), reward=float(reward),
                          metadata=dict(metadata or {}))

    def log(self, name: str, value: float) -> None:
        """Record one observation of the harness's own metric `name` (turns, tool errors, an exit status as 0/1, …).

        The run aggregates every observation of a train step's episodes under `harness/<name>/{mean,min,max,count}`,
        beside the numeric fields of each `Trajectory.metadata` (`fullasync.observe.metrics.harness_stats`)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"client.log: the metric name must be a non-empty string, got {name!r}")
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"client.log({name!r}, {value!r}): the value must be a finite number (a bool counts "
                             "as 0 or 1)")
        self.episode.logged.append((name.strip(), float(value)))

    @contextlib.contextmanager
    def hold(self) -> Iterator[HeldCalls]:
        """Calls made inside (in this task and the tasks it starts) record into the `HeldCalls` yielded, not the
        episode, until its `commit()`: for callers that learn only after the call whether the harness got it."""
        held = HeldCalls(self.episode)
        token = _HELD.set(held)
        try:
            yield held
        finally:
            _HELD.reset(token)

    @contextlib.contextmanager
    def noting_faults(self) -> Iterator[None]:
        """A call that fails because of the policy (its own turn echoed back malformed, a conversation past the
        context) marks the episode's `fault`, so the harness's failure that follows is the policy's."""
        try:
            yield
        except PolicyOutputError:
            self.episode.fault = FailureKind.MODEL
            raise
        except InvalidRequestError as error:
            if error.code == CONTEXT_LENGTH_EXCEEDED:
                self.episode.fault = FailureKind.LENGTH
            raise

    def blame(self, messages: object, error: InvalidRequestError) -> InvalidRequestError:
        """`error` as a `PolicyOutputError` when the malformed message is an assistant turn this episode's client
        returned (the policy wrote it; the harness only sent it back), else `error` itself."""
        where = re.match(r"messages\[(\d+)\]", str(error))
        if where is None or not isinstance(messages, Sequence) or int(where.group(1)) >= len(messages):
            return error
        sent = messages[int(where.group(1))]
        if not isinstance(sent, Mapping) or sent.get("role") != "assistant":
            return error
        if not any(echoes_turn(sent, returned) for returned in self.episode.returned):
            return error
        return PolicyOutputError(f"{error} (this assistant turn is the policy's own output, sent back by the "
                                 "harness: trained as the policy's failure)", param=error.param, code=error.code)

    def _held(self) -> HeldCalls | None:
        held = _HELD.get()
        return held if held is not None and held.episode is self.episode else None

    def remember(self, turns: list[TurnState] | None = None,
                  last_completion: tuple[str, tuple[int, ...]] | None = None) -> None:
        """What a later call may extend (the chat turns, the completion text); held while the call is."""
        target: HeldCalls | Episode = self._held() or self.episode
        if turns is not None:
            self.episode.returned += [turn.messages[-1] for turn in turns]  # the message only, not its token ids
            target.turns = turns
        if last_completion is not None:
            target.last_completion = last_completion

    def close(self) -> None:
        """Forget the episode's engine binding (its recorded calls stay readable)."""
        self.service.router.release(self.episode.id)

    # -- the steps every dialect's call takes: prepare (check, build), sample (or sample_stream), record --------

    def prepare(self, prompt_ids: list[int], request: SamplingRequest, *, max_tokens: int | None,
                 num_top_logprobs: int, with_logprobs: bool, prompt_field: str,
                 structured: tuple[str, StructuredSpec] | None = None) -> CallRequest:
        """Check the limits that depend on tokens and engines, then build the engine-side request."""
        self.episode.went_on(prompt_ids)
        config = self.service.config
        context, length = config.max_model_len, len(prompt_ids)
        cap = config.max_answer_tokens or context
        if max_tokens is not None:
            max_tokens = min(max_tokens, cap)  # lowered before the context is checked
        if length >= context or max_tokens is not None and length + max_tokens > context:
            asked = (f"your {prompt_field} resulted in {length} tokens" if max_tokens is None else
                     f"you requested {length + max_tokens} tokens ({length} in the {prompt_field}, {max_tokens} in "
                     "the completion)")
            raise InvalidRequestError(
                f"This model's maximum context length is {context} tokens. However, {asked}. Please reduce the "
                f"length of the {prompt_field}{'' if max_tokens is None else ' or completion'}.",
                param=prompt_field, code=CONTEXT_LENGTH_EXCEEDED,
            )
        if max(prompt_ids) >= self.service.vocab_size:
            raise InvalidRequestError(f"token id {max(prompt_ids)} is outside the vocabulary (ids must be in "
                                      f"[0, {self.service.vocab_size}))", param=prompt_field)
        if request.stop_token_ids and max(request.stop_token_ids) >= self.service.vocab_size:
            raise InvalidRequestError(f"stop token id {max(request.stop_token_ids)} is outside the vocabulary (ids "
                                      f"must be in [0, {self.service.vocab_size}))", param="stop_token_ids")
        if num_top_logprobs > config.max_top_logprobs:
            raise InvalidRequestError(f"at most {config.max_top_logprobs} top log-probs per token can be returned, "
                                      f"got {num_top_logprobs}", param="top_logprobs")
        sampling = SamplingOptions(
            temperature=1.0 if request.temperature is None else request.temperature,
            top_p=1.0 if request.top_p is None else request.top_p,
            top_k=request.top_k or 0,
            min_p=request.min_p or 0.0,
            stop=(request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ()),
            stop_token_ids=tuple(request.stop_token_ids or ()),
            ignore_eos=bool(request.ignore_eos),
            seed=request.seed,
            num_top_logprobs=num_top_logprobs,
            structured=structured or structured_output(request),
        )
        return CallRequest(
            prompt_ids=prompt_ids,
            max_tokens=max_tokens or min(context - length, cap),
            n=request.n,
            sampling=sampling,
            with_logprobs=with_logprobs,
            token_ids=bool(request.return_token_ids),
            tokens_as_ids=bool(request.return_tokens_as_token_ids),
        )

    async def sample(self, request: CallRequest) -> list[StitchedGeneration]:
        service = self.service
        call_id = next(service.call_ids)  # request ids carry the episode's id, so a counter makes them unique
        generations = (
            generate_with_resume(self._resumable(request, f"{self.episode.id}-{call_id}-{i}"))
            for i in range(request.n)
        )
        if request.n == 1:  # the common case: awaited in this task, without a task and a gather of one
            return [await next(generations)]
        return list(await asyncio.gather(*generations))

    def record(self, prompt_ids: list[int], generation: StitchedGeneration) -> None:
        versions, weight_versions = tuple(generation.output_versions), tuple(generation.output_weight_versions)
        held = self._held()
        self.episode.fault = None
        (held.calls if held is not None else self.episode.calls).append(
            ModelCall(
                prompt_ids=tuple(prompt_ids),
                output_ids=tuple(generation.output_ids),
                output_logprobs=tuple(generation.output_logprobs),
                output_versions=versions,
                finish_reason=generation.finish_reason,
                num_resumes=generation.num_resumes,
                resubmitted_tokens=generation.resubmitted_tokens, starved_resumes=generation.starved_resumes,
                engine=generation.engine,
                output_weight_versions=weight_versions if weight_versions != versions else (),
            )
        )

    def _turn(self, messages: list[ChatMessage], answers: AnswerFormat, prompt_ids: list[int],
              generation: StitchedGeneration, answer: Answer) -> TurnState:
        eos = self.service.chat_tokens.eos_token_id
        return TurnState(
            messages=tuple(messages) + (chat_answers.message_dict(answer.content, answer.calls, answer.reasoning),),
            tools=tuple(answers.tools) or None,
            token_ids=tuple(prompt_ids) + tuple(generation.output_ids),
            ended_with_eos=bool(generation.output_ids) and generation.output_ids[-1] == eos,
            template_kwargs=tuple(sorted(answers.template_kwargs.items())),
        )

    def _resumable(self, request: CallRequest, request_id: str) -> ResumableCall:
        config = self.service.config
        return ResumableCall(self.service.router, self.episode.id, request_id, request.prompt_ids, request.max_tokens,
                             request.sampling, config.resume_timeout_s, config.restart_wait_s,
                             on_versions=self.episode.note_versions, infra=self.episode.infra_hooks(),
                             priority=self.episode.priority)

    def sample_stream(self, request: CallRequest) -> TokenStream:
        call = self._resumable(request, f"{self.episode.id}-{next(self.service.call_ids)}")
        return stream_with_resume(call, interval=self.service.config.stream_interval)

    def _chat_stream(self, request: CallRequest, messages: list[ChatMessage], answers: AnswerFormat,
                     model: str, with_logprobs: bool, include_usage: bool) -> AsyncIterator[ChatCompletionChunk]:
        def on_done(generation: StitchedGeneration, answer: Answer) -> None:
            self.record(request.prompt_ids, generation)
            self.remember(turns=[self._turn(messages, answers, request.prompt_ids, generation, answer)])

        return chat_stream(
            self.sample_stream(request), answers=answers, model=model, prompt_ids=request.prompt_ids,
            stop=request.sampling.stop, with_logprobs=with_logprobs, token_ids=request.token_ids,
            tokens_as_ids=request.tokens_as_ids, include_usage=include_usage, on_done=on_done,
        )

    def _chat_prompt_ids(self, messages: list[ChatMessage], tools: list[Tool] | None,
                         template_kwargs: JSON) -> list[int]:
        chat_tokens = self.service.chat_tokens
        tool_key = tuple(tools) if tools else None
        kwargs_key = tuple(sorted(template_kwargs.items()))
        for turn in reversed(self.episode.turns):
            k = len(turn.messages)
            if turn.tools != tool_key or turn.template_kwargs != kwargs_key:
                continue
            if len(messages) <= k or messages[: k - 1] != list(turn.messages[: k - 1]):
                continue
            if not same_assistant_turn(messages[k - 1], turn.messages[-1]):
                continue
            glue = chat_tokens.continuation_ids(turn, messages[k:])
            if glue is not None:
                return list(turn.token_ids) + glue
        return chat_tokens.prompt_ids(messages, tools, template_kwargs)


class _ChatCompletions:
    def __init__(self, client: RolloutClient) -> None:
        self._client = client

    async def create(self, **fields: object) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        """`openai.AsyncOpenAI().chat.completions.create`: the fields and their allowed values are
        `request_schema.ChatRequest`'s; vLLM extras may come at the top level or in `extra_body`.

        A malformed assistant turn that this episode's policy wrote (echoed back by the harness) raises
        `PolicyOutputError`: the policy's mistake, trained as such, not the harness's."""
        with self._client.noting_faults():
            return await self._create(fields)

    async def _create(self, fields: JSON) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        client, service = self._client, self._client.service
        asked = service.accept(parse_chat(fields))
        try:
            normalized = normalize_messages(asked.messages)
        except InvalidRequestError as error:
            raise client.blame(asked.messages, error) from None
        tool_list = normalize_tools(asked.tools) if asked.tool_choice != "none" else None
        constrained = constrained_choice(asked.tool_choice, tool_list)
        kwargs = dict(asked.chat_template_kwargs or {})
        answers = service.answer_format(normalized, tool_list, constrained, kwargs)
        logprobs, model = bool(asked.logprobs), asked.model
        calls_only = None if constrained is None else (  # the output is the calls' JSON, with no free whitespace
            "compact_json",
            json_schema(tool_choice_schema(constrained, tool_list or (), asked.parallel_tool_calls is not False)))
        request = client.prepare(
            client._chat_prompt_ids(normalized, tool_list, kwargs), asked,
            max_tokens=asked.max_completion_tokens if asked.max_completion_tokens is not None else asked.max_tokens,
            num_top_logprobs=(asked.top_logprobs or 0) if logprobs else 0, with_logprobs=logprobs,
            prompt_field="messages",
            structured=calls_only,
        )
        if asked.stream:
            include_usage = bool(asked.stream_options and asked.stream_options.include_usage)
            return client._chat_stream(request, normalized, answers, model, logprobs, include_usage)
        generations = await client.sample(request)
        choices, turns = [], []
        for index, generation in enumerate(generations):
            answer = answers.answer(answers.visible_text(generation))
            logprob_obj = (chat_answers.chat_logprobs(service.chat_tokens, generation, request.tokens_as_ids)
                           if logprobs else None)
            choices.append(
                chat_answers.chat_choice(index, answer.content, chat_answers.tool_call_objects(answer.calls),
                                         generation, logprob_obj, request.token_ids, answer.reasoning)
            )
            turns.append(client._turn(normalized, answers, request.prompt_ids, generation, answer))
        response = chat_answers.chat_completion(model, request.prompt_ids, choices, generations, request.token_ids)
        for generation in generations:
            client.record(request.prompt_ids, generation)
        client.remember(turns=turns)
        return response


class _Chat:
    def __init__(self, client: RolloutClient) -> None:
        self.completions = _ChatCompletions(client)
