"""The chat path's data as it types it: a JSON object, a normalised chat message, a tool, a constrained choice.

Owns the shapes only (`messages` makes the messages and tools, `tool_parsers` the constrained choice), and the one
place a request's JSON schema, typed with `object` values, is taken as the JSON value the engine contract names.
A tool and a named `tool_choice` are the openai SDK's own types; a message is ours: its tool calls carry their
arguments as an object (templates read them so), not as the SDK's JSON text, and it may carry `reasoning_content`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, NotRequired, TypeAlias, TypedDict, cast

from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionNamedToolChoiceParam

from fullasync.types import JsonValue

JSON: TypeAlias = dict[str, object]  # a JSON object: its values are read (and narrowed) where they are used
Tool: TypeAlias = ChatCompletionFunctionToolParam  # `{"type": "function", "function": {"name": ..., ...}}`
# `tool_choice` when it constrains the output: "required", or `{"type": "function", "function": {"name": ...}}`
ConstrainedChoice: TypeAlias = Literal["required"] | ChatCompletionNamedToolChoiceParam


class FunctionCall(TypedDict):
    name: str
    arguments: JSON


class MessageToolCall(TypedDict):
    id: str
    type: Literal["function"]
    function: FunctionCall


class ChatMessage(TypedDict):
    """A message as the chat template renders it (`developer` read as `system`, content parts joined)."""

    role: str
    content: str | None
    reasoning_content: NotRequired[str]  # an assistant turn's thinking, for templates that show it
    tool_calls: NotRequired[list[MessageToolCall]]
    tool_call_id: NotRequired[str]


def json_schema(schema: Mapping[str, object]) -> Mapping[str, JsonValue]:
    """A JSON schema a request sent (the SDK types its values as `object`) as the engine contract takes it: a JSON
    value, as it came over the wire (or, in process, as the engine's backend serialises it)."""
    return cast("Mapping[str, JsonValue]", schema)
