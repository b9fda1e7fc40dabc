"""The records crossing the zygote boundary are typed and checked on receipt: a spec or result that does not match
its type fails with an error naming the record and the field; the zygote refuses a bad spec and serves on."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from dataclasses import dataclass

import pytest

from fullasync_agents.launcher import HarnessMessageError, ZygoteLauncher
from fullasync_agents.messages import Message, MessageError
from fullasync_agents.mini_swe.messages import AgentSettings, MiniSweOutcome, MiniSweSpec
from fullasync_agents.terminus.messages import TerminusOutcome, TerminusSpec

SPEC = MiniSweSpec(
    base_url="http://127.0.0.1:1/sessions/e/v1", api_key="key", task="fix it", action_format="text",
    model_name="hosted_vllm/policy", model_kwargs={"temperature": 1.0, "extra_body": {"structured_outputs": {}}},
    environment={"environment_class": "local", "cwd": "/tmp", "timeout": 10}, observation_template="{{output}}",
    format_error_template="", agent=AgentSettings("system", "{{task}}", 4, 0.0, 3, 0),
)


def test_a_record_survives_json_both_ways():
    assert MiniSweSpec.from_json(json.loads(json.dumps(SPEC.to_json()))) == SPEC
    outcome = TerminusOutcome(reward=1.0, rewards={"reward": 1.0}, n_turns=2, messages=[{"role": "user"}],
                              rollout_details=[{"prompt_token_ids": [[1, 2]]}])
    assert TerminusOutcome.from_json(json.loads(json.dumps(outcome.to_json()))) == outcome
    spec = TerminusSpec(task_dir="/t", trials_dir="/t/trials", trial_name="trial", agent={"name": "nop"},
                        environment={"type": "docker", "kwargs": {}})
    assert TerminusSpec.from_json(spec.to_json()) == spec  # defaults (verifier, extra_instructions) included


def test_json_integers_are_accepted_where_a_float_is_declared():
    outcome = TerminusOutcome.from_json({"reward": 1, "rewards": {"reward": 1}})
    assert outcome.reward == 1.0 and isinstance(outcome.reward, float) and outcome.rewards == {"reward": 1.0}


@pytest.mark.parametrize(("data", "error"), [
    ({"exit_status": "Submitted", "submission": "", "n_calls": "three"},
     r"MiniSweOutcome\.n_calls: expected int, got 'three' \(str\)"),
    ({"exit_status": "Submitted", "submission": ""}, r"MiniSweOutcome\.n_calls is missing"),
    ({"exit_status": "Submitted", "submission": "", "n_calls": 1, "calls": 1}, r"unknown field\(s\) \['calls'\]"),
    ({"exit_status": "Submitted", "submission": "", "n_calls": True}, r"n_calls: expected int, got True \(bool\)"),
    ({"exit_status": "Submitted", "submission": "", "n_calls": 1, "error": 7}, r"error: expected str \| None"),
    ([], r"MiniSweOutcome: expected a JSON object, got \[\] \(list\)"),
])
def test_a_record_that_does_not_match_its_type_names_the_field(data, error):
    with pytest.raises(MessageError, match=error):
        MiniSweOutcome.from_json(data)


def test_nested_records_and_free_json_are_checked_too():
    data = SPEC.to_json()
    with pytest.raises(MessageError, match=r"MiniSweSpec\.agent\.step_limit: expected int, got '4' \(str\)"):
        MiniSweSpec.from_json({**data, "agent": {**data["agent"], "step_limit": "4"}})
    with pytest.raises(MessageError, match=r"MiniSweSpec\.model_kwargs\['stop'\]: expected a JSON value"):
        MiniSweSpec.from_json({**data, "model_kwargs": {"stop": {"a"}}})
    with pytest.raises(MessageError, match=r"TerminusSpec\.extra_instructions\[1\]: expected str, got 2 \(int\)"):
        TerminusSpec.from_json({"task_dir": "/t", "trials_dir": "/t", "trial_name": "t", "agent": {},
                                "environment": {}, "extra_instructions": ["hint", 2]})


HARNESS = textwrap.dedent('''
    from dataclasses import dataclass

    from fullasync_agents.messages import Message
    from fullasync_agents.zygote import serve


    @dataclass(frozen=True)
    class EchoSpec(Message):
        text: str
        malformed: bool = False


    @dataclass(frozen=True)
    class EchoOutcome(Message):
        text: str
        length: int


    @dataclass(frozen=True)
    class MalformedOutcome(Message):
        text: str
        length: str


    def run_episode(spec):
        if spec.malformed:
            return MalformedOutcome(spec.text, "many")
        return EchoOutcome(spec.text.upper(), len(spec.text))


    if __name__ == "__main__":
        serve(lambda: None, run_episode, EchoSpec)
''')


@dataclass(frozen=True)
class EchoSpec(Message):
    text: str
    malformed: bool = False


@dataclass(frozen=True)
class EchoOutcome(Message):
    text: str
    length: int


@dataclass(frozen=True)
class NumberSpec(Message):
    text: int


async def test_the_zygote_refuses_a_spec_of_the_wrong_type_and_the_launcher_a_malformed_result(tmp_path):
    (tmp_path / "echo_harness.py").write_text(HARNESS)
    launcher = ZygoteLauncher(tmp_path / "work", [sys.executable, str(tmp_path / "echo_harness.py")],
                              dict(os.environ), harness="echo")
    await launcher.start()
    try:
        assert await launcher.run(EchoSpec("hi"), EchoOutcome, timeout_s=60.0) == EchoOutcome("HI", 2)
        with pytest.raises(HarnessMessageError, match=r"echo's process refused the episode: EchoSpec\.text: "
                                                      r"expected str, got 7 \(int\)"):
            await launcher.run(NumberSpec(7), EchoOutcome, timeout_s=60.0)
        with pytest.raises(HarnessMessageError, match=r"echo's episode result is not a valid EchoOutcome: "
                                                      r"EchoOutcome\.length: expected int, got 'many'"):
            await launcher.run(EchoSpec("hi", malformed=True), EchoOutcome, timeout_s=60.0)
        assert await launcher.run(EchoSpec("again"), EchoOutcome, timeout_s=60.0) == EchoOutcome("AGAIN", 5)
    finally:
        await launcher.stop()
