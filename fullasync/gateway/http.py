"""An ASGI app served by uvicorn as a task of the caller's event loop, on a socket bound first.

Owns: binding (loopback by default; port 0 picks a free one, read back before serving), starting
uvicorn on the running loop and waiting until it serves, and stopping it. The gateway and the
examples' services (e.g. deepresearch's retrieval server) share it. The process's signals stay its owner's:
uvicorn would take SIGTERM / SIGINT for itself while it serves (stop serving at once, then raise the signal again
— a run's one SIGTERM reached it twice and stopped it without its checkpoint, its harnesses cut off first).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

START_TIMEOUT_S = 60.0  # a bound on a hang: start() returns as soon as uvicorn serves
STOP_TIMEOUT_S = 30.0


def http_url(host: str, port: int) -> str:
    """`http://host:port`, an IPv6 address in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


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
        # the client's delayed ACK on a kept-alive connection (the cost: docs/benchmarks.md, "Figures behind the
        # code")
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_STREAM,
                             socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the process's signals are its owner's, not uvicorn's
                yield

        self._server = Server(uvicorn.Config(self.app, **self.options))
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
