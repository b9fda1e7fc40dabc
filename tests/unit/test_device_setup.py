"""`make setup` installs the lock of the machine's device: the GPU lock where an NVIDIA GPU answers `nvidia-smi -L`
(a stand-in here), the CPU lock otherwise, FULLASYNC_DEVICE deciding instead when set."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LISTING = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5b6e1c2a-0000-0000-0000-000000000000)"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."


def _stand_in(tmp_path: Path, output: str, status: int) -> dict[str, str]:
    """An environment whose PATH starts with an `nvidia-smi` printing `output` and exiting `status`."""
    tool = tmp_path / "bin" / "nvidia-smi"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(f"#!/bin/sh\necho '{output}'\nexit {status}\n")
    tool.chmod(0o755)
    environment = {key: value for key, value in os.environ.items() if key != "FULLASYNC_DEVICE"}
    return {**environment, "PATH": f"{tool.parent}:{environment['PATH']}"}


def _decided(environment: dict[str, str]) -> tuple[str, str]:
    """(what requirements/device.sh prints, the lock `make setup` would install) in `environment`."""
    device = subprocess.run(["sh", "requirements/device.sh"], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=30)
    planned = subprocess.run(["make", "-n", "-B", "setup"], cwd=ROOT, env=environment, capture_output=True, text=True,
                             timeout=60)
    locks = {line.split("-r ", 1)[1].split()[0] for line in planned.stdout.splitlines() if "install" in line
             and " -r requirements/" in line}
    assert len(locks) == 1, planned.stdout
    return device.stdout.strip(), locks.pop()


@pytest.mark.parametrize("output, status, device", [(LISTING, 0, "gpu"), (NO_DRIVER, 9, "cpu"), ("", 0, "cpu")])
def test_setup_installs_the_gpu_lock_only_where_a_gpu_answers(tmp_path, output, status, device):
    assert _decided(_stand_in(tmp_path, output, status)) == (device, f"requirements/{device}-lock.txt")


def test_without_nvidia_smi_the_cpu_lock_and_fullasync_device_decides_instead(tmp_path):
    environment = _stand_in(tmp_path, LISTING, 0)
    assert _decided({**environment, "FULLASYNC_DEVICE": "cpu"}) == ("cpu", "requirements/cpu-lock.txt")
    (tmp_path / "bin" / "nvidia-smi").unlink()
    assert _decided(environment) == ("cpu", "requirements/cpu-lock.txt")
    refused = subprocess.run(["make", "-n", "setup"], cwd=ROOT, env={**environment, "FULLASYNC_DEVICE": "tpu"},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "FULLASYNC_DEVICE=tpu: use cpu or gpu" in refused.stderr
