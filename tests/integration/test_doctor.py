"""`fullasync doctor` on this machine: every check runs (vLLM imported in a child process) and the status is right."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("python", "versions", "torch", "ray", "vllm", "cache", "loopback")


def doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fullasync.cli", "doctor"], capture_output=True, text=True,
                          timeout=400, cwd=ROOT, env={**os.environ, **env})


def test_doctor_passes_here_and_reports_every_check(tmp_path):
    done = doctor({"FULLASYNC_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[1]: line for line in done.stdout.splitlines()[1:-1]}
    assert set(lines) == set(CHECKS), done.stdout
    assert all(line.split()[0] in ("ok", "warn") for line in lines.values())
    assert lines["vllm"].startswith("ok") and " on cpu," in lines["vllm"]
    assert done.stdout.strip().endswith("all checks passed")


def test_doctor_fails_and_says_how_to_fix_an_unusable_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = doctor({"FULLASYNC_CACHE_DIR": str(blocker / "cache")})
    assert done.returncode == 1
    assert any(line.startswith("FAIL cache") and "FULLASYNC_CACHE_DIR" in line for line in done.stdout.splitlines())
    assert done.stdout.strip().endswith("1 check(s) failed")
