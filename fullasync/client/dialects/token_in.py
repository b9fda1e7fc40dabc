"""vLLM's token-in dialect: `POST /inference/v1/generate`, `POST /tokenize`, `POST /detokenize`.

Clients that render prompts themselves call these: verifiers' renderer client and prime-rl's rollouts send token ids
and read sampled ids and log-probs back; verifiers' chat token client stitches turns with `/tokenize`.

Owns: `TokensEndpoint.generate(**fields)` (vLLM 0.32's `GenerateRequest`: `token_ids`, `sampling_params`,
`output_mode` "tokens" or "text", streamed or whole) over the client's one generation path, so a call is checked
(vocabulary, context length, `logprobs` maximum), resumed across weight pushes and recorded like every other; its
answer in vLLM's shape with each choice's `weight_versions` (spans of output tokens by the weight version that
sampled them); `tokenize` (a prompt, or messages through the run's chat template: the ids a chat call would
generate from) and `detokenize`.

The prompt ids the client sends are the sequence's prompt (not trained); the sampled ids are trained.
Ignored (accepted, warned once, no effect): `request_id` (named in the answer's id only), `cache_salt` (the engines
serve one run: there is no other tenant to hide a prefix from), `priority` (the run schedules by episode),
`token_offsets`, `reasoning_ended` and `reasoning_parser_kwargs` (the answer is ids, not parsed text), and in
`sampling_params` `flat_logprobs` and `extra_args` (a storage layout and engine plug-ins) and
`spaces_between_special_tokens` (text is the tokenizer's decode). Refused with a 400 naming the field: multimodal
input (`features`, `content_parts`), disaggregated serving (`kv_transfer_params`, `ec_transfer_params`),
`prompt_logprobs`, `min_tokens` above 0, `logprobs: -1` (the whole vocabulary), and, like the chat path, penalties.
Does not own: generation, recording, HTTP (the gateway routes these under each episode's base URL).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Literal

from openai.types.chat.chat_completion import ChoiceLogprobs
from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError

from fullasync.client import chat_answers
from fullasync.client.continuation import StitchedGeneration
from fullasync.client.messages import normalize_messages, normalize_tools
from fullasync.client.request_schema import (
    INT64_MAX,
    INT64_MIN,
    MAX_N,
    SamplingRequest,
    StreamOptions,
    Strict,
    StructuredOutputs,
    check_neutral,
    check_stop,
    check_structured,
    check_text,
    explain,
)
from fullasync.client.streaming import Sent, TextDeltas
from fullasync.client.wire_types import JSON
from fullasync.errors import InvalidRequestError

if TYPE_CHECKING:
    from fullasync.client.rollout_client import CallRequest, RolloutClient

TokenId = Annotated[int, Field(ge=0, le=INT64_MAX)]
IGNORED = ("request_id", "cache_salt", "priority", "token_offsets", "reasoning_ended", "reasoning_parser_kwargs")
SAMPLING_IGNORED = ("flat_logprobs", "extra_args", "spaces_between_special_tokens")
REFUSED = {
    "features": "multimodal input is not served (the policy reads text tokens only)",
    "content_parts": "multimodal input is not served (the policy reads text tokens only)",
    "kv_transfer_params": "disaggregated prefill is not served: send the whole prompt's token ids",
    "ec_transfer_params": "disaggregated encoding is not served: send the whole prompt's token ids",
}


class SamplingParams(Strict):
    """`sampling_params` of a generate request: vLLM's names and defaults, the values this client samples with."""

    n: int = Field(1, ge=1, le=MAX_N, description=f"an integer in [1, {MAX_N}]")
    max_tokens: int | None = Field(None, ge=1, description="a positive integer (unset: the rest of the context)")
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False, description="a number in [0, 2]")
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False, description="a number in (0, 1]")
    top_k: int = Field(0, ge=-1, description="-1 or 0 (off) or a positive integer")
    min_p: float = Field(0.0, ge=0, le=1, allow_inf_nan=False, description="a number in [0, 1]")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="an integer within 64 bits")
    stop: str | list[str] | None = Field(None, description="a non-empty string or a list of them")
    stop_token_ids: list[TokenId] | None = Field(None, description="a list of token ids")
    ignore_eos: bool = Field(False, description="true or false")
    logprobs: int | None = Field(None, ge=-1, description="null (none), 0 (the sampled token's) or a positive "
                                                          "integer (that many alternatives)")
    min_tokens: int = Field(0, ge=0, description="0 (a minimum output length is not supported)")
    detokenize: bool = Field(True, description="true or false")
    skip_special_tokens: bool = Field(True, description="true or false")
    include_stop_str_in_output: bool = Field(False, description="true or false")
    prompt_logprobs: int | None = Field(None, description="null (prompt log-probs are not served)")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="one of {'regex': str}, {'json': schema}, {'choice': [str, ...]}, {'json_object': true}")
    presence_penalty: float | None = Field(None, allow_inf_nan=False, description="0 (penalties are not supported)")
    frequency_penalty: float | None = Field(None, allow_inf_nan=False, description="0 (penalties are not supported)")
    repetition_penalty: float | None = Field(None, allow_inf_nan=False, description="1 (penalties are not supported)")
    logit_bias: dict[str, float] | None = Field(None, description="empty (logit_bias is not supported)")


class GenerateRequest(Strict):
    token_ids: list[TokenId] = Field(min_length=1, description="a non-empty list of token ids")
    sampling_params: SamplingParams = Field(default_factory=lambda: SamplingParams.model_validate({}),
                                            description="vLLM's sampling parameters")
    model: str | None = Field(None, description="the served model name")
    stream: bool = Field(False, description="true or false")
    stream_options: StreamOptions | None = Field(None, description="{'include_usage': true|false}")
    return_token_ids: bool | None = Field(None, description="true or false (the prompt's ids in the answer)")
    output_mode: Literal["tokens", "text"] = Field("tokens", description="'tokens' or 'text'")


class TokenizeRequest(Strict):
    """`/tokenize`: a `prompt`, or `messages` (with `tools`) rendered by the run's chat template."""

    model: str | None = Field(None, description="the served model name")
    prompt: str | None = Field(None, description="a string")
    messages: list[object] | None = Field(None, min_length=1, description="a non-empty list of message objects")
    tools: list[object] | None = Field(None, description="a list of {'type': 'function', 'function': {...}}")
    add_generation_prompt: bool = Field(True, description="true or false")
    add_special_tokens: bool | None = Field(None, description="true or false")
    continue_final_message: Literal[False] = Field(False, description="false (an open final message is not "
                                                                      "rendered)")
    chat_template_kwargs: JSON | None = Field(None, description="an object of extra variables for the chat template")
    return_token_strs: bool = Field(False, description="true or false")


class DetokenizeRequest(Strict):
    model: str | None = Field(None, description="the served model name")
    tokens: list[TokenId] = Field(description="a list of token ids")


class _Wire(BaseModel):
    """An answer's object, written with every field vLLM writes."""

    model_config = ConfigDict(extra="forbid")


class TokenLogprob(_Wire):
    token_id: int
    logprob: float
    rank: int | None = None


class SampledLogprob(TokenLogprob):
    top_logprobs: list[TokenLogprob] = []  # the sampled token first, then the alternatives


class TokenLogprobs(_Wire):
    content: list[SampledLogprob] | None = None  # one per output token


class WeightVersionSpan(_Wire):
    """Output tokens `[start, end)` were sampled by the weights of `version`."""

    version: str
    start: int
    end: int


class Usage(_Wire):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int
    prompt_tokens_details: None = None


class GenerateChoice(_Wire):
    index: int
    finish_reason: str | None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None
    routed_experts: None = None
    sampling_mask: None = None
    weight_versions: list[WeightVersionSpan] | None = None
    logprobs: TokenLogprobs | None = None


class GenerateTextChoice(GenerateChoice):
    text: str = ""
    logprobs: ChoiceLogprobs | None = None  # type: ignore[assignment]  # OpenAI's shape in text mode


class GenerateResponse(_Wire):
    request_id: str
    model: str | None = None
    created: int | None = None
    usage: Usage | None = None
    prompt_logprobs: None = None
    prompt_token_id_logprobs: None = None
    prompt_token_ids: list[int] | None = None
    mm_placeholders: None = None
    metrics: None = None
    kv_transfer_params: None = None
    ec_transfer_params: None = None
    output_mode: Literal["tokens", "text"] = "tokens"
    choices: list[SerializeAsAny[GenerateChoice]]  # text mode: `GenerateTextChoice`s


class GenerateChunk(_Wire):
    """One streamed event (`data: {...}`); the stream ends with `data: [DONE]`."""

    request_id: str
    output_mode: Literal["tokens", "text"] = "tokens"
    choices: list[SerializeAsAny[GenerateChoice]]  # text mode: `GenerateTextChoice`s
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


class TokenizeResponse(_Wire):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(_Wire):
    prompt: str


_serial = itertools.count()


def version_spans(versions: Sequence[int]) -> list[WeightVersionSpan]:
    """Runs of equal versions over output token indexes."""
    spans, start = [], 0
    for version, run in itertools.groupby(versions):
        end = start + len(list(run))
        spans.append(WeightVersionSpan(version=str(version), start=start, end=end))
        start = end
    return spans


def _validated(schema: type[Strict], fields: Mapping[str, object]) -> BaseModel:
    try:
        check_text(fields, "")
    except RecursionError:
        raise InvalidRequestError("the request nests objects or lists too deeply") from None
    try:
        return schema.model_validate(dict(fields))
    except ValidationError as error:
        raise explain(error, schema) from None


class TokensEndpoint:
    """`client.tokens.generate(**fields)`, `.tokenize(**fields)`, `.detokenize(**fields)`: the bodies vLLM reads."""

    def __init__(self, client: RolloutClient) -> None:
        self._client = client

    def _accept_model(self, model: str | None) -> str:
        service = self._client.service
        if model is not None:
            service.accept_model(model)
        return service.config.model_name

    async def generate(self, **fields: object) -> GenerateResponse | AsyncIterator[GenerateChunk]:
        """vLLM's `POST /inference/v1/generate`: sampled ids (and log-probs, text) for a prompt of token ids."""
        with self._client.noting_faults():
            return await self._generate(fields)

    async def _generate(self, fields: JSON) -> GenerateResponse | AsyncIterator[GenerateChunk]:
        client = self._client
        asked = self._parse(fields)
        sampling = asked.sampling_params
        model = self._accept_model(asked.model)
        request = client.prepare(
            list(asked.token_ids), _sampling_request(model, sampling), max_tokens=sampling.max_tokens,
            num_top_logprobs=max(sampling.logprobs or 0, 0), with_logprobs=sampling.logprobs is not None,
            prompt_field="token_ids",
        )
        answer = _Answer(client, asked, request, model)
        if asked.stream:
            return answer.stream()
        generations = await client.sample(request)
        for generation in generations:
            client.record(request.prompt_ids, generation)
        return answer.whole(generations)

    def _parse(self, fields: JSON) -> GenerateRequest:
        body, ignored = dict(fields), [name for name in IGNORED if name in fields]
        for name, reason in REFUSED.items():
            if body.get(name) is not None:
                raise InvalidRequestError(f"{name}: {reason}", param=name)
            body.pop(name, None)
        for name in ignored:
            body.pop(name)
        sampling = body.get("sampling_params")
        if isinstance(sampling, Mapping):
            ignored += [f"sampling_params.{name}" for name in SAMPLING_IGNORED if name in sampling]
            body["sampling_params"] = {k: v for k, v in sampling.items() if k not in SAMPLING_IGNORED}
        asked = _validated(GenerateRequest, body)
        assert isinstance(asked, GenerateRequest)
        self._client.service.note_ignored(ignored)
        sp = asked.sampling_params
        check_neutral(sp)
        check_stop(sp.stop)
        if sp.logprobs == -1:
            raise InvalidRequestError("logprobs=-1 (the whole vocabulary) is not served; ask for at most "
                                      f"{self._client.service.config.max_top_logprobs}", param="sampling_params")
        if sp.min_tokens:
            raise InvalidRequestError("min_tokens is not supported (it would mask EOS in a way the trainer's "
                                      "log-probs do not reproduce); leave it at 0", param="sampling_params")
        if sp.prompt_logprobs is not None:
            raise InvalidRequestError("prompt_logprobs are not served: the engines return the log-probs of sampled "
                                      "tokens only; leave it unset", param="sampling_params")
        if sp.stop and not sp.detokenize:
            raise InvalidRequestError("stop strings need detokenize: true (use stop_token_ids to stop on ids)",
                                      param="sampling_params")
        if asked.output_mode == "text" and not sp.detokenize:
            raise InvalidRequestError("output_mode 'text' needs sampling_params.detokenize: true",
                                      param="output_mode")
        if asked.stream and sp.n != 1:
            raise InvalidRequestError("stream=true supports n=1 only", param="sampling_params")
        return asked

    async def tokenize(self, **fields: object) -> TokenizeResponse:
        """vLLM's `POST /tokenize`: a prompt's ids, or the ids the chat template gives messages (and tools)."""
        asked = _validated(TokenizeRequest, fields)
        assert isinstance(asked, TokenizeRequest)
        self._accept_model(asked.model)
        service = self._client.service
        chat_tokens = service.chat_tokens
        if (asked.prompt is None) == (asked.messages is None):
            raise InvalidRequestError("give one of `prompt` and `messages`", param="prompt")
        if asked.prompt is not None:
            special = True if asked.add_special_tokens is None else asked.add_special_tokens
            ids = list(chat_tokens.tokenizer.encode(asked.prompt, add_special_tokens=special))
        else:
            assert asked.messages is not None
            tools = normalize_tools(asked.tools) if asked.tools else None
            rendered = chat_tokens.render(normalize_messages(asked.messages), tools, asked.add_generation_prompt,
                                          asked.chat_template_kwargs)
            ids = list(chat_tokens.tokenizer.encode(rendered, add_special_tokens=bool(asked.add_special_tokens)))
        strs = [chat_tokens.decode([i], skip_special_tokens=False) for i in ids] if asked.return_token_strs else None
        return TokenizeResponse(count=len(ids), max_model_len=service.config.max_model_len, tokens=ids,
                                token_strs=strs)

    async def detokenize(self, **fields: object) -> DetokenizeResponse:
        """vLLM's `POST /detokenize`: the text of token ids, special tokens included."""
        asked = _validated(DetokenizeRequest, fields)
        assert isinstance(asked, DetokenizeRequest)
        self._accept_model(asked.model)
        vocab = self._client.service.vocab_size
        if asked.tokens and max(asked.tokens) >= vocab:
            raise InvalidRequestError(f"token id {max(asked.tokens)} is outside the vocabulary (ids must be in "
                                      f"[0, {vocab}))", param="tokens")
        return DetokenizeResponse(prompt=self._client.service.chat_tokens.decode(asked.tokens,
                                                                                 skip_special_tokens=False))


def _sampling_request(model: str, sp: SamplingParams) -> SamplingRequest:
    """The chat path's sampling fields of a generate request (checked already)."""
    request = SamplingRequest.model_construct(
        model=model, n=sp.n, temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, min_p=sp.min_p,
        stop=sp.stop, stop_token_ids=sp.stop_token_ids, seed=sp.seed, ignore_eos=sp.ignore_eos,
        structured_outputs=sp.structured_outputs, return_token_ids=True)
    check_structured(request)
    return request


class _Answer:
    """One generate request's answer in vLLM's shape, whole or streamed."""

    def __init__(self, client: RolloutClient, asked: GenerateRequest, request: CallRequest, model: str) -> None:
        self.client, self.asked, self.request, self.model = client, asked, request, model
        self.sampling = asked.sampling_params
        self.text_mode = asked.output_mode == "text"
        self.request_id = f"generate-tokens-{client.episode.id}-{next(_serial)}"

    def decode(self, ids: Sequence[int]) -> str:
        return self.client.service.chat_tokens.decode(ids, skip_special_tokens=self.sampling.skip_special_tokens)

    def text(self, generation: StitchedGeneration) -> str:
        if self.sampling.include_stop_str_in_output:
            return self.decode(generation.output_ids)
        return chat_answers.visible_text(self.client.service.chat_tokens, generation, self.decode)

    def token_logprobs(self, part: StitchedGeneration) -> TokenLogprobs | None:
        """Tokens mode: each sampled id with its log-prob, then its alternatives (the sampled one first)."""
        if self.sampling.logprobs is None:
            return None
        keep = max(self.sampling.logprobs, 1)
        content = []
        for i, (token_id, logprob) in enumerate(zip(part.output_ids, part.output_logprobs, strict=True)):
            alternatives = part.top_logprobs[i] if part.top_logprobs else {}
            top = [TokenLogprob(token_id=token_id, logprob=logprob)] + [
                TokenLogprob(token_id=other, logprob=value) for other, value in alternatives.items()
                if other != token_id]
            content.append(SampledLogprob(token_id=token_id, logprob=logprob, top_logprobs=top[:keep]))
        return TokenLogprobs(content=content)

    def choice(self, index: int, part: StitchedGeneration, finish: str | None, text: str,
               versions: list[WeightVersionSpan] | None) -> GenerateChoice:
        stop = part.stop_reason if finish else None
        if self.text_mode:
            logprobs = (chat_answers.chat_logprobs(self.client.service.chat_tokens, part)
                        if self.sampling.logprobs is not None else None)
            return GenerateTextChoice(index=index, finish_reason=finish, stop_reason=stop,
                                      token_ids=list(part.output_ids), weight_versions=versions, logprobs=logprobs,
                                      text=text)
        return GenerateChoice(index=index, finish_reason=finish, stop_reason=stop, token_ids=list(part.output_ids),
                              weight_versions=versions, logprobs=self.token_logprobs(part))

    def usage(self, generations: Sequence[StitchedGeneration]) -> Usage:
        prompt, output = len(self.request.prompt_ids), sum(len(g.output_ids) for g in generations)
        return Usage(prompt_tokens=prompt, completion_tokens=output, total_tokens=prompt + output)

    def whole(self, generations: list[StitchedGeneration]) -> GenerateResponse:
        choices = [self.choice(index, generation, chat_answers.finish_reason(generation.finish_reason),
                               self.text(generation) if self.text_mode else "",
                               version_spans(generation.output_versions))
                   for index, generation in enumerate(generations)]
        return GenerateResponse(
            request_id=self.request_id, model=self.model, created=int(time.time()), usage=self.usage(generations),
            prompt_token_ids=list(self.request.prompt_ids) if self.asked.return_token_ids else None,
            output_mode=self.asked.output_mode, choices=choices)

    def chunk(self, choices: list[GenerateChoice], **fields: object) -> GenerateChunk:
        return GenerateChunk(request_id=self.request_id, output_mode=self.asked.output_mode, choices=choices,
                             **fields)  # type: ignore[arg-type]

    async def stream(self) -> AsyncIterator[GenerateChunk]:
        """A chunk per token delta (its ids, log-probs, text), then the last with the finish, the stop and the
        weight versions of the whole output; the call is recorded once the engine finished it."""
        client, prompt_pending = self.client, bool(self.asked.return_token_ids)
        texts = TextDeltas(self.decode, () if self.sampling.include_stop_str_in_output else
                           tuple(self.request.sampling.stop))
        sent = Sent()
        generation = None
        async for item in client.sample_stream(self.request):
            if isinstance(item, StitchedGeneration):
                generation = item
                break
            part = StitchedGeneration(output_ids=list(item.output_ids), output_logprobs=list(item.output_logprobs),
                                      top_logprobs=list(item.top_logprobs))
            text = sent.more(texts.push(item.output_ids)) if self.text_mode else ""
            extra = {"prompt_token_ids": list(self.request.prompt_ids)} if prompt_pending else {}
            prompt_pending = False
            yield self.chunk([self.choice(0, part, None, text, None)], **extra)
        assert generation is not None
        client.record(self.request.prompt_ids, generation)
        last = StitchedGeneration(stop_reason=generation.stop_reason)
        text = sent.more(self.text(generation)) if self.text_mode else ""
        yield self.chunk([self.choice(0, last, chat_answers.finish_reason(generation.finish_reason), text,
                                      version_spans(generation.output_versions))])
        if self.asked.stream_options is not None and self.asked.stream_options.include_usage:
            yield self.chunk([], usage=self.usage([generation]))
