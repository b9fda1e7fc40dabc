"""Every failed episode has a kind, and the kind decides its fate: an infrastructure failure runs the episode
again (bounded, counted) and never fails the row; a failure the policy caused is trained with the failure reward;
time waiting for an engine restart does not count against the episode's deadline. The rollouter is real; engines
and clock are the simulator's."""

from __future__ import annotations

import asyncio

import pytest
from sim_rollouts import rows_through_a_rollouter

from fullasync.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    EngineDiedError,
    EngineResumeTimeoutError,
    FailureKind,
    InfraError,
    InvalidRequestError,
    PolicyOutputError,
)
from fullasync.rollout.ledger import failure_kind
from fullasync.rollout.rollouter import RolloutSettings, RowOutcome


@pytest.mark.parametrize(("error", "fault", "kind"), [
    (InfraError("the sandbox did not start"), None, FailureKind.INFRA),
    (EngineDiedError("engine-0 died"), None, FailureKind.INFRA),
    (EngineResumeTimeoutError("engine-0 did not resume"), None, FailureKind.INFRA),
    (PolicyOutputError("messages[2].tool_calls[0].function.name must be a non-empty string"), None, FailureKind.MODEL),
    (InvalidRequestError("prompt too long", code=CONTEXT_LENGTH_EXCEEDED), None, FailureKind.LENGTH),
    (RuntimeError("an SDK error hiding the cause"), FailureKind.MODEL, FailureKind.MODEL),  # the client saw it
    (RuntimeError("an SDK error hiding the cause"), FailureKind.INFRA, FailureKind.INFRA),
    (TimeoutError(), None, FailureKind.TIMEOUT),
    (KeyError("answer"), None, FailureKind.HARNESS),
])
def test_each_failure_has_a_kind(error, fault, kind):
    assert failure_kind(error, fault) is kind


def run_rows(rollout_fn, settings: RolloutSettings, count: int = 3):
    """`count` rows through a real rollouter on a simulated engine; the queued groups and the report."""
    rollouter, groups = rows_through_a_rollouter(rollout_fn, settings,
                                                 ((f"row-{i}", {"i": i}) for i in range(count)))
    return groups, rollouter.report()


async def one_call(client) -> None:
    await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=4, extra_body={"ignore_eos": True})


def test_an_infrastructure_failure_runs_the_episode_again_and_the_row_is_trained():
    async def flaky_sandbox(client, row) -> float:
        await one_call(client)
        if "#" not in client.episode.id:  # the first attempt of every episode: its sandbox fails
            raise InfraError("the sandbox did not start")
        return 1.0

    groups, report = run_rows(flaky_sandbox, RolloutSettings(n=2, max_running_rows=8, episode_timeout_s=60))
    assert set(report.row_outcomes.values()) == {RowOutcome.QUEUED.value}  # no row failed
    assert all(len(group.trajectories) == 2 for group in groups)  # every episode ran again and was trained
    assert report.failure_kinds == {"infra": 6} and report.infra_retries == 6


def test_infrastructure_that_keeps_failing_is_retried_a_bounded_number_of_times():
    async def broken_sandbox(client, row) -> float:
        raise InfraError("the sandbox never starts")

    groups, report = run_rows(broken_sandbox, RolloutSettings(n=2, max_running_rows=8, episode_timeout_s=60,
                                                              infra_retries=2), count=1)
    assert groups == [] and report.row_outcomes == {"row-0": RowOutcome.FAILED.value}
    assert report.failure_kinds == {"infra": 2 * 3} and report.infra_retries == 2 * 2


def test_a_failure_the_policy_caused_is_trained_with_the_failure_reward():
    async def harness(client, row) -> float:
        if row["i"] == 1:
            raise PolicyOutputError("the policy's first turn is unreadable")  # no call made: nothing to train
        await one_call(client)
        if row["i"] == 0:
            raise PolicyOutputError("the policy wrote an action no parser reads")
        return 1.0

    groups, report = run_rows(harness, RolloutSettings(n=2, max_running_rows=8, episode_timeout_s=60,
                                                       failure_reward=-1.0))
    by_row = {group.row_id: group for group in groups}
    assert set(by_row) == {"row-0", "row-2"} and report.row_outcomes["row-1"] == RowOutcome.FAILED.value
    broken = by_row["row-0"].trajectories
    assert [t.reward for t in broken] == [-1.0, -1.0] and all(len(t.calls) == 1 for t in broken)
    assert {t.metadata["failure"] for t in broken} == {"model"}
    assert report.failure_kinds == {"model": 4}


def test_time_waiting_for_an_engine_restart_does_not_count_against_the_deadline():
    async def waits_for_a_restart(client, row) -> float:
        await one_call(client)
        with client.episode.deadline_paused():  # what the client does while a dead engine is restarted
            await asyncio.sleep(30.0)
        await one_call(client)
        return 1.0

    async def just_slow(client, row) -> float:
        await asyncio.sleep(30.0)
        return 1.0

    settings = RolloutSettings(n=2, max_running_rows=8, episode_timeout_s=2.0)
    groups, report = run_rows(waits_for_a_restart, settings, count=2)
    assert len(groups) == 2 and report.episode_failures == 0
    groups, report = run_rows(just_slow, settings, count=2)
    assert groups == [] and report.failure_kinds == {"timeout": 4}
