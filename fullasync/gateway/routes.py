"""HTTP routes of the gateway (Starlette): parse, call the episode's client (through `delivery`: a call is
recorded only when its answer reached the harness; identical retries join it), answer or stream.

Every answer that is not a completion is an OpenAI-style JSON error body: unknown routes (404),
wrong methods (405), malformed bodies (400), engine faults (503) and our own bugs (500, logged).
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fullasync.errors import InvalidRequestError
from fullasync.gateway.delivery import Deliveries, Production
from fullasync.gateway.http import Connection, connection_of
from fullasync.gateway.wire import error_body, error_of, sse

if TYPE_CHECKING:
    from fullasync.gateway.server import Gateway

log = logging.getLogger("fullasync")

CLIENT_CLOSED = 499  # nginx's status for a request whose client went away before the answer

ROUTES_HELP = ("POST /sessions/{key}/v1/chat/completions, POST /sessions/{key}/v1/completions, "
               "GET /sessions/{key}/v1/models, GET /v1/models")


def _error(message: str, status: int, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code), status_code=status, headers=headers)


async def _read_json(gateway: Gateway, request: Request) -> tuple[bytes, Any]:
    """The body as sent, and parsed."""
    raw = await request.body()
    if len(raw) > gateway.max_body_bytes:
        raise OverflowError(f"request body of {len(raw)} bytes exceeds the gateway limit of {gateway.max_body_bytes}")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequestError(f"the request body is not valid JSON: {error}") from None
    except RecursionError:
        raise InvalidRequestError("the request body nests objects or lists too deeply") from None
    if not isinstance(body, dict):
        raise InvalidRequestError(f"the request body must be a JSON object, got {type(body).__name__}")
    return raw, body


def _json(obj: Any) -> str:
    """An openai response object as JSON text, serialised by pydantic-core in one pass (no dict in between)."""
    return obj.model_dump_json(exclude_none=False)


def _chunk_json(chunk: BaseModel) -> str:
    """A streamed chunk as OpenAI and vLLM send one: the fields the chunk set (a delta's text, without nulls for
    the delta's other fields), so a harness that reads the raw JSON and tests `"tool_calls" in delta` sees a
    call only where there is one. (The cost per event is the same either way: `bench/stream_chunks.py`.)"""
    return chunk.model_dump_json(exclude_unset=True)


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body was read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        continue


async def _stream(chunks: Any) -> Any:
    try:
        async for chunk in chunks:
            yield sse(_chunk_json(chunk))
    except Exception as error:  # the status line is sent already: report in the stream, as OpenAI does
        body, status = error_of(error)
        if status >= 500:
            log.exception("gateway: a streamed request failed")
        yield sse(body)
    yield sse("[DONE]")


def _models_body(gateway: Gateway) -> dict[str, Any]:
    name = gateway.service.config.model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                        "owned_by": "fullasync"}]}


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    if error.status_code == 404:
        return _error(f"no route {request.method} {request.url.path}; the gateway serves {ROUTES_HELP}", 404,
                      code="not_found")
    if error.status_code == 405:
        return _error(f"method {request.method} is not allowed on {request.url.path}", 405,
                      code="method_not_allowed", headers=dict(error.headers or {}))
    return _error(str(error.detail), error.status_code)


async def _server_error(request: Request, error: Exception) -> Response:
    log.error("gateway: %s %s failed", request.method, request.url.path, exc_info=error)
    body, status = error_of(error)
    return JSONResponse(body, status_code=status)


def _episode_ended(key: str) -> Response:
    """The answer to a request whose episode ended while it ran (its work was stopped with the episode)."""
    return _error(f"episode {key[:8]}… ended while this request ran; nothing was recorded", 404,
                  code="episode_not_found")


def _sdk_retry(request: Request) -> bool:
    """Whether the openai SDK (or a client generated like it) says this is a retry: its try before returned nothing."""
    count = request.headers.get("x-stainless-retry-count", "0")
    return count.isdigit() and int(count) > 0


class _Delivery(Response):
    """A completion's JSON answer, delivered (its record joins the episode) once written to its connection."""

    def __init__(self, production: Production, connection: Connection | None, body: bytes) -> None:
        super().__init__(body, media_type="application/json")
        self.production, self.connection = production, connection

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        self.production.delivered(self.connection)


def build_app(gateway: Gateway) -> Starlette:
    async def handle(request: Request, kind: str) -> Response:
        response = await answer(request, kind)
        gateway.answered[response.status_code] += 1
        return response

    async def answer(request: Request, kind: str) -> Response:
        key = request.path_params["key"]
        try:
            episode = gateway.lookup(key)
        except LookupError as error:
            return _error(str(error), 404, code="episode_not_found")
        try:
            raw, body = await _read_json(gateway, request)
        except OverflowError as error:
            return _error(str(error), 413, code="request_too_large")
        except InvalidRequestError as error:
            error_json, status = error_of(error)
            return JSONResponse(error_json, status_code=status)
        endpoint = episode.client.chat.completions if kind == "chat" else episode.client.completions
        stream = bool(body.get("stream"))

        async def produce(production: Production) -> None:
            try:
                result = await endpoint.create(**body)
            except Exception as error:
                error_json, status = error_of(error)
                if status >= 500:
                    log.error("gateway: %s %s failed", request.method, request.url.path, exc_info=error)
                production.add(json.dumps(error_json).encode(), status)
                return
            if stream:
                async for piece in _stream(result):
                    production.add(piece)
            else:
                production.add(_json(result).encode())

        request_key = Deliveries.request_key(kind, raw, stream, request.headers.get("idempotency-key"))
        production = gateway.deliveries.production(key, episode.client, request_key, produce,
                                                   sdk_retry=_sdk_retry(request))
        if stream:
            started = await production.started()
            if not started.chunks:
                return _episode_ended(key)
            if started.status != 200:
                return Response(started.chunks[0], status_code=started.status, media_type="application/json")
            return StreamingResponse(production.stream(connection_of(request.scope)), media_type="text/event-stream")
        answered = await production.json(lambda: _disconnected(request))
        if answered is None:
            return Response(status_code=CLIENT_CLOSED)  # nobody reads it; what it generated is not recorded
        if not answered.chunks:
            return _episode_ended(key)
        if answered.status != 200:
            return Response(answered.chunks[0], status_code=answered.status, media_type="application/json")
        return _Delivery(production, connection_of(request.scope), answered.chunks[0])

    async def chat(request: Request) -> Response:
        return await handle(request, "chat")

    async def completions(request: Request) -> Response:
        return await handle(request, "completions")

    async def session_models(request: Request) -> Response:
        try:
            gateway.lookup(request.path_params["key"])
        except LookupError as error:
            return _error(str(error), 404, code="episode_not_found")
        return JSONResponse(_models_body(gateway))

    async def models(request: Request) -> Response:
        return JSONResponse(_models_body(gateway))

    return Starlette(
        routes=[
            Route("/sessions/{key}/v1/chat/completions", chat, methods=["POST"]),
            Route("/sessions/{key}/v1/completions", completions, methods=["POST"]),
            Route("/sessions/{key}/v1/models", session_models, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
