"""The wheel installs what it imports: built from the sources, installed into a fresh environment on the CPU lock's
pinned versions (verl among them, --no-deps as pyproject.toml explains), then `fullasync doctor` and a 2-step
`fullasync train` run from a folder outside the repository, importing the installed package and nothing of the clone.

The fresh environment downloads the lock's ~250 distributions from the registry (~2.5 min here, 4.6 GB).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements" / "cpu-lock.txt"


def run(command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{' '.join(command[:4])} ... failed:\n{(done.stdout + done.stderr)[-4000:]}"
    return done.stdout + done.stderr


def build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "source"  # a copy: the build leaves build/ and *.egg-info beside the sources
    for name in ("fullasync", "agents", "patches"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist"),
         str(source)], tmp_path, 300)
    (wheel,) = (tmp_path / "dist").glob("fullasync-*.whl")
    return wheel


def test_the_wheel_in_a_fresh_environment_passes_doctor_and_trains_two_steps_outside_the_clone(tmp_path):
    wheel = build_wheel(tmp_path)
    fresh = tmp_path / "fresh"
    run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(fresh)], tmp_path, 120)
    pip = [str(fresh / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", "--no-deps", "-r", str(LOCK)], tmp_path, 1200)
    # the wheel's own requirements resolved against what the lock installed, the registry out of reach: a base
    # requirement the lock lacks, or one its pins contradict, fails here
    run([*pip, "install", "--no-index", str(wheel)], tmp_path, 300)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "RAY_ADDRESS", "VIRTUAL_ENV")}
    env["PATH"] = f"{fresh / 'bin'}:{env.get('PATH', '')}"
    where = run([str(fresh / "bin" / "python"), "-c", "import fullasync, fullasync_agents; "
                 "print(fullasync.__file__); print(fullasync_agents.__file__)"], elsewhere, 120, env)
    assert all(line.startswith(str(fresh)) for line in where.split()), where  # nothing of the clone

    doctor = run([str(fresh / "bin" / "fullasync"), "doctor"], elsewhere, 600, env)
    for name in ("requires", "torch", "ray", "vllm", "verl", "loopback"):
        assert any(line.startswith(f"ok   {name}") for line in doctor.splitlines()), doctor
    assert "all checks passed" in doctor

    output = elsewhere / "run"
    log = run([str(fresh / "bin" / "fullasync"), "train", "total_steps=2", "rollout.batch_size=2", "rollout.n=2",
               "val_samples_per_row=1", f"output_dir={output}"], elsewhere, 1200, env)
    result = json.loads((output / "result.json").read_text())
    assert result["steps"] == 2, log[-3000:]
    assert len((output / "metrics.jsonl").read_text().splitlines()) >= 2
    assert not (elsewhere / "outputs").exists()  # Hydra's run folder stays out of the working directory
