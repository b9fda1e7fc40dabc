"""build_batch / shard_batch on hand-made groups: layout, loss masks, per-group advantages."""

from __future__ import annotations

import math

import pytest
import torch

from fullasync.config import LoraConfig, TrainerConfig
from fullasync.trainer.batch import (
    PADDING_ROW,
    build_batch,
    loss_normaliser,
    sequence_gradient_scales,
    shard_batch,
)
from fullasync.types import PROMPT_VERSION, FinishReason, ModelCall, Trajectory, TrajectoryGroup

ADV = 1 / math.sqrt(2)  # grpo advantage of a two-sample group with distinct rewards (std with Bessel)


def call(prompt, output, version=0, logprob=-0.5):
    return ModelCall(
        prompt_ids=tuple(prompt),
        output_ids=tuple(output),
        output_logprobs=tuple(logprob - 0.01 * i for i in range(len(output))),
        output_versions=tuple([version] * len(output)),
        finish_reason=FinishReason.STOP,
    )


def trajectory(*calls, reward):
    return Trajectory(tuple(calls), reward=reward)


def test_layout_follows_verl_padding_and_keeps_rollout_records():
    short = trajectory(call([5, 6], [10, 11], version=3), reward=1.0)
    long = trajectory(call([5, 6, 7, 8], [12, 13, 14], version=4), reward=0.0)
    batch = build_batch([TrajectoryGroup("g", (short, long))], pad_token_id=0)
    assert batch.prompts.tolist() == [[0, 0, 5, 6], [5, 6, 7, 8]]  # left-padded
    assert batch.responses.tolist() == [[10, 11, 0], [12, 13, 14]]  # right-padded
    assert batch.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1, 0], [1] * 7]
    assert batch.position_ids[0].tolist() == [0, 0, 0, 1, 2, 3, 3]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch.versions.tolist() == [[3, 3, PROMPT_VERSION], [4, 4, 4]]
    assert torch.allclose(batch.behaviour_logprobs, torch.tensor([[-0.5, -0.51, 0.0], [-0.5, -0.51, -0.52]]))
    assert torch.allclose(batch.advantages, torch.tensor([[ADV, ADV, 0.0], [-ADV, -ADV, -ADV]]), atol=1e-5)
    assert batch.rewards.tolist() == [1.0, 0.0]
    assert batch.row_index.tolist() == [0, 1] and batch.num_trained_tokens == 5


def test_environment_tokens_carry_no_loss_and_no_advantage():
    first = call([1, 2], [3, 4])
    second = call([1, 2, 3, 4, 90, 91], [5])  # 90, 91: tool output inserted by the environment
    group = TrajectoryGroup("g", (trajectory(first, second, reward=1.0), trajectory(call([1, 2], [6]), reward=0.0)))
    batch = build_batch([group])
    assert batch.responses[0].tolist() == [3, 4, 90, 91, 5]
    assert batch.response_mask[0].tolist() == [1, 1, 0, 0, 1]
    assert batch.versions[0].tolist() == [0, 0, PROMPT_VERSION, PROMPT_VERSION, 0]
    assert batch.behaviour_logprobs[0, 2:4].tolist() == [0.0, 0.0]
    assert torch.allclose(batch.advantages[0], torch.tensor([ADV, ADV, 0.0, 0.0, ADV]), atol=1e-5)


def test_zero_variance_group_has_zero_advantages():
    same = TrajectoryGroup("same", (trajectory(call([1], [2, 3]), reward=1.0), trajectory(call([1], [4]), reward=1.0)))
    varied = TrajectoryGroup("varied", (trajectory(call([1], [5]), reward=1.0), trajectory(call([1], [6]), reward=0.0)))
    for estimator in ("grpo", "rloo"):
        batch = build_batch([same, varied], advantage_estimator=estimator)
        assert batch.group_index.tolist() == [0, 0, 1, 1]
        assert torch.equal(batch.advantages[:2], torch.zeros_like(batch.advantages[:2]))
        assert batch.advantages[2, 0] > 0 > batch.advantages[3, 0]


def test_multi_sequence_trajectory_is_one_sample_of_its_group():
    rewritten = trajectory(call([1, 2], [3, 4]), call([1, 7], [8]), reward=1.0)  # no prefix extension: 2 sequences
    plain = trajectory(call([1, 2], [9]), reward=0.0)
    batch = build_batch([TrajectoryGroup("g", (rewritten, plain))])
    assert batch.num_sequences == 3
    assert batch.trajectory_index.tolist() == [0, 0, 1]
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0]
    # counted once, the group is {1, 0}: ±1/sqrt(2); counted per sequence it would be {1, 1, 0}
    assert torch.allclose(batch.advantages[0, :2], torch.tensor([ADV, ADV]), atol=1e-5)
    assert torch.allclose(batch.advantages[1, :1], torch.tensor([ADV]), atol=1e-5)
    assert torch.allclose(batch.advantages[2, :1], torch.tensor([-ADV]), atol=1e-5)


def test_each_sequence_of_an_episode_weighs_one_over_its_lineages():
    parent, sub_agent = call([1, 2], [3, 4]), call([50], [51])
    three = trajectory(parent, sub_agent, call([1, 2, 3, 4, 9], [5]), call([1, 8], [6]), reward=1.0)  # 3 lineages
    one = trajectory(call([1, 2], [7]), reward=0.0)
    batch = build_batch([TrajectoryGroup("g", (three, one))])
    assert batch.trajectory_index.tolist() == [0, 0, 0, 1]
    assert torch.allclose(batch.sequence_weights, torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0]))
    assert batch.num_episodes == pytest.approx(2.0)
    assert loss_normaliser(batch, "seq-mean-token-mean") == pytest.approx(2.0)  # episodes, not sequences
    assert loss_normaliser(batch, "seq-mean-token-sum", by_episode=False) == 4.0
    assert loss_normaliser(batch, "token-mean") == 6.0  # token modes stay token-weighted
    sharded = shard_batch(batch, num_workers=1, mini_batches=2, micro_batch_size=1)
    assert sharded.sequences_per_mini_batch == [2, 2]
    assert sharded.episodes_per_mini_batch == pytest.approx([2 / 3, 4 / 3])  # the split episode, in parts
    single = build_batch([TrajectoryGroup("g", (one, trajectory(call([1, 2], [5]), reward=1.0)))])
    assert single.sequence_weights.tolist() == [1.0, 1.0]
    assert sequence_gradient_scales(single, "seq-mean-token-mean", 2, single.num_episodes) is None  # nothing to do
    assert sequence_gradient_scales(batch, "token-mean", 4, 2.0) is None


def loss_and_row_gradients(config: TrainerConfig, batch, scaled: bool = True):
    """The policy loss of `batch` as one mini-batch through the trainer's path (`sequence_gradient_scales` →
    `to_tensordict` → `CorrectedPolicyLoss` → verl's `ppo_loss`, entropy bonus and KL included), and the gradient
    it sends into each row's log-probs and entropy. Every row is given the same log-probs, off the behaviour."""
    from fullasync.trainer.corrections import GRADIENT_SCALES
    from fullasync.trainer.verl_setup import policy_loss_fn, to_tensordict

    behaviour = batch.behaviour_logprobs
    extra = {"old_log_probs": behaviour, "ref_log_prob": behaviour - 0.1}
    scales = sequence_gradient_scales(batch, config.loss_agg_mode, batch.num_sequences, batch.num_episodes)
    if scaled and scales is not None:
        extra[GRADIENT_SCALES] = scales
    data = to_tensordict(batch, config.temperature, extra, dp_size=1, batch_num_tokens=batch.num_trained_tokens,
                         global_batch_size=batch.num_sequences, trainer_version=0)
    offsets = data["input_ids"].offsets()
    lengths = offsets.diff().tolist()
    log_probs = torch.cat([-1.0 + 0.05 * torch.arange(n) for n in lengths]).requires_grad_()
    entropy = torch.cat([0.5 + 0.1 * torch.arange(n) for n in lengths]).requires_grad_()
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(log_probs, offsets),
                    "entropy": torch.nested.nested_tensor_from_jagged(entropy, offsets)}
    loss, _ = policy_loss_fn(config)(model_output=model_output, data=data)
    loss.backward()
    rows = [(log_probs.grad[int(a): int(b)], entropy.grad[int(a): int(b)]) for a, b in zip(offsets, offsets[1:])]
    return loss.detach(), rows


@pytest.mark.parametrize("loss_agg_mode", ["seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm",
                                           "token-mean"])
def test_an_episode_of_three_lineages_weighs_as_one_of_one_lineage_in_the_seq_mean_losses(loss_agg_mode):
    """Three lineages of the same tokens (three samples of one prompt in one episode) against one: the same
    advantage, the same tokens and log-probs, so each sequence's unweighted gradient is the same."""
    lineage = call([1, 2, 3], [4, 5, 6], logprob=-1.0)
    three = trajectory(lineage, lineage, lineage, reward=1.0)
    one = trajectory(lineage, reward=1.0)
    failed = trajectory(call([1, 2, 3], [7, 8], logprob=-1.0), reward=0.0)
    batch = build_batch([TrajectoryGroup("g", (three, one, failed))])
    assert batch.trajectory_index.tolist() == [0, 0, 0, 1, 2]
    config = TrainerConfig(loss_agg_mode=loss_agg_mode, entropy_coeff=0.01, kl_coef=0.1)
    config.validate()
    loss, rows = loss_and_row_gradients(config, batch)
    plain_loss, plain_rows = loss_and_row_gradients(config, batch, scaled=False)
    assert torch.equal(loss, plain_loss)  # verl's loss reads as before: the mean over sequences
    share = 1 / 3 if loss_agg_mode.startswith("seq-mean") else 1.0  # token-mean: each token weighs the same
    for part in (0, 1):  # log-probs (policy loss, KL), entropy
        single = rows[3][part]
        assert single.abs().sum() > 0
        for row in range(3):
            torch.testing.assert_close(rows[row][part], share * single, rtol=1e-5, atol=1e-8)
        episode = sum(rows[row][part] for row in range(3))
        torch.testing.assert_close(episode, 3 * share * single, rtol=1e-5, atol=1e-8)
        if loss_agg_mode.startswith("seq-mean"):  # exactly the gradient of Σ w L / episodes (5 sequences, 3 episodes)
            for row, weight in enumerate(batch.sequence_weights.tolist()):
                torch.testing.assert_close(rows[row][part], plain_rows[row][part] * weight * 5 / 3, rtol=1e-5,
                                           atol=1e-8)


def test_groups_with_the_same_row_id_stay_separate_groups():
    group = TrajectoryGroup("row", (trajectory(call([1], [2]), reward=1.0), trajectory(call([1], [3]), reward=0.0)))
    batch = build_batch([group, group])
    assert batch.group_index.tolist() == [0, 0, 1, 1]
    assert torch.allclose(batch.advantages[:, 0], torch.tensor([ADV, -ADV, ADV, -ADV]), atol=1e-5)


def test_reinforce_plus_plus_whitens_over_the_batch_and_respects_masks():
    first = call([1, 2], [3, 4])
    second = call([1, 2, 3, 4, 90], [5])
    groups = [TrajectoryGroup("a", (trajectory(first, second, reward=1.0), trajectory(call([1], [6, 7]), reward=0.0)))]
    batch = build_batch(groups, advantage_estimator="reinforce_plus_plus")
    trained = batch.advantages[batch.response_mask.bool()]
    assert abs(float(trained.mean())) < 1e-5  # whitened over sampled tokens
    assert batch.advantages[0, 2] == 0.0  # the environment token
    assert (batch.advantages[0, [0, 1, 3]] > 0).all() and (batch.advantages[1, :2] < 0).all()


def test_sequences_without_sampled_tokens_are_left_out():
    empty = trajectory(call([1, 2], []), reward=0.0)
    group = TrajectoryGroup("g", (trajectory(call([1, 2], [3]), reward=1.0), empty))
    batch = build_batch([group])
    assert batch.num_sequences == 1  # the empty trajectory still counted in the group's statistics
    assert torch.allclose(batch.advantages[0, :1], torch.tensor([ADV]), atol=1e-5)
    with pytest.raises(ValueError, match="no sampled tokens"):
        build_batch([TrajectoryGroup("g", (empty,))])


def test_shard_batch_spreads_rows_and_fills_blocks_to_micro_batches():
    groups = [
        TrajectoryGroup(str(i), tuple(trajectory(call([1, i], [2 + j]), reward=float(j)) for j in range(2)))
        for i in range(5)
    ]
    batch = build_batch(groups)  # 10 sequences
    sharded = shard_batch(batch, num_workers=2, mini_batches=2, micro_batch_size=2)
    assert sharded.sequences_per_mini_batch == [5, 5]
    assert sharded.rows_per_block == 4  # ceil(3 / 2) * 2
    assert [s.num_sequences for s in sharded.shards] == [8, 8]
    real = torch.cat([s.row_index for s in sharded.shards])
    assert sorted(real[real != PADDING_ROW].tolist()) == list(range(10))
    fill = sharded.shards[1].select(torch.nonzero(sharded.shards[1].row_index == PADDING_ROW).flatten())
    assert fill.num_trained_tokens == 0 and float(fill.advantages.abs().sum()) == 0.0
    assert fill.attention_mask.sum(dim=1).tolist() == [2] * fill.num_sequences
    with pytest.raises(ValueError, match="mini-batches"):
        shard_batch(batch.select([0]), num_workers=1, mini_batches=2, micro_batch_size=1)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("advantage_estimator", "gae", "needs \\['values'"),
        ("advantage_estimator", "nope", "not in verl's advantage registry"),
        ("policy_loss", "nope", "not in verl's policy-loss registry"),
        ("loss_agg_mode", "mean", "loss_agg_mode"),
        ("kl_type", "full", "kl_type"),
        ("micro_batch_size", 0, "micro_batch_size"),
        ("clip_ratio_c", 1.0, "clip_ratio_c"),
        ("model_dtype", "fp16", r"model_dtype='fp16': choose one of \('fp32', 'bf16'\)"),
        ("padding_free", "yes", "padding_free='yes'"),
        ("lora", LoraConfig(rank=-1), r"trainer.lora.rank=-1 must be an integer >= 0"),
        ("lora", LoraConfig(rank=8, target_modules=" , "), r"trainer.lora.target_modules=' , ' names no module"),
        ("lora", LoraConfig(rank=8, alpha=0), r"trainer.lora.alpha=0 must be > 0"),
        ("max_tokens_per_micro_batch", -1, r"max_tokens_per_micro_batch=-1 must be >= 0"),
        ("sequence_parallel_size", 0, r"sequence_parallel_size=0 must be an integer >= 1"),
        ("sequence_parallel_size", 3, r"sequence_parallel_size=3 must divide num_workers=2"),
        ({"sequence_parallel_size": 2, "padding_free": "off"}, None, r"needs padding_free=on or auto, not off"),
        ("hf_overrides", "rope", r"hf_overrides='rope' must be a mapping"),
        ("cpus", "3-1", r"trainer.cpus='3-1' is not a CPU list: write ids and ranges such as 0, 0-3"),
        ("cpus", "0", r"trainer.cpus='0' names 1 cores for 2 ranks"),
    ],
)
def test_config_validation_names_the_field(field, value, message):
    settings = field if isinstance(field, dict) else {field: value}
    with pytest.raises(ValueError, match=message):
        TrainerConfig(num_workers=2, **settings).validate()
    TrainerConfig().validate()


def test_a_token_budget_is_raised_to_the_longest_sequence_of_the_batch_over_its_sequence_parallel_group():
    from fullasync.trainer.verl_setup import micro_batch_keys

    group = TrajectoryGroup("row", (trajectory(call(range(10, 40), range(40, 70)), reward=1.0),
                                    trajectory(call(range(10, 20), range(20, 30)), reward=0.0)))
    batch = build_batch([group])  # sequences of 60 and 20 tokens
    longest = int(batch.attention_mask.sum(dim=1).max())
    assert longest == 60
    assert micro_batch_keys(TrainerConfig(micro_batch_size=3), batch) == {"use_dynamic_bsz": False,
                                                                           "micro_batch_size_per_gpu": 3}
    assert micro_batch_keys(TrainerConfig(max_tokens_per_micro_batch=4096), batch)["max_token_len_per_gpu"] == 4096
    assert micro_batch_keys(TrainerConfig(max_tokens_per_micro_batch=10), batch)["max_token_len_per_gpu"] == longest
    two = TrainerConfig(max_tokens_per_micro_batch=10, num_workers=2, sequence_parallel_size=2)
    assert micro_batch_keys(two, batch)["max_token_len_per_gpu"] == -(-longest // 2)


def test_packed_sequences_start_where_their_position_is_zero():
    from fullasync.trainer.attention import sequence_bounds

    positions = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]])
    assert sequence_bounds(positions, 10) == [(0, 3), (3, 5), (5, 6), (6, 10)]
    assert sequence_bounds(torch.tensor([[5, 6, 0, 1]]), 4) == [(0, 2), (2, 4)]  # a slice starting mid-sequence
    assert sequence_bounds(None, 7) == [(0, 7)]
