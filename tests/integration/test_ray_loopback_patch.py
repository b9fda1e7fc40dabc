"""The loopback patch still matches Ray, and a running Ray listens on loopback only."""

from __future__ import annotations

import inspect
import subprocess

import ray

import fullasync_patches.ray_loopback as ray_loopback


def test_ray_still_has_what_the_patch_changes():
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    assert hasattr(ray_constants, "ENABLE_RAY_CLUSTER"), "Ray renamed ENABLE_RAY_CLUSTER: revisit patches/ray_loopback"
    assert "ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address)
    assert callable(services.start_api_server)
    ray_loopback.apply()
    ray_loopback.apply()  # idempotent: wrapped once
    assert services.start_api_server.fullasync_loopback
    assert not hasattr(services.start_api_server.__wrapped__, "fullasync_loopback")


def _listeners_of(pids: set[int]) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if any(f"pid={pid}," in line for pid in pids)]


def test_every_ray_listener_is_on_loopback(engine):
    import psutil

    assert ray.util.get_node_ip_address() == "127.0.0.1"
    root = psutil.Process()
    session_pids = {p.pid for p in root.children(recursive=True)} | {root.pid}
    listeners = _listeners_of(session_pids)
    assert listeners, "found no listeners of this session: the check would prove nothing"
    for line in listeners:
        local = line.split()[3]
        assert local.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:", "[::1]:")), f"not loopback: {line}"
