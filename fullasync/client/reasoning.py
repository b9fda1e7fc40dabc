"""Reasoning text split from the answer: any reasoning parser registered in vLLM (`ReasoningParserManager`).

Owns: `ReasoningSplitter` — `split(text)` gives `(reasoning, content)` of a complete output, `partial(text)` what of a
growing output may be streamed as each. vLLM's parser is imported only when `model.reasoning_parser` names one.
Does not own: the tokens. Thinking text is sampled like any other text: it stays in the recorded call's output ids
and is trained as such; the split only decides what a harness reads as `reasoning_content` and as `content`.

A template may open or close the thinking section itself in the generation prompt: Qwen3's with
`enable_thinking: false` writes an empty `<think>\\n\\n</think>` there, so the output is all content. `thinks(gen)`
says, from the text the template added for the new turn, whether the output starts inside reasoning.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from fullasync.client.tool_parsers import vllm_chat_request, vllm_tokenizer
from fullasync.client.wire_types import JSON
from fullasync.contracts.tokenizer import Tokenizer

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParser


class ReasoningSplitter:
    """One of vLLM's reasoning parsers (by name), made per set of `chat_template_kwargs` (some read them)."""

    def __init__(self, name: str, tokenizer: Tokenizer) -> None:
        from vllm.reasoning import ReasoningParserManager

        try:
            self._class = ReasoningParserManager.get_reasoning_parser(name)
        except KeyError:
            raise ValueError(f"unknown reasoning parser {name!r}; vLLM's: "
                             f"{ReasoningParserManager.list_registered()}") from None
        self.name = name
        self.tokenizer = tokenizer
        self._parsers: dict[str, ReasoningParser] = {}
        self._request: ChatCompletionRequest | None = None
        parser = self._parser({})
        self.start: str | None = parser.reasoning_start_str
        end: str | None = parser.reasoning_end_str
        if end is None:
            raise ValueError(f"vLLM's reasoning parser {name!r} reads its model's own output protocol (it has no end "
                             "marker to split text at); it cannot be used with this client")
        self.end: str = end

    def _parser(self, template_kwargs: JSON) -> ReasoningParser:
        key = json.dumps(template_kwargs, sort_keys=True)
        if key not in self._parsers:
            try:
                tokenizer = vllm_tokenizer(self.tokenizer)
                self._parsers[key] = self._class(tokenizer, chat_template_kwargs=dict(template_kwargs))
            except (RuntimeError, ValueError, KeyError) as error:  # its marker tokens are not in the vocabulary
                raise ValueError(f"vLLM's reasoning parser {self.name!r} does not fit this model's tokenizer: "
                                 f"{error}") from None
        return self._parsers[key]

    def thinks(self, generation_prompt: str) -> bool:
        """Whether an output after this generation prompt (the text the template added for the new assistant turn)
        starts in reasoning: not when the template already closed the thinking section there."""
        return self.end not in generation_prompt

    def split(self, text: str, template_kwargs: JSON, thinks: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of a complete output; (None, text) when the output starts after reasoning."""
        if not thinks:
            return None, text or None
        if self._request is None:
            self._request = vllm_chat_request()
        reasoning, content = self._parser(template_kwargs).extract_reasoning(text, self._request)
        return reasoning or None, content or None

    def partial(self, text: str, thinks: bool = True) -> tuple[str, str]:
        """(reasoning, content) of an output still growing: until the end marker, all of it is reasoning (the start
        marker left out); after it, the rest is content. `split` of the whole output decides in the end."""
        if not thinks:
            return "", text
        if self.start and text.startswith(self.start):
            text = text[len(self.start) :]
        reasoning, marker, content = text.partition(self.end)
        return reasoning, content if marker else ""
