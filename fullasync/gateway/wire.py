"""What the gateway writes on the wire besides completions: OpenAI-style error bodies, their HTTP statuses, and
server-sent events.

Owns: the error object's shape and which error is the caller's (4xx) or an engine's (503). Does not own: routing
(`routes.py`) or the episodes (`server.py`); it imports neither.
"""

from __future__ import annotations

import json
from typing import Any

from fullasync.errors import EngineDiedError, EngineResumeTimeoutError, InvalidRequestError


def error_body(message: str, status: int, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code or str(status)}}


def status_of(error: BaseException) -> int:
    """HTTP status for an error of the request path: 4xx for the caller's mistakes, 503 for engine faults."""
    if isinstance(error, InvalidRequestError):
        return 400
    if isinstance(error, (EngineDiedError, EngineResumeTimeoutError, TimeoutError)):
        return 503
    return 500


def sse(payload: object) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()
