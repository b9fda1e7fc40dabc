"""Claude Code 2.1.328 and Codex CLI 0.169, unchanged (`make setup-coding-agents`), through the gateway's Anthropic
Messages and Responses routes: each runs an episode of several model calls in which the CLI itself executes the tool
call the policy wrote (a shell command that writes a file), and every answer it received is recorded token-exactly
as one training sequence, nothing it did not receive; a weight push in the middle of a call goes unnoticed by the
CLI and shows in the record's versions. The engine is the edge fake that samples what the test
scripted (the tool call in the template's format, then a final answer): the prompts the CLIs send (~4-7k tokens with
the adapters' tool sets) cost nothing to prefill there; the gateway, the client and the CLIs are real."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from loopback_only import loopback_only
from scripted_engine import ScriptedEngine, assert_one_exact_sequence, script_texts

from fullasync.client import ClientConfig, RolloutService
from fullasync.gateway import Gateway
from fullasync.models import build_pretrained_model, load_tokenizer, with_chat_template
from fullasync_agents.claude_code import ClaudeCodeConfig, run_claude_code
from fullasync_agents.codex import CodexConfig, run_codex
from fullasync_agents.coding_agents import CodingAgentEpisode, installed_binary

ANSWER = "Done: out.txt holds hello."
PROMPT = "Write the word hello into the file out.txt, then say that you are done."


def call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(with_chat_template(build_pretrained_model("smollm2-135m-instruct"), "chatml-tools"))


@contextlib.asynccontextmanager
async def serving(engine: ScriptedEngine, tokenizer):
    """A started gateway in front of `engine` (as `gateway.engine`), the CLIs' background model untrained."""
    service = RolloutService([engine], tokenizer, ClientConfig(model_name="policy", max_model_len=32768))
    gateway = Gateway(service, untrained_models=("policy-background",))
    await gateway.start()
    gateway.engine = engine
    try:
        yield gateway
    finally:
        await gateway.stop()


@pytest.fixture
async def gateway(tokenizer):
    async with serving(ScriptedEngine(), tokenizer) as gateway:
        yield gateway


async def codex_episode(gateway, workdir: Path, prompt: str, config: CodexConfig):
    """One Codex run on `prompt` in a loopback-only namespace; the episode closed: (episode, run)."""
    installed("node_modules/.bin/codex")
    episode = gateway.open_episode()
    where = CodingAgentEpisode(episode.base_url, episode.api_key, str(workdir), prompt)
    async with loopback_only(gateway.port) as launcher:
        run = await run_codex(replace(config, launcher=launcher), where)
    gateway.close_episode(episode)
    assert run.status == "turn.completed" and run.returncode == 0, run.stderr
    return episode, run


def installed(binary: str) -> None:
    if not installed_binary(binary).exists():
        pytest.fail(f"{binary} is not installed: run `make setup-coding-agents` (make test does)")


@pytest.mark.parametrize("push", [False, True], ids=["", "push-mid-call"])
@pytest.mark.parametrize("cli", ["claude_code", "codex"])
async def test_a_coding_agent_cli_runs_its_tool_and_every_answer_it_received_is_recorded(gateway, tokenizer, cli, push,
                                                                                        tmp_path: Path):
    """With `push`, a weight push interrupts the tool call mid-stream: the CLI reads one continuous answer. Every run
    is in a network namespace holding only loopback (`loopback_only`): the CLI reaches the gateway and nothing else."""
    engine = gateway.engine
    if push:
        engine.push_after(call=0, tokens=5)
    if cli == "claude_code":
        installed("node_modules/.bin/claude")
        script_texts(engine, tokenizer, call("Bash", {"command": "printf hello > out.txt",
                                                     "description": "write the file"}), ANSWER)
    else:
        installed("node_modules/.bin/codex")
        script_texts(engine, tokenizer, call("exec_command", {"cmd": "printf hello > out.txt"}), ANSWER)
    episode = gateway.open_episode()
    where = CodingAgentEpisode(episode.base_url, episode.api_key, str(tmp_path), PROMPT)
    async with loopback_only(gateway.port) as launcher:
        if cli == "claude_code":
            run = await run_claude_code(ClaudeCodeConfig(max_turns=4, max_output_tokens=256, time_limit_s=120,
                                                         background_model="policy-background", launcher=launcher),
                                        where)
            assert run.status == "success", run.stderr
        else:
            run = await run_codex(CodexConfig(time_limit_s=120, launcher=launcher), where)
            assert run.status == "turn.completed", run.stderr
    assert run.returncode == 0 and not run.timed_out
    assert (tmp_path / "out.txt").read_text() == "hello"  # the CLI ran the policy's command itself
    assert ANSWER in json.dumps(run.transcript)
    gateway.close_episode(episode)
    assert engine.script == [] and gateway.answered[404] == 0 and not any(s >= 500 for s in gateway.answered)
    assert gateway.answered[200] == 2 + gateway.untrained_calls  # every policy answer it received, recorded
    assert_one_exact_sequence(episode.client, calls=2)
    first = episode.client.episode.calls[0]
    assert first.num_resumes == int(push) and set(first.output_versions) == ({0, 1} if push else {0})


PROBE = """
import socket, sys
try:
    socket.create_connection(("192.0.2.1", 80), timeout=5)
    print("outside reached")
except OSError as error:
    print("outside refused", error.errno)
socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5).close()
print("gateway reached")
"""


async def test_the_loopback_only_namespace_reaches_the_gateway_and_nothing_else(gateway):
    async with loopback_only(gateway.port) as launcher:
        probe = await asyncio.create_subprocess_exec(*launcher, sys.executable, "-c", PROBE, str(gateway.port),
                                                     stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(probe.communicate(), timeout=60)
    assert out.decode().split("\n")[:2] == [f"outside refused {errno.ENETUNREACH}", "gateway reached"]



Answer = str | Callable[[str], str]  # a scripted text, or one made from the prompt's text (an id the CLI chose)


class ParentAndSubAgent(ScriptedEngine):
    """Answers the calls that extend the first call's prompt (the parent's) from the parent's script and the others
    (the sub-agent's) from the sub-agent's: the CLIs run sub-agents in the background, so the two interleave in no
    fixed order. A call beyond a script is answered `after` (a parent the CLI calls once more to read a
    notification, or not, depending on when it arrives)."""

    def __init__(self, tokenizer, parent: list[Answer], sub_agent: list[Answer], after: str = "") -> None:
        super().__init__()
        self.tokenizer, self.after = tokenizer, after
        self.scripts = {True: list(parent), False: list(sub_agent)}
        self.first: tuple[int, ...] = ()
        self.afters = 0  # calls answered `after`

    async def generate(self, request):
        prompt = tuple(request.prompt_ids)
        self.first = self.first or prompt
        script = self.scripts[prompt[: len(self.first)] == self.first]
        if not script and self.after:
            script.append(self.after)
            self.afters += 1
        answer = script.pop(0)
        text = answer(self.tokenizer.decode(list(prompt))) if callable(answer) else answer
        self.script.insert(0, self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id])
        return await super().generate(request)


def assert_lineages_train_apart(episode, lineage_calls: list[int]) -> None:
    """The episode's calls form lineages of these sizes (the parent's first) and train as one sequence each, every
    sampled token in exactly one of them."""
    recorded = episode.client.trajectory(reward=1.0)
    lineages = recorded.lineages()
    assert [len(lineage) for lineage in lineages] == lineage_calls and lineages[0][0] == 0
    sequences = recorded.to_sequences()
    assert len(sequences) == len(lineage_calls)
    trained = [[t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m] for s in sequences]
    assert trained == [[t for i in lineage for t in recorded.calls[i].output_ids] for lineage in lineages]


async def test_a_claude_code_sub_agent_trains_as_a_lineage_of_its_own(tokenizer, tmp_path: Path):
    """The policy starts a sub-agent with Claude Code's Agent tool (Claude Code runs it in the background and tells
    the parent when it is done); the sub-agent, a context of its own, runs the shell command and reports; the parent
    answers. Five calls, two lineages — the parent's three, the sub-agent's two — so two training sequences, every
    sampled token in exactly one of them."""
    installed("node_modules/.bin/claude")
    engine = ParentAndSubAgent(
        tokenizer,
        [call("Agent", {"description": "write the file", "subagent_type": "general-purpose",
                        "prompt": "Write the word hello into the file out.txt."}),
         "The sub-agent is writing the file.", ANSWER],
        [call("Bash", {"command": "printf hello > out.txt", "description": "write the file"}),
         "out.txt now holds hello."])
    async with serving(engine, tokenizer) as gateway:
        episode = gateway.open_episode()
        where = CodingAgentEpisode(episode.base_url, episode.api_key, str(tmp_path), PROMPT)
        async with loopback_only(gateway.port) as launcher:
            run = await run_claude_code(ClaudeCodeConfig(tools=["Bash", "Agent"], max_turns=6, max_output_tokens=256,
                                                         time_limit_s=180, background_model="policy-background",
                                                         launcher=launcher), where)
        gateway.close_episode(episode)
    assert run.status == "success" and run.returncode == 0, run.stderr
    assert (tmp_path / "out.txt").read_text() == "hello"  # the sub-agent ran the policy's command
    assert ANSWER in json.dumps(run.transcript)
    assert engine.scripts == {True: [], False: []} and gateway.answered[200] == 5 + gateway.untrained_calls
    assert_lineages_train_apart(episode, [3, 2])


def wait_for_the_spawned_agent(prompt: str) -> str:
    """The parent's wait_agent call on the id Codex returned from spawn_agent (Codex chooses it at run time)."""
    ids = re.findall(r'"agent_id":\s*"([^"]+)"', prompt)
    assert ids, "no spawn_agent result in the parent's prompt"
    return call("multi_agent_v1.wait_agent", {"targets": ids[-1:], "timeout_ms": 60000})


async def test_a_codex_sub_agent_trains_as_a_lineage_of_its_own(tokenizer, tmp_path: Path):
    """Codex's multi-agent tools (`sub_agents=True`): the policy spawns a sub-agent, waits for it on the id Codex
    gave, and answers; the sub-agent runs the shell command and reports. Codex may call the parent once more to
    read the sub-agent's completion notice, depending on when it arrives: the parent's lineage holds 3 or 4 calls,
    the sub-agent's 2, each trained as one sequence."""
    engine = ParentAndSubAgent(
        tokenizer,
        [call("multi_agent_v1.spawn_agent", {"message": "Write the word hello into the file out.txt."}),
         wait_for_the_spawned_agent, ANSWER],
        [call("exec_command", {"cmd": "printf hello > out.txt"}), "out.txt now holds hello."],
        after="Nothing more to do.")
    async with serving(engine, tokenizer) as gateway:
        episode, run = await codex_episode(gateway, tmp_path, "Use a sub-agent to write the word hello into the file "
                                           "out.txt, then say that you are done.", CodexConfig(sub_agents=True,
                                                                                               time_limit_s=180))
    assert (tmp_path / "out.txt").read_text() == "hello"  # the sub-agent ran the policy's command
    tools = [item.get("item", {}).get("tool") for item in run.transcript]
    assert "spawn_agent" in tools and "wait" in tools and ANSWER in json.dumps(run.transcript)
    assert engine.scripts == {True: [], False: []} and engine.afters <= 1
    assert gateway.answered[200] == 5 + engine.afters and gateway.answered[404] == 0
    assert_lineages_train_apart(episode, [3 + engine.afters, 2])


async def test_a_codex_compacted_context_starts_a_lineage_of_its_own(gateway, tokenizer, tmp_path: Path):
    """Codex compacts its context past `auto_compact_token_limit` (set under the first prompt's ~5k tokens): after
    the tool call it asks the policy for a hand-off summary, then goes on from a history holding the summary instead
    of the turns before. Neither call's prompt extends an earlier one, so the three calls train as three sequences,
    and the summary the policy wrote is in the context the last one answered."""
    summary = "SUMMARY: out.txt now holds hello."
    script_texts(gateway.engine, tokenizer, call("exec_command", {"cmd": "printf hello > out.txt"}), summary, ANSWER)
    episode, run = await codex_episode(gateway, tmp_path, PROMPT, CodexConfig(auto_compact_token_limit=3000,
                                                                                 time_limit_s=120))
    assert (tmp_path / "out.txt").read_text() == "hello" and ANSWER in json.dumps(run.transcript)
    assert gateway.engine.script == [] and gateway.answered[200] == 3
    calls = episode.client.episode.calls
    last_context = tokenizer.decode(calls[2].prompt_ids)
    assert summary in last_context and "printf hello" not in last_context  # the history was replaced
    assert_lineages_train_apart(episode, [1, 1, 1])
