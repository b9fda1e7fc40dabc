"""The OpenAI Responses API (`POST /v1/responses`) over the chat path: Codex CLI, the OpenAI Agents SDK.

Owns: `ResponsesEndpoint.create(**fields)` (what `openai.AsyncOpenAI().responses.create` sends), translating
`instructions` and `input` items into chat messages, function / namespaced / custom tools into chat tools, and the
recorded chat answer back into a `Response` or its event stream (`response.created` … `response.completed`).

Items and their chat messages: `message` (user, system, developer, assistant; text parts only), `function_call` and
`custom_tool_call` (an assistant turn's tool calls), `function_call_output` and `custom_tool_call_output` (tool
messages), `reasoning` (the assistant turn's reasoning: its `encrypted_content`, a handle this gateway issued, gives
back the exact reasoning text; else its `content` or `summary` text). Consecutive reasoning, assistant message and
call items form one assistant turn, as this gateway answers them. A namespaced function is a chat tool named
`namespace.name`, answered as a call of `name` with its `namespace`; a custom (free-form) tool is a chat tool with
one string parameter `input`.

Ignored (accepted, warned once, no effect): `store: false`, `include` (but `reasoning.encrypted_content` is always
served with reasoning), `prompt_cache_key`, `metadata`, `user`, `safety_identifier`, `service_tier`, `truncation`,
`reasoning` (the chat template decides whether the policy thinks), `max_tool_calls`, `top_logprobs`,
`stream_options`, `client_metadata`, and server-side tools (`web_search`, `file_search`, `code_interpreter`,
`image_generation`, `mcp`, `tool_search`: never called). Refused with a 400 naming the field: server-side state
(`previous_response_id`, `conversation`, `store: true`: send the whole history, as Codex does), `background`,
`prompt`, non-text input parts. vLLM's sampling extras (`ignore_eos`, `min_p`, `seed`) pass through.
Does not own: generation, recording, validation of the chat request (the chat path), HTTP (the gateway).
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from openai.types.chat import ChatCompletionChunk
from openai.types.responses import (
    Response,
    ResponseCustomToolCall,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseStreamEvent,
    ResponseUsage,
)
from pydantic import TypeAdapter

from fullasync.client.dialects.turns import (
    VLLM_EXTRAS,
    ChatAnswer,
    Fields,
    ToolCall,
    check_fields,
    json_object,
    pieces,
    require,
)
from fullasync.errors import InvalidRequestError

if TYPE_CHECKING:
    from fullasync.client.rollout_client import RolloutClient

API = "POST /v1/responses"
USED = ("model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice",
        "parallel_tool_calls", "stream", "text", "store", *VLLM_EXTRAS)
IGNORED = ("include", "prompt_cache_key", "metadata", "user", "safety_identifier", "service_tier", "truncation",
           "reasoning", "max_tool_calls", "top_logprobs", "stream_options", "prompt_cache_retention", "client_metadata")
STATELESS = "this gateway keeps no responses: send the whole conversation in `input` (with `store: false`)"
REFUSED = {"previous_response_id": STATELESS, "conversation": STATELESS,
           "background": "background responses are not served; send the request without it",
           "prompt": "stored prompt templates are not served; send `instructions` and `input`"}
SERVER_TOOLS = ("web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11",
                "file_search", "code_interpreter", "image_generation", "mcp", "tool_search")
CUSTOM_INPUT = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
_EVENT = TypeAdapter(ResponseStreamEvent)
OutputItem = ResponseReasoningItem | ResponseOutputMessage | ResponseFunctionToolCall | ResponseCustomToolCall
EventOf = Callable[..., ResponseStreamEvent]  # an event of a kind, with its fields
_hex = map(f"{uuid.uuid4().hex[:12]}{{:012x}}".format, itertools.count())


@dataclass(frozen=True)
class _ToolName:
    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass
class _Request:
    """A Responses request translated: the chat fields, and what the answer needs to be written back."""

    chat: Fields
    names: dict[str, _ToolName]  # chat tool name -> the Responses tool it stands for
    body: Fields
    ignored: list[str] = field(default_factory=list)


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    parts: list[object] = require(content, list, where, "a string or a list of text parts")
    texts = []
    for index, given in enumerate(parts):
        part: Fields = require(given, dict, f"{where}[{index}]", "an object")
        if part.get("type") not in ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text"):
            raise InvalidRequestError(f"{where}[{index}] is a {part.get('type')!r} part; this policy reads text "
                                      "parts only (input_text, output_text)", param=where)
        texts.append(require(part.get("text", part.get("refusal")), str, f"{where}[{index}].text", "a string"))
    return "".join(texts)


def _tools(tools: object) -> tuple[list[Fields], dict[str, _ToolName]]:
    listed: list[object] = require(tools, list, "tools", "a list")
    chat: list[Fields] = []
    names: dict[str, _ToolName] = {}

    def add(tool: Fields, where: str, namespace: str | None) -> None:
        kind = tool.get("type")
        name = require(tool.get("name"), str, f"{where}.name", "a string")
        description = tool.get("description") or ""
        if kind == "function":
            parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        elif kind == "custom":
            parameters = CUSTOM_INPUT
        else:
            raise InvalidRequestError(f"{where} is a {kind!r} tool; a namespace holds function and custom tools",
                                      param=where)
        flat = f"{namespace}.{name}" if namespace else name
        chat.append({"type": "function", "function": {"name": flat, "description": description,
                                                      "parameters": parameters}})
        names[flat] = _ToolName(name, namespace, kind == "custom")

    for index, given in enumerate(listed):
        where = f"tools[{index}]"
        tool: Fields = require(given, dict, where, "an object")
        kind = tool.get("type")
        if kind in ("function", "custom"):
            add(tool, where, None)
        elif kind == "namespace":
            namespace = require(tool.get("name"), str, f"{where}.name", "a string")
            for inner, member in enumerate(require(tool.get("tools"), list, f"{where}.tools", "a list")):
                add(require(member, dict, f"{where}.tools[{inner}]", "an object"), f"{where}.tools[{inner}]",
                    namespace)
        elif kind not in SERVER_TOOLS:
            raise InvalidRequestError(f"{where}: {kind!r} tools are not served here (function, custom and namespace "
                                      f"tools are; server-side {SERVER_TOOLS} are accepted and never called)",
                                      param="tools")
    return chat, names


class _Turns:
    """Input items into chat messages: an assistant turn gathers its reasoning, text and calls."""

    def __init__(self, client: RolloutClient, names: dict[str, _ToolName]) -> None:
        self.messages: list[Fields] = []
        self.pending: Fields | None = None
        self.handles = client.handles
        self.flat = {(n.namespace, n.name): flat for flat, n in names.items()}

    def assistant(self, part: str) -> Fields:
        if self.pending is not None and (part == "content" and self.pending.get("tool_calls")
                                         or part == "reasoning" and (self.pending["content"]
                                                                     or self.pending.get("tool_calls"))):
            self.flush()  # a new turn
        if self.pending is None:
            self.pending = {"role": "assistant", "content": ""}
        return self.pending

    def flush(self) -> None:
        if self.pending is not None:
            self.pending["content"] = self.pending["content"] or None
            self.messages.append(self.pending)
            self.pending = None

    def add(self, item: object, where: str) -> None:
        item = require(item, dict, where, "an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequestError(f"{where}.role must be user, system, developer or assistant, got "
                                          f"{role!r}", param="input")
            text = _text(item.get("content"), f"{where}.content")
            if role == "assistant":
                self.assistant("content")["content"] += text
            else:
                self.flush()
                self.messages.append({"role": role, "content": text})
        elif kind in ("function_call", "custom_tool_call"):
            name = require(item.get("name"), str, f"{where}.name", "a string")
            call_id = require(item.get("call_id"), str, f"{where}.call_id", "a string")
            arguments = (json_object(item.get("arguments"), f"{where}.arguments") if kind == "function_call" else
                         {"input": require(item.get("input"), str, f"{where}.input", "a string")})
            flat = self.flat.get((item.get("namespace"), name), name)
            self.assistant("call").setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": flat, "arguments": arguments}})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            self.flush()
            self.messages.append({"role": "tool", "content": _text(item.get("output"), f"{where}.output"),
                                  "tool_call_id": require(item.get("call_id"), str, f"{where}.call_id", "a string")})
        elif kind == "reasoning":
            restored = self.handles.lookup(item.get("encrypted_content"))
            given = item.get("content") or item.get("summary") or []
            text = restored if restored is not None else _text(given, f"{where}.content")
            self.assistant("reasoning")["reasoning_content"] = text
        elif kind == "item_reference":
            raise InvalidRequestError(f"{where}: {STATELESS}", param="input")
        else:
            raise InvalidRequestError(f"{where} is a {kind!r} item; this gateway reads message, function_call, "
                                      "function_call_output, custom_tool_call(_output) and reasoning items",
                                      param="input")


def translate(client: RolloutClient, body: Mapping[str, object]) -> _Request:
    """The chat request a Responses request stands for."""
    ignored = check_fields(body, USED, IGNORED, REFUSED, API)
    if body.get("store"):
        raise InvalidRequestError(f"store: {STATELESS}", param="store")
    chat_tools, names = _tools(body["tools"]) if body.get("tools") else ([], {})
    turns = _Turns(client, names)
    if body.get("instructions") is not None:
        turns.messages.append({"role": "system", "content": require(body["instructions"], str, "instructions",
                                                                    "a string")})
    given = body.get("input")
    if isinstance(given, str):
        turns.messages.append({"role": "user", "content": given})
    else:
        for index, item in enumerate(require(given, list, "input", "a string or a list of items")):
            turns.add(item, f"input[{index}]")
    turns.flush()
    chat: Fields = {"model": body.get("model"), "messages": turns.messages, "stream": bool(body.get("stream"))}
    for name, chat_name in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                            ("parallel_tool_calls", "parallel_tool_calls"), *((extra, extra) for extra in VLLM_EXTRAS)):
        if body.get(name) is not None:
            chat[chat_name] = body[name]
    if chat_tools:
        chat["tools"] = chat_tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = _tool_choice(body["tool_choice"], names)
    if chat["stream"]:
        chat["stream_options"] = {"include_usage": True}
    if (text := body.get("text")) is not None:
        chat.update(_text_format(require(text, dict, "text", "an object")))
    return _Request(chat, names, dict(body), ignored)


def _tool_choice(choice: object, names: dict[str, _ToolName]) -> str | Fields:
    if choice in ("auto", "none", "required"):
        return choice
    choice = require(choice, dict, "tool_choice", '"auto", "none", "required" or {"type": "function", "name": ...}')
    if choice.get("type") in ("function", "custom"):
        name = require(choice.get("name"), str, "tool_choice.name", "a string")
        flat = next((f for f, n in names.items() if n.name == name and n.namespace == choice.get("namespace")), name)
        return {"type": "function", "function": {"name": flat}}
    raise InvalidRequestError(f"tool_choice of type {choice.get('type')!r} is not served (auto, none, required, or "
                              "a named function)", param="tool_choice")


def _text_format(text: Fields) -> Fields:
    """`text.format` as the chat request's `response_format` (`text.verbosity` is ignored)."""
    form = text.get("format")
    if form is None or form == {"type": "text"}:
        return {}
    form = require(form, dict, "text.format", "an object")
    if form.get("type") == "json_object":
        return {"response_format": {"type": "json_object"}}
    if form.get("type") == "json_schema":
        schema = {key: form[key] for key in ("name", "schema", "strict", "description") if key in form}
        return {"response_format": {"type": "json_schema", "json_schema": schema}}
    raise InvalidRequestError(f"text.format of type {form.get('type')!r} is not served (text, json_object, "
                              "json_schema)", param="text.format")


def _call_item(call: ToolCall, names: dict[str, _ToolName], status: str = "completed"
               ) -> ResponseCustomToolCall | ResponseFunctionToolCall:
    tool = names.get(call.name, _ToolName(call.name))
    if tool.custom:
        value = json_object(call.arguments, "arguments").get("input", "")
        return ResponseCustomToolCall(type="custom_tool_call", id=f"ctc_{next(_hex)}", call_id=call.id,
                                      name=tool.name, input=value if isinstance(value, str) else str(value),
                                      namespace=tool.namespace)
    return ResponseFunctionToolCall(type="function_call", id=f"fc_{next(_hex)}", call_id=call.id, name=tool.name,
                                    arguments=call.arguments if status == "completed" else "",
                                    namespace=tool.namespace, status=status)  # type: ignore[arg-type]


def _reasoning_item(client: RolloutClient, text: str, item_id: str, done: bool = True) -> ResponseReasoningItem:
    return ResponseReasoningItem(type="reasoning", id=item_id, summary=[],
                                 content=[{"type": "reasoning_text", "text": text}] if done else None,  # type: ignore[list-item]
                                 encrypted_content=client.handles.issue(text) if done else None,
                                 status="completed" if done else "in_progress")


def _message_item(text: str, item_id: str, done: bool = True) -> ResponseOutputMessage:
    content = [ResponseOutputText(type="output_text", text=text, annotations=[], logprobs=[])] if done else []
    return ResponseOutputMessage(type="message", id=item_id, role="assistant", content=content,  # type: ignore[arg-type]
                                 status="completed" if done else "in_progress")


def _response(request: _Request, response_id: str, created: float, output: list[OutputItem],
              answer: ChatAnswer | None) -> Response:
    body = request.body
    incomplete = answer is not None and answer.finish == "length"
    usage = None if answer is None else ResponseUsage(
        input_tokens=answer.usage.prompt_tokens, output_tokens=answer.usage.completion_tokens,
        total_tokens=answer.usage.prompt_tokens + answer.usage.completion_tokens,
        input_tokens_details={"cached_tokens": 0, "cache_write_tokens": 0},  # type: ignore[arg-type]
        output_tokens_details={"reasoning_tokens": 0})  # type: ignore[arg-type]
    choice: Literal["none", "auto", "required"] = (body["tool_choice"] if body.get("tool_choice") in
                                                   ("auto", "none", "required") else "auto")
    return Response(id=response_id, object="response", created_at=created, model=str(body.get("model")),
                    output=list(output), parallel_tool_calls=body.get("parallel_tool_calls") is not False,
                    tool_choice=choice, tools=[], instructions=body.get("instructions"),
                    max_output_tokens=body.get("max_output_tokens"), temperature=body.get("temperature"),
                    top_p=body.get("top_p"), usage=usage,
                    status="in_progress" if answer is None else "incomplete" if incomplete else "completed",
                    incomplete_details={"reason": "max_output_tokens"} if incomplete else None)  # type: ignore[arg-type]


class ResponsesEndpoint:
    """`client.responses`: `create(**fields)` as `openai.AsyncOpenAI().responses.create`."""

    def __init__(self, client: RolloutClient) -> None:
        self._client = client

    async def create(self, **fields: object) -> Response | AsyncIterator[ResponseStreamEvent]:
        client = self._client
        request = translate(client, fields)
        client.service.note_ignored(request.ignored)
        result = await client.chat.completions.create(**request.chat)
        response_id, created = f"resp_{next(_hex)}", time.time()
        if request.chat["stream"]:
            return _events(client, request, result, response_id, created)  # type: ignore[arg-type]
        answer = ChatAnswer.of(result)  # type: ignore[arg-type]
        output: list[OutputItem] = []
        if answer.reasoning:
            output.append(_reasoning_item(client, answer.reasoning, f"rs_{next(_hex)}"))
        if answer.content:
            output.append(_message_item(answer.content, f"msg_{next(_hex)}"))
        output += [_call_item(call, request.names) for call in answer.calls]
        return _response(request, response_id, created, output, answer)


async def _events(client: RolloutClient, request: _Request, chunks: AsyncIterator[ChatCompletionChunk],
                  response_id: str, created: float) -> AsyncIterator[ResponseStreamEvent]:
    """The Responses event stream of a streamed chat completion, each event one of the SDK's types."""
    sequence = itertools.count()
    output: list[OutputItem] = []
    open_item: Fields | None = None  # the reasoning or message item being streamed

    def event(kind: str, **fields: object) -> ResponseStreamEvent:
        return _EVENT.validate_python({"type": kind, "sequence_number": next(sequence), **fields})

    def close() -> list[ResponseStreamEvent]:
        nonlocal open_item
        if open_item is None:
            return []
        item, index, text = open_item["id"], open_item["index"], open_item["text"]
        done: ResponseReasoningItem | ResponseOutputMessage
        if open_item["kind"] == "reasoning":
            done = _reasoning_item(client, text, item)
            events = [event("response.reasoning_text.done", item_id=item, output_index=index, content_index=0,
                            text=text)]
        else:
            message = done = _message_item(text, item)
            part = message.content[0].model_dump()
            events = [event("response.output_text.done", item_id=item, output_index=index, content_index=0,
                            text=text, logprobs=[]),
                      event("response.content_part.done", item_id=item, output_index=index, content_index=0,
                            part=part)]
        output.append(done)
        open_item = None
        return [*events, event("response.output_item.done", output_index=index, item=done.model_dump())]

    def opened(kind: str) -> list[ResponseStreamEvent]:
        nonlocal open_item
        events = close() if open_item is not None and open_item["kind"] != kind else []
        if open_item is not None:
            return events
        item, index = f"{'rs' if kind == 'reasoning' else 'msg'}_{next(_hex)}", len(output)
        open_item = {"kind": kind, "id": item, "index": index, "text": ""}
        shell = _reasoning_item(client, "", item, done=False) if kind == "reasoning" else _message_item("", item, False)
        events.append(event("response.output_item.added", output_index=index, item=shell.model_dump()))
        if kind == "content":
            events.append(event("response.content_part.added", item_id=item, output_index=index, content_index=0,
                                part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        return events

    start = _response(request, response_id, created, [], None).model_dump()
    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    async for piece in pieces(chunks):
        if piece.kind in ("reasoning", "content"):
            for opening in opened(piece.kind):
                yield opening
            assert open_item is not None
            open_item["text"] += piece.text
            kind = "response.reasoning_text.delta" if piece.kind == "reasoning" else "response.output_text.delta"
            extra: Fields = {} if piece.kind == "reasoning" else {"logprobs": []}
            yield event(kind, item_id=open_item["id"], output_index=open_item["index"], content_index=0,
                        delta=piece.text, **extra)
        elif piece.kind == "call":
            assert piece.call is not None
            for closing in close():
                yield closing
            yield from_call(event, output, piece.call, request.names)
            for call_event in call_events(event, output, piece.call, request.names):
                yield call_event
        else:
            for closing in close():
                yield closing
            final = _response(request, response_id, created, output, piece.answer)
            kind = "response.incomplete" if final.status == "incomplete" else "response.completed"
            yield event(kind, response=final.model_dump())


def from_call(event: EventOf, output: list[OutputItem], call: ToolCall, names: dict[str, _ToolName]
              ) -> ResponseStreamEvent:
    """`response.output_item.added` of a tool call about to stream."""
    shell = _call_item(call, names, status="in_progress")
    output.append(shell)
    return event("response.output_item.added", output_index=len(output) - 1, item=shell.model_dump())


def call_events(event: EventOf, output: list[OutputItem], call: ToolCall, names: dict[str, _ToolName]
                ) -> list[ResponseStreamEvent]:
    """A tool call's arguments (one delta: the chat path parses a call whole) and its `output_item.done`."""
    index, shell = len(output) - 1, output[-1]
    done = _call_item(call, names)
    done.id = shell.id
    output[index] = done
    if isinstance(done, ResponseCustomToolCall):
        events = [event("response.custom_tool_call_input.delta", item_id=done.id, output_index=index,
                        delta=done.input),
                  event("response.custom_tool_call_input.done", item_id=done.id, output_index=index,
                        input=done.input)]
    else:
        events = [event("response.function_call_arguments.delta", item_id=done.id, output_index=index,
                        delta=done.arguments),
                  event("response.function_call_arguments.done", item_id=done.id, output_index=index,
                        name=done.name, arguments=done.arguments)]
    return [*events, event("response.output_item.done", output_index=index, item=done.model_dump())]
