"""HTTP routes of the gateway (Starlette): parse, call the episode's client (through `delivery`: a call is
recorded only when its answer reached the harness; identical retries join it), answer or stream.

One code path serves every dialect (`dialects.DIALECTS`: chat completions, completions, the Responses API,
Anthropic Messages, vLLM's token-in generate); the calls that generate nothing (Anthropic's token count, vLLM's
`/tokenize` and `/detokenize`) answer from the episode's client and record nothing. Every answer that is not a
completion is the dialect's JSON error body (OpenAI's, or Anthropic's on the `/messages` routes): unknown episodes
(404), malformed bodies (400), engine faults (503) and our own bugs (500, logged); unknown routes (404) and wrong
methods (405) answer OpenAI-style.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fullasync.client.dialects.turns import Fields
from fullasync.errors import InvalidRequestError
from fullasync.gateway.delivery import Deliveries, Production
from fullasync.gateway.dialects import CHAT, COMPLETIONS, GENERATE, MESSAGES, RESPONSES, Answered, Dialect
from fullasync.gateway.http import Connection, connection_of

if TYPE_CHECKING:
    from fullasync.client import RolloutClient
    from fullasync.gateway.server import Gateway, GatewayEpisode

log = logging.getLogger("fullasync")

CLIENT_CLOSED = 499  # nginx's status for a request whose client went away before the answer

ROUTES_HELP = ("POST /sessions/{key}/v1/chat/completions, POST /sessions/{key}/v1/completions, "
               "POST /sessions/{key}/v1/responses, POST /sessions/{key}/v1/messages, "
               "POST /sessions/{key}/v1/messages/count_tokens, POST /sessions/{key}/inference/v1/generate, "
               "POST /sessions/{key}/tokenize, POST /sessions/{key}/detokenize, GET /sessions/{key}/v1/models, "
               "GET /v1/models; and each POST route without /sessions/{key}, the episode named by the "
               "X-Session-ID header")
SESSION_HEADER = "x-session-id"  # names the episode on the run-wide routes (verifiers' clients send X-Session-ID)


def _episode_key(request: Request) -> str:
    """The episode a request names: the key in its path (`/sessions/{key}/...`), else in its X-Session-ID header
    (the run-wide routes: one base URL, one HTTP client, for every episode of a run)."""
    key = request.path_params.get("key")
    if key is None:
        key = request.headers.get(SESSION_HEADER, "").strip()
        if not key:
            raise LookupError("no episode named: on the run-wide routes (/v1/...) send the header X-Session-ID: "
                              "<the episode's key> (GatewayEpisode.api_key), or use the episode's own base URL")
    return str(key)


def _error(message: str, status: int, param: str | None = None, code: str | None = None,
           headers: dict[str, str] | None = None, dialect: Dialect = CHAT) -> JSONResponse:
    return JSONResponse(dialect.error_body(message, status, param, code), status_code=status, headers=headers)


async def _read_json(gateway: Gateway, request: Request) -> tuple[bytes, Fields]:
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


async def _disconnected(request: Request) -> None:
    """Return when the client closes the connection (the body was read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        continue


async def _stream(chunks: AsyncIterator[BaseModel], dialect: Dialect) -> AsyncIterator[bytes]:
    try:
        async for chunk in chunks:
            yield dialect.event(chunk)
    except Exception as error:  # the status line is sent already: report in the stream, as OpenAI does
        body, status = dialect.error_of(error)
        if status >= 500:
            log.exception("gateway: a streamed request failed")
        yield dialect.stream_error(body)
    if dialect.stream_end:
        yield dialect.stream_end


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
    body, status = CHAT.error_of(error)
    return JSONResponse(body, status_code=status)


def _episode_ended(key: str, dialect: Dialect) -> Response:
    """The answer to a request whose episode ended while it ran (its work was stopped with the episode)."""
    return _error(f"episode {key[:8]}… ended while this request ran; nothing was recorded", 404,
                  code="episode_not_found", dialect=dialect)


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


class _Routes:
    """The gateway's endpoints: each completion route reads the episode and its body, produces the answer once
    (identical retries join it) and delivers it, streamed or whole."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def completion(self, dialect: Dialect) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            response = await self.answer(request, dialect)
            self.gateway.answered[response.status_code] += 1
            return response
        return endpoint

    async def read(self, request: Request, dialect: Dialect) -> tuple[GatewayEpisode, bytes, Fields] | Response:
        """The episode and the body of a request, or the dialect's error answer."""
        try:
            episode = self.gateway.lookup(_episode_key(request))
        except LookupError as error:
            return _error(str(error), 404, code="episode_not_found", dialect=dialect)
        try:
            raw, body = await _read_json(self.gateway, request)
        except OverflowError as error:
            return _error(str(error), 413, code="request_too_large", dialect=dialect)
        except InvalidRequestError as error:
            error_json, status = dialect.error_of(error)
            return JSONResponse(error_json, status_code=status)
        return episode, raw, body

    async def answer(self, request: Request, dialect: Dialect) -> Response:
        received = await self.read(request, dialect)
        if isinstance(received, Response):
            return received
        episode, raw, body = received
        key = episode.api_key
        stream = bool(body.get("stream"))
        request_key = Deliveries.request_key(dialect.name, raw, stream, request.headers.get("idempotency-key"))
        production = self.gateway.deliveries.production(key, episode.client, request_key,
                                                        self.producer(request, dialect, episode, body),
                                                        sdk_retry=_sdk_retry(request))
        if stream:
            started = await production.started()
            if not started.chunks:
                return _episode_ended(key, dialect)
            if started.status != 200:
                return Response(started.chunks[0], status_code=started.status, media_type="application/json")
            return StreamingResponse(production.stream(connection_of(request.scope)), media_type="text/event-stream")
        answered = await production.json(lambda: _disconnected(request))
        if answered is None:
            return Response(status_code=CLIENT_CLOSED)  # nobody reads it; what it generated is not recorded
        if not answered.chunks:
            return _episode_ended(key, dialect)
        if answered.status != 200:
            return Response(answered.chunks[0], status_code=answered.status, media_type="application/json")
        return _Delivery(production, connection_of(request.scope), answered.chunks[0])

    def producer(self, request: Request, dialect: Dialect, episode: GatewayEpisode,
                 body: Fields) -> Callable[[Production], Awaitable[None]]:
        """What generates a request's answer into its production: the episode's client, or a client of its own
        for a model the run does not train (its calls are dropped)."""
        async def produce(production: Production) -> None:
            model = body.get("model")
            if not (isinstance(model, str) and model in self.gateway.untrained_models):
                return await _produce(production, dialect.endpoint(episode.client), body)
            # a model the run does not train: a client of its own, made only when this is not a retry's, dropped
            client = self.gateway.service.client()
            self.gateway.untrained_calls += 1
            try:
                await _produce(production, dialect.endpoint(client),
                               {**body, "model": self.gateway.service.config.model_name})
            finally:
                client.close()

        async def _produce(production: Production, endpoint: Callable[..., Awaitable[Answered]],
                           fields: Fields) -> None:
            try:
                result = await endpoint(**fields)
            except Exception as error:
                error_json, status = dialect.error_of(error)
                if status >= 500:
                    log.error("gateway: %s %s failed", request.method, request.url.path, exc_info=error)
                production.add(json.dumps(error_json).encode(), status)
                return
            if isinstance(result, BaseModel):
                production.add(_json(result).encode())
            else:
                async for piece in _stream(result, dialect):
                    production.add(piece)
        return produce

    def uncounted(self, dialect: Dialect, call: Callable[[RolloutClient], Callable[..., Awaitable[object]]]
                  ) -> Callable[[Request], Awaitable[Response]]:
        """A route that generates and records nothing (a token count, a tokenization): the client's answer."""
        async def endpoint(request: Request) -> Response:
            received = await self.read(request, dialect)
            if isinstance(received, Response):
                return received
            episode, _, body = received
            try:
                answer = await call(episode.client)(**body)
            except InvalidRequestError as error:
                error_json, status = dialect.error_of(error)
                return JSONResponse(error_json, status_code=status)
            if isinstance(answer, BaseModel):
                return Response(_json(answer), media_type="application/json")
            return JSONResponse(answer)
        return endpoint

    async def session_models(self, request: Request) -> Response:
        try:
            self.gateway.lookup(request.path_params["key"])
        except LookupError as error:
            return _error(str(error), 404, code="episode_not_found")
        return JSONResponse(_models_body(self.gateway))

    async def models(self, request: Request) -> Response:
        return JSONResponse(_models_body(self.gateway))


def build_app(gateway: Gateway) -> Starlette:
    routes = _Routes(gateway)
    episode_routes = [  # each under /sessions/{key} (an episode's base URL) and at the root (X-Session-ID names it)
        ("/v1/chat/completions", routes.completion(CHAT)),
        ("/v1/completions", routes.completion(COMPLETIONS)),
        ("/v1/responses", routes.completion(RESPONSES)),
        ("/v1/messages", routes.completion(MESSAGES)),
        ("/v1/messages/count_tokens", routes.uncounted(MESSAGES, lambda client: client.messages.count_tokens)),
        ("/inference/v1/generate", routes.completion(GENERATE)),
        ("/tokenize", routes.uncounted(CHAT, lambda client: client.tokens.tokenize)),
        ("/detokenize", routes.uncounted(CHAT, lambda client: client.tokens.detokenize)),
    ]
    return Starlette(
        routes=[
            *(Route(prefix + path, endpoint, methods=["POST"]) for prefix in ("/sessions/{key}", "")
              for path, endpoint in episode_routes),
            Route("/sessions/{key}/v1/models", routes.session_models, methods=["GET"]),
            Route("/v1/models", routes.models, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
