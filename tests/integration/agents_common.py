"""Helpers the harness adapters' tests share (mini-swe-agent, Terminus-2): run one episode through the real
gateway, check its recording is token-exact, watch a harness's process tree, record weight versions, make a
weight push land inside an episode."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import time
from collections.abc import AsyncIterator

import pytest

from fullasync.contracts.engine import GenerateRequest, GenerateResult, InstallTiming, PauseMode, TokenDelta
from fullasync.rollout.generator import EpisodeContext
from fullasync.rollout.processes import alive, descendants
from fullasync_agents.containers import MANAGED, ContainerSettings


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
    call's prompt + output joins its sequence (a harness that drops a reply from its history starts a new
    lineage, unless it returns to an earlier one's context). Returns which calls extend the previous one."""
    calls = client.episode.calls
    trajectory = client.trajectory(reward)
    sequences, lineages = trajectory.to_sequences(), trajectory.lineages()
    extends = [later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids for earlier, later in zip(calls, calls[1:])]
    assert len(sequences) == len(lineages) <= 1 + extends.count(False)
    assert sorted(i for lineage in lineages for i in lineage) == list(range(len(calls)))
    for sequence, lineage in zip(sequences, lineages, strict=True):
        assert [t for t, m in zip(sequence.token_ids, sequence.loss_mask) if m] == [
            t for i in lineage for t in calls[i].output_ids]  # loss mask on sampled tokens only
        assert [lp for lp, m in zip(sequence.logprobs, sequence.loss_mask) if m] == [
            lp for i in lineage for lp in calls[i].output_logprobs]
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


async def assert_all_killed(harness: list[int], zygote: int, deadline_s: float = 30.0) -> None:
    """Every process in `harness` has ended and the zygote holds none (SIGKILL and reaping are asynchronous: poll
    until `deadline_s`, a bound on a hang)."""
    deadline = time.monotonic() + deadline_s
    while [pid for pid in harness if alive(pid)] or descendants(zygote):
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert [pid for pid in harness if alive(pid)] == []
    assert descendants(zygote) == []


async def train_fully_async(vllm_engine, model_path: str, output_dir, generator, train: list[dict], **sections):
    """A 4-step fully-async run (staleness 2, groups of 2, 3 rows at once) of `generator` on `train` served by
    `vllm_engine`, with the verl CPU trainer; `sections` are extra `RunConfig` fields (e.g. `engine=`)."""
    from fullasync.api import AsyncAgentTrainer
    from fullasync.config import DataSection, RolloutSection, RunConfig, TrainerConfig
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


class EpisodeAcrossAPush:
    """The run's engine, changed in one thing: one episode's model calls after its first wait until a weight push
    has landed, and the first push waits until that first call is done. That episode's tokens so come from two
    weight versions by construction, where hoping that a long episode outlasts a train step would depend on the
    machine's speed. `episode_id` must be an episode the run admits before its first push, in a row whose group
    the first train step does not need (the push waits for its first call; its later calls wait for the push).
    """

    def __init__(self, engine, episode_id: str, deadline_s: float = 900.0) -> None:
        self.engine = engine
        self.episode_id = episode_id
        self.deadline_s = deadline_s  # a bound on a hang
        self.first_call: str | None = None  # request ids are "<episode>-<call>-<choice>-<resume>"
        self.first_call_done = asyncio.Event()
        self.pushed = asyncio.Event()

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    async def _hold(self, request: GenerateRequest) -> bool:
        """Wait if `request` is a later call of the episode; whether it is its first call."""
        if not request.request_id.startswith(f"{self.episode_id}-"):
            return False
        call = request.request_id.rsplit("-", 1)[0]  # the resumes of one call share it
        if self.first_call is None:
            self.first_call = call
        if call == self.first_call:
            return True
        await asyncio.wait_for(self.pushed.wait(), self.deadline_s)
        return False

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        first = await self._hold(request)
        result = await self.engine.generate(request)
        if first:
            self.first_call_done.set()
        return result

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[TokenDelta | GenerateResult]:
        first = await self._hold(request)
        async for item in self.engine.generate_stream(request):
            yield item
        if first:
            self.first_call_done.set()

    async def install(self, weights, version: int, mode: PauseMode) -> InstallTiming:
        await asyncio.wait_for(self.first_call_done.wait(), self.deadline_s)
        timing = await self.engine.install(weights, version, mode)
        self.pushed.set()
        return timing


def assert_pushes_landed_mid_episode(result, generator, held: EpisodeAcrossAPush) -> None:
    """Every step trained a full group, no episode failed, and a weight push landed while the held episode ran."""
    assert result.steps == 4 and result.episode_failures == 0
    assert all(step["rollout/samples"] == 2 for step in result.history)
    assert held.pushed.is_set()
    versions = generator.episode_versions[held.episode_id]
    assert len(versions) > 1, (generator.episode_versions, [h["version"] for h in result.history])
    assert result.max_token_staleness <= 2


class RecordsWeightVersions:
    """Mixed in before a generator: `record(episode)` keeps the weight versions each episode's tokens came from."""

    def __init__(self, config) -> None:
        super().__init__(config)
        self.episode_versions: dict[str, set[int]] = {}  # by episode id

    def record(self, episode) -> None:
        calls = episode.client.episode.calls
        self.episode_versions[episode.episode_id] = {v for call in calls for v in call.output_versions}


def our_containers() -> list[str]:
    """Containers carrying fullasync's label, running or not."""
    listed = subprocess.run(["podman", "ps", "-aq", "--filter", f"label={MANAGED}=1"], capture_output=True,
                            text=True, check=True)
    return listed.stdout.split()


def cluster_container_settings(store: str) -> ContainerSettings:
    """placement=cluster, each node's podman store under `store` (its images read from this host's store too)."""
    root = subprocess.run(["podman", "info", "--format", "{{.Store.GraphRoot}}"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return ContainerSettings(placement="cluster", node_store=f"{store}/{{node}}", image_store=root)


@pytest.fixture(scope="module")
def podman_required():
    """Fail (not skip: CI has them) where podman is missing, saying how to get it."""
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: run `make setup-containers` (CI runs it before these tests)")
