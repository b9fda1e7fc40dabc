"""`fullasync doctor` on this machine: every check runs (vLLM imported in a child process) and the status is right."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("python", "versions", "requires", "torch", "ray", "vllm", "verl", "shm", "cache", "loopback")


def doctor(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fullasync.cli", "doctor", *flags], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={**os.environ, **env})


def test_doctor_passes_here_and_reports_every_check(tmp_path):
    done = doctor({"FULLASYNC_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[1]: line for line in done.stdout.splitlines()[1:-1]}
    assert set(lines) == set(CHECKS), done.stdout
    assert all(line.split()[0] in ("ok", "warn") for line in lines.values())
    assert lines["vllm"].startswith("ok") and " on cpu," in lines["vllm"]
    assert lines["versions"].startswith("ok   versions  all ")  # the clone's lock found and matched
    assert lines["requires"].startswith("ok") and lines["verl"].startswith("ok   verl      0.9.1")
    assert lines["shm"].startswith("ok") and "/dev/shm: " in lines["shm"] and " GiB free" in lines["shm"]
    assert done.stdout.strip().endswith("all checks passed")


@pytest.mark.slow  # CI's slow tier: a doctor process each
def test_doctor_fails_and_says_how_to_fix_an_unusable_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = doctor({"FULLASYNC_CACHE_DIR": str(blocker / "cache")})
    assert done.returncode == 1
    assert any(line.startswith("FAIL cache") and "FULLASYNC_CACHE_DIR" in line for line in done.stdout.splitlines())
    assert done.stdout.strip().endswith("1 check(s) failed")


@pytest.mark.slow  # CI's slow tier: a doctor process each
def test_doctor_gpu_on_a_machine_without_one_fails_at_cuda_and_skips_what_needs_it(tmp_path):
    done = doctor({"FULLASYNC_CACHE_DIR": str(tmp_path / "cache")}, "--gpu")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    (cuda,) = [line for line in lines if line.split()[1:2] == ["cuda"]]
    assert cuda.startswith("FAIL") and "sees no CUDA device" in cuda and "make setup-gpu" in cuda
    assert [line.split()[:2] for line in lines if line.startswith("skip")] == [["skip", "ray-gpus"], ["skip", "stack"]]


@pytest.mark.slow
@pytest.mark.extended
def test_doctor_stack_runs_an_engine_a_train_step_and_a_checked_push_here(tmp_path):
    done = doctor({"FULLASYNC_CACHE_DIR": str(tmp_path / "cache")}, "--stack")
    assert done.returncode == 0, done.stdout + done.stderr
    (stack,) = [line for line in done.stdout.splitlines() if line.split()[1:2] == ["stack"]]
    assert stack.startswith("ok") and "checksums matched, engine serves version 1" in stack, stack
