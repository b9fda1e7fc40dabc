"""Parsers that find tool calls in generated text, selected by name.

Owns: the `ToolParser` protocol and the registry of formats. Each parser splits the output text
into plain content and a list of `(name, arguments)` calls; text it cannot parse stays content.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ParsedToolCall:
    name: str
    arguments: dict[str, Any]


class ToolParser(Protocol):
    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]: ...


class HermesToolParser:
    """Hermes / Qwen format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks."""

    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse(self, text: str) -> tuple[str | None, list[ParsedToolCall]]:
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
        arguments = data.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ParsedToolCall(data["name"], arguments)


TOOL_PARSERS: dict[str, type] = {"hermes": HermesToolParser, "qwen": HermesToolParser}


def make_tool_parser(name: str) -> ToolParser:
    try:
        return TOOL_PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; choose one of {sorted(TOOL_PARSERS)}") from None
