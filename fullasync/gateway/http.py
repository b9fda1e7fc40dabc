"""An ASGI app served by uvicorn as a task of the caller's event loop, on a socket bound first.

Owns: binding (loopback by default; port 0 picks a free one, read back before serving), starting
uvicorn on the running loop and waiting until it serves, and stopping it. The gateway and the
examples' services (e.g. deepresearch's retrieval server) share it. The process's signals stay its owner's:
uvicorn would take SIGTERM / SIGINT for itself while it serves (stop serving at once, then raise the signal again
— a run's one SIGTERM reached it twice and stopped it without its checkpoint, its harnesses cut off first).

Also owns `Connection`, each request's client connection (in its scope at `CONNECTION`): whether it is still open
and how it ended. An answer written to a connection that then ends in a reset before its next request was not read
by its client: TCP resets a connection closed with bytes unread in it, or that bytes reach after it closed — the
openai SDK giving up on a request at its timeout just as the answer arrives. A client that read the answer and then
closed ends it cleanly. (Measured with httpx and a 50 ms timeout racing the answer: 300 requests, each of the 64
written but not returned ended in a reset, each of the 125 returned ended cleanly.) That holds for what was written
last: a client that reads a stream up to the answer's end and closes with the bytes after it unread (the sync openai
SDK stops at `[DONE]`, before the end of the chunked body) resets the connection too.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

START_TIMEOUT_S = 60.0  # a bound on a hang: start() returns as soon as uvicorn serves
STOP_TIMEOUT_S = 30.0
CONNECTION = "fullasync.connection"  # the scope key of a served request's `Connection`


def http_url(host: str, port: int) -> str:
    """`http://host:port`, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Connection:
    """One client connection of a served app: open until lost; what waits for its end until its next request."""

    def __init__(self) -> None:
        self.open = True
        self._watchers: list[Callable[[bool], None]] = []

    def watch(self, ended: Callable[[bool], None]) -> None:
        """`ended(reset)` when this connection ends before its next request: `reset` when TCP reset it (what was
        written to it last was not read), else it closed cleanly (read or not: HTTP cannot tell)."""
        self._watchers.append(ended)

    def next_request(self) -> None:
        """The client sent another request on it: it read every answer before (HTTP/1.1 clients do not pipeline)."""
        self._watchers.clear()

    def lost(self, error: BaseException | None) -> None:
        self.open = False
        watchers, self._watchers = self._watchers, []
        for ended in watchers:
            ended(error is not None)  # an error is a reset (or a broken pipe), not a clean close


def connection_of(scope: Scope) -> Connection | None:
    """The request's connection, when a `ServedApp` serves it (an app called otherwise has none)."""
    return scope.get(CONNECTION)


def _tracking(app: ASGIApp) -> tuple[ASGIApp, type]:
    """`app` with each request's `Connection` in its scope, and the uvicorn protocol that keeps them."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    connections: dict[tuple[str, int], Connection] = {}

    class Tracked(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            if self.client is not None:  # a TCP peer (a Unix socket has no address to tell connections apart)
                connections[self.client] = Connection()

        def connection_lost(self, exc: Exception | None) -> None:
            connection = connections.pop(self.client, None)
            super().connection_lost(exc)
            if connection is not None:
                connection.lost(exc)

    async def tracked(scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        connection = connections.get(tuple(client)) if client else None
        if connection is not None and scope["type"] == "http":
            connection.next_request()
            scope[CONNECTION] = connection
        await app(scope, receive, send)

    return tracked, Tracked


class ServedApp:
    """`await start()` binds and serves `app`; `url` is then valid; `await stop()` ends it."""

    def __init__(self, app: Any, name: str, host: str = "127.0.0.1", port: int = 0, **uvicorn_options: Any) -> None:
        self.app = app
        self.name = name
        self.host = host
        self.port = port
        self.options = {"log_level": "warning", "access_log": False, "lifespan": "off", **uvicorn_options}
        self._server: Any = None
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        return http_url(self.host, self.port)

    async def start(self) -> None:
        import uvicorn

        # IPPROTO_TCP named explicitly: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections of
        # a socket whose protocol says TCP, and a response written as headers then body would otherwise wait for
        # the client's delayed ACK on a kept-alive connection (the cost: docs/benchmarks/figures.md)
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM,
                             socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the process's signals are its owner's, not uvicorn's
                yield

        app, protocol = _tracking(self.app)
        self._server = Server(uvicorn.Config(app, http=protocol, **self.options))
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=self.name)
        for _ in range(int(START_TIMEOUT_S / 0.01)):
            if self._server.started:
                return
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        raise TimeoutError(f"{self.name} on {self.url} did not start within {START_TIMEOUT_S:.0f} s")

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._task, STOP_TIMEOUT_S)
            self._server = None
