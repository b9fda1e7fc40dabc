"""Every token's labels are true under pushes: its recorded log-prob is what the weights its labels name compute.

The event tests make the moment happen that a push storm hit by chance: a request that reaches the engine while a
push is under way is computed by the weights that push installs, and must say so. The storms check every token of
many long calls of every kind against the weights of each version (`label_storm.py`)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from events import wait_for_tokens
from label_storm import StormSettings, check_calls, run_storm, summary

from fullasync.client import RolloutService
from fullasync.contracts.engine import PauseMode


async def _call_sent_while_paused(engine, policy, tokenizer, mode: PauseMode, install):
    """A call whose request reaches the engine after a pause in `mode`; then `install` (a coroutine function
    taking new weights) installs them, and the engine resumes. Returns the call, checked against the weights of
    the versions before and after."""
    client = RolloutService([engine], tokenizer).client()
    new = policy.perturbed(seed=4242)
    weights = {policy.weight_sync.version: policy.current}
    await engine.pause(mode)
    try:
        task = asyncio.create_task(client.completions.create(
            model="policy", prompt="Count: 1 2 3", max_tokens=40, temperature=0.7, extra_body={"ignore_eos": True}))
        await wait_for_tokens(engine, client.episode.id, 0)  # the request is at the engine, which is paused
        await install(new)
    finally:
        await engine.resume()
    await task
    (call,) = client.episode.calls
    weights[policy.weight_sync.version] = policy.current
    return call, check_calls(policy.model, [call], [0.7], weights)


async def test_a_request_that_arrives_during_an_abort_push_carries_the_version_that_computed_it(
        engine, policy, tokenizer):
    """An ABORT push's steps with a request arriving between its pause and its update: the request never ran
    before the push, so the new weights compute its whole KV and sample every token."""

    async def update(state):
        version = policy.weight_sync.version + 1
        await engine.update_weights(state, version)
        policy.installed(state, version)

    call, report = await _call_sent_while_paused(engine, policy, tokenizer, PauseMode.ABORT, update)
    assert call.num_resumes == 0
    assert set(call.output_versions) == {policy.weight_sync.version} and call.output_weight_versions == ()
    assert not report.mismatches, report.mismatches


async def test_a_request_held_by_a_keep_push_carries_the_version_that_computed_it(engine, policy, tokenizer):
    """A KEEP push while a request waits to be scheduled (it holds no KV yet): nothing of it was computed by the
    old weights, so it is not a mixed-policy request."""
    call, report = await _call_sent_while_paused(engine, policy, tokenizer, PauseMode.KEEP,
                                                 lambda state: policy.push(state, mode=PauseMode.KEEP))
    assert set(call.output_versions) == {policy.weight_sync.version} and call.output_weight_versions == ()
    assert not report.mismatches, report.mismatches


FAST = StormSettings(min_tokens=200, max_tokens=400, max_pushes=15)  # 48 calls; ~15 s each


@pytest.mark.parametrize("mode", [PauseMode.ABORT, pytest.param(PauseMode.RECOMPUTE, marks=pytest.mark.slow),
                                  pytest.param(PauseMode.KEEP, marks=pytest.mark.slow)])  # CI's slow tier
async def test_a_push_storm_leaves_every_token_labelled_true(engine, policy, tokenizer, mode):
    """Long calls of every kind under dense pushes; then a deliberately mislabelled token is caught."""
    result = await run_storm(engine, policy, tokenizer, dataclasses.replace(FAST, mode=mode))
    report = check_calls(policy.model, result.calls, result.temperatures, result.weights)
    assert result.pushes == FAST.max_pushes and result.calls, summary(result, report)
    weight_versions = [call.output_weight_versions or call.output_versions for call in result.calls]
    assert len({v for versions in weight_versions for v in versions}) > 3, summary(result, report)
    if mode is PauseMode.ABORT:
        assert result.resumes > len(result.calls), summary(result, report)
    elif mode is PauseMode.KEEP:  # frozen across pushes: later tokens' weights are newer than their KV
        assert any(call.output_weight_versions for call in result.calls), summary(result, report)
    else:  # recompute: preempted and prefilled again in the engine, so one call's tokens span versions
        assert any(len(set(call.output_versions)) > 1 for call in result.calls), summary(result, report)
    assert not report.mismatches, "\n".join([summary(result, report), *map(str, report.mismatches)])
    # the check can fail: a token that says the weights before a push sampled it is found, at its position
    index, position = next((index, i) for index, versions in enumerate(weight_versions)
                           for i in range(1, len(versions)) if versions[i] != versions[i - 1])
    call, weights = result.calls[index], list(weight_versions[index])
    weights[position] = weights[position - 1]
    labels = list(call.output_versions)
    labels[position] = min(labels[position], weights[position])
    wrong = dataclasses.replace(call, output_versions=tuple(labels), output_weight_versions=tuple(weights))
    (caught,) = check_calls(policy.model, [wrong], [result.temperatures[index]], result.weights).mismatches
    assert (caught.position, caught.weight_version) == (position, weights[position])


@pytest.mark.slow
@pytest.mark.parametrize("mode", [PauseMode.ABORT])
@pytest.mark.parametrize("seed", [11])
async def test_full_push_storms_leave_every_token_labelled_true(engine, policy, tokenizer, mode, seed):
    """The storm at full size (48 calls of 300-900 tokens, 40 pushes) with client resumes, where labels broke; the
    other modes run at the fast size above, and `python tests/integration/label_storm.py --runs N --mode M` runs many
    more of any mode."""
    result = await run_storm(engine, policy, tokenizer, StormSettings(mode=mode, seed=seed))
    report = check_calls(policy.model, result.calls, result.temperatures, result.weights)
    assert not report.mismatches, "\n".join([summary(result, report), *map(str, report.mismatches)])
