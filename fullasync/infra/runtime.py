"""Process-level set-up shared by the demo, the trainer and the tests: a loopback-only Ray, or a cluster's.

Owns: starting Ray so that every port it opens is bound to 127.0.0.1, or, when `RAY_ADDRESS` is
set, joining that cluster instead (and saying so). Does not own: where components go on a cluster
(`placement.py`, the components' `ray_resources`).

A local start never attaches to another Ray found on the machine (`ray.init(address="local")`):
only `RAY_ADDRESS` joins a cluster.
"""

from __future__ import annotations

import logging
import os

import ray

from fullasync_patches import ray_loopback

LOOPBACK = "127.0.0.1"

log = logging.getLogger("fullasync")


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, log_to_driver: bool = True) -> None:
    """Start a local Ray on loopback, or join the cluster at `RAY_ADDRESS`; a no-op when already running.

    With `RAY_ADDRESS` the cluster's nodes bring their own CPUs and GPUs, so `num_cpus` / `num_gpus`
    must not be given. `log_to_driver=False` keeps the workers' console output (vLLM, verl) in
    Ray's log files (`/tmp/ray/session_latest/logs`) instead of this console; their errors still
    reach the caller.
    """
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS", "").strip()
    if address:
        join_cluster(address, num_cpus, num_gpus, log_to_driver)
        return
    ray_loopback.apply()
    os.environ.setdefault("VLLM_HOST_IP", LOOPBACK)
    os.environ.setdefault("MASTER_ADDR", LOOPBACK)
    # Ray starts its workers at niceness 15, to keep a shared machine's other work responsive; here the workers
    # (engines, trainer ranks) are the work, and at 15 any other load starves them (docs/benchmarks/figures.md).
    # Workers inherit this from the raylet we start.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(
        address="local",
        num_cpus=num_cpus if num_cpus is not None else os.cpu_count(),
        num_gpus=num_gpus,
        _node_ip_address=LOOPBACK,
        include_dashboard=False,
        configure_logging=False,
        log_to_driver=log_to_driver,
    )


def join_cluster(address: str, num_cpus: int | None, num_gpus: int | None, log_to_driver: bool) -> None:
    """Connect to the running cluster at `address` and log its nodes and resources.

    The driver's own listeners (the gateway, the harness processes) stay on loopback; what the
    cluster's nodes bind is the cluster's set-up (`ray start --node-ip-address=...`), not ours.
    """
    if num_cpus is not None or num_gpus is not None:
        raise ValueError(f"RAY_ADDRESS={address!r} joins an existing cluster, whose nodes declare their own CPUs "
                         f"and GPUs; do not pass num_cpus={num_cpus} / num_gpus={num_gpus}, or unset RAY_ADDRESS "
                         "for a local Ray")
    try:
        ray.init(address=address, log_to_driver=log_to_driver, configure_logging=False)
    except ConnectionError as error:
        raise ConnectionError(f"could not join the Ray cluster at RAY_ADDRESS={address!r}: {error}; check that "
                              "its head node runs (`ray status --address ...`) and its GCS port is reachable "
                              "from here, or unset RAY_ADDRESS for a local Ray") from error
    log.info("joined the Ray cluster at RAY_ADDRESS=%s: %s", address, describe_cluster())


def describe_cluster() -> str:
    """One line: each live node's address and resources (custom ones decide where engines and ranks go)."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    parts = []
    for node in nodes:
        resources = {key: value for key, value in node["Resources"].items()
                     if key not in ("memory", "object_store_memory") and not key.startswith("node:")}
        parts.append(f"{node['NodeManagerAddress']} {resources}")
    return f"{len(nodes)} live node(s): " + "; ".join(parts)

