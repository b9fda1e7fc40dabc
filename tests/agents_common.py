"""Helpers the harness adapters' tests share (mini-swe-agent, Terminus-2): run one episode through the real
gateway, check its recording is token-exact, watch a harness's process tree, record weight versions."""

from __future__ import annotations

import asyncio
import re

from fullasync.rollout.generator import EpisodeContext
from fullasync.rollout.processes import alive, descendants


def literal(text: str) -> str:
    """A regex matching exactly `text`."""
    return re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", text)


async def run_episode(gateway, generator, row):
    """(reward, client) of one episode of `generator` on `row` through the gateway."""
    episode = gateway.open_episode()
    context = EpisodeContext(episode.episode_id, episode.client, episode.base_url, episode.api_key)
    try:
        return await generator.generate(context, row), episode.client
    finally:
        gateway.close_episode(episode)


def assert_token_exact(client, reward):
    """Every sampled token is trained exactly once, with its log-prob; a call whose prompt extends the previous
    call's prompt + output joins its sequence (a harness that drops a reply from its history starts a new one).
    Returns which calls extend the previous one."""
    calls = client.episode.calls
    sequences = client.trajectory(reward).to_sequences()
    extends = [later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids for earlier, later in zip(calls, calls[1:])]
    assert len(sequences) == 1 + extends.count(False)
    assert [t for s in sequences for t, m in zip(s.token_ids, s.loss_mask) if m] == [
        t for call in calls for t in call.output_ids]  # loss mask on sampled tokens only
    assert [lp for s in sequences for lp, m in zip(s.logprobs, s.loss_mask) if m] == [
        lp for call in calls for lp in call.output_logprobs]
    return extends


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


HANG = "sleep 301 & setsid sleep 302 & sleep 303"  # a background job, an escaped session, a blocking call


def _sleeps(pids: list[int]) -> int:
    return sum(cmdline(pid).startswith("sleep 30") for pid in pids)


async def hanging_harness(zygote: int, tries: int) -> list[int]:
    """The processes below the zygote once `HANG`'s three sleeps run (waiting up to `tries` tenths of a second)."""
    harness: list[int] = []
    for _ in range(tries):
        harness = descendants(zygote)
        if _sleeps(harness) == 3:
            break
        await asyncio.sleep(0.1)
    assert _sleeps(harness) == 3, [cmdline(pid) for pid in harness]
    return harness


async def assert_all_killed(harness: list[int], zygote: int) -> None:
    """Every process in `harness` has ended and the zygote holds none (SIGKILL and reaping are asynchronous)."""
    for _ in range(100):
        if not [pid for pid in harness if alive(pid)] and not descendants(zygote):
            break
        await asyncio.sleep(0.05)
    assert [pid for pid in harness if alive(pid)] == []
    assert descendants(zygote) == []


async def train_fully_async(vllm_engine, model_path: str, output_dir, generator, train: list[dict], **sections):
    """A 4-step fully-async run (staleness 2, groups of 2, 3 rows at once) of `generator` on `train` served by
    `vllm_engine`, with the verl CPU trainer; `sections` are extra `RunConfig` fields (e.g. `engine=`)."""
    from fullasync.api import AsyncAgentTrainer
    from fullasync.config import DataSection, RolloutSection, RunConfig
    from fullasync.trainer.config import TrainerConfig
    from fullasync.trainer.verl_trainer import VerlTrainer

    trainer = VerlTrainer(model_path, TrainerConfig(lr=1e-3, micro_batch_size=8))
    await trainer.start()
    try:
        config = RunConfig(mode="fully_async", max_staleness=2, total_steps=4, output_dir=str(output_dir),
                           trainer=TrainerConfig(lr=1e-3, micro_batch_size=8),
                           rollout=RolloutSection(n=2, batch_size=1, max_running_rows=3, episode_timeout_s=300),
                           data=DataSection(task="", epochs=1), **sections)
        return await AsyncAgentTrainer(config, rollout_fn=generator, train_dataset=train,
                                       val_dataset=None).train_async(engines=[vllm_engine], trainer=trainer)
    finally:
        await trainer.shutdown()


def assert_pushes_landed_mid_episode(result, generator) -> None:
    """Every step trained a full group, no episode failed, and a weight push landed while an episode ran."""
    assert result.steps == 4 and result.episode_failures == 0
    assert all(step["rollout/samples"] == 2 for step in result.history)
    spanning = [versions for versions in generator.episode_versions if len(versions) > 1]
    assert spanning or generator.resumed_calls, (generator.episode_versions, [h["version"] for h in result.history])
    assert result.max_token_staleness <= 2


class RecordsWeightVersions:
    """Mixed in before a generator: `record(episode)` keeps the weight versions each episode's tokens came from."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.episode_versions: list[set[int]] = []
        self.resumed_calls = 0

    def record(self, episode) -> None:
        calls = episode.client.episode.calls
        self.episode_versions.append({v for call in calls for v in call.output_versions})
        self.resumed_calls += sum(call.num_resumes > 0 for call in calls)
