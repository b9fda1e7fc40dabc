"""A network namespace holding only loopback for a process under test, with the gateway's port reachable in it.

`loopback_only(port)` yields a command prefix: the process it launches runs in a namespace of its own (`unshare
-n`, loopback up, no other interface, so every connection to any other address fails), where a relay listens on
127.0.0.1:`port` — the port the episode's base URL names — and carries each connection through a Unix socket (files
cross namespaces; sockets do not) to the gateway on this side's 127.0.0.1:`port`. A process that reaches anything but
the gateway fails to connect. The relay ends when the process does."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()


@contextlib.asynccontextmanager
async def loopback_only(port: int) -> AsyncIterator[list[str]]:
    with tempfile.TemporaryDirectory(prefix="fullasync-netns-") as folder:
        socket_path, ready = Path(folder) / "gateway.sock", Path(folder) / "ready"

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            gateway_reader, gateway_writer = await asyncio.open_connection("127.0.0.1", port)
            await asyncio.gather(_pipe(reader, gateway_writer), _pipe(gateway_reader, writer),
                                 return_exceptions=True)

        server = await asyncio.start_unix_server(accepted, str(socket_path))
        script = (f'ip link set lo up && {sys.executable} {__file__} {socket_path} {port} {ready} >/dev/null 2>&1 & '
                  f'while [ ! -e {ready} ]; do sleep 0.05; done; exec "$@"')
        try:
            yield ["unshare", "--net", "--", "sh", "-c", script, "loopback_only"]
        finally:
            server.close()
            await server.wait_closed()


async def _relay_inside(socket_path: str, port: int, ready: str) -> None:
    """In the namespace: 127.0.0.1:`port` to the Unix socket, until the process under test (the relay's parent, the
    shell that became it) ends."""
    parent = os.getppid()

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inner_reader, inner_writer = await asyncio.open_unix_connection(socket_path)
        await asyncio.gather(_pipe(reader, inner_writer), _pipe(inner_reader, writer), return_exceptions=True)

    await asyncio.start_server(accepted, "127.0.0.1", port)
    Path(ready).touch()
    while os.getppid() == parent:
        await asyncio.sleep(0.1)


if __name__ == "__main__":
    asyncio.run(_relay_inside(sys.argv[1], int(sys.argv[2]), sys.argv[3]))
