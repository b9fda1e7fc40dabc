"""The one call the built-in tasks make: a chat completion's reply text, through the episode's client."""

from __future__ import annotations

from typing import Any


# `client: Any`: a RolloutClient, whose `create` types its reply as a completion or a stream (no overload on
# `stream`), so a typed client would need a check of what this never asks for
async def reply_text(client: Any, model: str, messages: list[dict[str, str]], **sampling: object) -> str | None:
    """The text of one chat completion of `messages` (`sampling`: the request's other fields)."""
    response = await client.chat.completions.create(model=model, messages=messages, **sampling)
    text: str | None = response.choices[0].message.content
    return text
