"""fullasync_patches.verl_cpu: what it relies on in verl 0.9.1 is still there, upstream still needs it, apply() is
idempotent.

The pytest process never applies the patch (it would select verl's platform for the whole
session); apply() runs in subprocesses.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

from fullasync_patches import verl_cpu

# What apply() and CPUPlatform rely on; a change here means re-checking the patch.
PLATFORM_ABSTRACT_METHODS = {
    "device_name", "vendor_name", "device_module", "is_available", "current_device", "device_count", "set_device",
    "synchronize", "manual_seed", "manual_seed_all", "set_allocator_settings", "empty_cache",
    "get_device_capability", "communication_backend_name", "visible_devices_envvar", "nvtx_range", "profiler_start",
    "profiler_stop", "ray_resource_name", "ray_noset_envvars", "is_ipc_supported", "cudart",
}


def run_python(script: str, **env: str) -> dict:
    """Run `script` in a fresh interpreter; it prints one JSON line last."""
    environment = {**os.environ, **env}
    environment.pop("VERL_PLATFORM", None)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                            env=environment, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_refuses_other_verl_versions(monkeypatch):
    assert verl_cpu.check_verl_version() == verl_cpu.SUPPORTED_VERL_VERSION
    monkeypatch.setattr(verl_cpu.importlib.metadata, "version", lambda name: "0.10.0")
    with pytest.raises(verl_cpu.VerlVersionError, match="written for verl 0.9.1, but verl 0.10.0 is installed"):
        verl_cpu.apply()


def test_verl_interfaces_the_patch_relies_on_are_unchanged():
    from verl.plugin.platform import PlatformBase, PlatformRegistry, platform_manager
    from verl.utils import distributed

    assert set(PlatformBase.__abstractmethods__) == PLATFORM_ABSTRACT_METHODS
    assert list(inspect.signature(PlatformRegistry.register).parameters) == ["platform"]
    assert "VERL_PLATFORM" in inspect.getsource(platform_manager._detect_platform_name)
    assert list(inspect.signature(distributed.initialize_global_process_group_ray).parameters) == [
        "timeout_second", "backend"]
    assert {"listen_socket", "host", "port"} <= set(inspect.signature(distributed.create_tcp_store).parameters)
    verl_init = inspect.getsource(sys.modules["verl"])
    assert 'os.getenv("VERL_USE_EXTERNAL_MODULES"' in verl_init and "import_external_libs(modules)" in verl_init
    cpu_platform = verl_cpu._build_platform_class(PlatformBase)()  # every abstract method implemented
    assert cpu_platform.communication_backend_name() == "gloo"
    assert cpu_platform.ray_resource_options(0.5) == {"num_cpus": 0.5}
    assert cpu_platform.device_module.max_memory_allocated() == 0


def test_upstream_still_lacks_a_cpu_platform():
    """When this fails, verl gained CPU support: check whether fullasync_patches.verl_cpu can go."""
    from verl.plugin.platform import PlatformRegistry
    from verl.utils import distributed

    assert verl_cpu.PLATFORM_NAME not in PlatformRegistry.registered_names()
    assert 'f"cpu:gloo,{get_device_name()}:{get_nccl_backend()}"' in inspect.getsource(
        distributed.initialize_global_process_group_ray)  # "cpu:gloo,cpu:gloo" is rejected by torch


def test_worker_env_makes_verl_import_the_patch():
    env = verl_cpu.worker_env_vars()
    assert env["VERL_PLATFORM"] == "cpu"
    assert env["VERL_USE_EXTERNAL_MODULES"].split(",")[0] == "fullasync_patches.verl_cpu"


def test_verl_hook_applies_the_patch_and_apply_is_idempotent():
    report = run_python(
        """
        import json, os, socket, psutil, torch
        import verl  # the external-module hook imports fullasync_patches.verl_cpu, which applies itself
        import fullasync_patches.verl_cpu as verl_cpu
        import verl.utils.distributed as distributed
        from verl.plugin.platform import PlatformRegistry, get_platform
        from verl.utils.device import get_device_id, get_torch_device
        from verl.workers.engine import EngineRegistry

        def state():
            engines = {(m, b): EngineRegistry._engines[m][b].get("cpu") for m in ("language_model", "value_model")
                       for b in ("fsdp", "fsdp2")}
            return PlatformRegistry.get("cpu"), get_platform(), distributed.initialize_global_process_group_ray, engines

        first = state()
        verl_cpu.apply()
        verl_cpu.apply()
        import verl.workers.engine_workers as engine_workers

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="192.0.2.1", MASTER_PORT=str(port))
        engine_workers.initialize_global_process_group_ray(timeout_second=60)  # the name TrainingWorker calls
        total = torch.ones(2)
        torch.distributed.all_reduce(total)
        print(json.dumps({
            "unchanged_by_reapply": all(a is b for a, b in zip(first[:3], state()[:3])) and first[3] == state()[3],
            "platform": get_platform().device_name,
            "engine": EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__,
            "value_engine": EngineRegistry.get_engine_cls("value_model", "fsdp2").__name__,
            "engine_workers_patched": engine_workers.initialize_global_process_group_ray
                                      is distributed.initialize_global_process_group_ray,
            "backend": torch.distributed.get_backend(),
            "all_reduce": total.tolist(),
            "device_id": str(get_device_id()),
            "memory": get_torch_device().max_memory_allocated(),
            "listening_on": sorted({c.laddr.ip for c in psutil.Process().net_connections("tcp")
                                    if c.status == psutil.CONN_LISTEN}),
        }))
        """,
        VERL_USE_EXTERNAL_MODULES="fullasync_patches.verl_cpu",
    )
    assert report == {
        "unchanged_by_reapply": True,
        "platform": "cpu",
        "engine": "FSDPEngineWithLMHead",
        "value_engine": "FSDPEngineWithValueHead",
        "engine_workers_patched": True,
        "backend": "gloo",  # rendezvous on loopback although MASTER_ADDR names another host
        "all_reduce": [1.0, 1.0],
        "device_id": "cpu",
        "memory": 0,
        "listening_on": ["127.0.0.1"],  # the rendezvous store and gloo's listener
    }


def test_apply_refuses_after_verl_chose_another_platform():
    report = run_python(
        """
        import json
        from verl.plugin.platform import get_platform
        import fullasync_patches.verl_cpu as verl_cpu

        get_platform()  # no VERL_PLATFORM, no GPU: verl falls back to "nvidia" and keeps it
        try:
            verl_cpu.apply()
            print(json.dumps({"error": None}))
        except RuntimeError as error:
            print(json.dumps({"error": str(error)}))
        """
    )
    assert "call fullasync_patches.verl_cpu.apply() before" in report["error"]
