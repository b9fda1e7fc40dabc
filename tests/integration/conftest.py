"""The integration tier's fixtures: one Ray, one real vLLM engine and one gateway per test session; every test
in this directory is marked `integration`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from policy_weights import PolicyWeights

from fullasync.client import ClientConfig, RolloutService
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.gateway import Gateway
from fullasync.infra.runtime import init_ray
from fullasync.infra.shm import remove_orphaned_semaphores
from fullasync.weights.sync import WeightSync

HERE = Path(__file__).parent
SHARED_CONTEXT = 2048  # the shared engine's (and gateway's) context: Terminus-2's prompt alone is ~1,600 tokens


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    began = time.time()
    init_ray()
    yield
    ray.shutdown()
    remove_orphaned_semaphores(began)  # of the engines tests killed outside a run (a run removes its own)


@pytest.fixture(scope="module")
async def gateway(engine, tokenizer):
    """A gateway in front of the shared engine, one per test module."""
    gateway = Gateway(RolloutService([engine], tokenizer, ClientConfig(max_model_len=SHARED_CONTEXT)))
    await gateway.start()
    yield gateway
    await gateway.stop()


@pytest.fixture(scope="session")
async def engine(ray_cluster, tiny_model_path):
    (engine,) = await launch_vllm_engines(VLLMEngineConfig(model_path=tiny_model_path, max_model_len=SHARED_CONTEXT))
    yield engine
    await engine.shutdown()


@pytest.fixture(scope="session")
async def policy(engine, tiny_model_path) -> PolicyWeights:
    """The shared engine's weights as tests know them. A test before may have trained on the shared engine and pushed
    its own weights (a training run through the gateway): the policy starts by installing the model's, so what it
    says the engine serves is what the engine serves."""
    policy = PolicyWeights(tiny_model_path, WeightSync([engine], version=await engine.version()))
    await policy.push({name: tensor for name, tensor in policy.current.items() if name != "lm_head.weight"})
    return policy
