"""The whole path on a real model: SmolLM2-135M-Instruct (+ chatml-tools) served by vLLM, trained by verl.

Slow (one vLLM engine and one verl trainer on a 135M-parameter model; a few minutes on 2 cores).
- a multi-turn tool episode through the gateway (openai SDK over HTTP) is one token-exact sequence;
- vLLM's float32 log-probs agree with the verl trainer's on the same sequences (max/mean printed);
- a trained step's weights pushed mid-generation: the generation continues under them, every token
  carries the version that sampled it, and both sides of the push score like their weights.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch
from events import frozen_mid_generation
from openai import AsyncOpenAI
from transformers import AutoModelForCausalLM

from fullasync.client import RolloutService
from fullasync.client.messages import normalize_messages
from fullasync.contracts.engine import PauseMode
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.gateway import Gateway
from fullasync.models import build_pretrained_model, load_tokenizer, with_chat_template
from fullasync.trainer import TrainerConfig, VerlTrainer
from fullasync.types import Trajectory, TrajectoryGroup
from fullasync.weights.sync import WeightSync

pytestmark = [pytest.mark.slow, pytest.mark.extended]

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
SYSTEM = "You are a careful assistant. Use the add tool for arithmetic."
QUESTIONS = ("What is 17 + 25?", "Name three colours.", "Write a haiku about the sea.",
             "What is the capital of France?")


@pytest.fixture(scope="module")
def smollm2_path() -> str:
    return str(with_chat_template(build_pretrained_model("smollm2-135m-instruct"), "chatml-tools"))


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="module")
async def smollm2_engine(ray_cluster, smollm2_path):
    # the CPU default KV budget (64 MiB) holds ~1,400 tokens of this model (46 KB per token): give it 256 MiB
    config = VLLMEngineConfig(model_path=smollm2_path, dtype="float32", max_model_len=1024, max_num_seqs=16,
                              extra_engine_kwargs={"kv_cache_memory_bytes": 256 * 2**20})
    (engine,) = await launch_vllm_engines(config)
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="module")
async def smollm2_trainer(ray_cluster, smollm2_path):
    trainer = VerlTrainer(smollm2_path, TrainerConfig(lr=1e-5, micro_batch_size=2, correction="none",
                                                      call_timeout_s=900))
    await trainer.start()
    yield trainer
    await trainer.shutdown()


def tool_call_regex(a: int, b: int) -> str:
    """Constrain the first turn to the tool call the template's own format writes (135M rarely calls unasked)."""
    body = json.dumps({"name": "add", "arguments": {"a": a, "b": b}})
    return "<tool_call>\n" + body.replace("{", r"\{").replace("}", r"\}") + "\n</tool_call>"


async def test_tool_episode_through_the_gateway_is_one_token_exact_sequence(smollm2_engine, smollm2_tokenizer):
    gateway = Gateway(RolloutService([smollm2_engine], smollm2_tokenizer))
    await gateway.start()
    try:
        episode = gateway.open_episode()
        openai = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 17 + 25?"}]
        first = await openai.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, max_tokens=40, temperature=1.0,
            extra_body={"structured_outputs": {"regex": tool_call_regex(17, 25)}})
        (call,) = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls"
        assert json.loads(call.function.arguments) == {"a": 17, "b": 25}
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": " 42 \n"}]
        final = await openai.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=40,
                                                     temperature=0.0)
        messages.append(final.choices[0].message.model_dump(exclude_none=True))
        await openai.close()
        gateway.close_episode(episode)
    finally:
        await gateway.stop()
    calls = episode.client.episode.calls
    assert len(calls) == 2 and calls[1].prompt_ids[: len(calls[0].all_ids)] == calls[0].all_ids
    (sequence,) = episode.client.trajectory(reward=1.0).to_sequences()
    rendered = smollm2_tokenizer.apply_chat_template(normalize_messages(messages), tools=TOOLS, tokenize=False)
    spelled = smollm2_tokenizer.decode(list(sequence.token_ids), skip_special_tokens=False)
    if final.choices[0].finish_reason == "length":  # the last turn was cut: no closing token was sampled
        assert spelled == rendered[: -len("<|im_end|>\n")]
    else:
        assert spelled == rendered[: -len("\n")]
    sampled = [i for i, mask in enumerate(sequence.loss_mask) if mask]
    assert sampled == [len(c.prompt_ids) + k for c in calls for k in range(len(c.output_ids))]
    print(f"\ntool episode: {len(sequence.token_ids)} tokens, {len(sampled)} sampled; final answer "
          f"{final.choices[0].message.content!r}")


async def sampled_groups(engine, tokenizer, max_tokens: int = 48) -> list[TrajectoryGroup]:
    """Two groups of two free generations each, recorded by the client (behaviour log-probs from vLLM)."""
    service = RolloutService([engine], tokenizer)

    async def episode(question: str) -> Trajectory:
        client = service.client()
        await client.chat.completions.create(model="policy", max_tokens=max_tokens, temperature=1.0, seed=7,
                                             messages=[{"role": "user", "content": question}])
        return client.trajectory(reward=float(len(question) % 2))

    trajectories = await asyncio.gather(*(episode(q) for q in QUESTIONS))
    return [TrajectoryGroup(f"row-{g}", (trajectories[2 * g], trajectories[2 * g + 1])) for g in range(2)]


async def test_vllm_and_verl_logprobs_agree_in_float32(smollm2_engine, smollm2_tokenizer, smollm2_trainer):
    batch = smollm2_trainer.build_batch(await sampled_groups(smollm2_engine, smollm2_tokenizer))
    started = time.perf_counter()
    trainer_logprobs = await smollm2_trainer.compute_logprobs(batch)
    seconds = time.perf_counter() - started
    mask = batch.response_mask.bool()
    difference = (trainer_logprobs[mask] - batch.behaviour_logprobs[mask]).abs()
    print(f"\nlog-prob agreement vLLM vs verl (fp32, {int(mask.sum())} tokens): max {difference.max():.2e}, "
          f"mean {difference.mean():.2e}; trainer forward {seconds:.1f} s")
    assert int(mask.sum()) > 50
    assert difference.max() < 5e-3 and difference.mean() < 5e-4  # measured 1.1e-3 / 1.5e-4 (30 layers)


async def test_trained_weights_pushed_mid_generation_continue_it(smollm2_engine, smollm2_tokenizer, smollm2_trainer,
                                                                 smollm2_path):
    batch = smollm2_trainer.build_batch(await sampled_groups(smollm2_engine, smollm2_tokenizer, max_tokens=24))
    metrics = await smollm2_trainer.train_step(batch, trainer_version=0)
    weights = await smollm2_trainer.export_weights()
    sync = WeightSync([smollm2_engine], mode=PauseMode.ABORT, version=await smollm2_engine.version())
    client = RolloutService([smollm2_engine], smollm2_tokenizer).client()
    generation = asyncio.create_task(client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        max_tokens=160, temperature=1.0, extra_body={"ignore_eos": True}))
    async with frozen_mid_generation(smollm2_engine, client.episode.id, at_least=8, budget=160):
        timing = await sync.push(weights)  # its pause (ABORT) interrupts the frozen request
    response = await generation
    (call,) = client.episode.calls
    print(f"\ntrain step {metrics['step_time_s']:.1f} s; push of 135M weights: {timing.total_s:.2f} s "
          f"(pause {timing.pause_s:.2f}, update {timing.update_s:.2f}, resume {timing.resume_s:.2f}); "
          f"resumed {call.num_resumes}x, versions {call.output_versions.count(0)}×v0 + "
          f"{call.output_versions.count(1)}×v1")
    assert response.choices[0].finish_reason == "length" and len(call.output_ids) == 160
    assert call.num_resumes >= 1 and timing.version == 1
    switch = call.output_versions.index(1)
    assert 0 < switch and call.output_versions == (0,) * switch + (1,) * (160 - switch)
    # each side of the push scores like the weights that sampled it (plain torch forwards, fp32)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    old_scores = token_logprobs(model, call.prompt_ids, call.output_ids)
    model.load_state_dict(await weights, strict=False)
    model.tie_weights()
    new_scores = token_logprobs(model, call.prompt_ids, call.output_ids)
    recorded = torch.tensor(call.output_logprobs)
    before, after = (recorded - old_scores)[:switch].abs(), (recorded - new_scores)[switch:].abs()
    assert before.max() < 2e-3 and after.max() < 2e-3, (before.max(), after.max())
    assert (recorded - old_scores)[switch:].abs().max() > 10 * after.max()  # the weights did change


def token_logprobs(model, prompt_ids, output_ids) -> torch.Tensor:
    """log p(output_i | prompt, output_<i) by one plain forward."""
    ids = torch.tensor([list(prompt_ids) + list(output_ids)])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    positions = torch.arange(len(prompt_ids) - 1, ids.shape[1] - 1)
    return logprobs[positions, torch.tensor(list(output_ids))]
