"""`RolloutClient`: an `openai.AsyncOpenAI` look-alike that is token-in/token-out underneath.

Owns: request validation, prompt ids (template applied here, earlier turns reused exactly),
generation through the engine router with resumption across weight pushes, `openai` response
objects, and recording every call into the episode that made it.
Does not own: engines, routing, or what the episode's trajectory is used for.

`RolloutService` holds what all episodes share (tokenizer, router, settings); it hands out one
`RolloutClient` per episode. A call that fails records nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from fullasync.client import responses
from fullasync.client.chat_tokens import ChatTokenizer, TurnState
from fullasync.client.continuation import StitchedGeneration, generate_with_resume, stream_with_resume
from fullasync.client.streaming import chat_stream, completion_stream
from fullasync.client.messages import normalize_messages, normalize_tools, same_assistant_turn
from fullasync.client.tool_parsers import make_tool_parser
from fullasync.engines.protocol import Engine, SamplingOptions
from fullasync.engines.router import EngineRouter
from fullasync.errors import InvalidRequestError
from fullasync.types import FinishReason, ModelCall, Trajectory

ACCEPTED_AND_IGNORED = frozenset({"user", "metadata", "parallel_tool_calls", "timeout", "extra_headers", "store"})
EXTRA_BODY_KEYS = frozenset({"return_token_ids", "ignore_eos", "top_k", "structured_outputs"})


@dataclass(frozen=True)
class ClientConfig:
    """Settings shared by every episode's client."""

    model_name: str = "policy"  # the name callers pass as `model`
    max_model_len: int = 2048  # the engines' context length (prompt + output)
    resume_timeout_s: float = 300.0  # how long an interrupted generation waits for the engines to resume
    tool_parser: str = "hermes"  # format of tool calls in the output; see fullasync.client.tool_parsers


@dataclass
class _Request:
    """A validated call, ready to generate."""

    prompt_ids: list[int]
    max_tokens: int
    n: int
    sampling: SamplingOptions
    with_logprobs: bool
    token_ids: bool


class RolloutService:
    """What all episodes share: the tokenizer, the engine router and the client settings."""

    def __init__(self, engines: Sequence[Engine], tokenizer: Any, config: ClientConfig = ClientConfig()) -> None:
        self.router = EngineRouter(engines)
        self.chat_tokens = ChatTokenizer(tokenizer)
        self.config = config
        self.tool_parser = make_tool_parser(config.tool_parser)

    def client(self, episode_id: str | None = None) -> RolloutClient:
        return RolloutClient(self, episode_id or uuid.uuid4().hex)


class Episode:
    """The calls one episode made, and the turns a later chat call may extend."""

    def __init__(self, episode_id: str) -> None:
        self.id = episode_id
        self.calls: list[ModelCall] = []
        self.turns: list[TurnState] = []
        self.last_completion: tuple[str, tuple[int, ...]] | None = None  # (prompt + output text, their ids)


class RolloutClient:
    """One episode's client: `client.chat.completions.create(...)`, `client.completions.create(...)`."""

    def __init__(self, service: RolloutService, episode_id: str) -> None:
        self.service = service
        self.episode = Episode(episode_id)
        self.chat = _Chat(self)
        self.completions = _Completions(self)

    def trajectory(self, reward: float, metadata: Mapping[str, Any] | None = None) -> Trajectory:
        """The episode's recorded calls as a `Trajectory` with `reward`."""
        return Trajectory(calls=tuple(self.episode.calls), reward=float(reward), metadata=dict(metadata or {}))

    def close(self) -> None:
        """Forget the episode's engine binding (its recorded calls stay readable)."""
        self.service.router.release(self.episode.id)

    # -- shared steps -------------------------------------------------------------------------

    def _check_common(self, model: str, params: Mapping[str, Any], extra_body: Mapping[str, Any] | None) -> None:
        if model != self.service.config.model_name:
            raise InvalidRequestError(
                f"unknown model {model!r}; this client serves {self.service.config.model_name!r}", param="model"
            )
        unsupported = sorted(set(params) - ACCEPTED_AND_IGNORED)
        if unsupported:
            raise InvalidRequestError(f"unsupported parameter(s) {unsupported}; remove them", param=unsupported[0])
        unknown = sorted(set(extra_body or {}) - EXTRA_BODY_KEYS)
        if unknown:
            raise InvalidRequestError(
                f"unsupported extra_body key(s) {unknown}; supported: {sorted(EXTRA_BODY_KEYS)}", param=unknown[0]
            )

    def _prepare(self, prompt_ids: list[int], *, max_tokens: int | None, n: int, temperature: float | None,
                 top_p: float | None, stop: Any, seed: int | None, num_top_logprobs: int, with_logprobs: bool,
                 extra_body: Mapping[str, Any] | None) -> _Request:
        extra = dict(extra_body or {})
        context = self.service.config.max_model_len
        if len(prompt_ids) >= context:
            raise InvalidRequestError(
                f"the prompt has {len(prompt_ids)} tokens but the context holds {context} (prompt + output); "
                "shorten the conversation or raise the engine's max_model_len",
                param="messages",
            )
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
            raise InvalidRequestError(f"max_tokens must be a positive integer, got {max_tokens!r}", param="max_tokens")
        if not isinstance(n, int) or n < 1:
            raise InvalidRequestError(f"n must be a positive integer, got {n!r}", param="n")
        if temperature is not None and temperature < 0:
            raise InvalidRequestError(f"temperature must be >= 0, got {temperature}", param="temperature")
        if top_p is not None and not 0 < top_p <= 1:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {top_p}", param="top_p")
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        if not all(isinstance(s, str) and s for s in stops):
            raise InvalidRequestError("stop must be a non-empty string or a list of them", param="stop")
        structured = extra.get("structured_outputs") or {}
        if set(structured) - {"regex"}:
            raise InvalidRequestError("structured_outputs supports only {'regex': ...}", param="structured_outputs")
        budget = context - len(prompt_ids)  # never ask for more than the context holds
        sampling = SamplingOptions(
            temperature=1.0 if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            top_k=int(extra.get("top_k", 0) or 0),
            stop=stops,
            ignore_eos=bool(extra.get("ignore_eos", False)),
            seed=seed,
            num_top_logprobs=num_top_logprobs,
            regex=structured.get("regex"),
        )
        return _Request(
            prompt_ids=prompt_ids,
            max_tokens=min(max_tokens or budget, budget),
            n=n,
            sampling=sampling,
            with_logprobs=with_logprobs,
            token_ids=bool(extra.get("return_token_ids", False)),
        )

    async def _generate(self, request: _Request) -> list[StitchedGeneration]:
        service = self.service
        call_id = uuid.uuid4().hex
        return list(
            await asyncio.gather(
                *(
                    generate_with_resume(
                        service.router, self.episode.id, f"{self.episode.id}-{call_id}-{i}", request.prompt_ids,
                        request.max_tokens, request.sampling, service.config.resume_timeout_s,
                    )
                    for i in range(request.n)
                )
            )
        )

    def _record(self, prompt_ids: list[int], generation: StitchedGeneration) -> None:
        self.episode.calls.append(
            ModelCall(
                prompt_ids=tuple(prompt_ids),
                output_ids=tuple(generation.output_ids),
                output_logprobs=tuple(generation.output_logprobs),
                output_versions=tuple(generation.output_versions),
                finish_reason=generation.finish_reason,
                num_resumes=generation.num_resumes,
                resubmitted_tokens=generation.resubmitted_tokens,
                engine=generation.engine,
            )
        )

    def _turn(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, prompt_ids: list[int],
              generation: StitchedGeneration, content: str | None, calls: list) -> TurnState:
        eos = self.service.chat_tokens.eos_token_id
        return TurnState(
            messages=tuple(messages) + (responses.message_dict(content, calls),),
            tools=tuple(tools) if tools else None,
            token_ids=tuple(prompt_ids) + tuple(generation.output_ids),
            ended_with_eos=bool(generation.output_ids) and generation.output_ids[-1] == eos,
        )

    def _stream(self, request: _Request) -> AsyncIterator[Any]:
        return stream_with_resume(
            self.service.router, self.episode.id, f"{self.episode.id}-{uuid.uuid4().hex}", request.prompt_ids,
            request.max_tokens, request.sampling, self.service.config.resume_timeout_s,
        )

    def _chat_stream(self, request: _Request, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                     model: str, with_logprobs: bool, stream_options: Mapping[str, Any] | None) -> AsyncIterator[Any]:
        def on_done(generation: StitchedGeneration, content: str | None, calls: list) -> None:
            self._record(request.prompt_ids, generation)
            self.episode.turns = [self._turn(messages, tools, request.prompt_ids, generation, content, calls)]

        return chat_stream(
            self._stream(request), chat_tokens=self.service.chat_tokens,
            parser=self.service.tool_parser if tools else None, model=model, prompt_ids=request.prompt_ids,
            stop=request.sampling.stop, with_logprobs=with_logprobs, token_ids=request.token_ids,
            include_usage=bool((stream_options or {}).get("include_usage")), on_done=on_done,
        )

    def _chat_prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        chat_tokens = self.service.chat_tokens
        tool_key = tuple(tools) if tools else None
        for turn in reversed(self.episode.turns):
            k = len(turn.messages)
            if turn.tools != tool_key or len(messages) <= k or messages[: k - 1] != list(turn.messages[: k - 1]):
                continue
            if not same_assistant_turn(messages[k - 1], turn.messages[-1]):
                continue
            glue = chat_tokens.continuation_ids(turn, messages[k:])
            if glue is not None:
                return list(turn.token_ids) + glue
        return chat_tokens.prompt_ids(messages, tools)


class _ChatCompletions:
    def __init__(self, client: RolloutClient) -> None:
        self._client = client

    async def create(
        self,
        *,
        messages: Any,
        model: str,
        tools: Any = None,
        tool_choice: Any = None,
        n: int = 1,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Any = None,
        logprobs: bool | None = None,
        top_logprobs: int | None = None,
        seed: int | None = None,
        stream: bool | None = None,
        stream_options: Mapping[str, Any] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> ChatCompletion | AsyncIterator[ChatCompletionChunk]:
        client, service = self._client, self._client.service
        client._check_common(model, params, extra_body)
        if stream and n != 1:
            raise InvalidRequestError("stream=True supports n=1 only", param="n")
        if tool_choice not in (None, "auto", "none"):
            raise InvalidRequestError("tool_choice supports 'auto' and 'none'", param="tool_choice")
        if max_tokens is not None and max_completion_tokens is not None and max_tokens != max_completion_tokens:
            raise InvalidRequestError("give max_tokens or max_completion_tokens, not both", "max_completion_tokens")
        normalized = normalize_messages(messages)
        tool_list = normalize_tools(tools) if tool_choice != "none" else None
        request = client._prepare(
            client._chat_prompt_ids(normalized, tool_list),
            max_tokens=max_completion_tokens if max_completion_tokens is not None else max_tokens,
            n=n, temperature=temperature, top_p=top_p, stop=stop, seed=seed,
            num_top_logprobs=int(top_logprobs or 0) if logprobs else 0, with_logprobs=bool(logprobs),
            extra_body=extra_body,
        )
        if stream:
            return client._chat_stream(request, normalized, tool_list, model, bool(logprobs), stream_options)
        generations = await client._generate(request)
        choices, turns = [], []
        for index, generation in enumerate(generations):
            text = responses.visible_text(service.chat_tokens, generation)
            content, calls = service.tool_parser.parse(text) if tool_list else (text, [])
            logprob_obj = responses.chat_logprobs(service.chat_tokens, generation) if logprobs else None
            choices.append(
                responses.chat_choice(
                    index, content, responses.tool_call_objects(calls), generation, logprob_obj, request.token_ids
                )
            )
            turns.append(client._turn(normalized, tool_list, request.prompt_ids, generation, content, calls))
        response = responses.chat_completion(model, request.prompt_ids, choices, generations, request.token_ids)
        for generation in generations:
            client._record(request.prompt_ids, generation)
        client.episode.turns = turns
        return response


class _Chat:
    def __init__(self, client: RolloutClient) -> None:
        self.completions = _ChatCompletions(client)


class _Completions:
    def __init__(self, client: RolloutClient) -> None:
        self._client = client

    def _prompt_ids(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if not isinstance(prompt, str) or not prompt:
            raise InvalidRequestError("prompt must be a non-empty string or a list of token ids", param="prompt")
        chat_tokens = self._client.service.chat_tokens
        last = self._client.episode.last_completion
        if last is not None and prompt.startswith(last[0]):
            rest = prompt[len(last[0]) :]
            return list(last[1]) + (chat_tokens.encode(rest) if rest else [])
        return chat_tokens.encode(prompt)

    async def create(
        self,
        *,
        model: str,
        prompt: Any,
        max_tokens: int | None = 16,
        n: int = 1,
        temperature: float | None = None,
        top_p: float | None = None,
        stop: Any = None,
        logprobs: int | None = None,
        seed: int | None = None,
        stream: bool | None = None,
        stream_options: Mapping[str, Any] | None = None,
        echo: bool | None = None,
        extra_body: Mapping[str, Any] | None = None,
        **params: Any,
    ) -> Completion | AsyncIterator[Completion]:
        client, service = self._client, self._client.service
        client._check_common(model, params, extra_body)
        if echo:
            raise InvalidRequestError("echo is not supported; the prompt ids are in prompt_token_ids", "echo")
        if stream and n != 1:
            raise InvalidRequestError("stream=True supports n=1 only", param="n")
        if logprobs is not None and (not isinstance(logprobs, int) or logprobs < 0):
            raise InvalidRequestError(f"logprobs must be an integer >= 0, got {logprobs!r}", param="logprobs")
        request = client._prepare(
            self._prompt_ids(prompt), max_tokens=max_tokens, n=n, temperature=temperature, top_p=top_p, stop=stop,
            seed=seed, num_top_logprobs=logprobs or 0, with_logprobs=logprobs is not None, extra_body=extra_body,
        )
        if stream:
            return completion_stream(
                client._stream(request), chat_tokens=service.chat_tokens, model=model, prompt_ids=request.prompt_ids,
                stop=request.sampling.stop, include_usage=bool((stream_options or {}).get("include_usage")),
                on_done=lambda generation: client._record(request.prompt_ids, generation),
            )
        generations = await client._generate(request)
        response = responses.completion(
            service.chat_tokens, model, request.prompt_ids, generations, request.with_logprobs, request.token_ids
        )
        for generation in generations:
            client._record(request.prompt_ids, generation)
        first = generations[0]
        raw_text = service.chat_tokens.tokenizer.decode(first.output_ids, skip_special_tokens=False)
        if isinstance(prompt, str) and first.finish_reason is FinishReason.LENGTH and raw_text == response.choices[0].text:
            # only an output whose text is exactly its ids can be extended by text later
            client.episode.last_completion = (prompt + raw_text, tuple(request.prompt_ids) + tuple(first.output_ids))
        return response
