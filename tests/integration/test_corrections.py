"""Off-policy corrections against hand-computed values on small tensors (no model, no Ray).

Batches mix versions inside one sequence, contain all-masked sequences, and include the version
gap 0 case, where every correction must be on-policy PPO exactly. The loss goes through the same
path as training: our `TrainBatch` → `to_tensordict` → `CorrectedPolicyLoss` → verl's `ppo_loss`.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from fullasync.config import Correction, RunConfig, TrainerConfig
from fullasync.trainer.batch import TrainBatch
from fullasync.trainer.corrections import CorrectionStats, correct, loglinear_proximal
from fullasync.trainer.verl_setup import policy_loss_fn, to_tensordict
from fullasync.types import PROMPT_VERSION

LN = math.log
# Two sequences of three response tokens. Row 0 was sampled by versions 5, 4, 2 (a generation
# resumed twice across weight pushes); row 1 by version 3 and an inserted token (mask 0) at the end.
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
VERSIONS = torch.tensor([[5, 4, 2], [3, 3, PROMPT_VERSION]])
TRAINER_VERSION = 5  # gaps: [[0, 1, 3], [2, 2, -]]
BEHAVIOUR = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.5, 0.0]])
# Recomputed proximal log-probs chosen so that r = exp(p − b) = [[3, 0.4, 1], [6, 1, -]].
PROXIMAL = BEHAVIOUR + torch.tensor([[LN(3.0), LN(0.4), 0.0], [LN(6.0), 0.0, 0.0]])
CURRENT = torch.tensor([[-0.5, -1.0, -1.0], [-0.25, -1.5, -7.0]])

# Expected weights per correction with the defaults C = 2, [lo, hi] = [0.5, 5]; ρ = [1.2, 6].
EXPECTED_WEIGHTS = {
    "token_tis": [[2.0, 0.4, 1.0], [2.0, 1.0, 0.0]],
    "seq_tis": [[1.2, 1.2, 1.2], [2.0, 2.0, 0.0]],
    "token_mask": [[3.0, 0.0, 1.0], [0.0, 1.0, 0.0]],
    "seq_mask": [[1.2, 1.2, 1.2], [0.0, 0.0, 0.0]],
    "decoupled": [[3.0, 0.4, 1.0], [0.0, 1.0, 0.0]],
}
EXPECTED_CLIPPED_MASKED = {  # (tokens truncated, tokens zeroed) of the five sampled tokens
    "token_tis": (2, 0), "seq_tis": (2, 0), "token_mask": (0, 2), "seq_mask": (0, 2), "decoupled": (0, 1),
}


def corrected(correction: str, proximal: str = "recompute", **inputs):
    """`correct` on the module's batch; proximal log-probs recomputed (PROXIMAL) unless told otherwise."""
    config = TrainerConfig(correction=correction, proximal=proximal)
    config.validate()
    arguments = dict(current=CURRENT, behaviour=BEHAVIOUR, versions=VERSIONS, response_mask=MASK,
                     trainer_version=TRAINER_VERSION, recomputed=PROXIMAL)
    arguments.update(inputs)
    return correct(config, **arguments)


def test_loglinear_proximal_interpolates_by_version_gap():
    gaps = torch.tensor([[0, 1, 3]])
    behaviour, current = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-0.5, -1.0, -1.0]])
    # α = g / (g + 1) = [0, 1/2, 3/4]:  b + α (θ − b)
    expected = torch.tensor([[-1.0, -2.0 + 0.5 * 1.0, -3.0 + 0.75 * 2.0]])
    assert torch.allclose(loglinear_proximal(behaviour, current, gaps), expected)


@pytest.mark.parametrize("correction", sorted(EXPECTED_WEIGHTS))
def test_proximal_corrections_clip_against_the_proximal_policy_with_hand_computed_weights(correction):
    result = corrected(correction)
    mask = MASK.bool()
    assert torch.equal(result.old_log_probs[mask], PROXIMAL[mask])
    assert torch.allclose(result.weights, torch.tensor(EXPECTED_WEIGHTS[correction]), atol=1e-6)
    clipped, masked = EXPECTED_CLIPPED_MASKED[correction]
    stats = result.stats
    assert (stats.weighted_tokens, stats.clipped, stats.masked) == (5, clipped, masked)
    weights = torch.tensor(EXPECTED_WEIGHTS[correction])[mask]
    assert stats.weight_sum == pytest.approx(float(weights.sum()), rel=1e-6)
    assert stats.weight_max == pytest.approx(float(weights.max()), rel=1e-6)


@pytest.mark.parametrize("correction", ["none", "gspo", "cispo"])
def test_behaviour_corrections_clip_against_the_behaviour_policy_without_weights(correction):
    result = corrected(correction)
    assert torch.equal(result.old_log_probs, BEHAVIOUR) and result.weights is None
    assert result.stats.weighted_tokens == 0
    config = TrainerConfig(correction=correction)
    assert config.loss_mode == ("vanilla" if correction == "none" else correction)
    assert not config.recomputes_proximal


def test_token_rs_clips_against_the_behaviour_policy_and_drops_drifted_tokens():
    result = corrected("token_rs")
    assert torch.equal(result.old_log_probs, BEHAVIOUR)
    # r = [[3, 0.4, 1], [6, 1, -]], kept where 0.5 <= r <= 5; a kept token's weight is 1, not r
    assert torch.equal(result.weights, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    stats = result.stats
    assert (stats.weighted_tokens, stats.clipped, stats.masked) == (5, 0, 2)
    assert stats.weight_max == 1.0
    assert TrainerConfig(correction="token_rs", proximal="recompute").recomputes_proximal


def test_token_rs_loglinear_drift_grows_with_the_version_gap():
    # the same θ − b = 2 on every token: α(θ − b) = 2g/(g+1), so r = e^{2g/(g+1)} crosses hi = 5 (ln 5 = 1.61)
    # between gap 3 (r = e^1.5 = 4.5, kept) and gap 7 (r = e^1.75 = 5.75, dropped); gap 0 always stays
    behaviour = torch.full((1, 3), -3.0)
    result = corrected("token_rs", proximal="loglinear", recomputed=None, behaviour=behaviour,
                       current=behaviour + 2.0, versions=torch.tensor([[7, 4, 0]]),
                       response_mask=torch.ones((1, 3), dtype=torch.long), trainer_version=7)
    assert torch.equal(result.weights, torch.tensor([[1.0, 1.0, 0.0]]))


def test_loglinear_token_tis_uses_version_interpolated_proximal_mid_sequence():
    result = corrected("token_tis", proximal="loglinear", recomputed=None)
    # gaps [[0, 1, 3], [2, 2]] → α [[0, 1/2, 3/4], [2/3, 2/3]]; p − b = α (θ − b)
    alpha = torch.tensor([[0.0, 0.5, 0.75], [2 / 3, 2 / 3, 0.0]])
    log_ratio = alpha * (CURRENT - BEHAVIOUR) * MASK
    assert torch.allclose(result.old_log_probs[MASK.bool()], (BEHAVIOUR + log_ratio)[MASK.bool()])
    expected = torch.exp(log_ratio).clamp(max=2.0) * MASK  # [[1, e^0.5, 2], [e^(1/6), 1, 0]]
    assert torch.allclose(result.weights, expected, atol=1e-6)
    assert result.stats.clipped == 1  # e^{0.75·2} = 4.48 truncated to 2


def test_mismatch_statistics_per_version_gap():
    stats = corrected("none").stats
    metrics = stats.metrics()
    k1 = BEHAVIOUR - CURRENT  # b − θ
    k3 = torch.exp(-k1) + k1 - 1  # e^{θ−b} − (θ − b) − 1
    by_gap = {0: [(0, 0)], 1: [(0, 1)], 3: [(0, 2)], 2: [(1, 0), (1, 1)]}
    for gap, cells in by_gap.items():
        assert metrics[f"correction/tokens_frac/gap_{gap}"] == pytest.approx(len(cells) / 5)
        assert metrics[f"correction/kl_k1/gap_{gap}"] == pytest.approx(sum(float(k1[c]) for c in cells) / len(cells))
        assert metrics[f"correction/kl_k3/gap_{gap}"] == pytest.approx(sum(float(k3[c]) for c in cells) / len(cells))
    assert metrics["correction/kl_k1"] == pytest.approx(float(k1[MASK.bool()].mean()))
    assert metrics["correction/kl_k3"] == pytest.approx(float(k3[MASK.bool()].mean()))
    assert "correction/is_weight_mean" not in metrics  # none applies no weight


def test_statistics_merged_over_parts_equal_those_of_the_whole():
    whole = corrected("seq_tis").stats
    merged = CorrectionStats()
    for row in range(2):
        part = corrected("seq_tis", current=CURRENT[row:row + 1], behaviour=BEHAVIOUR[row:row + 1],
                         versions=VERSIONS[row:row + 1], response_mask=MASK[row:row + 1],
                         recomputed=PROXIMAL[row:row + 1]).stats
        merged.merge(part)
    for name, value in whole.metrics().items():
        assert merged.metrics()[name] == pytest.approx(value), name


def test_a_token_newer_than_the_trainer_is_an_error():
    with pytest.raises(ValueError, match="newer than the trainer"):
        corrected("decoupled", trainer_version=4)


def test_recompute_without_recomputed_logprobs_is_an_error():
    with pytest.raises(ValueError, match="recompute"):
        corrected("decoupled", recomputed=None)


# --- the loss path: TrainBatch → TensorDict → CorrectedPolicyLoss → verl ppo_loss ---------------


def train_batch(behaviour, versions, mask, advantages) -> TrainBatch:
    """One prompt token per row; every response position attended (masked ones as inserted tokens)."""
    n, width = behaviour.shape
    return TrainBatch(
        prompts=torch.full((n, 1), 7), responses=torch.full((n, width), 8),
        attention_mask=torch.ones((n, 1 + width), dtype=torch.long),
        position_ids=torch.arange(1 + width).repeat(n, 1), response_mask=mask.long(),
        advantages=advantages * mask, behaviour_logprobs=behaviour * mask, versions=versions,
        rewards=torch.zeros(n), sequence_weights=torch.ones(n), group_index=torch.zeros(n, dtype=torch.long),
        trajectory_index=torch.arange(n), row_index=torch.arange(n),
    )


def loss_and_grad(config: TrainerConfig, batch: TrainBatch, current: torch.Tensor, old: torch.Tensor,
                  trainer_version: int | None):
    """Loss and d loss / d θ of the configured loss; `current` is θ on the response positions."""
    meta = dict(dp_size=1, batch_num_tokens=max(batch.num_trained_tokens, 1), global_batch_size=batch.num_sequences)
    if trainer_version is not None:
        meta["trainer_version"] = trainer_version
    data = to_tensordict(batch, 1.0, {"old_log_probs": old}, **meta)
    offsets = data["input_ids"].offsets()
    values = torch.zeros(int(offsets[-1]))
    width = batch.response_length
    for row in range(batch.num_sequences):  # the log-prob of response token j sits at sequence position j
        values[int(offsets[row]): int(offsets[row]) + width] = current[row]
    values.requires_grad_()
    log_probs = torch.nested.nested_tensor_from_jagged(values, offsets)
    loss, metrics = policy_loss_fn(config)(model_output={"log_probs": log_probs}, data=data)
    loss.backward()
    gradient = torch.stack([values.grad[int(offsets[r]): int(offsets[r]) + width] for r in range(batch.num_sequences)])
    return loss.detach(), gradient, metrics


ADVANTAGES = torch.tensor([[1.0, -1.0, 0.5], [-0.5, 2.0, 3.0]])


def test_decoupled_loss_and_gradient_match_the_hand_computed_objective():
    config = TrainerConfig(correction="decoupled", proximal="recompute")
    batch = train_batch(BEHAVIOUR, VERSIONS, MASK, ADVANTAGES)
    loss, gradient, _ = loss_and_grad(config, batch, CURRENT, PROXIMAL, TRAINER_VERSION)
    weights = torch.tensor(EXPECTED_WEIGHTS["decoupled"])
    ratio = torch.exp(CURRENT - PROXIMAL)  # s = π_θ / π_prox
    clipped = ratio.clamp(0.8, 1.2)
    per_token = torch.maximum(-ADVANTAGES * ratio, -ADVANTAGES * clipped)
    per_token = torch.where(ADVANTAGES < 0, torch.minimum(per_token, -ADVANTAGES * 3.0), per_token)  # dual clip
    expected = (weights * per_token * MASK).sum() / MASK.sum()
    assert loss == pytest.approx(float(expected), rel=1e-5)
    # d/dθ: −w A s where the unclipped branch is active, 0 where the clip binds
    unclipped = -ADVANTAGES * ratio >= -ADVANTAGES * clipped
    active = unclipped & ((ADVANTAGES >= 0) | (-ADVANTAGES * ratio < -ADVANTAGES * 3))
    expected_gradient = torch.where(active, -weights * ADVANTAGES * ratio, torch.zeros(())) * MASK / MASK.sum()
    assert torch.allclose(gradient, expected_gradient, atol=1e-6)


def test_token_rs_loss_and_gradient_match_the_hand_computed_objective():
    config = TrainerConfig(correction="token_rs", proximal="recompute")
    batch = train_batch(BEHAVIOUR, VERSIONS, MASK, ADVANTAGES)
    loss, gradient, _ = loss_and_grad(config, batch, CURRENT, PROXIMAL, TRAINER_VERSION)
    keep = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    ratio = torch.exp(CURRENT - BEHAVIOUR)  # π_θ / π_behaviour: the PPO ratio is against the sampling policy
    clipped = ratio.clamp(0.8, 1.2)
    per_token = torch.maximum(-ADVANTAGES * ratio, -ADVANTAGES * clipped)
    per_token = torch.where(ADVANTAGES < 0, torch.minimum(per_token, -ADVANTAGES * 3.0), per_token)
    assert loss == pytest.approx(float((keep * per_token * MASK).sum() / MASK.sum()), rel=1e-5)
    unclipped = -ADVANTAGES * ratio >= -ADVANTAGES * clipped
    active = unclipped & ((ADVANTAGES >= 0) | (-ADVANTAGES * ratio < -ADVANTAGES * 3))
    expected_gradient = torch.where(active, -keep * ADVANTAGES * ratio, torch.zeros(())) * MASK / MASK.sum()
    assert torch.allclose(gradient, expected_gradient, atol=1e-6)


ALL_CORRECTIONS = [c.value for c in Correction if c is not Correction.AUTO]


@pytest.mark.parametrize("proximal", ["recompute", "loglinear"])
@pytest.mark.parametrize("correction", ALL_CORRECTIONS)
def test_version_gap_zero_is_on_policy_ppo_exactly(correction, proximal):
    """Every token sampled by the trainer's version (proximal = behaviour): loss and gradient of plain PPO."""
    on_policy = torch.full_like(VERSIONS, TRAINER_VERSION)
    batch = train_batch(BEHAVIOUR, on_policy, MASK, ADVANTAGES)
    loss, gradient, _ = loss_and_grad(TrainerConfig(correction=correction, proximal=proximal), batch, CURRENT,
                                      batch.behaviour_logprobs, TRAINER_VERSION)
    plain = TrainerConfig(correction="none", policy_loss=correction if correction in ("gspo", "cispo") else "vanilla")
    plain_loss, plain_gradient, _ = loss_and_grad(plain, batch, CURRENT, batch.behaviour_logprobs, TRAINER_VERSION)
    assert torch.equal(loss, plain_loss)
    assert torch.equal(gradient, plain_gradient)


@pytest.mark.parametrize("correction", ALL_CORRECTIONS)
def test_all_masked_sequences_and_micro_batches_train_nothing_and_do_not_fail(correction):
    config = TrainerConfig(correction=correction, proximal="recompute")
    mask = torch.tensor([[1, 1, 1], [0, 0, 0]])
    batch = train_batch(BEHAVIOUR, VERSIONS, mask, ADVANTAGES)
    near = BEHAVIOUR + 0.1  # θ within every clip range of b, so row 0's kept tokens carry a gradient
    _, gradient, _ = loss_and_grad(config, batch, near, PROXIMAL, TRAINER_VERSION)
    assert torch.equal(gradient[1], torch.zeros(3)) and gradient[0].abs().sum() > 0
    weights = corrected(correction, response_mask=mask).weights
    assert weights is None or torch.equal(weights[1], torch.zeros(3))

    nothing = train_batch(BEHAVIOUR, VERSIONS, torch.zeros_like(MASK), ADVANTAGES)  # a micro-batch of fill rows
    loss, gradient, _ = loss_and_grad(config, nothing, CURRENT, PROXIMAL, None)
    assert loss == 0 and torch.equal(gradient, torch.zeros_like(gradient))
    assert corrected(correction, response_mask=torch.zeros_like(MASK)).stats.metrics() == {}


@pytest.mark.parametrize("correction", ["token_mask", "seq_mask", "decoupled", "token_rs"])
def test_a_micro_batch_whose_every_weight_is_zeroed_trains_nothing_and_does_not_fail(correction):
    far = torch.tensor([[LN(9.0), LN(9.0), LN(9.0)], [LN(8.0), LN(8.0), 0.0]])  # every r and ρ above 5
    batch = train_batch(BEHAVIOUR, VERSIONS, MASK, ADVANTAGES)
    config = TrainerConfig(correction=correction, proximal="recompute")
    loss, gradient, _ = loss_and_grad(config, batch, CURRENT, BEHAVIOUR + far, TRAINER_VERSION)
    assert loss == 0 and torch.equal(gradient, torch.zeros_like(gradient))
    stats = corrected(correction, recomputed=BEHAVIOUR + far).stats
    assert stats.masked == stats.weighted_tokens == 5


def test_the_loss_records_statistics_only_while_recording():
    config = TrainerConfig(correction="token_tis", proximal="recompute")
    loss = policy_loss_fn(config)
    batch = train_batch(BEHAVIOUR, VERSIONS, MASK, ADVANTAGES)
    data = to_tensordict(batch, 1.0, {"old_log_probs": PROXIMAL}, dp_size=1, batch_num_tokens=5,
                         global_batch_size=2, trainer_version=TRAINER_VERSION)
    offsets = data["input_ids"].offsets()
    log_probs = torch.nested.nested_tensor_from_jagged(torch.full((int(offsets[-1]),), -1.0), offsets)
    loss(model_output={"log_probs": log_probs}, data=data)
    assert loss.drain().metrics() == {}
    loss.recording = True
    loss(model_output={"log_probs": log_probs}, data=data)
    metrics = loss.drain().metrics()
    assert metrics["correction/tokens_frac/gap_2"] == pytest.approx(2 / 5)
    assert metrics["correction/clipped_frac"] == pytest.approx(2 / 5)


# --- configuration: names, validation, the default rule -----------------------------------------


def test_default_correction_rule_follows_staleness():
    assert RunConfig(mode="sync").correction is Correction.NONE
    assert RunConfig(mode="fully_async").correction is Correction.NONE  # staleness 2: plain PPO on the behaviour
    assert RunConfig(mode="one_step_off").resolved_trainer().correction == "none"
    assert RunConfig(mode="one_step_off").resolved_trainer().loss_mode == "vanilla"
    assert RunConfig(mode="sync").resolved_trainer().correction == "none"
    chosen = RunConfig(mode="fully_async", max_staleness=4, trainer=TrainerConfig(correction="seq_tis"))
    assert chosen.correction is Correction.SEQ_TIS
    gspo = RunConfig(mode="fully_async", trainer=TrainerConfig(correction="gspo"))
    assert gspo.resolved_trainer().loss_mode == "gspo" and gspo.correction is Correction.GSPO
    assert RunConfig().correction_summary() == "correction=none (default for max_staleness=2)"
    assert chosen.correction_summary() == "correction=seq_tis (chosen, proximal=loglinear)"
    assert RunConfig(mode="sync").correction_summary() == "correction=none (default for max_staleness=0)"
    assert TrainerConfig().resolved_correction is Correction.NONE  # a trainer alone: staleness unknown


def test_auto_keeps_a_chosen_policy_loss():
    run = RunConfig(mode="fully_async", max_staleness=4, trainer=TrainerConfig(policy_loss="cispo"))
    run.validate()  # auto does not turn into gspo and contradict the chosen loss
    assert run.correction is Correction.NONE and run.resolved_trainer().loss_mode == "cispo"
    assert run.correction_summary() == ("correction=none (policy_loss=cispo chosen, applied to the behaviour "
                                        "log-probs as is)")
    assert TrainerConfig(policy_loss="cispo").resolved_correction is Correction.NONE


def test_choosing_none_is_the_default_and_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for mode in ("fully_async", "sync"):
            config = RunConfig(mode=mode)
            config.trainer.correction = "none"
            config.validate()
            assert config.resolved_trainer() == RunConfig(mode=mode).resolved_trainer()  # the same run as auto


@pytest.mark.parametrize("fields, message", [
    ({"correction": "tis"}, "TrainerConfig.correction='tis'"),
    ({"proximal": "linear"}, "TrainerConfig.proximal='linear'"),
    ({"mask_low": 2.0, "mask_high": 1.0}, "mask_low=2.0 exceeds mask_high=1.0"),
    ({"is_threshold": 0.0}, "TrainerConfig.is_threshold=0.0 must be > 0"),
    ({"correction": "gspo", "policy_loss": "cispo"}, "set policy_loss=vanilla"),
])
def test_invalid_correction_settings_name_the_field_and_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        TrainerConfig(**fields).validate()
