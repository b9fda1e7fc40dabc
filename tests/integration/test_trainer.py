"""VerlTrainer with real verl (FSDP2 on CPU, gloo), real Ray and the tiny model.

One trainer per module (start-up ~15 s). Tests that share it state what they assume about its
weights: each one reads the weights it compares against from the trainer itself.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fullasync.contracts.engine import GenerateRequest, SamplingOptions
from fullasync.trainer import TrainerConfig, VerlTrainer, build_batch
from fullasync.trainer.verl_setup import policy_loss_fn, to_tensordict
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup

PROMPTS = ((17, 40, 41, 42), (17, 50, 51), (17, 60, 61, 62, 63))
RESPONSES = ((300, 301, 302), (310, 311), (320, 321, 322, 323), (330,), (340, 341), (350, 351, 352))


@pytest.fixture(scope="module")
async def trainer(ray_cluster, tiny_model_path):
    # decoupled PPO with recomputed proximal log-probs (the first test checks them against a plain forward)
    config = TrainerConfig(lr=1e-2, micro_batch_size=2, call_timeout_s=120, correction="decoupled",
                           proximal="recompute")
    trainer = VerlTrainer(tiny_model_path, config)
    await trainer.start()
    yield trainer
    await trainer.shutdown()


def fresh_model(model_path: str, weights: dict[str, torch.Tensor] | None = None):
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    if weights is not None:
        model.load_state_dict(weights, strict=True)
    return model


def hf_logprobs(model, prompt, output) -> list[float]:
    """log p(output_i | prompt, output_<i) by a plain PyTorch forward."""
    ids = torch.tensor([list(prompt) + list(output)])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return logprobs[positions, torch.tensor(output)].tolist()


def model_call(model, prompt, output, version=0) -> ModelCall:
    """A model call whose behaviour log-probs are `model`'s (or a constant when model is None)."""
    logprobs = hf_logprobs(model, prompt, output) if model is not None else [-1.0] * len(output)
    return ModelCall(tuple(prompt), tuple(output), tuple(logprobs), (version,) * len(output), FinishReason.STOP)


def groups_for(model, rewards=((1.0, 0.0), (0.0, 1.0), (0.5, 0.5))) -> list[TrajectoryGroup]:
    """Three groups of two single-call trajectories; the last group has zero reward variance."""
    groups = []
    for g, (prompt, group_rewards) in enumerate(zip(PROMPTS, rewards)):
        trajectories = tuple(
            Trajectory((model_call(model, prompt, RESPONSES[2 * g + i]),), reward=reward)
            for i, reward in enumerate(group_rewards)
        )
        groups.append(TrajectoryGroup(f"row-{g}", trajectories))
    return groups


def batch_hf_logprobs(model, batch) -> torch.Tensor:
    """(N, R) response log-probs of `batch` under `model`, aligned like `VerlTrainer.compute_logprobs`."""
    result = torch.zeros(batch.responses.shape)
    for row in range(batch.num_sequences):
        prompt = batch.prompts[row][batch.attention_mask[row, : batch.prompts.shape[1]].bool()].tolist()
        length = int(batch.attention_mask[row, batch.prompts.shape[1] :].sum())
        result[row, :length] = torch.tensor(hf_logprobs(model, prompt, batch.responses[row, :length].tolist()))
    return result


async def test_train_step_recomputes_old_logprobs_exactly_and_changes_weights(trainer, tiny_model_path):
    before = await (await trainer.export_weights())
    model = fresh_model(tiny_model_path, before)
    batch = trainer.build_batch(groups_for(model))  # behaviour log-probs: a plain fp32 forward of these weights
    mask = batch.response_mask.bool()

    logprobs = await trainer.compute_logprobs(batch)
    assert torch.allclose(logprobs[mask], batch.behaviour_logprobs[mask], atol=1e-5)

    metrics = await trainer.train_step(batch, trainer_version=0)
    assert metrics["logprob_gap_max"] < 1e-5  # the proximal log-probs the step recomputed = the plain forward
    # decoupled PPO with a recomputed proximal on on-policy tokens: no mismatch, weights 1
    assert metrics["correction/tokens_frac/gap_0"] == 1.0 and abs(metrics["correction/kl_k1"]) < 1e-5
    assert abs(metrics["correction/is_weight_mean"] - 1.0) < 1e-4 and metrics["correction/masked_frac"] == 0.0
    assert metrics["grad_norm"] > 0 and torch.isfinite(torch.tensor(metrics["loss"]))
    assert {"pg_loss", "pg_clipfrac", "entropy", "ppo_kl", "lr", "step_time_s"} <= set(metrics)
    after = await (await trainer.export_weights())
    assert any(not torch.equal(before[name], after[name]) for name in before)


async def test_positive_advantage_raises_its_sequence_logprob_from_stale_samples(trainer, tiny_model_path):
    """Samples of the trainer's current weights, trained on for 4 steps (version gaps 0..3, decoupled PPO)."""
    model = fresh_model(tiny_model_path, await (await trainer.export_weights()))
    prompt, winner, loser = PROMPTS[0], RESPONSES[0], RESPONSES[1]
    group = TrajectoryGroup("g", (Trajectory((model_call(model, prompt, winner),), 1.0),
                                  Trajectory((model_call(model, prompt, loser),), 0.0)))
    batch = trainer.build_batch([group])
    before = (await trainer.compute_logprobs(batch)).sum(dim=1)
    for step in range(4):
        metrics = await trainer.train_step(batch, trainer_version=step)
        assert metrics[f"correction/tokens_frac/gap_{step}"] == 1.0
    assert metrics["correction/kl_k3/gap_3"] > 0  # the policy moved away from the one that sampled
    after = (await trainer.compute_logprobs(batch)).sum(dim=1)
    assert after[0] > before[0] + 0.1  # the positive-advantage sequence became more likely
    assert after[1] < before[1] - 0.1  # the negative one less likely


async def test_train_step_refuses_tokens_newer_than_the_trainer_version(trainer):
    batch = trainer.build_batch(groups_for(None))  # tokens of version 0
    with pytest.raises(ValueError, match="pass the weight version the trainer holds"):
        await trainer.train_step(batch, trainer_version=-1)


async def test_exported_weights_reproduce_trainer_logprobs_and_include_tied_lm_head(trainer, tiny_model_path):
    weights = await (await trainer.export_weights())
    assert "lm_head.weight" in weights
    assert torch.equal(weights["lm_head.weight"], weights["model.embed_tokens.weight"])
    batch = trainer.build_batch(groups_for(None))
    expected = await trainer.compute_logprobs(batch)
    reproduced = batch_hf_logprobs(fresh_model(tiny_model_path, weights), batch)
    assert torch.allclose(reproduced, expected, atol=1e-5)
    assert trainer.timings["export_s"] > 0  # timed (how fast is bench/weight_push.py's business, not a test's)


async def test_checkpoint_is_a_loadable_hf_directory(trainer, tmp_path):
    path = await trainer.save_checkpoint(str(tmp_path / "checkpoint"))
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    assert AutoTokenizer.from_pretrained(path).eos_token == "<|im_end|>"
    batch = trainer.build_batch(groups_for(None))
    assert torch.allclose(batch_hf_logprobs(model.eval(), batch), await trainer.compute_logprobs(batch), atol=1e-5)


async def test_exported_reference_goes_straight_to_a_vllm_engine(trainer, engine, policy):
    """train → export (a Ray reference) → engine.update_weights(ref) → generate: trainer and engine agree."""
    original = dict(policy.current)
    reference = await trainer.export_weights()
    try:
        await policy.weight_sync.push(reference)  # WeightSync hands the reference on; the engine resolves it
        policy.current = dict(await reference)  # keep the shared fixture's record of the engine's weights
        sampling = SamplingOptions(seed=0, ignore_eos=True)
        result = await engine.generate(GenerateRequest("trainer-export", PROMPTS[1], max_tokens=8, sampling=sampling))
        call = ModelCall(PROMPTS[1], result.output_ids, result.output_logprobs, result.output_versions,
                         FinishReason.STOP)
        batch = trainer.build_batch([TrajectoryGroup("engine", (Trajectory((call,), reward=1.0),))])
        mask = batch.response_mask.bool()
        logprobs = await trainer.compute_logprobs(batch)
        assert torch.allclose(logprobs[mask], batch.behaviour_logprobs[mask], atol=1e-4)  # fp32 engine: ~3e-6
    finally:
        await policy.push(original)  # other tests expect the engine's weights to be policy.current


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus"])
@pytest.mark.parametrize("loss", ["vanilla", "gspo", "cispo"])
def test_verl_loss_path_runs_for_each_estimator_and_policy_loss(estimator, loss):
    """Our batch → verl's ppo_loss (policy-loss registry, agg_loss, kl_penalty) → a finite loss with gradient."""
    config = TrainerConfig(advantage_estimator=estimator, policy_loss=loss, kl_coef=0.1)
    config.validate()
    batch = build_batch(groups_for(None), advantage_estimator=estimator)
    old = batch.behaviour_logprobs
    data = to_tensordict(batch, config.temperature, {"old_log_probs": old, "ref_log_prob": old - 0.1},
                         dp_size=1, batch_num_tokens=batch.num_trained_tokens, global_batch_size=batch.num_sequences)
    offsets = data["input_ids"].offsets()
    values = (torch.randn(int(offsets[-1])) * 0.1 - 1.0).requires_grad_()
    entropy = torch.nested.nested_tensor_from_jagged(torch.ones(int(offsets[-1])), offsets)
    model_output = {"log_probs": torch.nested.nested_tensor_from_jagged(values, offsets), "entropy": entropy}
    loss_value, metrics = policy_loss_fn(config)(model_output=model_output, data=data)
    loss_value.backward()
    assert torch.isfinite(loss_value) and values.grad.abs().sum() > 0
    assert {"actor/pg_loss", "actor/pg_clipfrac", "kl_loss"} <= set(metrics)


async def test_two_ranks_with_reference_kl_and_rollout_logprobs(ray_cluster, tiny_model_path):
    """N = 2 data-parallel ranks (gloo), a frozen reference, gspo, decoupled PPO with the loglinear proximal."""
    config = TrainerConfig(lr=1e-2, micro_batch_size=1, num_workers=2, worker_num_cpus=0.25, worker_threads=1,
                           kl_coef=0.05, policy_loss="gspo", loss_agg_mode="seq-mean-token-mean",
                           advantage_estimator="rloo", correction="decoupled", proximal="loglinear", mini_batches=2,
                           ppo_epochs=2, call_timeout_s=120)
    trainer = VerlTrainer(tiny_model_path, config)
    await trainer.start()
    try:
        model = fresh_model(tiny_model_path)
        batch = trainer.build_batch(groups_for(model))
        assert torch.allclose(await trainer.compute_logprobs(batch), batch_hf_logprobs(model, batch), atol=1e-5)
        metrics = await trainer.train_step(batch, trainer_version=0)
        assert metrics["num_updates"] == 4 and metrics["kl_loss"] >= 0 and "logprob_gap_max" not in metrics
        assert metrics["correction/tokens_frac/gap_0"] == 1.0  # statistics summed over both ranks
        assert metrics["correction/is_weight_mean"] == 1.0  # gap 0: the loglinear proximal is the behaviour
        weights = await (await trainer.export_weights())
        trained = fresh_model(tiny_model_path, weights)
        assert torch.allclose(await trainer.compute_logprobs(batch), batch_hf_logprobs(trained, batch), atol=1e-5)
    finally:
        await trainer.shutdown()


@pytest.mark.parametrize(("loss_agg_mode", "num_workers"), [("token-mean", 2), pytest.param(
    "seq-mean-token-sum", 1, marks=pytest.mark.slow)])  # the second in CI's slow tier
async def test_a_batch_taken_in_two_parts_makes_the_same_update_as_taken_whole(ray_cluster, tiny_model_path, tmp_path,
                                                                               loss_agg_mode, num_workers):
    """The loop binds a step's last groups late (`TrainingLoop._late_places`): the trainer works through the first
    part, then takes the rest; the one update over both must be the update of the whole batch. The parts are
    unequal (10 and 5 tokens, 4 and 2 sequences), so a part left unscaled would move the gradient."""
    config = TrainerConfig(lr=1e-2, micro_batch_size=1, num_workers=num_workers, worker_num_cpus=0.25,
                           worker_threads=1, loss_agg_mode=loss_agg_mode, kl_coef=0.05, correction="decoupled",
                           proximal="recompute", call_timeout_s=120)
    trainer = VerlTrainer(tiny_model_path, config)
    await trainer.start()
    try:
        assert trainer.binds_late
        groups = groups_for(None, rewards=((1.0, 0.0), (0.0, 1.0), (0.25, 0.75)))  # stale behaviour log-probs
        start = await (await trainer.export_weights())
        await trainer.save_state(str(tmp_path / "start"))
        whole = await trainer.train_step(trainer.build_batch(groups), trainer_version=1)
        whole_weights = await (await trainer.export_weights())
        await trainer.load_state(str(tmp_path / "start"))
        assert torch.equal((await (await trainer.export_weights()))["model.norm.weight"], start["model.norm.weight"])
        asked = []

        async def rest():
            asked.append(True)
            return trainer.build_batch(groups[2:])

        parts = await trainer.train_step(trainer.build_batch(groups[:2]), trainer_version=1, late=rest)
        parts_weights = await (await trainer.export_weights())
        assert asked == [True] and trainer.step == 1
        assert parts["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-5)
        assert parts["loss"] == pytest.approx(whole["loss"], rel=1e-5)
        assert parts["num_sequences"] == whole["num_sequences"] == 6
        assert parts["correction/tokens_frac/gap_1"] == whole["correction/tokens_frac/gap_1"] == 1.0
        assert any(not torch.equal(start[name], whole_weights[name]) for name in start)
        for name in start:  # Adam's first step moves a weight by ~lr·sign(g): elements with |g| near its eps
            # differ by float rounding (1e-5 seen); a part's gradient of the wrong sign would move one by 2·lr
            torch.testing.assert_close(parts_weights[name], whole_weights[name], rtol=0, atol=config.lr / 100)
    finally:
        await trainer.shutdown()


@pytest.mark.parametrize("micro_batches", [{"micro_batch_size": 1}, pytest.param(
    {"max_tokens_per_micro_batch": 16}, marks=pytest.mark.slow)])  # the second in CI's slow tier
async def test_an_episode_of_three_lineages_makes_the_update_of_one_in_a_seq_mean_loss(ray_cluster, tiny_model_path,
                                                                                      tmp_path, micro_batches):
    """The same sequence three times in one episode (three lineages; one micro-batch each, or two 7-token
    sequences a micro-batch by tokens) weighs as that sequence once: in seq-mean-token-mean both batches'
    objectives are the mean over their two episodes, so the worker's update (policy loss, entropy bonus and KL)
    must be the same."""
    config = TrainerConfig(lr=1e-2, worker_num_cpus=0.25, worker_threads=1, loss_agg_mode="seq-mean-token-mean",
                           entropy_coeff=0.01, kl_coef=0.05, call_timeout_s=120, **micro_batches)
    trainer = VerlTrainer(tiny_model_path, config)
    await trainer.start()
    try:
        lineage = model_call(None, PROMPTS[0], RESPONSES[0])
        failed = Trajectory((model_call(None, PROMPTS[0], RESPONSES[1]),), reward=0.0)
        batches = [trainer.build_batch([TrajectoryGroup("row", (Trajectory(calls, reward=1.0), failed))])
                   for calls in ((lineage,) * 3, (lineage,))]
        await trainer.save_state(str(tmp_path / "start"))
        three = await trainer.train_step(batches[0], trainer_version=0)
        three_weights = await (await trainer.export_weights())
        await trainer.load_state(str(tmp_path / "start"))
        one = await trainer.train_step(batches[1], trainer_version=0)
        one_weights = await (await trainer.export_weights())
        assert (three["num_sequences"], one["num_sequences"]) == (4, 2)
        assert three["num_episodes"] == pytest.approx(one["num_episodes"]) == pytest.approx(2.0)
        assert three["reward_mean"] == pytest.approx(one["reward_mean"]) == pytest.approx(0.5)
        assert three["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)  # weighed per sequence, it is not
        for name in one_weights:  # Adam's first step: elements with |g| near its eps differ by rounding only
            torch.testing.assert_close(three_weights[name], one_weights[name], rtol=0, atol=config.lr / 100)
    finally:
        await trainer.shutdown()
