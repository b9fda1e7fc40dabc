"""smolagents 1.26's streaming `ToolCallingAgent`, unchanged, through the gateway: every answer it acted on is
recorded and trained (issue 69). Its sync openai SDK reads a stream up to `[DONE]` and closes the connection with
the end of the chunked body unread, which TCP answers with a reset when those bytes came in before the close; and it
sends each turn back rewritten (its tool calls as "Calling tools:" text), so no request goes on from a recorded turn
token for token. Which close comes is a race (a reset for ~1 % of streams on loopback), made certain here at the
edges: the network delays the end of each chunked body (`LateBodyEnds`), and every other episode's harness is slow
to close (`smolagents_episodes.py`): a reset; the others close before the end comes: a clean close.

smolagents is not in the project's lock: it runs in a venv of its own, built from requirements/smolagents-lock.txt
under `$FULLASYNC_CACHE_DIR` (~25 s the first time, nothing after). The engine is the edge fake (`ScriptedEngine`)
that answers each call with the tool call a test scripted; the gateway and the client are real."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from pathlib import Path

import httpx
import psutil
import pytest
from scripted_engine import ScriptedEngine
from side_venvs import venv_python

from fullasync.client import ClientConfig, RolloutService
from fullasync.gateway import Gateway

HERE = Path(__file__).parent
EPISODES = 8
ADDS = ((1, 2), (3, 3), (6, 4))  # each episode: three calls of `add`, then `final_answer`
END_OF_BODY = b"0\r\n\r\n"  # the last chunk of a chunked HTTP body
LATE_S = 0.02  # how late the network brings it (the slow harness closes later: `smolagents_episodes.SLOW_CLOSE_S`)


@pytest.fixture(scope="module")
def smolagents_python() -> Path:
    """The interpreter of a venv with smolagents (`side_venvs`, from requirements/smolagents-lock.txt)."""
    return venv_python("smolagents")


class LateBodyEnds:
    """A TCP relay in front of the gateway that forwards the end of each chunked body `LATE_S` after the bytes before
    it (a network delaying one segment), and a harness's close to the gateway as it came: a reset as a reset."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for relay in self._relays:
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        relay = asyncio.ensure_future(self._relay(reader, writer))
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)

    async def _relay(self, harness_reader: asyncio.StreamReader, harness_writer: asyncio.StreamWriter) -> None:
        gateway_reader, gateway_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        down = asyncio.ensure_future(self._down(gateway_reader, harness_writer))
        try:
            while data := await harness_reader.read(1 << 16):
                gateway_writer.write(data)
            gateway_writer.close()  # the harness closed cleanly
        except ConnectionResetError:  # the harness reset: so does the relay (a close with SO_LINGER 0)
            gateway_writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                               struct.pack("ii", 1, 0))
            gateway_writer.transport.abort()
        finally:
            await asyncio.gather(down, return_exceptions=True)
            harness_writer.transport.abort()

    async def _down(self, gateway_reader: asyncio.StreamReader, harness_writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await gateway_reader.read(1 << 16):
                head, end = (data[:-len(END_OF_BODY)], END_OF_BODY) if data.endswith(END_OF_BODY) else (data, b"")
                harness_writer.write(head)
                if end:
                    await asyncio.sleep(LATE_S)
                    harness_writer.write(end)


def reply(chat, name: str, parameters: dict) -> list[int]:
    """A `tool_choice="required"` answer as vLLM constrains it (the calls' JSON), ended by EOS."""
    return chat.encode(json.dumps([{"name": name, "parameters": parameters}], separators=(",", ":"))) + [
        chat.eos_token_id]


async def connections_closed(port: int) -> None:
    """Until the server of this process listening on `port` has no client connection left (asyncio closes a socket
    after its protocol saw the connection end)."""
    async with asyncio.timeout(30):
        while [c for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.laddr.port == port]:
            await asyncio.sleep(0.01)


async def test_every_answer_the_streaming_agent_acted_on_is_recorded_and_trained(smolagents_python, tokenizer,
                                                                                 tmp_path):
    engine = ScriptedEngine()
    service = RolloutService([engine], tokenizer, ClientConfig(max_model_len=8192))
    chat = service.chat_tokens
    gateway = Gateway(service)
    await gateway.start()
    network = LateBodyEnds(httpx.URL(gateway.url).port)
    await network.start()
    try:
        episodes = [gateway.open_episode() for _ in range(EPISODES)]
        answers = [reply(chat, "add", {"a": a, "b": b}) for a, b in ADDS] + [
            reply(chat, "final_answer", {"answer": "10"})]
        engine.script += answers * EPISODES
        (tmp_path / "episodes.json").write_text(json.dumps(
            [{"base_url": str(httpx.URL(e.base_url).copy_with(port=network.port)), "api_key": e.api_key,
              "slow_close": index % 2 == 1}
             for index, e in enumerate(episodes)]))
        harness = await asyncio.create_subprocess_exec(
            str(smolagents_python), str(HERE / "smolagents_episodes.py"), str(tmp_path / "episodes.json"),
            str(tmp_path / "result.json"), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        async with asyncio.timeout(120):
            output, _ = await harness.communicate()
        assert harness.returncode == 0, output.decode()[-3000:]
        await connections_closed(network.port)
        await connections_closed(httpx.URL(gateway.url).port)
        results = json.loads((tmp_path / "result.json").read_text())
        assert engine.script == []
        lost = []
        for index, (episode, result) in enumerate(zip(episodes, results, strict=True)):
            acted_on = [[{"name": "add", "arguments": {"a": a, "b": b}}] for a, b in ADDS]
            assert result == {"answer": "10", "steps": [*acted_on, [{"name": "final_answer",
                                                                      "arguments": {"answer": "10"}}]]}, result
            calls = episode.client.episode.calls
            trained = episode.client.episode.settled_calls()  # what its trajectory holds
            if [list(call.output_ids) for call in calls] != answers or trained != calls:
                lost.append(f"episode {index}: {len(result['steps'])} answers acted on, {len(calls)} recorded, "
                            f"{len(trained)} trained")
            gateway.close_episode(episode)
        print(f"\n{EPISODES} episodes, {EPISODES * (len(ADDS) + 1)} streamed answers; gateway "
              f"unread_calls={gateway.deliveries.unread_calls}")
        assert not lost, "\n".join(lost)
    finally:
        await network.stop()
        await gateway.stop()
