"""Checkpoint and resume of a whole run: format, atomicity, compatibility, and exactly-once rows across a restart.

The control code is real (Rollouter, MessageQueue, WeightSync, TrainingLoop, Run, the checkpoint
writer); engines and trainer are the simulator's, on its virtual clock. The simulated trainer's
state is the list of rows it trained, so "no row trained twice" is checked on what the resumed
trainer actually holds.
"""

from __future__ import annotations

import asyncio
import errno
import json
import math
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from fullasync.client import ClientConfig, RolloutService
from fullasync.observe.metrics import MetricsSink
from fullasync.rollout.curriculum import Curriculum, CurriculumSettings
from fullasync.rollout.rollouter import RolloutSettings
from fullasync.run import checkpoint as ckpt
from fullasync.run.assemble import assemble
from fullasync.run.checkpoint import CheckpointPolicy, IncompatibleCheckpointError
from fullasync.run.runner import RunSettings
from fullasync.sim.clock import run_virtual
from fullasync.sim.engine import DecodeCost, SimulatedEngine
from fullasync.sim.harness import SimTokenizer
from fullasync.sim.trainer import SimulatedTrainer, TrainCost
from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup, group_from_dict, group_to_dict

FINAL = {"trained", "filtered", "failed", "too_stale"}
ROWS = 24


def parts():
    engines = [SimulatedEngine("sim-0", DecodeCost(max_num_seqs=16, push_s=0.1))]
    service = RolloutService(engines, SimTokenizer(), ClientConfig(model_name="policy", max_model_len=4096))
    return engines, SimulatedTrainer(TrainCost(1e-3, 0.5), 1), service


def rows():
    # episode lengths differ inside a row, so a checkpoint catches rows with some episodes finished
    return ((f"row-{i}", {"i": i}) for i in range(ROWS))


def run_settings(**overrides) -> RunSettings:
    fields = dict(max_staleness=1, batch_size=2, total_steps=0, queue_in_process=True,
                  rollout=RolloutSettings(n=3, max_running_rows=4, episode_timeout_s=1e6))
    fields.update(overrides)
    return RunSettings(**fields)


class Harness:
    """Records every episode it runs; row 5 always fails, rows 7 and 8 give equal rewards (filtered)."""

    def __init__(self) -> None:
        self.episodes: Counter = Counter()

    async def __call__(self, client, row) -> float:
        index = int(client.episode.id.rsplit("/", 1)[1])
        self.episodes[client.episode.id] += 1
        if row["i"] == 5:
            raise RuntimeError("the sandbox is broken")
        await client.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=20 + 60 * index,
                                        extra_body={"ignore_eos": True})
        return 1.0 if row["i"] in (7, 8) else float(index == 0)


async def first_run(root: Path, stop_at_s: float | None = None, total_steps: int = 0, source=None):
    engines, trainer, service = parts()
    harness = Harness()
    run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=harness,
                         settings=run_settings(total_steps=total_steps, rollout=RolloutSettings(
                             n=3, max_running_rows=4, episode_timeout_s=1e6, filter_zero_variance=True)),
                         sink=MetricsSink(root.parent / "metrics.jsonl"),
                         checkpoints=CheckpointPolicy(root, every=2, keep=0, fingerprint={"seed": 0}))
    if stop_at_s is not None:
        asyncio.get_running_loop().call_later(stop_at_s, run.request_stop, "SIGTERM")
    return await run.execute(rows() if source is None else source), trainer, harness, run


async def resumed_run(root: Path, checkpoint_dir: Path, source=None):
    engines, trainer, service = parts()
    harness = Harness()
    run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=harness,
                         settings=run_settings(rollout=RolloutSettings(
                             n=3, max_running_rows=4, episode_timeout_s=1e6, filter_zero_variance=True)),
                         sink=MetricsSink(root.parent / "metrics.jsonl"),
                         checkpoints=CheckpointPolicy(root, every=2, keep=0, fingerprint={"seed": 0}))
    return (await run.execute(rows() if source is None else source, resume=ckpt.load(checkpoint_dir)), trainer,
            harness, engines)


def test_resuming_an_early_checkpoint_accounts_every_row_once_and_trains_none_twice(tmp_path):
    """A crash after step 4: the run restarts from the step-2 checkpoint (what survived) and finishes the epoch."""
    root = tmp_path / "checkpoints"
    first, first_trainer, _, _ = run_virtual(lambda: first_run(root, total_steps=5))
    saved = ckpt.complete_checkpoints(root)
    assert [p.name for p in saved] == ["step_00000002", "step_00000004", "step_00000005"]
    at_step_2 = ckpt.load(saved[0])
    assert at_step_2.loop.steps == 2 and at_step_2.loop.version == 2
    assert at_step_2.rollout.in_flight, "the checkpoint should catch rows still generating"
    assert any(eps for eps in at_step_2.rollout.in_flight.values()), "…some with finished episodes kept"

    result, trainer, harness, engines = run_virtual(lambda: resumed_run(root, saved[0]))

    # every row of the epoch has exactly one final outcome; the trainer holds each trained row once
    assert set(result.row_outcomes) == {f"row-{i}" for i in range(ROWS)}
    assert set(result.row_outcomes.values()) <= FINAL, result.outcomes
    assert result.row_outcomes["row-5"] == "failed"
    assert result.row_outcomes["row-7"] == result.row_outcomes["row-8"] == "filtered"
    assert len(trainer.trained_rows) == len(set(trainer.trained_rows))
    trained = {r for r, outcome in result.row_outcomes.items() if outcome == "trained"}
    assert set(trainer.trained_rows) == trained
    assert trainer.trained_rows[:4] == first_trainer.trained_rows[:4]  # the two steps before the checkpoint
    assert result.trained_rows_seen_twice == []
    # version numbering goes on from the checkpoint, strictly increasing over both runs' steps
    versions = [step["version"] for step in result.history]
    assert versions == list(range(1, len(versions) + 1)) and result.resumed_from_step == 2
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, result.steps + 1))
    # finished episodes of running rows were kept, not generated again
    for row_id, episodes in at_step_2.rollout.in_flight.items():
        for index in episodes:
            assert harness.episodes[f"{row_id}/{index}"] == 0, f"{row_id}/{index} ran again"
    # rows the step-2 checkpoint had accounted for did not run again
    for row_id in at_step_2.rollout.outcomes:
        assert not any(episode.startswith(f"{row_id}/") for episode in harness.episodes), row_id


def test_a_curriculums_checkpoint_resumes_its_sampling_and_accounts_every_draw_once(tmp_path):
    """Rows sampled by a curriculum: the step-2 checkpoint holds the sampler (its draws still running among them);
    the resumed run runs those first, draws on from the sampler's state, and accounts for every draw once."""
    root = tmp_path / "checkpoints"
    sampler = CurriculumSettings(draws=36, seed=5)
    run_virtual(lambda: first_run(root, total_steps=5, source=Curriculum(list(rows()), sampler)))
    at_step_2 = ckpt.load(ckpt.complete_checkpoints(root)[0])
    state = at_step_2.rollout.curriculum
    assert state is not None and state["pending"] and set(at_step_2.rollout.in_flight) <= set(state["pending"])
    resumed = Curriculum(list(rows()), sampler)
    result, trainer, _, _ = run_virtual(lambda: resumed_run(root, ckpt.complete_checkpoints(root)[0], resumed))
    assert len(result.row_outcomes) == 36 and set(result.row_outcomes.values()) <= FINAL  # each draw once
    assert set(state["pending"]) <= set(result.row_outcomes) and resumed.drawn == 36 and not resumed.pending
    assert len(trainer.trained_rows) == len(set(trainer.trained_rows)) and result.trained_rows_seen_twice == []


def test_a_stop_signal_checkpoints_queued_and_running_rows_and_the_resume_finishes_the_epoch(tmp_path):
    root = tmp_path / "checkpoints"
    first, first_trainer, _, _ = run_virtual(lambda: first_run(root, stop_at_s=3.0))
    assert first.interrupted and first.val_after is None
    last = ckpt.load(ckpt.latest_checkpoint(root))
    assert last.loop.steps == first.steps and last.loop.version == first.steps
    queued = {g.row_id for g in last.groups}
    assert queued, "the stop should leave groups queued"
    assert {r for r, o in last.rollout.outcomes.items() if o == "queued"} == queued
    assert not queued & set(last.rollout.in_flight)

    result, trainer, _, _ = run_virtual(lambda: resumed_run(root, ckpt.latest_checkpoint(root)))
    assert set(result.row_outcomes) == {f"row-{i}" for i in range(ROWS)}
    assert set(result.row_outcomes.values()) <= FINAL
    assert len(trainer.trained_rows) == len(set(trainer.trained_rows))
    assert queued <= set(trainer.trained_rows) | {r for r, o in result.row_outcomes.items() if o == "too_stale"}


def test_an_interrupted_save_leaves_the_previous_checkpoint_the_newest(tmp_path):
    root = tmp_path / "checkpoints"
    run_virtual(lambda: first_run(root, total_steps=2))
    (good,) = ckpt.complete_checkpoints(root)
    staging = root / ".step_00000004.tmp-12345"  # what a kill during a save leaves
    (staging / "trainer").mkdir(parents=True)
    (staging / "run.json").write_text("{")
    half = root / "step_00000006"  # a directory without its manifest is not a checkpoint
    half.mkdir()
    assert ckpt.latest_checkpoint(root) == good
    assert ckpt.remove_interrupted_saves(root) == [staging.name] and not staging.exists()
    assert ckpt.load(good).loop.steps == 2


@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs of its own (the checkpoints' file system fills while the rest of the machine has room)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    assert mounted.returncode == 0, f"this test mounts a small tmpfs and needs root: {mounted.stderr.strip()}"
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def fill(disk: Path) -> None:
    """Take every byte left on `disk`."""
    with open(disk / "filler", "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError as error:
            assert error.errno == errno.ENOSPC, error


class DiskFillingTrainer(SimulatedTrainer):
    """Something else on the machine fills the checkpoints' disk just before the trainer's second save."""

    def __init__(self, disk: Path) -> None:
        super().__init__(TrainCost(1e-3, 0.5), 1)
        self.disk, self.saves = disk, 0

    async def save_state(self, path: str) -> None:
        self.saves += 1
        if self.saves == 2:
            fill(self.disk)
        await super().save_state(path)


def test_a_full_disk_leaves_the_newest_complete_checkpoint_usable_and_the_run_goes_on(small_disk, caplog):
    root = small_disk / "checkpoints"

    async def main():
        engines, _, service = parts()
        trainer = DiskFillingTrainer(small_disk)
        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=Harness(),
                             settings=run_settings(total_steps=6), sink=MetricsSink(None),
                             checkpoints=CheckpointPolicy(root, every=2, keep=1, fingerprint={"seed": 0},
                                                          hf_every=2))
        return await run.execute(rows()), trainer

    result, trainer = run_virtual(main)
    # checkpoints of steps 2, 4 and 6 tried, and 6 again at the run's end (its checkpoint was not written), model
    # folders at 2, 4 and 6; every step trained
    assert result.steps == 6 and trainer.saves == 4
    assert result.failed_saves == 5 and result.summary()["failed_saves"] == 5
    (kept,) = ckpt.complete_checkpoints(root)
    assert kept.name == "step_00000002" and ckpt.load(kept).loop.steps == 2  # keep=1 pruned nothing for them
    assert [p.name for p in root.iterdir()] == [kept.name]  # what the failed saves wrote is gone
    assert [p.name for p in (small_disk / "hf").iterdir()] == ["step_00000002"]
    said = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert len(said) == 5 and all("\n" not in line for line in said), said
    assert "checkpoint of step 4 not written: No space left on device" in said[0] and str(kept) in said[0]


def test_keep_prunes_old_checkpoints_only_after_a_newer_one_is_complete(tmp_path):
    async def main():
        engines, trainer, service = parts()
        run = await assemble(engines=engines, trainer=trainer, service=service, rollout_fn=Harness(),
                             settings=run_settings(total_steps=6), sink=MetricsSink(None),
                             checkpoints=CheckpointPolicy(tmp_path, every=2, keep=2))
        return await run.execute(rows())

    run_virtual(main)
    assert [p.name for p in ckpt.complete_checkpoints(tmp_path)] == ["step_00000004", "step_00000006"]


def test_a_checkpoint_of_a_different_run_is_refused_naming_the_field(tmp_path):
    root = tmp_path / "checkpoints"
    run_virtual(lambda: first_run(root, total_steps=2))
    with pytest.raises(IncompatibleCheckpointError, match=r"differs in seed \(seed: checkpoint 0, now 1\)"):
        ckpt.find_resumable(root, "auto", {"seed": 1})
    with pytest.raises(IncompatibleCheckpointError, match="resume=auto to continue it"):
        ckpt.find_resumable(root, "never", {"seed": 0})
    assert ckpt.find_resumable(root, "auto", {"seed": 0}).loop.steps == 2
    assert ckpt.find_resumable(tmp_path / "elsewhere", "auto", {"seed": 0}) is None
    with pytest.raises(ValueError, match="not a complete fullasync checkpoint"):
        ckpt.find_resumable(root, str(tmp_path), {"seed": 0})


def test_groups_round_trip_through_plain_json():
    call = ModelCall((1, 2), (3, 4), (-0.5, -math.inf), (2, 3), FinishReason.LENGTH, num_resumes=1,
                     resubmitted_tokens=1, engine="e0")
    group = TrajectoryGroup("row-1", (Trajectory((call,), 0.5, {"turns": 2, "tool": object()}),), {"failed": 0})
    data = json.loads(json.dumps(group_to_dict(group)))
    back = group_from_dict(data)
    assert back.trajectories[0].calls == (call,)
    assert back.trajectories[0].metadata["turns"] == 2
    assert back.trajectories[0].metadata["tool"].startswith("<object object")  # kept as its repr
    assert back.row_id == "row-1" and dict(back.metadata) == {"failed": 0}
