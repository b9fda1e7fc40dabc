"""Process-level set-up shared by the demo, the trainer and the tests: a loopback-only Ray.

Owns: starting (or joining) Ray so that every port it opens is bound to 127.0.0.1 unless the
user points `RAY_ADDRESS` at a cluster.
"""

from __future__ import annotations

import os

import ray

from patches import ray_loopback

LOOPBACK = "127.0.0.1"


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, log_to_driver: bool = True) -> None:
    """Start a local Ray on loopback (or connect to `RAY_ADDRESS`); a no-op when already running.

    `log_to_driver=False` keeps the workers' console output (vLLM, verl) in Ray's log files
    (`/tmp/ray/session_latest/logs`) instead of this console; their errors still reach the caller.
    """
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=log_to_driver)
        return
    ray_loopback.apply()
    os.environ.setdefault("VLLM_HOST_IP", LOOPBACK)
    os.environ.setdefault("MASTER_ADDR", LOOPBACK)
    ray.init(
        num_cpus=num_cpus if num_cpus is not None else os.cpu_count(),
        num_gpus=num_gpus,
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=log_to_driver,
    )
