"""Chat template rendering and the token ids that continue an episode without re-tokenization.

Owns: prompt token ids for a chat call. A call that continues the previous turn of its episode
gets `previous prompt + previous output ids` (exactly what the model saw and sampled) followed by
the ids of the text the template inserts between turns (turn closing, tool results, the next
generation prompt). Only that inserted text is tokenized, so earlier turns never drift.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fullasync.client.wire_types import ChatMessage, Tool
from fullasync.contracts.tokenizer import Tokenizer, text
from fullasync.errors import InvalidRequestError


@dataclass(frozen=True)
class TurnState:
    """What a later call needs to extend one returned assistant turn."""

    messages: tuple[ChatMessage, ...]  # the conversation up to and including that assistant turn
    tools: tuple[Tool, ...] | None
    token_ids: tuple[int, ...]  # prompt + output ids of that call
    ended_with_eos: bool  # the output's last token closes the turn (EOS)
    template_kwargs: tuple[tuple[str, object], ...] = ()  # the request's chat_template_kwargs, part of the render


class ChatTokenizer:
    """Wraps a tokenizer with a chat template (a HF one, or the simulator's); all methods are pure functions of their
    input. The client reads text through it only."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        if not tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat_template; chat completions need one")
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token; a chat model's tokenizer names the one ending a turn")
        self.tokenizer = tokenizer
        self.eos_token_id: int = tokenizer.eos_token_id
        self.eos_text = self.decode([self.eos_token_id], skip_special_tokens=False)
        self._shows_tools: bool | None = None  # does the template render `tools`? learnt on the first call with tools

    def render(self, messages: list[ChatMessage], tools: list[Tool] | None,
               generation_prompt: bool, template_kwargs: Mapping[str, object] | None = None) -> str:
        extra = dict(template_kwargs or {})
        try:
            rendered = text(self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt, **extra
            ))
            if tools and self._shows_tools is None:
                without = text(self.tokenizer.apply_chat_template(
                    messages, tools=None, tokenize=False, add_generation_prompt=generation_prompt, **extra
                ))
                self._shows_tools = rendered != without
        except Exception as error:  # jinja raises many types; the user needs to know the template refused
            raise InvalidRequestError(f"the chat template could not render these messages: {error}",
                                      "messages") from error
        if tools and not self._shows_tools:
            raise InvalidRequestError(
                "the model's chat template ignores `tools`, so the model would never see them; set "
                "model.chat_template=chatml-tools (or a template file with a tool section)", "tools"
            )
        return rendered

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return text(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def prompt_ids(self, messages: list[ChatMessage], tools: list[Tool] | None,
                   template_kwargs: Mapping[str, object] | None = None) -> list[int]:
        """Fresh tokenization of a whole conversation, ending with the generation prompt."""
        return self.encode(self.render(messages, tools, generation_prompt=True, template_kwargs=template_kwargs))

    def generation_prompt(self, messages: list[ChatMessage], tools: list[Tool] | None,
                          template_kwargs: Mapping[str, object] | None = None) -> str:
        """The text the template adds to open the next assistant turn (it may open or close a thinking section)."""
        closed = self.render(messages, tools, generation_prompt=False, template_kwargs=template_kwargs)
        opened = self.render(messages, tools, generation_prompt=True, template_kwargs=template_kwargs)
        return opened[len(closed) :] if opened.startswith(closed) else opened

    def continuation_ids(self, turn: TurnState, new_messages: list[ChatMessage]) -> list[int] | None:
        """Ids to append to `turn.token_ids` so the model sees `turn.messages + new_messages`.

        None when the template does not render the conversation as a pure extension (then the
        caller tokenizes afresh, and the call becomes a new training sequence).
        """
        tools = list(turn.tools) if turn.tools else None
        history, kwargs = list(turn.messages), dict(turn.template_kwargs)
        before = self.render(history[:-1], tools, generation_prompt=True, template_kwargs=kwargs)
        with_turn = self.render(history, tools, generation_prompt=False, template_kwargs=kwargs)
        extended = self.render(history + new_messages, tools, generation_prompt=True, template_kwargs=kwargs)
        if not with_turn.startswith(before) or not extended.startswith(with_turn):
            return None
        assistant_section = with_turn[len(before) :]
        closing_at = assistant_section.rfind(self.eos_text)
        if closing_at < 0:
            return None
        if turn.ended_with_eos:
            closing_at += len(self.eos_text)
        return self.encode(assistant_section[closing_at:] + extended[len(with_turn) :])


def model_vocab_size(model_dir: Path | str | None) -> int:
    """Rows of the model's token embedding (`vocab_size` in its config.json; 0 when absent or no
    directory): the ids its engine can sample, which a padded embedding puts beyond the tokenizer's last id."""
    path = Path(model_dir) / "config.json" if model_dir else None
    if path is None or not path.is_file():
        return 0
    config = json.loads(path.read_text(encoding="utf-8"))
    return int(config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 0)
