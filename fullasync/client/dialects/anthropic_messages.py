"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`) over the chat path: Claude Code, the
`anthropic` SDK.

Owns: `MessagesEndpoint.create(**fields)` (what `anthropic.AsyncAnthropic().messages.create` sends) and
`count_tokens(**fields)`, translating `system` and content blocks into chat messages, `tools` (`input_schema`) into
chat tools, and the recorded chat answer back into a `Message` or its event stream (`message_start` …
`message_stop`).

A `system` message among `messages` (Claude Code sends its environment so) is a system message there.
Blocks and their chat messages: `text` (user or assistant text), `tool_use` (an assistant turn's tool calls),
`tool_result` (a tool message; its text), `thinking` (the assistant turn's reasoning: its `signature`, a handle this
gateway issued, gives back the exact thinking text; else its `thinking` text), `redacted_thinking` (dropped: it holds
nothing the policy wrote here). Stop reasons: `end_turn`, `max_tokens`, `stop_sequence` (with the string), `tool_use`.

Ignored (accepted, warned once, no effect): `metadata`, `thinking` (the chat template decides whether the policy
thinks), `context_management`, `output_config` (but its `format` becomes structured output), `service_tier`,
`inference_geo`, `cache_control` markers anywhere, and server-side tools (`web_search_*`, `web_fetch_*`,
`code_execution_*`, `tool_search_*`: never called). Refused with a 400 naming the field: `container`,
`mcp_servers`, non-text blocks (images, documents), Anthropic-defined client tools (`bash_*`, `text_editor_*`,
`computer_*`, `memory_*`: give them as custom tools). vLLM's sampling extras (`ignore_eos`, `min_p`, `seed`) pass
through.
Does not own: generation, recording, validation of the chat request (the chat path), HTTP (the gateway).
"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletionChunk
from pydantic import TypeAdapter

from fullasync.client.dialects.turns import VLLM_EXTRAS, ChatAnswer, Fields, check_fields, json_object, pieces, require
from fullasync.client.messages import normalize_messages, normalize_tools
from fullasync.errors import InvalidRequestError

if TYPE_CHECKING:
    from fullasync.client.rollout_client import RolloutClient

API = "POST /v1/messages"
USED = ("model", "max_tokens", "messages", "system", "stop_sequences", "stream", "temperature", "top_p", "top_k",
        "tools", "tool_choice", "output_config", *VLLM_EXTRAS)
IGNORED = ("metadata", "thinking", "context_management", "service_tier", "inference_geo", "cache_control")
REFUSED = {"container": "containers of Anthropic's code execution are not served; the harness runs its own tools",
           "mcp_servers": "MCP servers are not connected here; the harness runs its own tools"}
SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "tool_search")
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_EVENT = TypeAdapter(RawMessageStreamEvent)
_hex = map(f"{uuid.uuid4().hex[:12]}{{:012x}}".format, itertools.count())


def _text(content: object, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for index, block in enumerate(require(content, list, where, "a string or a list of text blocks")):
        block = require(block, dict, f"{where}[{index}]", "an object")
        if block.get("type") not in kinds:
            raise InvalidRequestError(f"{where}[{index}] is a {block.get('type')!r} block; this policy reads text "
                                      "blocks only", param=where)
        texts.append(require(block.get("text"), str, f"{where}[{index}].text", "a string"))
    return "".join(texts)


def _assistant(client: RolloutClient, blocks: list[object], where: str) -> Fields:
    message: Fields = {"role": "assistant", "content": ""}
    for index, block in enumerate(blocks):
        at = f"{where}[{index}]"
        block = require(block, dict, at, "an object")
        kind = block.get("type")
        if kind == "text":
            message["content"] += require(block.get("text"), str, f"{at}.text", "a string")
        elif kind == "tool_use":
            message.setdefault("tool_calls", []).append({
                "id": require(block.get("id"), str, f"{at}.id", "a string"), "type": "function",
                "function": {"name": require(block.get("name"), str, f"{at}.name", "a string"),
                             "arguments": json_object(block.get("input"), f"{at}.input")}})
        elif kind == "thinking":
            text = client.handles.lookup(block.get("signature"))
            message["reasoning_content"] = text if text is not None else require(
                block.get("thinking"), str, f"{at}.thinking", "a string")
        elif kind != "redacted_thinking":
            raise InvalidRequestError(f"{at} is a {kind!r} block; an assistant turn here holds text, tool_use and "
                                      "thinking blocks", param="messages")
    message["content"] = message["content"] or None
    return message


def _user(blocks: list[object], where: str) -> list[Fields]:
    """A user turn's blocks in order: tool results as tool messages, runs of text as user messages."""
    messages: list[Fields] = []
    for index, block in enumerate(blocks):
        at = f"{where}[{index}]"
        block = require(block, dict, at, "an object")
        if block.get("type") == "tool_result":
            content = block.get("content", "")
            messages.append({"role": "tool", "content": _text(content, f"{at}.content"),
                             "tool_call_id": require(block.get("tool_use_id"), str, f"{at}.tool_use_id", "a string")})
        elif block.get("type") == "text":
            text = require(block.get("text"), str, f"{at}.text", "a string")
            if messages and messages[-1]["role"] == "user":
                messages[-1]["content"] += text
            else:
                messages.append({"role": "user", "content": text})
        else:
            raise InvalidRequestError(f"{at} is a {block.get('type')!r} block; a user turn here holds text and "
                                      "tool_result blocks (this policy reads text only)", param="messages")
    return messages


def _messages(client: RolloutClient, body: Mapping[str, object]) -> list[Fields]:
    messages: list[Fields] = []
    if (system := body.get("system")) is not None:
        if isinstance(system, list):
            system = "\n\n".join(_text([block], f"system[{i}]") for i, block in enumerate(system))
        messages.append({"role": "system", "content": _text(system, "system")})
    for index, message in enumerate(require(body.get("messages"), list, "messages", "a list of messages")):
        where = f"messages[{index}]"
        message = require(message, dict, where, "an object")
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant", "system"):
            raise InvalidRequestError(f"{where}.role must be user or assistant (or system, as Claude Code sends its "
                                      f"environment), got {role!r}", param="messages")
        if role == "system":
            messages.append({"role": "system", "content": _text(content, f"{where}.content")})
        elif isinstance(content, str):
            messages.append({"role": role, "content": content})
        elif role == "assistant":
            blocks = require(content, list, f"{where}.content", "a string or a list")
            messages.append(_assistant(client, blocks, f"{where}.content"))
        else:
            messages += _user(require(content, list, f"{where}.content", "a string or a list"), f"{where}.content")
    return messages


def _tools(tools: object) -> list[Fields]:
    chat = []
    for index, tool in enumerate(require(tools, list, "tools", "a list")):
        where = f"tools[{index}]"
        tool = require(tool, dict, where, "an object")
        kind = tool.get("type")
        if kind not in (None, "custom"):
            if str(kind).startswith(SERVER_TOOLS):
                continue
            raise InvalidRequestError(f"{where}: Anthropic's {kind!r} tool is not served; give it as a custom tool "
                                      "(name, description, input_schema)", param="tools")
        chat.append({"type": "function", "function": {
            "name": require(tool.get("name"), str, f"{where}.name", "a string"),
            "description": require(tool.get("description", ""), str, f"{where}.description", "a string"),
            "parameters": require(tool.get("input_schema"), dict, f"{where}.input_schema", "a JSON-schema object")}})
    return chat


def _tool_choice(choice: object) -> Fields:
    choice = require(choice, dict, "tool_choice", 'an object {"type": "auto" | "any" | "tool" | "none"}')
    kind = choice.get("type")
    fields: Fields = {}
    if choice.get("disable_parallel_tool_use"):
        fields["parallel_tool_calls"] = False
    if kind in ("auto", "none"):
        return {"tool_choice": kind, **fields}
    if kind == "any":
        return {"tool_choice": "required", **fields}
    if kind == "tool":
        name = require(choice.get("name"), str, "tool_choice.name", "a string")
        return {"tool_choice": {"type": "function", "function": {"name": name}}, **fields}
    raise InvalidRequestError(f"tool_choice.type must be auto, any, tool or none, got {kind!r}", param="tool_choice")


def translate(client: RolloutClient, body: Mapping[str, object], counting: bool = False
              ) -> tuple[Fields, list[str]]:
    """The chat request an Anthropic Messages request stands for, and the ignored fields it set."""
    ignored = check_fields(body, USED, IGNORED, REFUSED, API)
    if not counting and body.get("max_tokens") is None:
        raise InvalidRequestError("max_tokens: field required", param="max_tokens")
    chat: Fields = {"model": body.get("model"), "messages": _messages(client, body),
                            "stream": bool(body.get("stream"))}
    for name, chat_name in (("max_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                            ("top_k", "top_k"), ("stop_sequences", "stop"), *((extra, extra) for extra in VLLM_EXTRAS)):
        if body.get(name) is not None and not counting:
            chat[chat_name] = body[name]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"]) or None
        if body.get("tool_choice") is not None and chat["tools"]:
            chat.update(_tool_choice(body["tool_choice"]))
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    form = require(body.get("output_config") or {}, dict, "output_config", "an object").get("format")
    if form is not None:
        form = require(form, dict, "output_config.format", "an object")
        if form.get("type") != "json_schema":
            raise InvalidRequestError("output_config.format.type must be json_schema", param="output_config")
        chat["response_format"] = {"type": "json_schema", "json_schema": {"name": "output",
                                                                           "schema": form.get("schema")}}
    return chat, ignored


def _stop(answer: ChatAnswer) -> tuple[str, str | None]:
    if answer.stop_sequence is not None and answer.finish == "stop":
        return "stop_sequence", answer.stop_sequence
    return STOP_REASONS[answer.finish], None


def _usage(answer: ChatAnswer) -> dict[str, int]:
    return {"input_tokens": answer.usage.prompt_tokens, "output_tokens": answer.usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


class MessagesEndpoint:
    """`client.messages`: `create(**fields)` and `count_tokens(**fields)` as `anthropic.AsyncAnthropic().messages`."""

    def __init__(self, client: RolloutClient) -> None:
        self._client = client

    async def create(self, **fields: object) -> Message | AsyncIterator[RawMessageStreamEvent]:
        client = self._client
        chat, ignored = translate(client, fields)
        client.service.note_ignored(ignored)
        result = await client.chat.completions.create(**chat)
        message_id, model = f"msg_{next(_hex)}", str(fields.get("model"))
        if chat["stream"]:
            return _events(client, result, message_id, model)  # type: ignore[arg-type]
        answer = ChatAnswer.of(result)  # type: ignore[arg-type]
        content: list[Fields] = []
        if answer.reasoning:
            content.append({"type": "thinking", "thinking": answer.reasoning,
                            "signature": client.handles.issue(answer.reasoning)})
        if answer.content:
            content.append({"type": "text", "text": answer.content})
        content += [{"type": "tool_use", "id": call.id, "name": call.name,
                     "input": json_object(call.arguments, "arguments")} for call in answer.calls]
        stop_reason, stop_sequence = _stop(answer)
        return Message.model_validate({"id": message_id, "type": "message", "role": "assistant", "model": model,
                                       "content": content, "stop_reason": stop_reason,
                                       "stop_sequence": stop_sequence, "usage": _usage(answer)})

    async def count_tokens(self, **fields: object) -> dict[str, int]:
        """`{"input_tokens": n}`: the prompt's tokens as a call of these fields would send them (prior turns by the
        ids they were sampled with). Nothing is generated or recorded."""
        client = self._client
        chat, _ = translate(client, {k: v for k, v in fields.items() if k != "max_tokens"}, counting=True)
        client.service.accept_model(chat["model"])
        tools = normalize_tools(chat.get("tools"))
        return {"input_tokens": len(client._chat_prompt_ids(normalize_messages(chat["messages"]), tools, {}))}


async def _events(client: RolloutClient, chunks: AsyncIterator[ChatCompletionChunk], message_id: str, model: str
                  ) -> AsyncIterator[RawMessageStreamEvent]:
    """The Messages event stream of a streamed chat completion, each event one of the SDK's types."""
    index, open_kind, thinking = -1, "", ""

    def event(kind: str, **fields: object) -> RawMessageStreamEvent:
        return _EVENT.validate_python({"type": kind, **fields})

    def close() -> list[RawMessageStreamEvent]:
        nonlocal open_kind
        events = []
        if open_kind == "thinking":
            events.append(event("content_block_delta", index=index,
                                delta={"type": "signature_delta", "signature": client.handles.issue(thinking)}))
        if open_kind:
            events.append(event("content_block_stop", index=index))
        open_kind = ""
        return events

    def start(kind: str, block: Fields) -> list[RawMessageStreamEvent]:
        nonlocal index, open_kind
        events = close()
        index, open_kind = index + 1, kind
        return [*events, event("content_block_start", index=index, content_block=block)]

    yield event("message_start", message={"id": message_id, "type": "message", "role": "assistant", "model": model,
                                          "content": [], "stop_reason": None, "stop_sequence": None,
                                          "usage": {"input_tokens": 0, "output_tokens": 0}})
    async for piece in pieces(chunks):
        if piece.kind == "reasoning":
            if open_kind != "thinking":
                for opening in start("thinking", {"type": "thinking", "thinking": "", "signature": ""}):
                    yield opening
            thinking += piece.text
            yield event("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": piece.text})
        elif piece.kind == "content":
            if open_kind != "text":
                for opening in start("text", {"type": "text", "text": ""}):
                    yield opening
            yield event("content_block_delta", index=index, delta={"type": "text_delta", "text": piece.text})
        elif piece.kind == "call":
            assert piece.call is not None
            for opening in start("tool_use", {"type": "tool_use", "id": piece.call.id, "name": piece.call.name,
                                              "input": {}}):
                yield opening
            arguments = json.dumps(json_object(piece.call.arguments, "arguments"))
            yield event("content_block_delta", index=index, delta={"type": "input_json_delta",
                                                                   "partial_json": arguments})
        else:
            for closing in close():
                yield closing
            assert piece.answer is not None
            stop_reason, stop_sequence = _stop(piece.answer)
            yield event("message_delta", delta={"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                        usage=_usage(piece.answer))
            yield event("message_stop")
