"""Shared prefixes computed once (`fullasync.trainer.prefix_sharing`), on the tiny model without verl: the tree of a
packed row holds each shared prefix once and gives the row back token for token; the decoder run on the tree gives
the logits and the gradients of the plain packed forward — on a group with a shared prompt, an episode's lineages that
share early turns, identical sequences, a sequence that is another's prefix, with gradient checkpointing — and the
same comparison fails when the tree is broken on purpose (a segment blind to its ancestors, a token read from the
wrong copy)."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

from fullasync.trainer import attention, prefix_sharing
from fullasync.trainer.prefix_sharing import MIN_SHARED_TOKENS, build_tree

VOCAB = range(5, 1000)


def tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.choice(VOCAB) for _ in range(count)]


def packed(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(1, T) token ids and positions of one packed row, positions restarting at 0 per sequence."""
    ids = torch.tensor([t for s in sequences for t in s])[None]
    positions = torch.tensor([p for s in sequences for p in range(len(s))])[None]
    return ids, positions


def agent_row(seed: int = 0) -> list[list[int]]:
    """A group of 4 episodes on a 100-token prompt; an episode's two lineages sharing 50 sampled tokens after it; a
    copy of an episode; a sequence that is another's first 140 tokens; an unrelated sequence; a 20-token common
    start (below the threshold: not shared)."""
    rng = random.Random(seed)
    prompt = tokens(rng, 100)
    group = [prompt + tokens(rng, 40 + 7 * i) for i in range(4)]
    early = prompt + tokens(rng, 50)
    lineages = [early + tokens(rng, 20), early + tokens(rng, 25)]
    start = tokens(rng, 20)
    return [*group, *lineages, list(group[0]), group[1][:140], tokens(rng, 40), start + tokens(rng, 30),
            start + tokens(rng, 35)]


def test_the_tree_holds_each_shared_prefix_once_and_gives_the_row_back():
    rows = agent_row()
    ids, positions = packed(rows)
    tree = build_tree(ids[0].numpy(), positions[0].numpy())
    assert tree is not None
    assert torch.equal(tree.token_ids[tree.expand], ids[0]) and torch.equal(tree.positions[tree.expand], positions[0])
    # the prompt once (100); the group's own tails (40+47+54+61: nothing more for the copy, nor for the sequence
    # inside another); the lineages' shared 50, then 20 and 25; the unrelated 40; the two sequences whose common
    # 20-token start is below the threshold in full (50 + 55)
    assert tree.distinct == 100 + (40 + 47 + 54 + 61) + (50 + 20 + 25) + 40 + 50 + 55
    assert tree.total == sum(len(s) for s in rows)
    covered = [i for s in tree.segments for i in range(s.start, s.end)]
    assert covered == list(range(tree.distinct))  # segments tile the tree's row in order


@pytest.mark.parametrize("rows", [
    [[1, 2, 3] * 20, [4, 5, 6] * 20],  # nothing in common
    [[7] * 31 + [1], [7] * 31 + [2]],  # 31 tokens in common: below the threshold
])
def test_a_row_without_a_prefix_worth_sharing_runs_as_it_is(rows):
    assert MIN_SHARED_TOKENS == 32
    ids, positions = packed(rows)
    assert build_tree(ids[0].numpy(), positions[0].numpy()) is None


def test_positions_that_do_not_count_up_from_zero_are_not_read_as_sequences():
    ids, positions = packed([[7] * 40, [7] * 40])
    assert build_tree(ids[0].numpy(), (positions[0] + 1).numpy()) is None


@pytest.fixture(scope="module")
def tiny_model_factory(tiny_model_path):
    from transformers import AutoModelForCausalLM

    attention.register()

    def build(checkpointing: bool = False) -> torch.nn.Module:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_path, attn_implementation=attention.PACKED_SDPA,
                                                     dtype=torch.float32)
        if checkpointing:
            model.gradient_checkpointing_enable()
            model.train()
        return model
    return build


def forward_backward(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor):
    """(logits, each parameter's gradient) of a weighted sum of every token's next-token log-prob."""
    logits = model(input_ids=ids, position_ids=positions).logits
    logprobs = torch.log_softmax(logits[0, :-1], dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    weights = torch.rand(len(logprobs), generator=torch.Generator().manual_seed(1))
    (logprobs * weights).sum().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_same(plain, shared, tolerance: float = 1e-5) -> None:
    (logits_a, grads_a), (logits_b, grads_b) = plain, shared
    assert (logits_a - logits_b).abs().max() < tolerance
    for name, grad in grads_a.items():
        assert (grad - grads_b[name]).abs().max() <= tolerance * max(grad.abs().max(), 1e-3), name


@pytest.mark.parametrize(("checkpointing", "kernel"), [(False, "merged"), (True, "merged"), (False, "masked")])
def test_the_decoder_on_the_tree_gives_the_logits_and_gradients_of_the_plain_row(tiny_model_factory, monkeypatch,
                                                                                checkpointing, kernel):
    # merged: CPU flash passes over context and own keys merged by log-sum-exp; masked: SDPA with the segment's mask
    # (where that kernel is missing, or off CPU)
    if kernel == "masked":
        monkeypatch.setattr(prefix_sharing, "_FLASH_CPU", None)
    ids, positions = packed(agent_row())
    plain = forward_backward(tiny_model_factory(checkpointing), ids, positions)
    model = tiny_model_factory(checkpointing)
    shared = prefix_sharing.install(model)
    result = forward_backward(model, ids, positions)
    tokens_seen, distinct = shared.take_counts()
    assert tokens_seen == ids.shape[1] and distinct < tokens_seen / 2  # computed once: less than half the row
    assert shared.head_positions == distinct  # the output layer too: once per tree state
    assert_same(plain, result)


def broken_blind(tree: prefix_sharing.PrefixTree) -> prefix_sharing.PrefixTree:
    """Each segment attends only to itself (its ancestors' keys dropped)."""
    return dataclasses.replace(tree, segments=tuple(prefix_sharing.Segment(s.start, s.end, None)
                                                    for s in tree.segments))


def broken_copy(tree: prefix_sharing.PrefixTree) -> prefix_sharing.PrefixTree:
    """Each token's hidden state read from the tree position after its own."""
    return dataclasses.replace(tree, expand=(tree.expand + 1).clamp(max=tree.distinct - 1))


@pytest.mark.parametrize("breakage", [broken_blind, broken_copy])
def test_the_comparison_fails_when_the_sharing_is_broken(tiny_model_factory, monkeypatch, breakage):
    ids, positions = packed(agent_row())
    plain = forward_backward(tiny_model_factory(), ids, positions)
    honest = prefix_sharing.build_tree
    monkeypatch.setattr(prefix_sharing, "build_tree", lambda *args: breakage(honest(*args)))
    model = tiny_model_factory()
    prefix_sharing.install(model)
    with pytest.raises(AssertionError):
        assert_same(plain, forward_backward(model, ids, positions))


def test_the_comparison_fails_when_the_merged_backward_reads_the_wrong_softmax(tiny_model_factory, monkeypatch):
    # the forward stays right; each part's backward recomputes its probabilities from a shifted log-sum-exp
    ids, positions = packed(agent_row())
    plain = forward_backward(tiny_model_factory(), ids, positions)
    honest = prefix_sharing._FLASH_CPU_BACKWARD
    monkeypatch.setattr(prefix_sharing, "_FLASH_CPU_BACKWARD",
                        lambda grad, q, k, v, out, lse, *args, **kwargs: honest(grad, q, k, v, out, lse + 0.5, *args,
                                                                                **kwargs))
    model = tiny_model_factory()
    prefix_sharing.install(model)
    logits, grads = forward_backward(model, ids, positions)
    assert (logits - plain[0]).abs().max() < 1e-5
    with pytest.raises(AssertionError):
        assert_same(plain, (logits, grads))


def test_sharing_is_exact_on_long_prefixes(tiny_model_factory):
    # 8 continuations of 64-300 tokens on a 1,500-token prompt (3.7× fewer tokens computed)
    rng = random.Random(3)
    prompt = tokens(rng, 1500)
    rows = [prompt + tokens(rng, rng.randrange(64, 300)) for _ in range(8)]
    ids, positions = packed(rows)
    plain = forward_backward(tiny_model_factory(), ids, positions)
    model = tiny_model_factory()
    shared = prefix_sharing.install(model)
    result = forward_backward(model, ids, positions)
    tokens_seen, distinct = shared.take_counts()
    assert tokens_seen / distinct > 3.5
    assert_same(plain, result, tolerance=2e-5)
    assert np.isfinite(result[0].numpy()).all()


def test_micro_batches_are_planned_by_distinct_tokens_and_keep_shared_prefixes_together():
    rng = random.Random(5)
    prompts = [tokens(rng, 200), tokens(rng, 200)]
    # two rows' groups of four, interleaved (as a rearrangement by length would leave them), 250 tokens each
    rows = [np.array(prompts[i % 2] + tokens(rng, 50)) for i in range(8)]
    plans = prefix_sharing.plan_micro_batches(rows, budget=400)
    # a group costs 200 + 4 × 50 = 400 distinct tokens (1,000 in all): one micro-batch per group
    assert sorted(sorted(plan) for plan in plans) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # counted in full (min_shared above every length), 400 tokens hold one sequence of 250
    assert len(prefix_sharing.plan_micro_batches(rows, budget=400, min_shared=251)) == 8
    # a sequence longer than the budget gets a micro-batch alone
    assert [len(plan) for plan in prefix_sharing.plan_micro_batches(rows[:2], budget=100)] == [1, 1]
