"""Validation and normalisation of OpenAI-style chat messages and tool schemas.

Owns: turning whatever a harness passes (dicts, openai pydantic objects) into plain dicts the chat
template renders, and rejecting malformed input with a message that says what to fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import cast

from fullasync.client.wire_types import JSON, ChatMessage, MessageToolCall, Tool
from fullasync.errors import InvalidRequestError

ROLES = ("system", "developer", "user", "assistant", "tool")


def _as_dict(value: object, where: str) -> JSON:
    if hasattr(value, "model_dump"):
        value = value.model_dump(exclude_none=True)
    if not isinstance(value, dict):
        raise InvalidRequestError(f"{where} must be an object (dict), got {type(value).__name__}", param=where)
    return dict(value)


def _text_content(content: object, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, raw in enumerate(content):
            part = _as_dict(raw, f"{where}[{i}]")
            text = part.get("text")
            if part.get("type") != "text" or not isinstance(text, str):
                raise InvalidRequestError(
                    f"{where}[{i}] must be a text part {{'type': 'text', 'text': ...}}; only text is supported",
                    param=where,
                )
            parts.append(text)
        return "".join(parts)
    raise InvalidRequestError(f"{where} must be a string or a list of text parts", param=where)


def _tool_call(raw: object, where: str) -> MessageToolCall:
    call = _as_dict(raw, where)
    function = _as_dict(call.get("function"), f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"{where}.function.name must be a non-empty string", param=where)
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, dict):
        arguments = json.dumps(arguments)
    if not isinstance(arguments, str):
        raise InvalidRequestError(f"{where}.function.arguments must be a JSON string", param=where)
    try:
        parsed = json.loads(arguments)
    except (json.JSONDecodeError, RecursionError) as error:
        raise InvalidRequestError(f"{where}.function.arguments is not valid JSON: {error}", param=where) from None
    if not isinstance(parsed, dict):
        raise InvalidRequestError(f"{where}.function.arguments must encode a JSON object, got {type(parsed).__name__}",
                                  param=where)
    call_id = call.get("id", "")
    if not isinstance(call_id, str):
        raise InvalidRequestError(f"{where}.id must be a string", param=where)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def normalize_messages(messages: object) -> list[ChatMessage]:
    """Plain-dict copies of `messages`; raises `InvalidRequestError` naming the bad message."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise InvalidRequestError("messages must be a non-empty list of message objects", param="messages")
    result = []
    for i, raw in enumerate(messages):
        where = f"messages[{i}]"
        message = _as_dict(raw, where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequestError(f"{where}.role must be one of {ROLES}, got {role!r}", param="messages")
        out: ChatMessage = {"role": "system" if role == "developer" else role,
                            "content": _text_content(message.get("content"), f"{where}.content")}
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if role == "assistant" and reasoning is not None:  # a reasoning model's thinking, for templates that show it
            if not isinstance(reasoning, str):
                raise InvalidRequestError(f"{where}.reasoning_content must be a string", param="messages")
            out["reasoning_content"] = reasoning
        tool_calls = message.get("tool_calls")
        if tool_calls is None:
            tool_calls = ()
        if not isinstance(tool_calls, Sequence) or isinstance(tool_calls, (str, bytes)):
            raise InvalidRequestError(f"{where}.tool_calls must be a list", param="messages")
        if tool_calls:
            if role != "assistant":
                raise InvalidRequestError(f"{where}: only assistant messages carry tool_calls", param="messages")
            out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(tool_calls)]
        elif out["content"] is None and role != "assistant":
            raise InvalidRequestError(f"{where} ({role}) needs a string content", param="messages")
        call_id = message.get("tool_call_id")
        if role == "tool" and call_id is not None:
            if not isinstance(call_id, str):
                raise InvalidRequestError(f"{where}.tool_call_id must be a string", param="messages")
            out["tool_call_id"] = call_id
        result.append(out)
    return result


def normalize_tools(tools: object) -> list[Tool] | None:
    """Plain-dict copies of OpenAI function tools, or None when there are none."""
    if tools is None:
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)):
        raise InvalidRequestError("tools must be a list of {'type': 'function', 'function': {...}}", param="tools")
    result: list[Tool] = []
    for i, raw in enumerate(tools):
        tool = _as_dict(raw, f"tools[{i}]")
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, dict):
            raise InvalidRequestError(
                f"tools[{i}] must look like {{'type': 'function', 'function': {{'name': ..., 'parameters': {{...}}}}}}",
                param="tools",
            )
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidRequestError(f"tools[{i}].function.name must be a non-empty string", param="tools")
        if not isinstance(function.get("parameters", {}), dict):
            raise InvalidRequestError(f"tools[{i}].function.parameters must be a JSON-schema object", param="tools")
        if not isinstance(function.get("description", ""), str):
            raise InvalidRequestError(f"tools[{i}].function.description must be a string", param="tools")
        # the checks above are the SDK type's (its other fields reach the template as they were sent)
        result.append(cast(Tool, {"type": "function", "function": dict(function)}))
    return result or None


def same_assistant_turn(sent: ChatMessage, recorded: ChatMessage) -> bool:
    """Whether a harness's assistant message is the one the client returned (content and calls)."""
    if sent.get("role") != "assistant":
        return False
    if (sent.get("content") or "") != (recorded.get("content") or ""):
        return False
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in sent.get("tool_calls", [])]
    expected = [(c["function"]["name"], c["function"]["arguments"]) for c in recorded.get("tool_calls", [])]
    return calls == expected


def echoes_turn(sent: Mapping[str, object], returned: ChatMessage) -> bool:
    """Whether a raw (not yet validated) assistant message repeats a turn the client returned: the same text and
    the same tool calls (names, and arguments as JSON values)."""
    if (sent.get("content") or "") != (returned.get("content") or ""):
        return False
    calls = sent.get("tool_calls") or []
    expected = returned.get("tool_calls") or []
    if not isinstance(calls, Sequence) or len(calls) != len(expected):
        return False
    for call, recorded in zip(calls, expected, strict=True):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or function.get("name") != recorded["function"]["name"]:
            return False
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except (json.JSONDecodeError, RecursionError):
                return False
        if arguments != recorded["function"]["arguments"]:
            return False
    return True
