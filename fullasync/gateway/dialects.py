"""The dialects the gateway speaks, each a row of one table: which client endpoint serves it, its error shape, and
how its streamed events go on the wire.

Owns: `Dialect` and `DIALECTS` (chat completions, completions, the OpenAI Responses API, Anthropic Messages, vLLM's
token-in generate). The
routes are one code path over this table (`routes.py`); the translation of each dialect into the chat path lives in
the client (`fullasync.client.dialects`), so in-process harnesses get the same.
Does not own: routing, delivery, or any translation.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from pydantic import BaseModel

from fullasync.client import RolloutClient
from fullasync.client.dialects.turns import Fields
from fullasync.errors import InvalidRequestError
from fullasync.gateway.wire import error_body, sse, status_of

ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                         429: "rate_limit_error", 499: "invalid_request_error", 503: "overloaded_error"}


def anthropic_error_body(message: str, status: int, param: str | None = None, code: str | None = None
                         ) -> Fields:
    """Anthropic's error object: `{"type": "error", "error": {"type", "message"}}`."""
    return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(status, "api_error"), "message": message}}


def _chunk_json(chunk: BaseModel) -> str:
    """A streamed chat chunk as OpenAI and vLLM send one: the fields the chunk set (a delta's text, without nulls for
    the delta's other fields), so a harness that reads the raw JSON and tests `"tool_calls" in delta` sees a
    call only where there is one. (The cost per event is the same either way: `bench/stream_chunks.py`.)"""
    return chunk.model_dump_json(exclude_unset=True)


def named_event(event: BaseModel) -> bytes:
    """An SSE event named by its `type` (the Responses API and Anthropic Messages stream so)."""
    return f"event: {event.type}\ndata: {event.model_dump_json(exclude_none=True)}\n\n".encode()  # type: ignore[attr-defined]


Answered = BaseModel | AsyncIterator[BaseModel]  # an answer whole, or its stream of chunks or events


@dataclass(frozen=True)
class Dialect:
    name: str
    endpoint: Callable[[RolloutClient], Callable[..., Awaitable[Answered]]]  # the client's `create`
    error_body: Callable[[str, int, str | None, str | None], Fields]
    event: Callable[[BaseModel], bytes]  # one streamed event on the wire
    stream_error: Callable[[Fields], bytes]  # an error after the stream's status line
    stream_end: bytes  # what ends a stream (chat's `data: [DONE]`)

    def error_of(self, error: BaseException) -> tuple[Fields, int]:
        """The dialect's body and status of any error raised while serving a request."""
        status = status_of(error)
        if isinstance(error, InvalidRequestError):
            return self.error_body(str(error), status, error.param, error.code), status
        return self.error_body(f"{type(error).__name__}: {error}", status, None, None), status


def _responses_stream_error(body: Fields) -> bytes:
    error = body["error"]
    payload = {"type": "error", "code": error.get("code"), "message": error["message"], "param": error.get("param"),
               "sequence_number": 0}
    return f"event: error\ndata: {json.dumps(payload)}\n\n".encode()


CHAT = Dialect("chat", lambda client: client.chat.completions.create, error_body,
               lambda chunk: sse(_chunk_json(chunk)), sse, sse("[DONE]"))
COMPLETIONS = Dialect("completions", lambda client: client.completions.create, error_body,
                      lambda chunk: sse(_chunk_json(chunk)), sse, sse("[DONE]"))
RESPONSES = Dialect("responses", lambda client: client.responses.create, error_body, named_event,
                    _responses_stream_error, b"")
def _generate_event(chunk: BaseModel) -> bytes:
    """A streamed generate chunk as vLLM writes one: `prompt_token_ids` only where it is set (the first chunk)."""
    unset = {"prompt_token_ids"} if getattr(chunk, "prompt_token_ids", None) is None else None
    return sse(chunk.model_dump_json(exclude=unset))


MESSAGES = Dialect("messages", lambda client: client.messages.create, anthropic_error_body, named_event,
                   lambda body: f"event: error\ndata: {json.dumps(body)}\n\n".encode(), b"")
GENERATE = Dialect("generate", lambda client: client.tokens.generate, error_body, _generate_event, sse, sse("[DONE]"))
DIALECTS = {dialect.name: dialect for dialect in (CHAT, COMPLETIONS, RESPONSES, MESSAGES, GENERATE)}
