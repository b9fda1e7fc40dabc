"""Long sequences in the trainer, with real verl (FSDP2 on CPU, gloo) and the tiny model: each memory setting gives
the update of the plain path.

- micro-batches by tokens (`max_tokens_per_micro_batch`, verl's dynamic batch size) against micro-batches by count:
  the same loss, gradient norm and weights after a step, with a different number of passes;
- log-probs and entropy in 512-position chunks (`chunked_logprobs`) on sequences of ~1,300 tokens: the values of a
  plain forward, and the update of the full-logits path;
- sequence parallelism (`sequence_parallel_size=2`, two ranks sharing each sequence) against one rank: the same
  log-probs, loss, gradient norm and weights.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_trainer import batch_hf_logprobs, fresh_model

from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

LR = 1e-2

pytestmark = pytest.mark.slow  # CI's slow tier: a trainer per setting on long sequences


def long_groups(lengths: list[tuple[int, int]], seed: int = 0, teacher: bool = False) -> list[TrajectoryGroup]:
    """Groups of two single-call trajectories of a (prompt, response) length from `lengths` (the second response 3
    tokens shorter, so that sequences do not pair up into equal halves), stale behaviour log-probs and unequal
    rewards; with `teacher`, a teacher's log-probs on every sampled token (distillation: advantages per token)."""
    rng = random.Random(seed)
    groups = []
    for g, (prompt_length, response_length) in enumerate(lengths):
        prompt = tuple(rng.randrange(20, 1000) for _ in range(prompt_length))
        trajectories = []
        for index, reward in enumerate((1.0, 0.0)):
            output = tuple(rng.randrange(20, 1000) for _ in range(response_length - 3 * index))
            behaviour = tuple(-rng.uniform(3, 9) for _ in output)
            call = ModelCall(prompt, output, behaviour, (0,) * len(output), FinishReason.STOP,
                             teacher_logprobs=tuple(lp + rng.uniform(-0.5, 0.5) for lp in behaviour) if teacher else ())
            trajectories.append(Trajectory((call,), reward=reward))
        groups.append(TrajectoryGroup(f"row-{g}", tuple(trajectories)))
    return groups


async def one_step(model_path: str, groups: list[TrajectoryGroup], **settings):
    """(metrics of one step, the weights after it, log-probs before it, the batch) of a fresh trainer with
    `settings`; the metrics carry what the model verl built runs as (`describe`)."""
    config = TrainerConfig(lr=LR, call_timeout_s=300, worker_num_cpus=0.25, entropy_coeff=0.01, **settings)
    trainer = VerlTrainer(model_path, config)
    await trainer.start()
    try:
        runs = await trainer.describe()
        batch = trainer.build_batch(groups)
        logprobs = await trainer.compute_logprobs(batch)
        metrics = await trainer.train_step(batch, trainer_version=1) | runs
        return metrics, await (await trainer.export_weights()), logprobs, batch
    finally:
        await trainer.shutdown()


def assert_same_update(a, b) -> None:
    (metrics_a, weights_a, logprobs_a, batch), (metrics_b, weights_b, logprobs_b, _) = a, b
    mask = batch.response_mask.bool()
    assert (logprobs_a - logprobs_b).abs()[mask].max() < 1e-5
    assert metrics_a["loss"] == pytest.approx(metrics_b["loss"], rel=1e-5)
    assert metrics_a["grad_norm"] == pytest.approx(metrics_b["grad_norm"], rel=1e-4)
    assert metrics_a["entropy"] == pytest.approx(metrics_b["entropy"], rel=1e-5)
    # Adam's first step moves a weight by ~lr·g/(|g| + eps), ~lr·sign(g): a gradient of the wrong sign moves one by
    # 2·lr. A gradient within rounding of zero (|g| ~ eps) moves by a fraction of lr that rounding changes: a few.
    for name in weights_a:
        moved_apart = (weights_a[name] - weights_b[name]).abs()
        assert moved_apart.max() < LR / 2, name
        assert (moved_apart > LR / 100).sum() <= max(moved_apart.numel() // 1000, 1), name


async def test_micro_batches_by_tokens_make_the_update_of_micro_batches_by_count(ray_cluster, tiny_model_path):
    # 6 sequences of 7 to 90 tokens (291): by count, 3 passes of 2; by tokens (budget 150), two passes. Distilled:
    # every sampled token has an advantage of its own (a teacher's gap), which the passes must keep in place
    groups = long_groups([(4, 6), (30, 20), (50, 40)], teacher=True)
    by_count = await one_step(tiny_model_path, groups, micro_batch_size=2)
    by_tokens = await one_step(tiny_model_path, groups, micro_batch_size=2, max_tokens_per_micro_batch=150)
    advantages, mask = by_count[3].advantages, by_count[3].response_mask.bool()
    assert all(len(set(row[keep].tolist())) > 1 for row, keep in zip(advantages, mask, strict=True))
    assert by_count[0]["micro_batches"] == 3
    assert by_tokens[0]["micro_batches"] == 2  # the split differs, the update must not
    assert_same_update(by_count, by_tokens)


async def test_a_sequence_longer_than_the_token_budget_gets_a_pass_alone(ray_cluster, tiny_model_path):
    groups = long_groups([(60, 60), (3, 5)])  # sequences of 117 and 120 tokens, a budget of 50
    metrics, _, logprobs, batch = await one_step(tiny_model_path, groups, max_tokens_per_micro_batch=50)
    assert metrics["micro_batches"] >= 2 and metrics["grad_norm"] > 0
    assert torch.isfinite(logprobs[batch.response_mask.bool()]).all()


@pytest.mark.slow  # CI's slow tier: two trainers on 1,300-token sequences
async def test_chunked_logprobs_equal_a_plain_forward_and_make_the_same_update(ray_cluster, tiny_model_path):
    groups = long_groups([(900, 400), (200, 30)])  # 1,300 positions: three 512-position chunks
    full = await one_step(tiny_model_path, groups, micro_batch_size=2)
    chunked = await one_step(tiny_model_path, groups, micro_batch_size=2, chunked_logprobs=True)
    batch = chunked[3]
    reference = batch_hf_logprobs(fresh_model(tiny_model_path), batch)
    assert (chunked[2] - reference).abs()[batch.response_mask.bool()].max() < 1e-5
    assert (full[0]["chunked_logprobs"], chunked[0]["chunked_logprobs"]) == ("false", "true")
    assert_same_update(full, chunked)  # entropy_coeff > 0: the entropy's chunked backward counts too


@pytest.mark.slow  # CI's slow tier: three trainers
async def test_two_ranks_sharing_each_sequence_make_the_update_of_one_rank(ray_cluster, tiny_model_path):
    # 2 heads, 1 kv head: the kv head is repeated per rank. Passes of 3 sequences (500, 497 and 65 tokens, then
    # 62, 97, 94): each rank's half of a pass ends inside a sequence, whose later tokens attend across the ranks.
    # The proximal log-probs are recomputed: every rank of the group must train on its group's values
    groups = long_groups([(300, 200), (40, 25), (7, 90)])
    settings = {"micro_batch_size": 3, "worker_threads": 1, "correction": "decoupled", "proximal": "recompute"}
    one = await one_step(tiny_model_path, groups, padding_free="on", **settings)
    shared = await one_step(tiny_model_path, groups, num_workers=2, sequence_parallel_size=2, **settings)
    assert (one[0]["sequence_parallel"], shared[0]["sequence_parallel"]) == ("1", "2")
    assert_same_update(one, shared)
