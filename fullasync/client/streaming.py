"""Streaming chat and text completions: `openai` chunk objects from a resumable token stream.

Owns: turning token deltas into text deltas (holding back an incomplete UTF-8 character and any
suffix that may still become a stop string), reasoning and content deltas as far as the answer's format
(`answers.AnswerFormat.partial`) lets them go before the end, tool calls as deltas at the end, the final chunk,
and recording the call once the stream finished. A stream the consumer
abandons records nothing. A weight push mid-stream is invisible: the deltas simply continue.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Literal, TypeAlias

from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import (
    Choice,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
    ChoiceLogprobs,
)

from fullasync.client import chat_answers
from fullasync.client.answers import Answer, AnswerFormat, before_markers
from fullasync.client.chat_tokens import ChatTokenizer
from fullasync.client.continuation import StitchedGeneration
from fullasync.contracts.engine import TokenDelta

# a resumable generation as it streams (`continuation.stream_with_resume`): token deltas, then the stitched whole
TokenStream: TypeAlias = AsyncIterator[TokenDelta | StitchedGeneration]


class IncrementalText:
    """`decode(ids)` of a growing list of ids, at a cost per push of the new ids rather than of all of them.

    The text of a settled prefix is kept; a push decodes only the ids after it, with `CONTEXT` ids before them
    so that a tokenizer reads them as it would in the whole (a word's leading space, a multi-byte character split
    over tokens), and appends what those ids add: decode(context + new)
    less decode(context). The prefix settles up to the newest id once `SETTLE_EVERY` ids have come since it last
    did and the text does not end inside a UTF-8 character (settling costs a decode of the context; a short
    answer is decoded whole at each push, as cheap as one call). Should a window ever fail to extend its
    context's text (a decode that rewrites text behind the new ids, as cleaning " ." up to "." does), the whole
    is decoded once more."""

    CONTEXT = 4  # ids decoded before the new ones, more where those ids have no text
    SETTLE_EVERY = 32  # ids

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self._settled_text = ""  # decode(ids[:settled]) ...
        self._settled = 0
        self._context_start = 0  # ... and decode(ids[context_start:settled]): text unless context_start is 0
        self._context_text = ""

    def push(self, ids: Sequence[int]) -> str:
        """The text of every id so far."""
        self.ids += ids
        window = self.decode(self.ids[self._context_start :])
        if window.startswith(self._context_text):
            text = self._settled_text + window[len(self._context_text) :]
        else:
            text = self.decode(self.ids)
        if len(self.ids) - self._settled >= self.SETTLE_EVERY and not text.endswith("\ufffd"):
            self._settle(text)
        return text

    def _settle(self, text: str) -> None:
        """The prefix is every id so far. Its context must have text: a decode that strips the first character
        (a SentencePiece word's space) or starts a word must do so in the context, as the whole decode did."""
        self._settled_text, self._settled = text, len(self.ids)
        start, context = self._settled, ""
        while start > 0 and not context:
            start = max(0, start - self.CONTEXT)
            context = self.decode(self.ids[start : self._settled])
        self._context_start, self._context_text = start, context


class TextDeltas:
    """Decodes a growing list of ids into the text that is safe to send: without an incomplete UTF-8 character at
    its end, and without a suffix that may still become one of the stop strings."""

    def __init__(self, decode: Callable[[list[int]], str], hold: tuple[str, ...]) -> None:
        self.text = IncrementalText(decode)
        self.hold = hold  # strings whose beginning must not be sent before it is clear
        self.generation: StitchedGeneration | None = None  # the stitched whole, once the stream ended

    async def follow(self, stream: TokenStream) -> AsyncIterator[tuple[TokenDelta, str]]:
        """(token delta, safe text so far) pairs; the stitched generation lands in `self.generation`."""
        async for item in stream:
            if isinstance(item, StitchedGeneration):
                self.generation = item
                return
            yield item, self.push(item.output_ids)

    def push(self, ids: Sequence[int]) -> str:
        text = self.text.push(ids)
        if text.endswith("\ufffd"):
            text = text[:-1]  # half of a multi-byte character
        return before_markers(text, self.hold)


class Sent:
    """The text of one stream field sent so far: `more(text)` is what to send next, given what may be sent now."""

    def __init__(self) -> None:
        self.text = ""

    def more(self, text: str | None) -> str:
        if not text or not text.startswith(self.text) or len(text) <= len(self.text):
            return ""  # a parser that changed its mind keeps what was sent; the recorded turn is the final answer
        delta, self.text = text[len(self.text) :], text
        return delta


def _chunk(chunk_id: str, created: int, model: str, delta: ChoiceDelta,
           finish: Literal["stop", "length", "tool_calls"] | None = None,
           logprobs: ChoiceLogprobs | None = None, token_ids: tuple[int, ...] | None = None) -> ChatCompletionChunk:
    choice = Choice(index=0, delta=delta, finish_reason=finish, logprobs=logprobs)
    if token_ids is not None:
        chat_answers.set_vllm_field(choice, "token_ids", list(token_ids))
    return ChatCompletionChunk(id=chunk_id, object="chat.completion.chunk", created=created, model=model,
                               choices=[choice])


def _delta(reasoning: str = "", content: str | None = "") -> ChoiceDelta:
    delta = ChoiceDelta(content=content)
    if reasoning:
        chat_answers.set_reasoning(delta, reasoning)
    return delta


async def chat_stream(stream: TokenStream, *, answers: AnswerFormat, model: str, prompt_ids: list[int],
                      stop: tuple[str, ...], with_logprobs: bool, token_ids: bool, include_usage: bool,
                      on_done: Callable[[StitchedGeneration, Answer], None], tokens_as_ids: bool = False,
                      ) -> AsyncIterator[ChatCompletionChunk]:
    """Chunks of one streamed chat completion; `on_done(generation, answer)` records it."""
    chunk_id, created = chat_answers.response_id("chatcmpl"), int(time.time())
    chat_tokens = answers.chat_tokens
    texts = TextDeltas(answers.text, stop)
    reasoning_sent, content_sent = Sent(), Sent()
    first = _chunk(chunk_id, created, model, ChoiceDelta(role="assistant", content=""))
    if token_ids:
        # chunk level, on the first chunk only (as vLLM streams it)
        chat_answers.set_vllm_field(first, "prompt_token_ids", list(prompt_ids))
    yield first
    async for item, text in texts.follow(stream):
        logprobs = None
        if with_logprobs:
            part = StitchedGeneration(output_ids=list(item.output_ids), output_logprobs=list(item.output_logprobs),
                                      top_logprobs=list(item.top_logprobs))
            logprobs = ChoiceLogprobs(content=chat_answers.chat_logprobs(chat_tokens, part, tokens_as_ids).content)
        reasoning, content = answers.partial(text)
        reasoning, content = reasoning_sent.more(reasoning), content_sent.more(content)
        if reasoning or content or logprobs is not None or token_ids:
            yield _chunk(chunk_id, created, model, _delta(reasoning, content), logprobs=logprobs,
                         token_ids=item.output_ids if token_ids else None)
    generation = texts.generation
    assert generation is not None
    answer = answers.answer(answers.visible_text(generation))
    reasoning, content = reasoning_sent.more(answer.reasoning), content_sent.more(answer.content)
    if reasoning or content:
        yield _chunk(chunk_id, created, model, _delta(reasoning, content))
    # the turn recorded is the message the harness assembles from the deltas (what a parser trimmed from the final
    # answer may already have been sent), so that its echo in the next request is recognised as this turn
    answer = Answer(reasoning_sent.text or None, content_sent.text or None, answer.calls)
    tool_calls = chat_answers.tool_call_objects(answer.calls)
    for index, call in enumerate(tool_calls):
        function = ChoiceDeltaToolCallFunction(name=call.function.name, arguments=call.function.arguments)
        yield _chunk(chunk_id, created, model,
                     ChoiceDelta(tool_calls=[ChoiceDeltaToolCall(index=index, id=call.id, type="function",
                                                                 function=function)]))
    on_done(generation, answer)
    finish: Literal["stop", "length", "tool_calls"] = (
        "tool_calls" if tool_calls else chat_answers.finish_reason(generation.finish_reason))
    last = _chunk(chunk_id, created, model, ChoiceDelta(), finish=finish)
    chat_answers.set_stop_reason(last.choices[0], generation)
    yield last
    if include_usage:
        yield ChatCompletionChunk(id=chunk_id, object="chat.completion.chunk", created=created, model=model,
                                  choices=[], usage=chat_answers.usage(len(prompt_ids), [generation]))


async def completion_stream(stream: TokenStream, *, chat_tokens: ChatTokenizer, model: str,
                            prompt_ids: list[int], stop: tuple[str, ...], token_ids: bool, include_usage: bool,
                            on_done: Callable[[StitchedGeneration], None]) -> AsyncIterator[Completion]:
    """Text-completion chunks (`object: text_completion`), as OpenAI streams them; with `token_ids`, each
    choice carries its delta's ids and the first one also `prompt_token_ids` (vLLM's placement)."""
    chunk_id, created = chat_answers.response_id("cmpl"), int(time.time())
    texts = TextDeltas(chat_tokens.decode, stop)
    sent = Sent()
    prompt_pending = token_ids

    def chunk(text: str, ids: tuple[int, ...], finish: str | None = None) -> Completion:
        nonlocal prompt_pending
        # streamed choices carry finish_reason null until the last one, which the pydantic type forbids
        choice = CompletionChoice.model_construct(index=0, text=text, finish_reason=finish, logprobs=None)
        if token_ids:
            chat_answers.set_vllm_field(choice, "token_ids", list(ids))
            if prompt_pending:
                chat_answers.set_vllm_field(choice, "prompt_token_ids", list(prompt_ids))
                prompt_pending = False
        return Completion.model_construct(id=chunk_id, object="text_completion", created=created, model=model,
                                          choices=[choice])

    async for item, text in texts.follow(stream):
        text = sent.more(text)
        if text or token_ids:
            yield chunk(text, item.output_ids)
    generation = texts.generation
    assert generation is not None
    full = chat_answers.visible_text(chat_tokens, generation)
    on_done(generation)
    last = chunk(sent.more(full), (), generation.finish_reason.value)
    if include_usage:
        last.usage = chat_answers.usage(len(prompt_ids), [generation])
    yield last
