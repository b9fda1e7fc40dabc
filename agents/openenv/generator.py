"""`OpenEnvGenerator`: an OpenEnv environment, its own released code unchanged, as a run's harness.

Owns: the run's server (`process.py`: started at the first episode with enough sessions for the run's episodes at
once, restarted when it dies, stopped in `teardown`; or one the user runs, `OpenEnvSpec.url`), the agent loop of an
episode (reset with the row's options → the observation shown to the policy through the episode's client → its
reply parsed into an action → step, until the environment says done or `max_turns`), and the reward: the sum of
the environment's step rewards (or the last, `reward="last"`). At most `sessions` episodes hold a session at once:
one more waits for a free one rather than being refused for capacity. The prompt and the parser are the user's
(`prompt_fn`, `action_fn`), with defaults for text environments (`session.py`). Does not own: the rows
(`__init__.py`), the engines, recording.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from fullasync.rollout.generator import CustomGenerator, EpisodeContext
from fullasync.tasks.chat import reply_text
from fullasync.types import JsonValue
from fullasync_agents.openenv.process import OpenEnvServerError, ServerProcess, openenv_python
from fullasync_agents.openenv.session import Observation, Session, default_system_prompt, parsed_action, shown

log = logging.getLogger("fullasync")

PromptFn = Callable[[Observation, int], str]  # (observation, turn) -> the user turn's text
ActionFn = Callable[[str, Mapping[str, Any]], Mapping[str, Any]]  # (reply, the action's JSON schema) -> the action


@dataclass(frozen=True)
class OpenEnvSpec:
    """Which environment the server serves, how many sessions, and how an episode talks to it."""

    module: str = ""  # the environment's package (its server/app.py holds the classes), as `openenv init` makes
    environment: str = ""  # module:Class of the Environment; "" = found in <module>.server.app (same for the two below)
    action: str = ""
    observation: str = ""
    url: str = ""  # a server the user runs (ws://host:port/ws or http://host:port); "" = the run starts its own
    sessions: int = 16  # the server's max_concurrent_envs and how many episodes hold a session at once
    model: str = "policy"
    max_turns: int = 8  # an episode ends here if the environment has not said done
    reward: str = "sum"  # the episode's reward: "sum" of its step rewards, or the "last" one
    system_prompt: str = ""  # "" = the default for the action's schema
    prompt_fn: str = ""  # pkg.module:function, a PromptFn; "" = the observation's fields as JSON
    action_fn: str = ""  # pkg.module:function, an ActionFn; "" = the default parser (session.parsed_action)
    sampling: Mapping[str, JsonValue] = field(default_factory=dict)  # each call's other fields (max_tokens, ...)
    python: str = ""  # openenv's interpreter; "" = $FULLASYNC_OPENENV_PYTHON, else <checkout>/.venv-openenv

    def __post_init__(self) -> None:
        if self.reward not in ("sum", "last"):
            raise ValueError(f"openenv reward={self.reward!r}: use sum (of the step rewards) or last")
        if self.max_turns < 1 or self.sessions < 1:
            raise ValueError(f"openenv max_turns={self.max_turns}, sessions={self.sessions}: both must be >= 1")
        if not (self.url or self.module or (self.environment and self.action and self.observation)):
            raise ValueError("name the OpenEnv environment: data.task=openenv:<package> (its server/app.py holds "
                             "the classes), openenv:ws://host:port for a server you run, or data.task_args "
                             "environment/action/observation as module:Class")

    def server_spec(self) -> dict[str, object]:
        return {"module": self.module, "environment": self.environment, "action": self.action,
                "observation": self.observation, "sessions": self.sessions}


def loaded(path: str, what: str) -> Callable[..., Any] | None:
    if not path:
        return None
    module, _, name = path.partition(":")
    function = getattr(importlib.import_module(module), name, None) if name else None
    if not callable(function):
        raise ValueError(f"openenv {what}={path!r} does not name a function (write pkg.module:function)")
    return function


def ws_url(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith(("http://", "https://")):
        url = "ws" + url.removeprefix("http")
    return url if url.endswith("/ws") else url + "/ws"


class OpenEnvGenerator(CustomGenerator):
    """An OpenEnv environment's episodes: each row's `openenv` field (the reset's options: a seed, a task) starts a
    session; the policy acts until the environment is done or `max_turns`."""

    def __init__(self, spec: OpenEnvSpec) -> None:
        self.spec = spec
        self.prompt_fn: PromptFn | None = loaded(spec.prompt_fn, "prompt_fn")
        self.action_fn: ActionFn | None = loaded(spec.action_fn, "action_fn")
        self.server: ServerProcess | None = None
        self.servers_started = 0
        self.action_schema: dict[str, Any] | None = None
        self.free = asyncio.Semaphore(spec.sessions)
        self._starting = asyncio.Lock()
        self._logs: Path | None = None

    async def url(self) -> str:
        """The running server's session URL (a new server if there is none), its action schema read once."""
        async with self._starting:
            if self.spec.url:
                url = ws_url(self.spec.url)
            else:
                if self.server is None or not self.server.alive:
                    await self._start()
                assert self.server is not None
                url = self.server.url
            if self.action_schema is None:
                self.action_schema = await _action_schema(url)
            return url

    async def _start(self) -> None:
        if self.server is not None:
            log.warning("%s: restarting it", self.server.failure("died"))
        self._logs = self._logs or Path(tempfile.mkdtemp(prefix="fullasync-openenv-"))
        self.servers_started += 1
        log_path = self._logs / f"server-{self.servers_started}.log"
        self.server = await ServerProcess.start(openenv_python(self.spec.python), self.spec.server_spec(), log_path)
        log.info("OpenEnv environment %s served by server %d on %s (%d sessions, pid %d, log %s)",
                 self.server.ready.get("environment"), self.servers_started, self.server.url, self.spec.sessions,
                 self.server.process.pid, log_path)

    async def generate(self, episode: EpisodeContext, row: Mapping[str, JsonValue]) -> float:
        options = (row.get("openenv") or {}) if isinstance(row, Mapping) else None
        if not isinstance(options, Mapping):
            raise TypeError("an OpenEnv row holds the reset's options under 'openenv' (data.task=openenv:... makes "
                            f"them), got {type(row).__name__} {str(row)[:200]}")
        url = await self.url()
        async with self.free:
            session = await Session.open(url)
            try:
                return await self._play(episode, session, dict(options))
            except OpenEnvServerError:
                if self.server is not None and not self.server.alive:
                    raise self.server.failure("died during an episode") from None
                raise
            finally:
                await session.close()

    async def _play(self, episode: EpisodeContext, session: Session, options: dict[str, Any]) -> float:
        schema = self.action_schema or {}
        answer = await session.reset(options)
        messages = [{"role": "system", "content": self.spec.system_prompt or default_system_prompt(schema)}]
        rewards: list[float] = []
        turn = 0
        while not answer.done and turn < self.spec.max_turns:
            messages.append({"role": "user", "content": self.prompt_fn(answer.observation, turn) if self.prompt_fn
                             else shown(answer.observation)})
            reply = await reply_text(episode.client, self.spec.model, messages, **self.spec.sampling) or ""
            messages.append({"role": "assistant", "content": reply})
            action = self.action_fn(reply, schema) if self.action_fn else parsed_action(reply, schema)
            answer = await session.step(action)
            rewards.append(answer.reward or 0.0)
            turn += 1
        episode.client.log("openenv/turns", float(turn))
        episode.client.log("openenv/done", float(answer.done))
        if not rewards:
            return 0.0
        return rewards[-1] if self.spec.reward == "last" else sum(rewards)

    async def teardown(self) -> None:
        if self.server is not None:
            await self.server.stop()
            self.server = None


async def _action_schema(url: str) -> dict[str, Any]:
    """The action's JSON schema, from the server's `/schema`."""
    base = "http" + url.removeprefix("ws").removesuffix("/ws")
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=60.0) as http:
            response = await http.get(f"{base}/schema")
            response.raise_for_status()
    except httpx.HTTPError as error:
        raise OpenEnvServerError(f"the OpenEnv server at {base} did not give its schema: {error}") from error
    schema: dict[str, Any] = dict(response.json().get("action") or {})
    return schema
