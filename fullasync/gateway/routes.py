"""HTTP routes of the gateway (Starlette): parse, call the episode's client, answer or stream."""

from __future__ import annotations

import json
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from fullasync.errors import InvalidRequestError
from fullasync.gateway.server import Gateway, error_body, split_body, sse, status_of


def _error(message: str, status: int, param: str | None = None, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status, param, code), status_code=status)


async def _read_json(gateway: Gateway, request: Request) -> Any:
    raw = await request.body()
    if len(raw) > gateway.max_body_bytes:
        raise OverflowError(f"request body of {len(raw)} bytes exceeds the gateway limit of {gateway.max_body_bytes}")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InvalidRequestError(f"the request body is not valid JSON: {error}") from error


def _dump(obj: Any) -> dict[str, Any]:
    return obj.model_dump(mode="json", exclude_none=False)


async def _stream(chunks: Any) -> Any:
    try:
        async for chunk in chunks:
            yield sse(_dump(chunk))
    except Exception as error:  # the status line is sent already: report in the stream, as OpenAI does
        yield sse(error_body(f"{type(error).__name__}: {error}", status_of(error)))
    yield sse("[DONE]")


def _models_body(gateway: Gateway) -> dict[str, Any]:
    name = gateway.service.config.model_name
    return {"object": "list", "data": [{"id": name, "object": "model", "created": int(time.time()),
                                        "owned_by": "fullasync"}]}


def build_app(gateway: Gateway) -> Starlette:
    async def handle(request: Request, kind: str) -> Response:
        try:
            episode = gateway.lookup(request.path_params["key"])
        except LookupError as error:
            return _error(str(error), 404, code="episode_not_found")
        try:
            kwargs = split_body(await _read_json(gateway, request))
            endpoint = episode.client.chat.completions if kind == "chat" else episode.client.completions
            result = await endpoint.create(**kwargs)
        except OverflowError as error:
            return _error(str(error), 413, code="request_too_large")
        except TypeError as error:  # a misspelt or misplaced field reaches the signature
            return _error(f"invalid request fields: {error}", 400)
        except Exception as error:
            status = status_of(error)
            if status == 500:
                raise
            return _error(str(error), status, getattr(error, "param", None))
        if kwargs.get("stream"):
            return StreamingResponse(_stream(result), media_type="text/event-stream")
        return JSONResponse(_dump(result))

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

    return Starlette(routes=[
        Route("/sessions/{key}/v1/chat/completions", chat, methods=["POST"]),
        Route("/sessions/{key}/v1/completions", completions, methods=["POST"]),
        Route("/sessions/{key}/v1/models", session_models, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
    ])
