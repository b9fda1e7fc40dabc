"""What every dialect shares: an answer seen apart from its wire, the handles of prior turns, the field checks.

Owns: `ChatAnswer` (a chat completion's first choice as text, reasoning, tool calls, finish, stop string and token
counts) and `pieces` (a streamed chat completion as `Piece`s in order); `Handles`, the opaque strings a dialect
hands out with a turn's reasoning (Responses' `encrypted_content`, Anthropic's thinking `signature`) and reads back
to restore the exact reasoning text the policy generated when a harness sends a prior turn; `check_fields`, the
rule for top-level fields: known and used, accepted and ignored (documented), refused with a message naming the
field, or unknown (refused).
Does not own: any wire format (the dialect modules), generation or recording (the chat path).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from openai.types.chat import ChatCompletion, ChatCompletionChunk

from fullasync.errors import InvalidRequestError

Finish = Literal["stop", "length", "tool_calls"]
# a chat message, tool or request as the chat path reads them (`fullasync.client.messages`): JSON, its values read
# where they are used
Fields = dict[str, Any]
T = TypeVar("T")
HANDLE_PREFIX = "fullasync-turn-"
VLLM_EXTRAS = ("ignore_eos", "min_p", "seed")  # vLLM's sampling extras, passed to the chat path as they are


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int


@dataclass
class ChatAnswer:
    """A chat completion's answer, dialect-neutral."""

    content: str = ""
    reasoning: str = ""
    calls: list[ToolCall] = field(default_factory=list)
    finish: Finish = "stop"
    stop_sequence: str | None = None  # the stop string that ended it, when one did
    usage: Usage = Usage(0, 0)

    @staticmethod
    def of(completion: ChatCompletion) -> ChatAnswer:
        choice = completion.choices[0]
        message = choice.message
        calls = [ToolCall(c.id, c.function.name, c.function.arguments)
                 for c in message.tool_calls or () if c.type == "function"]
        usage = completion.usage
        return ChatAnswer(message.content or "", getattr(message, "reasoning_content", None) or "", calls,
                          choice.finish_reason, _stop_string(choice),  # type: ignore[arg-type]
                          Usage(usage.prompt_tokens, usage.completion_tokens) if usage else Usage(0, 0))


@dataclass(frozen=True)
class Piece:
    """One step of a streamed answer: `reasoning` or `content` text, a whole tool `call`, or the `end`."""

    kind: Literal["reasoning", "content", "call", "end"]
    text: str = ""
    call: ToolCall | None = None
    answer: ChatAnswer | None = None  # with `end`: the whole answer (text, calls, finish, usage)


async def pieces(chunks: AsyncIterator[ChatCompletionChunk]) -> AsyncIterator[Piece]:
    """A streamed chat completion (asked with usage) as pieces; the last is `end` with the whole answer."""
    answer = ChatAnswer()
    async for chunk in chunks:
        if chunk.usage is not None:
            answer.usage = Usage(chunk.usage.prompt_tokens, chunk.usage.completion_tokens)
        for choice in chunk.choices:
            delta = choice.delta
            if reasoning := getattr(delta, "reasoning_content", None):
                answer.reasoning += reasoning
                yield Piece("reasoning", reasoning)
            if delta.content:
                answer.content += delta.content
                yield Piece("content", delta.content)
            for call in delta.tool_calls or ():  # the chat stream sends each call whole
                assert call.function is not None and call.function.name is not None
                whole = ToolCall(call.id or "", call.function.name, call.function.arguments or "{}")
                answer.calls.append(whole)
                yield Piece("call", call=whole)
            if choice.finish_reason is not None:
                answer.finish = choice.finish_reason  # type: ignore[assignment]  # never a filter here
                answer.stop_sequence = _stop_string(choice)
    yield Piece("end", answer=answer)


def _stop_string(choice: object) -> str | None:
    stop = getattr(choice, "stop_reason", None)  # vLLM's field: the stop string matched, if one was
    return stop if isinstance(stop, str) else None


class Handles:
    """Opaque handles of one episode's turns: `issue(reasoning)` gives a string to send with the turn, `lookup`
    turns one sent back into that reasoning text (None for a string this episode did not issue)."""

    _serial = itertools.count()
    _prefix = HANDLE_PREFIX + uuid.uuid4().hex[:12] + "-"

    def __init__(self) -> None:
        self._reasoning: dict[str, str] = {}

    def issue(self, reasoning: str) -> str:
        handle = f"{self._prefix}{next(self._serial)}"
        self._reasoning[handle] = reasoning
        return handle

    def lookup(self, handle: object) -> str | None:
        return self._reasoning.get(handle) if isinstance(handle, str) else None


def check_fields(body: Mapping[str, object], used: Collection[str], ignored: Collection[str],
                 refused: Mapping[str, str], api: str) -> list[str]:
    """The ignored fields the body set; raises for a refused field (with its reason) or an unknown one."""
    for name in body:
        if name in refused:
            raise InvalidRequestError(f"{name}: {refused[name]}", param=name)
        if name not in used and name not in ignored:
            raise InvalidRequestError(f"unknown field {name!r} for {api}; the fields this gateway reads are "
                                      f"{sorted(used)} (and it accepts and ignores {sorted(ignored)})", param=name)
    return [name for name in body if name in ignored]


def require(value: object, kind: type[T], where: str, what: str) -> T:
    """`value` when it is of `kind` (a bool is not an int), else an error naming `where`."""
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise InvalidRequestError(f"{where} must be {what}, got {type(value).__name__}", param=where)
    return value


def json_object(text: object, where: str) -> Fields:
    """A tool call's arguments: a JSON object, given as one or as its text."""
    if isinstance(text, dict):
        return dict(text)
    try:
        value = json.loads(require(text, str, where, "a JSON object (or its text)"))
    except (json.JSONDecodeError, RecursionError) as error:
        raise InvalidRequestError(f"{where} is not valid JSON: {error}", param=where) from None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where} must encode a JSON object, got {type(value).__name__}", param=where)
    return value
