"""The tokenizer as fullasync uses it: what the client, the chat-template checks and the simulator need.

A Hugging Face `PreTrainedTokenizerBase` satisfies `Tokenizer` as it is (its return types are wider than ours
use: `text()` narrows them); so does the simulator's `SimTokenizer`. Imports nothing from the tokenizer libraries.
"""

from __future__ import annotations

from typing import Any, Protocol


class Tokenizer(Protocol):
    """Encode, decode and render a chat; its length is the number of ids it can decode."""

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def eos_token(self) -> str | None: ...

    @property
    def chat_template(self) -> str | None: ...

    def __len__(self) -> int: ...

    def encode(self, text: str, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = ...) -> object: ...

    # messages and tools as the template reads them (Hugging Face types them loosely: lists of Any, here)
    def apply_chat_template(self, conversation: list[Any], *, tools: list[Any] | None = ...,
                            add_generation_prompt: bool = ..., tokenize: bool = ..., **kwargs: Any) -> object: ...


def text(rendered: object) -> str:
    """What `decode` or `apply_chat_template(tokenize=False)` returned, as the one string it is for one input."""
    if not isinstance(rendered, str):
        raise TypeError(f"the tokenizer returned {type(rendered).__name__} where text was expected")
    return rendered
