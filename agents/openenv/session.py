"""One episode's session on an OpenEnv server (its WebSocket protocol, `/ws`), and the default text agent.

Owns: the session (`reset` / `step` / `close` messages; each answer an observation, its reward and done, or an
error), what an error means here (a session the server refuses or loses — capacity, factory, session errors, a
dropped connection — is the infrastructure's, `OpenEnvServerError`; an action that does not validate is the
policy's, `PolicyOutputError`; the environment raising in `step` is the episode's, `OpenEnvEpisodeError`), and the
default prompt and action parser for text environments: the observation's fields as JSON in the user turn, the
reply as the action's one required text field, or as a JSON object of its fields. Does not own: the server process
(`process.py`) or the loop (`generator.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection

from fullasync.errors import PolicyOutputError
from fullasync_agents.openenv.process import OpenEnvServerError

OPEN_TIMEOUT_S = 60.0
MAX_MESSAGE = 64 * 1024 * 1024
INFRA_CODES = ("CAPACITY_REACHED", "FACTORY_ERROR", "SESSION_ERROR", "INVALID_JSON", "UNKNOWN_TYPE")
HIDDEN = ("metadata", "reward", "done")  # an observation's fields the policy is not shown by default
JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)

Observation = dict[str, Any]  # the observation's own fields, as the server sent them (JSON)


class OpenEnvEpisodeError(RuntimeError):
    """The environment raised while it stepped (openenv's EXECUTION_ERROR): the episode failed, as the harness's."""


@dataclass(frozen=True)
class Answer:
    """What the server answered a reset or a step."""

    observation: Observation
    reward: float | None
    done: bool


class Session:
    """One WebSocket session: an environment instance of the server's, this episode's alone."""

    def __init__(self, socket: ClientConnection, url: str) -> None:
        self.socket = socket
        self.url = url

    @classmethod
    async def open(cls, url: str) -> Session:
        try:
            socket = await websockets.connect(url, open_timeout=OPEN_TIMEOUT_S, max_size=MAX_MESSAGE,
                                              ping_interval=None, proxy=None)
        except (OSError, TimeoutError, websockets.InvalidHandshake) as error:
            raise OpenEnvServerError(f"the OpenEnv server at {url} refused a session: {error}") from error
        return cls(socket, url)

    async def reset(self, options: Mapping[str, Any]) -> Answer:
        return await self._ask({"type": "reset", "data": dict(options)}, "reset")

    async def step(self, action: Mapping[str, Any]) -> Answer:
        return await self._ask({"type": "step", "data": dict(action)}, "step")

    async def close(self) -> None:
        try:
            await self.socket.send(json.dumps({"type": "close"}))
        except websockets.ConnectionClosed:
            pass
        await self.socket.close()

    async def _ask(self, message: Mapping[str, Any], what: str) -> Answer:
        try:
            await self.socket.send(json.dumps(message))
        except websockets.ConnectionClosed:
            pass  # a server that refuses a session says why, then closes it: its reason is still there to read
        try:
            reply = json.loads(await self.socket.recv())
        except websockets.ConnectionClosed as error:
            raise OpenEnvServerError(f"the OpenEnv server at {self.url} closed the session during {what}: "
                                     f"{error}") from error
        data = reply.get("data") or {}
        if reply.get("type") == "error":
            code = str(data.get("code", ""))
            text = f"the OpenEnv environment refused the {what} ({code}): {data.get('message', '')}"
            if code == "VALIDATION_ERROR" and what == "step":
                raise PolicyOutputError(f"{text}; the action {json.dumps(message['data'])[:300]} does not validate: "
                                        f"{json.dumps(data.get('errors', []))[:600]}")
            if code in INFRA_CODES or what == "reset":
                raise OpenEnvServerError(text)
            raise OpenEnvEpisodeError(text)
        if reply.get("type") != "observation":
            raise OpenEnvServerError(f"the OpenEnv server answered a {what} with {str(reply)[:300]}")
        reward = data.get("reward")
        return Answer(dict(data.get("observation") or {}), None if reward is None else float(reward),
                      bool(data.get("done")))


def shown(observation: Observation) -> str:
    """The default user turn: the observation's fields (less metadata) as JSON."""
    return json.dumps({key: value for key, value in observation.items() if key not in HIDDEN}, ensure_ascii=False)


def text_field(action_schema: Mapping[str, Any]) -> str | None:
    """The action's one required text field (a text environment's action), if that is all it requires."""
    required = list(action_schema.get("required") or [])
    properties = action_schema.get("properties") or {}
    if len(required) == 1 and (properties.get(required[0]) or {}).get("type") == "string":
        return str(required[0])
    return None


def parsed_action(reply: str, action_schema: Mapping[str, Any]) -> dict[str, Any]:
    """The default parser: the reply as the action's one text field, else the last JSON object in it."""
    field = text_field(action_schema)
    if field is not None:
        return {field: reply}
    match = JSON_OBJECT.search(reply)
    try:
        action = json.loads(match.group(0)) if match else None
    except json.JSONDecodeError:
        action = None
    if not isinstance(action, dict):
        raise PolicyOutputError(f"the reply holds no JSON object of the action's fields "
                                f"({sorted(action_schema.get('properties') or {})}): {reply[:300]!r}")
    return action


def default_system_prompt(action_schema: Mapping[str, Any]) -> str:
    field = text_field(action_schema)
    about = str(action_schema.get("description") or "").strip()
    if field is not None:
        return (f"You act in an environment. Each turn shows what you observe; your whole reply is the action's "
                f"{field}. {about}").strip()
    return (f"You act in an environment. Each turn shows what you observe; answer with one JSON object, the "
            f"action, matching this schema: {json.dumps(action_schema)}").strip()
