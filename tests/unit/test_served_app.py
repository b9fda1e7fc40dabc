"""`ServedApp`, the HTTP server under the gateway and the examples' services: loopback, and no Nagle delay."""

from __future__ import annotations

import asyncio
import socket

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fullasync.gateway.http import ServedApp, connection_of


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


async def test_a_connection_reset_with_its_answer_unread_is_told_apart_from_one_closed_after_reading():
    """What `Connection` tells the gateway: an answer written to a connection its client then closes unread ends
    in a reset (the bytes were in the client's socket; TCP resets it); one the client read and then closed ends
    cleanly; another request on the connection settles what came before."""
    written: asyncio.Queue = asyncio.Queue()

    class Answer(Response):
        async def __call__(self, scope, receive, send):
            await super().__call__(scope, receive, send)
            connection = connection_of(scope)
            unread: list[str] = []
            connection.watch(lambda reset: unread.append("reset" if reset else "closed"))
            await written.put((connection, unread))

    async def answer(request):
        return Answer(b'{"answer": 42}', media_type="application/json")

    app = ServedApp(Starlette(routes=[Route("/answer", answer, methods=["GET"])]), "answers")
    await app.start()
    request = b"GET /answer HTTP/1.1\r\nHost: test\r\n\r\n"
    try:
        async def ask(close_unread: bool, earlier: int = 0) -> list[list[str]]:
            """What each answer's watcher heard: `earlier` answers read first on the same connection."""
            reader, writer = await asyncio.open_connection(app.host, app.port)
            heard = []
            for _ in range(earlier):
                writer.write(request)
                connection, unread = await written.get()
                await reader.readuntil(b'{"answer": 42}')
                heard.append(unread)
            if close_unread:
                writer.transport.pause_reading()  # what arrives now stays in the kernel's buffer, unread
            writer.write(request)
            connection, unread = await written.get()  # the answer is in the client's socket now (loopback)
            heard.append(unread)
            if not close_unread:
                await reader.readuntil(b'{"answer": 42}')
            writer.close()  # with the answer unread: TCP resets the connection
            async with asyncio.timeout(30):
                while connection.open:
                    await asyncio.sleep(0.01)
            return heard

        assert await ask(close_unread=False) == [["closed"]]
        assert await ask(close_unread=True) == [["reset"]]
        assert await ask(close_unread=True, earlier=1) == [[], ["reset"]]  # the second request settled the first
    finally:
        await app.stop()
