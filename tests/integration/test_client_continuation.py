"""The client continues generations interrupted by weight pushes (real vLLM engine, tiny model)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from events import frozen_mid_generation

from fullasync.client import ClientConfig, RolloutService
from fullasync.contracts.engine import PauseMode

TOLERANCE = 1e-4  # float32 engine vs float32 torch forward; seen ~3e-6


async def generate_with_pushes(engine, policy, tokenizer, num_pushes: int, max_tokens: int = 200):
    """One long call; each push lands while it is frozen mid-way (>= 15 tokens into the current request)."""
    client = RolloutService([engine], tokenizer, ClientConfig()).client()
    states = [policy.perturbed(seed=100 + push) for push in range(num_pushes)]  # ready before the call starts
    task = asyncio.create_task(
        client.chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "Tell me a long story about numbers."}],
            max_tokens=max_tokens,
            extra_body={"ignore_eos": True},
        )
    )
    weights = [dict(policy.current)]
    request_id = None
    for state in states:
        async with frozen_mid_generation(engine, client.episode.id, at_least=15, budget=max_tokens,
                                         not_request=request_id) as request_id:
            await policy.push(state)  # its pause (ABORT) interrupts the frozen request
        weights.append(dict(policy.current))
    response = await task
    return client, response, weights


def split_by_version(versions):
    segments, start = [], 0
    for i in range(1, len(versions) + 1):
        if i == len(versions) or versions[i] != versions[start]:
            segments.append((versions[start], start, i))
            start = i
    return segments


@pytest.mark.parametrize("num_pushes", [1, 3])
async def test_interrupted_generation_is_one_response_with_per_token_versions(engine, policy, tokenizer, num_pushes):
    version_before = await engine.version()
    client, response, weights = await generate_with_pushes(engine, policy, tokenizer, num_pushes)
    (call,) = client.episode.calls
    assert len(call.output_ids) == 200
    assert len(call.output_logprobs) == len(call.output_ids) == len(call.output_versions)
    assert call.num_resumes == num_pushes
    assert response.usage.completion_tokens == 200
    assert response.choices[0].finish_reason == "length"
    assert response.choices[0].message.content == tokenizer.decode(list(call.output_ids), skip_special_tokens=True)
    segments = split_by_version(call.output_versions)
    assert [v for v, _, _ in segments] == list(range(version_before, version_before + num_pushes + 1))
    assert all(end - start >= 15 for _, start, end in segments[:-1])
    # every segment was sampled by the weights of its version: compare with a torch forward
    for index, (_, start, end) in enumerate(segments):
        reference = policy.token_logprobs(weights[index], call.prompt_ids, call.output_ids)
        other = policy.token_logprobs(weights[index - 1] if index else weights[1], call.prompt_ids, call.output_ids)
        got = call.output_logprobs[start:end]
        assert max(abs(a - b) for a, b in zip(got, reference[start:end])) < TOLERANCE
        assert max(abs(a - b) for a, b in zip(got, other[start:end])) > 100 * TOLERANCE  # the check can tell


def mixed_logprobs(policy, old, new, prompt_ids, output_ids, split: int) -> list[float]:
    """log p(output_i), i >= split, sampled by `new` weights over the KV cache `old` weights computed for
    prompt + output[:split-1] (what a request frozen by a KEEP push goes on sampling from)."""
    model = policy.model

    def load(state):
        model.load_state_dict(state, strict=False)
        if model.config.tie_word_embeddings:
            model.tie_weights()

    with torch.no_grad():
        load(old)
        past = model(torch.tensor([list(prompt_ids) + list(output_ids[:split - 1])]), use_cache=True).past_key_values
        load(new)
        logits = model(torch.tensor([list(output_ids[split - 1:])]), past_key_values=past).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[i, output_ids[split + i]]) for i in range(len(output_ids) - split)]


async def test_keep_mode_labels_tokens_after_the_push_with_the_version_of_their_kv(engine, policy, tokenizer):
    """A KEEP push inside a request: later tokens are sampled by the new weights over the old weights' KV.
    Their weight version is the new one, their version (staleness, proximal) the old one, and their
    log-probs are those of that mixed computation, not of either policy alone."""
    client = RolloutService([engine], tokenizer).client()
    old, new = dict(policy.current), policy.perturbed(seed=7)
    task = asyncio.create_task(
        client.completions.create(model="policy", prompt="Count: 1 2 3", max_tokens=120,
                                  extra_body={"ignore_eos": True})
    )
    async with frozen_mid_generation(engine, client.episode.id, at_least=15, budget=120):
        timing = await policy.push(new, mode=PauseMode.KEEP)  # the frozen request goes on over its old KV
    await task
    (call,) = client.episode.calls
    assert call.num_resumes == 0 and len(call.output_ids) == 120
    weight_segments = split_by_version(call.output_weight_versions)
    assert [v for v, _, _ in weight_segments] == [timing.version - 1, timing.version]
    assert set(call.output_versions) == {timing.version - 1}  # every token read the old weights' KV
    split = weight_segments[1][1]
    got = call.output_logprobs[split:]
    mixed = mixed_logprobs(policy, old, policy.current, call.prompt_ids, call.output_ids, split)
    new_alone = policy.token_logprobs(policy.current, call.prompt_ids, call.output_ids)[split:]
    assert max(abs(a - b) for a, b in zip(got, mixed)) < TOLERANCE
    assert max(abs(a - b) for a, b in zip(got, new_alone)) > 100 * TOLERANCE  # the check can tell them apart
    # the trainer sees the old version on every token (its staleness and proximal policy)
    (sequence,) = client.trajectory(1.0).to_sequences()
    assert set(v for v, m in zip(sequence.versions, sequence.loss_mask) if m) == {timing.version - 1}
    # and a new request after the push reads no KV block of the old version
    await client.completions.create(model="policy", prompt="Count: 1 2 3", max_tokens=20, seed=1)
    second = client.episode.calls[-1]
    assert set(second.output_versions) == {timing.version} and second.output_weight_versions == ()
    reference = policy.token_logprobs(policy.current, second.prompt_ids, second.output_ids)
    assert max(abs(a - b) for a, b in zip(second.output_logprobs, reference)) < TOLERANCE


async def test_recompute_mode_goes_on_inside_the_engine_over_kv_the_new_weights_computed(engine, policy, tokenizer):
    """A RECOMPUTE push inside a request: the engine keeps it, drops its KV and prefills prompt + tokens so far
    again under the new weights. Nothing returns to the client or is resubmitted; every later token has the new
    version (weights and KV alike), and its log-prob is the new policy's alone — as after a resubmission."""
    client = RolloutService([engine], tokenizer).client()
    old = dict(policy.current)
    task = asyncio.create_task(
        client.completions.create(model="policy", prompt="Count: 1 2 3", max_tokens=120,
                                  extra_body={"ignore_eos": True})
    )
    try:
        async with frozen_mid_generation(engine, client.episode.id, at_least=15, budget=120):
            timing = await policy.push(policy.perturbed(seed=8), mode=PauseMode.RECOMPUTE)
        await task
        (call,) = client.episode.calls
        assert call.num_resumes == 0 and len(call.output_ids) == 120
        segments = split_by_version(call.output_versions)
        assert [v for v, _, _ in segments] == [timing.version - 1, timing.version]
        assert call.output_weight_versions == ()  # the weights' and the KV's version agree on every token
        split = segments[1][1]
        new_alone = policy.token_logprobs(policy.current, call.prompt_ids, call.output_ids)
        old_alone = policy.token_logprobs(old, call.prompt_ids, call.output_ids)
        mixed = mixed_logprobs(policy, old, policy.current, call.prompt_ids, call.output_ids, split)
        got = call.output_logprobs
        assert max(abs(a - b) for a, b in zip(got[:split], old_alone[:split])) < TOLERANCE
        assert max(abs(a - b) for a, b in zip(got[split:], new_alone[split:])) < TOLERANCE
        assert max(abs(a - b) for a, b in zip(got[split:], mixed)) > 100 * TOLERANCE  # KEEP's KV would differ
        (sequence,) = client.trajectory(1.0).to_sequences()  # the trainer sees each token's own version
        assert [v for v, m in zip(sequence.versions, sequence.loss_mask) if m] == list(call.output_versions)
    finally:  # later tests see the weights they always saw
        await policy.push({name: tensor for name, tensor in old.items() if name != "lm_head.weight"})


async def test_pushed_weights_match_torch_forward_with_tied_embeddings(engine, policy, tokenizer):
    assert policy.model.config.tie_word_embeddings
    state = policy.perturbed(seed=11)
    assert "lm_head.weight" not in state  # the engine must refresh its packed output layer itself
    timing = await policy.push(state)
    assert timing.version == await engine.version()
    await policy.assert_engine_serves_current(engine, tokenizer, "The weights changed; 12 + 30 =", timing.version,
                                              TOLERANCE)
