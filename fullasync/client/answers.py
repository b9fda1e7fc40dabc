"""What one chat call's output text means: reasoning, content and tool calls.

Owns: `AnswerFormat`, made per call from the run's parsers and the request (`tools`, `tool_choice`,
`chat_template_kwargs`): the text of the output ids (with special tokens where a parser reads them), the complete
answer (`answer`), and the parts of a growing output that a stream may already send (`partial`). The order is
vLLM's: reasoning is split off first, tool calls are read from the rest; a constrained `tool_choice` ("required" or
a named function) makes the output JSON that is read as calls whatever the tool parser.
Does not own: the parsers (`tool_parsers`, `reasoning`), the constraint itself (`tool_parsers.tool_choice_schema`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from fullasync.client import chat_answers
from fullasync.client.chat_tokens import ChatTokenizer
from fullasync.client.continuation import StitchedGeneration
from fullasync.client.reasoning import ReasoningSplitter
from fullasync.client.tool_parsers import ParsedToolCall, ToolParser, constrained_calls
from fullasync.client.wire_types import JSON, ConstrainedChoice, Tool


@dataclass(frozen=True)
class Answer:
    reasoning: str | None
    content: str | None
    calls: list[ParsedToolCall]


@dataclass(frozen=True)
class AnswerFormat:
    """How one call's output becomes an answer; `parser` is None when the call has no tools (or `tool_choice` is
    "none"), `constrained` the `tool_choice` when it is "required" or a named function."""

    chat_tokens: ChatTokenizer
    parser: ToolParser | None
    tools: Sequence[Tool] = ()
    reasoning: ReasoningSplitter | None = None
    thinks: bool = True  # the output starts inside reasoning (not when the template closed it in the prompt)
    constrained: ConstrainedChoice | None = None
    template_kwargs: JSON = field(default_factory=dict)

    @property
    def keeps_special_tokens(self) -> bool:
        return self.reasoning is not None or (self.parser is not None and self.parser.keeps_special_tokens)

    def text(self, ids: Sequence[int]) -> str:
        """The output's text as the parsers read it: special tokens kept where one of them reads them (a format's
        tags may be special tokens), the closing EOS never."""
        if not self.keeps_special_tokens:
            return self.chat_tokens.decode(ids)
        end = len(ids)
        while end and ids[end - 1] == self.chat_tokens.eos_token_id:
            end -= 1
        return self.chat_tokens.decode(ids[:end], skip_special_tokens=False)

    def visible_text(self, generation: StitchedGeneration) -> str:
        """`text` of the whole output, cut before a matched stop string (as OpenAI does)."""
        return chat_answers.visible_text(self.chat_tokens, generation, self.text)

    def answer(self, text: str) -> Answer:
        reasoning, rest = (self.reasoning.split(text, self.template_kwargs, self.thinks) if self.reasoning
                           else (None, text))
        if self.constrained is not None:
            calls = constrained_calls(rest or "", self.constrained)
            return Answer(reasoning, None if calls else rest, calls)
        if self.parser is None:
            return Answer(reasoning, rest, [])
        content, calls = self.parser.parse(rest or "", self.tools)
        return Answer(reasoning, content, calls)

    def partial(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of a growing output that may be sent already: nothing that a later token could still
        turn into a marker, nothing from a tool call's opening on (nor the whitespace before it), nothing at all of a
        constrained output or of a format whose calls have no opening tag."""
        if self.reasoning is not None:
            reasoning, content = self.reasoning.partial(text, self.thinks)
            if not content:
                return _before_partial(reasoning, (self.reasoning.end,)), ""
        else:
            reasoning, content = "", text
        if self.constrained is not None:
            return reasoning, ""
        if self.parser is not None:
            if self.parser.hold is None:
                return reasoning, ""
            content = before_markers(content, self.parser.hold)
            content = content.rstrip()  # whitespace before a call is trimmed from the answer: sent only if no call
        return reasoning, content


def before_markers(text: str, markers: Sequence[str]) -> str:
    """What of `text` may be sent before the end: up to the first of `markers` in it, and without a suffix that may
    yet become one."""
    return _before_partial(_before_any(text, markers), markers)


def _before_any(text: str, markers: Sequence[str]) -> str:
    """`text` up to the first of `markers` in it."""
    found = [at for at in (text.find(marker) for marker in markers) if at >= 0]
    return text[: min(found)] if found else text


def _before_partial(text: str, markers: Sequence[str]) -> str:
    """`text` without a suffix that is the beginning of one of `markers` (it may yet become the marker)."""
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:size]):
                text = text[:-size]
                break
    return text
