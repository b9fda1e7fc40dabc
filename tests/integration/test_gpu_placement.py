"""GPUs per engine and per trainer rank, placed by Ray: checked with Ray's logical GPUs on this CPU machine.

A child process starts a Ray cluster whose nodes declare GPUs (one node × 8, or two nodes × 4; `ray.cluster_utils`,
every node on 127.0.0.1, a Ray temp dir of its own), proves the layout fits (`plan_gpus` over the cluster's nodes),
places the trainer's ranks (`place_ranks` / `rank_options`, the trainer's own code) and the engines
(`engine_actor_options` with `on_gpu=True`, the engines' own options) as probe actors that report where they run,
which GPU ids Ray gave them and their CUDA_VISIBLE_DEVICES, and writes that as JSON. The test checks that every
engine holds `tensor_parallel_size` GPUs of one node, every rank one GPU, the ranks one node, and no GPU is held
twice. Run this file as a script (`python tests/integration/test_gpu_placement.py NODES GPUS REPORT`) to see it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fullasync.infra.placement import LayoutError, gpu_blocks, layout_table, plan_gpus

ENGINES, TENSOR_PARALLEL, RANKS = 2, 2, 4  # 2 × 2 + 4 = 8 GPUs: one node of 8, or two of 4


def test_a_layout_that_fits_is_planned_and_one_that_does_not_is_refused_naming_the_numbers():
    blocks = gpu_blocks(ENGINES, TENSOR_PARALLEL, RANKS)
    assert plan_gpus(blocks, {"a": 8}) == {"trainer": "a", "engine 0": "a", "engine 1": "a"}
    plan = plan_gpus(blocks, {"a": 4, "b": 4})
    assert plan["trainer"] != plan["engine 0"] == plan["engine 1"]
    with pytest.raises(LayoutError, match=r"engine 2 \(2 GPUs\) fits nowhere") as refused:
        plan_gpus(gpu_blocks(3, 2, 4), {"a": 4, "b": 4})  # 10 GPUs asked of 8
    assert "trainer 4, engine 0 2, engine 1 2, engine 2 2; 10 in all" in str(refused.value)
    with pytest.raises(LayoutError, match=r"engine 0 \(8 GPUs\) fits nowhere"):
        plan_gpus(gpu_blocks(1, 8, 0), {"a": 4, "b": 4})  # 8 GPUs exist, but not on one node
    with pytest.raises(LayoutError, match="the Ray cluster's nodes have no GPUs"):
        plan_gpus(gpu_blocks(1, 1, 0), {})
    assert plan_gpus(gpu_blocks(0, 1, 0), {}) == {}  # nothing asks for a GPU: nothing to place


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.parametrize("nodes, gpus", [(1, 8), (2, 4)])
def test_engines_and_trainer_ranks_get_distinct_gpus_as_planned(tmp_path, nodes, gpus):
    report_path = tmp_path / "placement.json"
    ray_tmp = tempfile.mkdtemp(prefix="fa-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    env.pop("RAY_ADDRESS", None)
    try:
        done = subprocess.run([sys.executable, __file__, str(nodes), str(gpus), str(report_path)], env=env,
                              capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    print("\n" + report["table"])
    held = [(actor["node"], gpu) for actor in report["actors"] for gpu in actor["gpus"]]
    assert len(held) == len(set(held)) == ENGINES * TENSOR_PARALLEL + RANKS  # every GPU held once
    for actor in report["actors"]:
        assert actor["cuda_visible_devices"] == ",".join(actor["gpus"])  # what vLLM / torch will see
        assert len(actor["gpus"]) == (TENSOR_PARALLEL if actor["name"].startswith("engine") else 1)
    ranks = [actor for actor in report["actors"] if actor["name"].startswith("trainer")]
    assert len(ranks) == RANKS and len({rank["node"] for rank in ranks}) == 1  # packed: one rendezvous node
    assert len({actor["node"] for actor in report["actors"]}) == nodes  # on 2 × 4, both nodes are used


class Probe:
    """Stands where an engine or a trainer rank would: reports its node, GPU ids and CUDA_VISIBLE_DEVICES."""

    def where(self) -> dict:
        from fullasync.infra.placement import where_am_i

        node, gpus = where_am_i()
        return {"node": node, "gpus": gpus, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")}


async def _place(report: dict) -> None:
    import ray

    from fullasync.engines.vllm import VLLMEngineConfig, engine_actor_options
    from fullasync.infra.placement import cluster_gpus
    from fullasync.trainer.worker_group import WorkerResources, place_ranks, rank_options

    report["plan"] = plan_gpus(gpu_blocks(ENGINES, TENSOR_PARALLEL, RANKS), cluster_gpus())
    probe = ray.remote(Probe)
    resources = WorkerResources(num_cpus=1, num_gpus=1, env_vars={})
    group = await place_ranks(RANKS, resources, timeout_s=120)
    actors = {f"trainer rank {rank}": probe.options(**rank_options(group, rank, resources, f"rank{rank}")).remote()
              for rank in range(RANKS)}
    config = VLLMEngineConfig(model_path="/unused", tensor_parallel_size=TENSOR_PARALLEL)
    for index in range(ENGINES):
        options = engine_actor_options(config, f"engine{index}", on_gpu=True)
        actors[f"engine {index}"] = probe.options(**options).remote()
    places = await asyncio.wait_for(asyncio.gather(*(actor.where.remote() for actor in actors.values())), 120)
    report["actors"] = [{"name": name, **place} for name, place in zip(actors, places, strict=True)]
    report["table"] = layout_table([(a["name"], a["node"], a["gpus"]) for a in report["actors"]])


def _run(nodes: int, gpus: int, report_path: Path) -> None:
    """Start a cluster of `nodes` nodes with `gpus` logical GPUs each on loopback, place, write the report."""
    import ray
    from ray.cluster_utils import Cluster

    from fullasync_patches import ray_loopback

    ray_loopback.apply()
    cluster = Cluster(initialize_head=True, head_node_args={"node_ip_address": "127.0.0.1", "num_cpus": RANKS,
                                                            "num_gpus": gpus, "include_dashboard": False})
    report: dict = {}
    try:
        for _ in range(nodes - 1):
            cluster.add_node(node_ip_address="127.0.0.1", num_cpus=RANKS, num_gpus=gpus)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        asyncio.run(_place(report))
    finally:
        ray.shutdown()
        cluster.shutdown()
    report_path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    _run(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
