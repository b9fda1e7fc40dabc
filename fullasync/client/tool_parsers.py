"""Parsers that find tool calls in generated text, selected by name: ours (Hermes) or any of vLLM's.

Owns: the `ToolParser` protocol, our tolerant Hermes parser, the adapter that runs any parser registered in vLLM's
`ToolParserManager` (imported only when one is named: importing vLLM's parsers costs seconds), and the calls a
constrained `tool_choice` ("required" or a named function): the request's choice checked against its tools
(`constrained_choice`), and the calls it produced, read from their JSON.
Each parser splits the output text into plain content and a list of `(name, arguments)` calls; text it cannot parse
stays content; `tool_choice_schema` is the JSON schema a constrained `tool_choice` holds the output to.

`hold` says what a stream may send as content before the answer is complete: the text before the first of the
`hold` strings (a call's opening tag), or, where it is None, nothing (a format such as `llama3_json` has no opening
tag: its call is JSON from the first character, so the stream keeps all text until the end and parses it then).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, cast

from fullasync.client.request_schema import NamedToolChoice
from fullasync.client.wire_types import JSON, ConstrainedChoice, Tool
from fullasync.contracts.tokenizer import Tokenizer
from fullasync.errors import InvalidRequestError

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tokenizers import TokenizerLike

OURS = ("hermes", "qwen")  # our parser's names; `vllm:NAME` asks for vLLM's parser of a name we also use
VLLM_PREFIX = "vllm:"


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: JSON


class ToolParser(Protocol):
    hold: tuple[str, ...] | None  # a stream sends content only before these strings (None: none before the end)
    keeps_special_tokens: bool  # reads the output decoded with its special tokens (a format's tags may be ones)

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str | None, list[ParsedToolCall]]: ...


class HermesToolParser:
    """Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks. Tolerant: a block
    that does not parse stays content and the others are still calls (vLLM's Hermes parser drops them all)."""

    hold: tuple[str, ...] | None = ("<tool_call>",)
    keeps_special_tokens = False
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse(self, text: str, tools: Sequence[Tool] = ()) -> tuple[str | None, list[ParsedToolCall]]:
        calls: list[ParsedToolCall] = []
        kept: list[str] = []
        position = 0
        for match in self._block.finditer(text):
            call = self._parse_call(match.group(1))
            if call is None:
                continue
            kept.append(text[position : match.start()])
            position = match.end()
            calls.append(call)
        kept.append(text[position:])
        content = "".join(kept).strip() if calls else text
        return (content or None), calls

    @staticmethod
    def _parse_call(body: str) -> ParsedToolCall | None:
        try:
            data = json.loads(body)
        except json.JSONDecodeError:
            return None
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            return None
        return _call(data["name"], data.get("arguments", {}))


def _call(name: object, arguments: object) -> ParsedToolCall | None:
    """A call from a name and arguments given as an object or its JSON text; None when they are not that."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (json.JSONDecodeError, RecursionError):
            return None
    if not isinstance(name, str) or not isinstance(arguments, dict):  # an empty name is the policy's to answer for
        return None
    return ParsedToolCall(name, arguments)


class VLLMToolParser:
    """Any tool parser registered in vLLM (`ToolParserManager`), run on the complete output text.

    vLLM's parsers read the output with its special tokens (`[TOOL_CALLS]`, `<|python_tag|>`, DeepSeek's call
    markers); a call whose arguments are not a JSON object keeps the whole output as content, as vLLM's own
    serving layer would return it unparsed."""

    hold: tuple[str, ...] | None = None
    keeps_special_tokens = True

    def __init__(self, name: str, tokenizer: Tokenizer) -> None:
        from vllm.tool_parsers import ToolParserManager

        try:
            parser_class = ToolParserManager.get_tool_parser(name)
        except KeyError:
            raise ValueError(f"unknown tool parser {name!r}; ours: {list(OURS)}; vLLM's: "
                             f"{ToolParserManager.list_registered()}") from None
        self.name = name
        try:
            self._parser = parser_class(vllm_tokenizer(tokenizer))
        except (RuntimeError, ValueError, KeyError) as error:  # vLLM's parsers refuse tokenizers without their tokens
            raise ValueError(f"vLLM's tool parser {name!r} does not fit this model's tokenizer: {error}") from None
        self._requests: dict[str, ChatCompletionRequest] = {}

    def parse(self, text: str, tools: Sequence[Tool] = ()) -> tuple[str | None, list[ParsedToolCall]]:
        found = self._parser.extract_tool_calls(text, self._request(tools))
        if not found.tools_called:
            return (found.content if found.content is not None else text) or None, []
        calls = [_call(call.function.name, call.function.arguments) for call in found.tool_calls]
        if not calls or None in calls:
            return text or None, []
        return (found.content.strip() if found.content else None) or None, [c for c in calls if c is not None]

    def _request(self, tools: Sequence[Tool]) -> ChatCompletionRequest:
        """The chat request vLLM's parsers read the tools from (some convert argument types by their schema)."""
        key = json.dumps(list(tools), sort_keys=True)
        if key not in self._requests:
            self._requests[key] = vllm_chat_request(tools)
        return self._requests[key]


def vllm_tokenizer(tokenizer: Tokenizer) -> TokenizerLike:
    """`tokenizer` as vLLM's parsers are typed to take it: they read a Hugging Face tokenizer's vocabulary and
    special tokens (its `TokenizerLike` lists more than they use), and refuse one without their markers."""
    return cast("TokenizerLike", tokenizer)


def vllm_chat_request(tools: Sequence[Tool] = ()) -> ChatCompletionRequest:
    """A chat request as vLLM's parsers take it (they read its tools, and some its chat_template_kwargs)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_validate({"model": "policy", "messages": [{"role": "user", "content": ""}],
                                                 "tools": list(tools) or None})


def make_tool_parser(name: str, tokenizer: Tokenizer | None = None) -> ToolParser:
    """Ours for `hermes`/`qwen`; vLLM's registered parser for any other name (or `vllm:NAME`)."""
    if name in OURS:
        return HermesToolParser()
    if tokenizer is None:
        raise ValueError(f"tool parser {name!r} is vLLM's and needs the model's tokenizer")
    return VLLMToolParser(name.removeprefix(VLLM_PREFIX), tokenizer)


def constrained_choice(tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None,
                       tools: Sequence[Tool] | None) -> ConstrainedChoice | None:
    """`tool_choice` as a constraint on the output ("required" or `{"type": "function", "function": {"name": ...}}`
    naming one of `tools`), or None when the policy chooses ("auto") or may not call ("none")."""
    if not isinstance(tool_choice, NamedToolChoice):
        return "required" if tool_choice == "required" else None
    name = tool_choice.function.name
    names = [tool["function"]["name"] for tool in tools or ()]
    if name not in names:
        raise InvalidRequestError(f"tool_choice names the function {name!r}, which is not among the request's tools "
                                  f"{names}", param="tool_choice")
    return {"type": "function", "function": {"name": name}}


def constrained_calls(text: str, tool_choice: ConstrainedChoice) -> list[ParsedToolCall]:
    """The calls an output constrained by `tool_choice` holds: for a named function, its arguments object; for
    "required", a list of `{"name": ..., "parameters": {...}}` (vLLM's wire form). [] when the output is not that
    (a length-cut JSON, say): then it stays content."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return []
    if not isinstance(tool_choice, str):
        call = _call(tool_choice["function"]["name"], data)
        return [call] if call is not None else []
    if not isinstance(data, list):
        return []
    calls = [_call(item.get("name"), item.get("parameters", {})) if isinstance(item, dict) else None for item in data]
    return [] if None in calls else [c for c in calls if c is not None]


def tool_choice_schema(tool_choice: ConstrainedChoice, tools: Sequence[Tool], parallel: bool = True) -> JSON:
    """The JSON schema a constrained `tool_choice` holds the output to (as vLLM does): a named function's
    parameters, or for "required" a non-empty list of `{"name": one of the tools, "parameters": its schema}` (one
    item at most when `parallel` is false)."""
    functions: dict[str, JSON] = {tool["function"]["name"]: tool["function"].get("parameters") or {"type": "object"}
                                  for tool in tools}
    if not isinstance(tool_choice, str):
        return functions[tool_choice["function"]["name"]]
    schema: JSON = {"type": "array", "minItems": 1, "items": {"anyOf": [
        {"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
         "required": ["name", "parameters"]}
        for name, parameters in functions.items()]}}
    if not parallel:
        schema["maxItems"] = 1
    return schema
