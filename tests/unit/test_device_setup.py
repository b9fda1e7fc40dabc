"""`make setup` installs the lock of the machine's device: the GPU lock where an NVIDIA GPU answers `nvidia-smi -L`
(a stand-in here), the CPU lock otherwise, FULLASYNC_DEVICE deciding instead when set."""

from __future__ import annotations

import os
import re
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


def _install_line(environment: dict[str, str], *variables: str) -> str:
    """The line of `make setup` (dry run) that installs a lock, in `environment`."""
    environment = {key: value for key, value in environment.items() if key not in ("MAKEFLAGS", "MFLAGS")}
    planned = subprocess.run(["make", "-n", "-B", "setup", *variables], cwd=ROOT, env=environment,
                             capture_output=True, text=True, timeout=60)
    lines = [line for line in planned.stdout.splitlines() if "install" in line and "-lock.txt" in line]
    assert len(lines) == 1, planned.stdout + planned.stderr
    return lines[0]


def _decided(environment: dict[str, str]) -> tuple[str, str]:
    """(what requirements/device.sh prints, the lock `make setup` would install) in `environment`."""
    device = subprocess.run(["sh", "requirements/device.sh"], cwd=ROOT, env=environment, capture_output=True,
                            text=True, timeout=30)
    locks = set(re.findall(r"requirements/(?:cpu|gpu)-lock\.txt", _install_line(environment)))
    assert len(locks) == 1, locks
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


def _python_reporting(tmp_path: Path, version: str) -> str:
    """A stand-in interpreter that answers `make`'s version question with `version`."""
    python = tmp_path / f"python{version}"
    python.write_text(f"#!/bin/sh\necho {version}\n")
    python.chmod(0o755)
    return str(python)


def test_on_python_3_12_the_cpu_lock_installs_with_pypis_torch_in_place_of_its_cpu_build(tmp_path):
    environment = {**_stand_in(tmp_path, "", 0), "FULLASYNC_DEVICE": "cpu"}
    on_311 = _install_line(environment, f"PYTHON={_python_reporting(tmp_path, '3.11')}")
    on_312 = _install_line(environment, f"PYTHON={_python_reporting(tmp_path, '3.12')}")
    assert on_311.endswith("-r requirements/cpu-lock.txt") and "py312" not in on_311
    assert "grep -v '^torch==' requirements/cpu-lock.txt" in on_312 and "-r requirements/cpu-lock-py312.txt" in on_312
    overlay = (ROOT / "requirements" / "cpu-lock-py312.txt").read_text()
    assert "\ntorch==2.13.0\n" in overlay and "+cpu" not in overlay.split("\ntorch==")[1]
    gpu = _install_line({**environment, "FULLASYNC_DEVICE": "gpu"}, f"PYTHON={_python_reporting(tmp_path, '3.12')}")
    assert gpu.endswith("-r requirements/gpu-lock.txt")  # the GPU lock serves 3.12 as it is
    refused = subprocess.run(["make", "-B", "setup", f"PYTHON={_python_reporting(tmp_path, '3.13')}",
                              "VENV=" + str(tmp_path / "venv")], cwd=ROOT, env=environment, capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode != 0 and "the locks serve CPython 3.11 and 3.12" in refused.stdout
