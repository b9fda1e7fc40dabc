"""Claude Code 2.1.328 and Codex CLI 0.169, unchanged (`make setup-coding-agents`), through the gateway's Anthropic
Messages and Responses routes: each runs an episode of several model calls in which the CLI itself executes the tool
call the policy wrote (a shell command that writes a file), and every answer it received is recorded token-exactly
as one training sequence, nothing it did not receive; a weight push in the middle of a call goes unnoticed by the
CLI and shows in the record's versions. The engine is the edge fake that samples what the test
scripted (the tool call in the template's format, then a final answer): the prompts the CLIs send (~4-7k tokens with
the adapters' tool sets) cost nothing to prefill there; the gateway, the client and the CLIs are real."""

from __future__ import annotations

import asyncio
import errno
import json
import sys
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


@pytest.fixture
async def gateway(tokenizer):
    engine = ScriptedEngine()
    service = RolloutService([engine], tokenizer, ClientConfig(model_name="policy", max_model_len=32768))
    gateway = Gateway(service, untrained_models=("policy-background",))
    await gateway.start()
    gateway.engine = engine
    yield gateway
    await gateway.stop()


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



class ParentAndSubAgent(ScriptedEngine):
    """Answers the calls that extend the first call's prompt (the parent's) from the parent's script and the others
    (the sub-agent's) from the sub-agent's: the CLI runs its sub-agent in the background, so the two interleave in
    no fixed order."""

    def __init__(self, parent: list[list[int]], sub_agent: list[list[int]]) -> None:
        super().__init__()
        self.scripts = {True: parent, False: sub_agent}
        self.first: tuple[int, ...] = ()

    async def generate(self, request):
        prompt = tuple(request.prompt_ids)
        self.first = self.first or prompt
        self.script.insert(0, self.scripts[prompt[: len(self.first)] == self.first].pop(0))
        return await super().generate(request)


def encoded(tokenizer, *texts: str) -> list[list[int]]:
    engine = ScriptedEngine()
    script_texts(engine, tokenizer, *texts)
    return engine.script


async def test_a_claude_code_sub_agent_trains_as_a_lineage_of_its_own(tokenizer, tmp_path: Path):
    """The policy starts a sub-agent with Claude Code's Agent tool (Claude Code runs it in the background and tells
    the parent when it is done); the sub-agent, a context of its own, runs the shell command and reports; the parent
    answers. Five calls, two lineages — the parent's three, the sub-agent's two — so two training sequences, every
    sampled token in exactly one of them."""
    installed("node_modules/.bin/claude")
    engine = ParentAndSubAgent(
        encoded(tokenizer, call("Agent", {"description": "write the file", "subagent_type": "general-purpose",
                                          "prompt": "Write the word hello into the file out.txt."}),
                "The sub-agent is writing the file.", ANSWER),
        encoded(tokenizer, call("Bash", {"command": "printf hello > out.txt", "description": "write the file"}),
                "out.txt now holds hello."))
    service = RolloutService([engine], tokenizer, ClientConfig(model_name="policy", max_model_len=32768))
    gateway = Gateway(service, untrained_models=("policy-background",))
    await gateway.start()
    try:
        episode = gateway.open_episode()
        where = CodingAgentEpisode(episode.base_url, episode.api_key, str(tmp_path), PROMPT)
        async with loopback_only(gateway.port) as launcher:
            run = await run_claude_code(ClaudeCodeConfig(tools=["Bash", "Agent"], max_turns=6, max_output_tokens=256,
                                                         time_limit_s=180, background_model="policy-background",
                                                         launcher=launcher), where)
        gateway.close_episode(episode)
    finally:
        await gateway.stop()
    assert run.status == "success" and run.returncode == 0, run.stderr
    assert (tmp_path / "out.txt").read_text() == "hello"  # the sub-agent ran the policy's command
    assert ANSWER in json.dumps(run.transcript)
    assert engine.scripts == {True: [], False: []} and gateway.answered[200] == 5 + gateway.untrained_calls
    recorded = episode.client.trajectory(reward=1.0)
    lineages = recorded.lineages()
    assert [len(lineage) for lineage in lineages] == [3, 2] and lineages[0][0] == 0  # the parent first
    sequences = recorded.to_sequences()
    assert len(sequences) == 2
    trained = [[t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m] for s in sequences]
    assert trained == [[t for i in lineage for t in recorded.calls[i].output_ids] for lineage in lineages]
