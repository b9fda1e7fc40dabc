"""The relay a harness's container commands take to a container on another node: `<relay> exec ... <id> <command>`.

Owns: the executable a harness is given in place of `podman` (`Relay.client`: a small Python script, its socket's path
written in) and the Unix socket it talks to in the generator's process (mode 0600, one per generator): a command line
`exec [-i] [-w DIR] [-e K=V]... [-u USER] <id> <command...>` goes through the socket to `forward` (the sandbox service
of the container's node runs it there) and its output and exit status come back as `podman exec` would print and
return them. A client killed at its harness's timeout closes its connection: the command is cancelled on the node. A
relay that cannot be reached exits 125, podman's own failure, which scoring reads as the infrastructure's. Does not
own: which node holds the container, or what may run there (`sandbox_nodes`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

Forward = Callable[[list[str], bytes | None], Awaitable[tuple[int, str]]]
RELAY_FAILED = 125  # as `podman exec` exits when podman itself failed
VALUED = ("-w", "--workdir", "-e", "--env", "-u", "--user")  # the relayed exec's options that take a value

# The client: a command line in, the node's output and exit status out. `-S`: it starts in ~15 ms.
CLIENT = r'''#!{python} -S
import base64, json, socket, sys
argv, stdin, i = sys.argv[1:], None, 1
while i < len(argv) and argv[i].startswith("-"):  # exec's options, up to the container id
    if argv[i] in ("-i", "--interactive"):
        stdin = base64.b64encode(sys.stdin.buffer.read()).decode()
    i += 2 if argv[i] in {valued!r} else 1
try:
    relay = socket.socket(socket.AF_UNIX)
    relay.connect({socket!r})
    relay.sendall(json.dumps({{"argv": argv, "stdin": stdin}}).encode() + b"\n")
    answer = json.loads(relay.makefile("rb").readline())
except (OSError, ValueError) as error:
    sys.stderr.write(f"fullasync sandbox relay at {socket!r}: {{error}}\n")
    sys.exit({failed})
sys.stdout.buffer.write(base64.b64decode(answer["output"]))
sys.exit(answer["returncode"])
'''


class Relay:
    """The socket a generator's harness reaches its containers through, and the client script that talks to it."""

    def __init__(self, forward: Forward) -> None:
        self.forward = forward
        self._dir = Path(tempfile.mkdtemp(prefix="fa-relay-", dir="/tmp"))  # short: a socket path has 108 bytes
        self.socket = str(self._dir / "relay.sock")
        self.client = str(self._dir / "podman")
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, self.socket)
        os.chmod(self.socket, 0o600)
        Path(self.client).write_text(CLIENT.format(python=sys.executable, socket=self.socket, failed=RELAY_FAILED,
                                                   valued=VALUED))
        os.chmod(self.client, 0o700)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for path in (self.socket, self.client):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            self._dir.rmdir()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closed: asyncio.Future[bytes] | None = None
        try:
            request = json.loads(await reader.readline())
            stdin = base64.b64decode(request["stdin"]) if request.get("stdin") is not None else None
            call = asyncio.ensure_future(self.forward([str(arg) for arg in request["argv"]], stdin))
            closed = asyncio.ensure_future(reader.read())  # EOF: the client is gone (killed at its timeout)
            await asyncio.wait({call, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                call.cancel()  # the command is abandoned on the node, as a killed `podman exec` abandons it
                return
            try:
                returncode, output = call.result()
            except Exception as error:  # the node's service or the relay itself: podman's own failure
                returncode, output = RELAY_FAILED, f"fullasync sandbox relay: {error}\n"
            answer = {"returncode": returncode, "output": base64.b64encode(output.encode()).decode()}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (OSError, ValueError, KeyError, TypeError):
            return  # a client that sent no request or went away: nothing to answer
        finally:
            if closed is not None:
                closed.cancel()
            writer.close()
