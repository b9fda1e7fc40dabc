"""Chat-completion and completion answers: real `openai` response objects built from stitched generations.

Owns: the mapping from token-level results to `ChatCompletion` / `Completion` (text, tool calls,
log-probs, usage, optional token ids in vLLM's field names).
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Literal, TypeVar

from openai import BaseModel
from openai.types import Completion, CompletionChoice, CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
    ChatCompletionMessageToolCallUnion,
)
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message_function_tool_call import Function
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob, TopLogprob
from openai.types.completion_choice import Logprobs

from fullasync.client.chat_tokens import ChatTokenizer
from fullasync.client.continuation import StitchedGeneration
from fullasync.client.tool_parsers import ParsedToolCall
from fullasync.client.wire_types import ChatMessage
from fullasync.types import FinishReason

# ids of responses and tool calls, 32 hex digits like a uuid4's: a random prefix per process, then a counter,
# so unique without an urandom system call per response (a measurable share of the driver's CPU at scale:
# docs/benchmarks/figures.md)
_unique_hex = map(f"{uuid.uuid4().hex[:16]}{{:016x}}".format, itertools.count())


def response_id(kind: str) -> str:
    """A fresh response id: `chatcmpl-…` or `cmpl-…` as OpenAI writes them."""
    return f"{kind}-{next(_unique_hex)}"


def finish_reason(reason: FinishReason) -> Literal["stop", "length"]:
    """OpenAI's `finish_reason` of a finished generation (an aborted one is resumed, never answered)."""
    if reason is FinishReason.ABORT:
        raise ValueError("an aborted generation has no OpenAI finish_reason: it is resumed before it is answered")
    return "stop" if reason is FinishReason.STOP else "length"


def set_reasoning(model: BaseModel, reasoning: str) -> None:
    """A reasoning model's thinking on a message or delta, under both names clients read: `reasoning_content`
    (litellm, most harnesses, vLLM before 0.11) and `reasoning` (vLLM now)."""
    model.reasoning_content = reasoning  # type: ignore[attr-defined]  # pydantic extra="allow"
    model.reasoning = reasoning  # type: ignore[attr-defined]


def set_vllm_field(model: BaseModel, name: str, value: list[int]) -> None:
    """Set one of vLLM's additions to OpenAI's schema (`token_ids`, `prompt_token_ids`): the SDK's models keep
    fields they do not declare (pydantic `extra="allow"`), though their types list OpenAI's fields only."""
    setattr(model, name, value)


def set_stop_reason(choice: BaseModel, generation: StitchedGeneration) -> None:
    """vLLM's `stop_reason` on a finished choice: the stop string that ended the output, when one did."""
    if isinstance(generation.stop_reason, str):
        choice.stop_reason = generation.stop_reason  # type: ignore[attr-defined]  # pydantic extra="allow"


def visible_text(chat_tokens: ChatTokenizer, generation: StitchedGeneration,
                 decode: Callable[[Sequence[int]], str] | None = None) -> str:
    """Decoded output (without special tokens, unless `decode` keeps some), cut before a matched stop string (as
    OpenAI does)."""
    text = (decode or chat_tokens.decode)(generation.output_ids)
    if isinstance(generation.stop_reason, str):
        cut = text.find(generation.stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text


def tool_call_objects(calls: list[ParsedToolCall]) -> list[ChatCompletionMessageToolCall]:
    return [
        ChatCompletionMessageToolCall(
            id=f"call_{next(_unique_hex)[8:]}",
            type="function",
            function=Function(name=call.name, arguments=json.dumps(call.arguments)),
        )
        for call in calls
    ]


def _token_texts(chat_tokens: ChatTokenizer, ids: list[int]) -> list[str]:
    return [chat_tokens.decode([i], skip_special_tokens=False) for i in ids]


def _labels(chat_tokens: ChatTokenizer, ids: list[int], as_ids: bool) -> list[str]:
    """Each token as its log-prob entry names it: its text, or `token_id:N` (vLLM's `return_tokens_as_token_ids`,
    for clients that must map entries back to ids a text cannot name uniquely)."""
    return [f"token_id:{i}" for i in ids] if as_ids else _token_texts(chat_tokens, ids)


def chat_logprobs(chat_tokens: ChatTokenizer, generation: StitchedGeneration, as_ids: bool = False) -> ChoiceLogprobs:
    ids = list(generation.output_ids)
    content = []
    for i, (token, text, logprob) in enumerate(zip(_labels(chat_tokens, ids, as_ids), _token_texts(chat_tokens, ids),
                                                   generation.output_logprobs, strict=True)):
        alternatives = generation.top_logprobs[i] if generation.top_logprobs else {}
        others = list(alternatives)
        top = [
            TopLogprob(token=label, logprob=lp, bytes=list(other_text.encode()))
            for label, other_text, lp in zip(_labels(chat_tokens, others, as_ids), _token_texts(chat_tokens, others),
                                             alternatives.values(), strict=True)
        ]
        content.append(
            ChatCompletionTokenLogprob(token=token, logprob=logprob, bytes=list(text.encode()), top_logprobs=top)
        )
    return ChoiceLogprobs(content=content)


def chat_choice(
    index: int,
    content: str | None,
    tool_calls: list[ChatCompletionMessageToolCall],
    generation: StitchedGeneration,
    logprobs: ChoiceLogprobs | None,
    token_ids: bool,
    reasoning: str | None = None,
) -> Choice:
    finish: Literal["stop", "length", "tool_calls"] = (
        "tool_calls" if tool_calls else finish_reason(generation.finish_reason))
    calls: list[ChatCompletionMessageToolCallUnion] = [*tool_calls]
    message = ChatCompletionMessage(role="assistant", content=content, tool_calls=calls or None)
    if reasoning is not None:
        set_reasoning(message, reasoning)
    choice = Choice(index=index, message=message, finish_reason=finish, logprobs=logprobs)
    set_stop_reason(choice, generation)
    if token_ids:
        set_vllm_field(choice, "token_ids", list(generation.output_ids))  # vLLM's field name (`return_token_ids`)
    return choice


def usage(prompt_tokens: int, generations: list[StitchedGeneration]) -> CompletionUsage:
    completion_tokens = sum(len(g.output_ids) for g in generations)
    return CompletionUsage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens * len(generations) + completion_tokens,
    )


Response = TypeVar("Response", ChatCompletion, Completion)


def _with_prompt_ids(response: Response, prompt_ids: list[int], token_ids: bool) -> Response:
    if token_ids:
        set_vllm_field(response, "prompt_token_ids", list(prompt_ids))  # vLLM's field name (`return_token_ids`)
    return response


def chat_completion(model: str, prompt_ids: list[int], choices: list[Choice], generations: list[StitchedGeneration],
                    token_ids: bool) -> ChatCompletion:
    response = ChatCompletion(id=response_id("chatcmpl"), object="chat.completion", created=int(time.time()),
                              model=model, choices=choices, usage=usage(len(prompt_ids), generations))
    return _with_prompt_ids(response, prompt_ids, token_ids)


def completion(
    chat_tokens: ChatTokenizer,
    model: str,
    prompt_ids: list[int],
    generations: list[StitchedGeneration],
    with_logprobs: bool,
    token_ids: bool,
    as_ids: bool = False,
) -> Completion:
    choices = []
    for index, generation in enumerate(generations):
        text = visible_text(chat_tokens, generation)
        logprobs = None
        if with_logprobs:
            tokens = _labels(chat_tokens, generation.output_ids, as_ids)
            offsets, offset = [], 0
            for token in _token_texts(chat_tokens, generation.output_ids):
                offsets.append(offset)
                offset += len(token)
            top = [
                dict(zip(_labels(chat_tokens, list(alt), as_ids), alt.values(), strict=True))
                for alt in generation.top_logprobs
            ] or None
            logprobs = Logprobs(
                tokens=tokens, token_logprobs=list(generation.output_logprobs), text_offset=offsets, top_logprobs=top
            )
        choice = CompletionChoice(index=index, text=text, finish_reason=finish_reason(generation.finish_reason),
                                  logprobs=logprobs)
        if token_ids:  # vLLM puts both on each completion choice
            set_vllm_field(choice, "token_ids", list(generation.output_ids))
            set_vllm_field(choice, "prompt_token_ids", list(prompt_ids))
        choices.append(choice)
    response = Completion(id=response_id("cmpl"), object="text_completion", created=int(time.time()), model=model,
                          choices=choices, usage=usage(len(prompt_ids), generations))
    return _with_prompt_ids(response, prompt_ids, token_ids)


def message_dict(content: str | None, tool_calls: list[ParsedToolCall], reasoning: str | None = None
                 ) -> ChatMessage:
    """The assistant turn as the episode remembers it (normalised like incoming messages)."""
    message: ChatMessage = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [
            {"id": "", "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in tool_calls
        ]
    return message
