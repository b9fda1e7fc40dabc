"""`ServedApp`, the HTTP server under the gateway and the examples' services: loopback, and no Nagle delay."""

from __future__ import annotations

import socket

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from fullasync.gateway.http import ServedApp


async def _echo(request):
    return JSONResponse({"got": len(await request.body())})


async def test_kept_alive_connections_send_without_waiting_for_acks():
    """A response goes out as headers then body; with Nagle's algorithm on, the body waits for the client's
    delayed ACK (~40 ms per request on a kept-alive connection, which every SDK keeps). Every connection the
    server accepts must have TCP_NODELAY set."""
    app = ServedApp(Starlette(routes=[Route("/echo", _echo, methods=["POST"])]), "echo")
    await app.start()
    try:
        assert app.host == "127.0.0.1"
        async with httpx.AsyncClient(base_url=app.url, timeout=120) as client:
            for _ in range(3):  # one kept-alive connection, several requests
                response = await client.post("/echo", content=b"x" * 100)
                assert response.json() == {"got": 100}
            connections = app._server.server_state.connections
            assert len(connections) == 1
            for protocol in connections:
                sock = protocol.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        await app.stop()
