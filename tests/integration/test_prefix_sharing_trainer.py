"""Shared prefixes in the trainer (`trainer.share_prefixes`), with real verl (FSDP2 on CPU, gloo) and the tiny model:
a step with sharing makes the update of a step without — the same log-probs, loss, entropy, gradient norm and
weights — on groups of four episodes with a shared prompt and an episode whose two lineages share its early turns,
with the proximal log-probs recomputed and a reference model (the log-prob passes share too), by count and by
tokens with chunked log-probs; slow: with two ranks sharing each sequence (sequence parallelism). The step reports
the tokens its passes held and computed."""

from __future__ import annotations

import random

import pytest
from test_trainer_long import assert_same_update, one_step

from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup


def call(rng: random.Random, prompt: tuple[int, ...], length: int, version: int = 0) -> ModelCall:
    output = tuple(rng.randrange(20, 1000) for _ in range(length))
    return ModelCall(prompt, output, tuple(-rng.uniform(3, 9) for _ in output), (version,) * length,
                     FinishReason.STOP)


def agent_groups(seed: int = 0) -> list[TrajectoryGroup]:
    """Two rows of four single-call episodes on an 80-token prompt (responses of 20 to 62 tokens, rewards 1, 0, 0.5,
    0), and a row of two episodes that fork: a first call, a second that continues it, a third that continues the
    first call only (a lineage of its own sharing the 80 + 24 tokens of the first call)."""
    rng = random.Random(seed)
    groups = []
    for row in range(2):
        prompt = tuple(rng.randrange(20, 1000) for _ in range(80))
        episodes = tuple(Trajectory((call(rng, prompt, 20 + 7 * i + 3 * row),), reward=reward)
                         for i, reward in enumerate((1.0, 0.0, 0.5, 0.0)))
        groups.append(TrajectoryGroup(f"row-{row}", episodes))
    prompt = tuple(rng.randrange(20, 1000) for _ in range(80))
    forks = []
    for reward in (1.0, 0.0):
        first = call(rng, prompt, 24)
        context = prompt + first.output_ids
        second = call(rng, context + tuple(rng.randrange(20, 1000) for _ in range(5)), 15)
        third = call(rng, context + tuple(rng.randrange(20, 1000) for _ in range(6)), 18)
        forks.append(Trajectory((first, second, third), reward=reward))
    groups.append(TrajectoryGroup("row-forks", tuple(forks)))
    return groups


SETTINGS = {"correction": "decoupled", "proximal": "recompute", "kl_coef": 0.05, "padding_free": "on"}


def test_the_groups_and_lineages_hold_shared_prefixes():
    groups = agent_groups()
    sequences = [s for g in groups for t in g.trajectories for s in t.to_sequences()]
    assert len(sequences) == 8 + 4  # each fork is two lineages
    forked = groups[2].trajectories[0].to_sequences()
    assert forked[1].token_ids[:104] == forked[0].token_ids[:104]


async def test_a_step_sharing_prefixes_makes_the_update_of_a_step_without(ray_cluster, tiny_model_path):
    groups = agent_groups()
    plain = await one_step(tiny_model_path, groups, micro_batch_size=4, **SETTINGS)
    shared = await one_step(tiny_model_path, groups, micro_batch_size=4, share_prefixes=True, **SETTINGS)
    assert_same_update(plain, shared)
    metrics = shared[0]
    assert metrics["shared_prefixes"] == "logits" and plain[0]["shared_prefixes"] == "off"
    assert metrics["prefix_tokens"] == plain[3].attention_mask.sum()  # every token of the update's passes
    assert metrics["prefix_saved"] > 0.3 and "prefix_saved" not in plain[0]


async def test_by_tokens_with_chunked_logprobs_the_update_is_the_same(ray_cluster, tiny_model_path):
    groups = agent_groups(seed=1)
    settings = {**SETTINGS, "max_tokens_per_micro_batch": 400, "chunked_logprobs": True}
    plain = await one_step(tiny_model_path, groups, **settings)
    shared = await one_step(tiny_model_path, groups, share_prefixes=True, **settings)
    assert plain[0]["micro_batches"] >= 3
    assert_same_update(plain, shared)
    assert shared[0]["prefix_distinct"] < shared[0]["prefix_tokens"]
    assert shared[0]["shared_prefixes"] == "fused"  # log-probs and entropy once per (tree state, next token)


@pytest.mark.slow  # CI's slow tier: two trainers of two ranks
async def test_two_ranks_sharing_each_sequence_and_its_prefixes_make_the_update_of_one_rank(ray_cluster,
                                                                                        tiny_model_path):
    groups = agent_groups(seed=2)
    settings = {**SETTINGS, "micro_batch_size": 6, "worker_threads": 1}
    one = await one_step(tiny_model_path, groups, **settings)
    shared = await one_step(tiny_model_path, groups, num_workers=2, sequence_parallel_size=2, share_prefixes=True,
                            **settings)
    assert shared[0]["sequence_parallel"] == "2" and shared[0]["prefix_saved"] > 0.3
    assert_same_update(one, shared)
