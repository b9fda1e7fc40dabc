"""Engines and trainer on cores of their own (`engine.cpus`, `trainer.cpus`), as a GPU node gives each its GPUs: the
engine actor and every process vLLM starts under it run on the engine's cores, each trainer rank on its share of
the trainer's, with as many torch threads."""

from __future__ import annotations

import os

import psutil
import pytest

from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.trainer import TrainerConfig, VerlTrainer

pytestmark = [pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to split"),
              pytest.mark.slow]  # CI's slow tier: an engine and a trainer of their own


async def test_engines_and_trainer_run_on_the_cores_given_to_each(ray_cluster, tiny_model_path):
    engine_core, trainer_core = sorted(os.sched_getaffinity(0))[:2]
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=tiny_model_path, max_model_len=256,
                                                           cpus=str(engine_core)))
    trainer = VerlTrainer(tiny_model_path, TrainerConfig(cpus=str(trainer_core), worker_num_cpus=0.5))
    try:
        await trainer.start()
        runs = await trainer.describe()
        assert (runs["cpus"], runs["threads"]) == (str(trainer_core), "1")
        pid = await engine.actor.__ray_call__.remote(lambda actor: os.getpid())
        processes = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        assert len(processes) >= 2  # the actor and vLLM's engine core
        assert {tuple(p.cpu_affinity()) for p in processes} == {(engine_core,)}
        assert await engine.num_in_flight() == 0
    finally:
        await trainer.shutdown()
        await engine.shutdown()


def test_a_core_the_node_does_not_offer_is_refused_naming_the_field():
    from fullasync.infra.platform import bind_to_cpus

    before = os.sched_getaffinity(0)
    with pytest.raises(ValueError, match=r"engine.cpus='4096' names cores \[4096\] that this node does not offer"):
        bind_to_cpus("engine.cpus", "4096")
    assert os.sched_getaffinity(0) == before  # nothing was bound


def test_the_run_process_holds_its_cores_while_it_trains_and_gets_its_own_back_after():
    import threading

    from fullasync.infra.platform import process_on_cpus

    before = os.sched_getaffinity(0)
    first = min(before)
    seen: dict[str, set[int]] = {}
    with process_on_cpus("rollout.cpus", str(first)):
        seen["process"] = os.sched_getaffinity(0)
        started = threading.Thread(target=lambda: seen.setdefault("thread", os.sched_getaffinity(0)))
        started.start()
        started.join()
    assert seen == {"process": {first}, "thread": {first}}  # a thread started meanwhile inherits the binding
    assert os.sched_getaffinity(0) == before
    with process_on_cpus("rollout.cpus", ""):  # "" leaves the process alone
        assert os.sched_getaffinity(0) == before
    with pytest.raises(ValueError, match=r"rollout.cpus='4096' names cores \[4096\]"):
        with process_on_cpus("rollout.cpus", "4096"):
            pass
    assert os.sched_getaffinity(0) == before
