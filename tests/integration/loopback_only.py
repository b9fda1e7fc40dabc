"""A network namespace holding only loopback for a process under test, with the gateway's port reachable in it.

`loopback_only(port)` yields a command prefix: the process it launches runs in a namespace of its own (`unshare
-n`, loopback up, no other interface, so every connection to any other address fails), where a relay listens on
127.0.0.1:`port` — the port the episode's base URL names — and carries each connection through a Unix socket (files
cross namespaces; sockets do not) to the gateway on this side's 127.0.0.1:`port`. A process that reaches anything but
the gateway fails to connect. The relay ends when the process does."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

INSIDE = """
import asyncio, os, sys
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
async def accepted(reader, writer):
    inner_reader, inner_writer = await asyncio.open_unix_connection(sys.argv[1])
    await asyncio.gather(pipe(reader, inner_writer), pipe(inner_reader, writer), return_exceptions=True)
async def main():
    parent = os.getppid()  # the shell that becomes the process under test: the relay ends with it
    server = await asyncio.start_server(accepted, "127.0.0.1", int(sys.argv[2]))
    open(sys.argv[3], "w").close()
    while os.getppid() == parent:
        await asyncio.sleep(0.1)
asyncio.run(main())
"""


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
        script = (f'ip link set lo up && {sys.executable} -c "$0" {socket_path} {port} {ready} >/dev/null 2>&1 & '
                  f'while [ ! -e {ready} ]; do sleep 0.05; done; exec "$@"')
        try:
            yield ["unshare", "--net", "--", "sh", "-c", script, INSIDE]
        finally:
            server.close()
            await server.wait_closed()
