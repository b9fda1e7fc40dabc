"""The engine watchdog on a real vLLM engine: a wedged engine core becomes an error that names the engine.

The wedge is the real one the request schema now prevents: a request whose seed is a string kills the
engine core's input thread (msgspec cannot decode it), after which no request gets an answer. The test
slips such a request past every check on purpose (the edge: a request no client would let through).
"""

from __future__ import annotations

import asyncio

import pytest
from events import wait_for_tokens

from fullasync.client import RolloutService
from fullasync.contracts.engine import GenerateRequest, SamplingOptions
from fullasync.engines.vllm import VLLMEngineConfig, launch_vllm_engines
from fullasync.errors import EngineDiedError, InvalidRequestError

STALL_TIMEOUT_S = 6.0

pytestmark = pytest.mark.slow  # CI's slow tier: a second engine, wedged and declared dead


def smuggled_seed_request(request_id: str) -> GenerateRequest:
    sampling = SamplingOptions()
    object.__setattr__(sampling, "seed", "abc")  # past SamplingOptions' own check, as no client would send it
    return GenerateRequest(request_id, (1, 2, 3), 4, sampling)


def test_sampling_options_refuse_what_would_wedge_an_engine():
    with pytest.raises(InvalidRequestError, match="seed must be an integer within 64 bits"):
        SamplingOptions(seed="1")
    with pytest.raises(InvalidRequestError, match="temperature must be a finite number"):
        SamplingOptions(temperature=float("nan"))
    with pytest.raises(InvalidRequestError, match="negative id"):
        GenerateRequest("r", (5, -1), 3)


async def test_a_wedged_engine_is_declared_dead_and_its_episodes_move_to_a_live_engine(
        ray_cluster, tiny_model_path, tokenizer, engine):
    config = VLLMEngineConfig(model_path=tiny_model_path, stall_timeout_s=STALL_TIMEOUT_S, probe_interval_s=1.0)
    (doomed,) = await launch_vllm_engines(config)
    try:
        service = RolloutService([doomed, engine], tokenizer)
        client = service.client("episode-on-doomed")
        assert service.router.pick(client.episode.id) is doomed  # the episode is bound to the engine about to wedge
        wedge = asyncio.create_task(doomed.generate(smuggled_seed_request("smuggled-seed")))
        await wait_for_tokens(doomed, "smuggled-seed", 0)  # the wedge is in the engine before the next request
        waiting = asyncio.create_task(doomed.generate(GenerateRequest("after-the-wedge", (1, 2, 3), 4)))
        # bounded by the stall timeout plus a probe, not by generate_timeout_s (1800 s)
        with pytest.raises(EngineDiedError, match=rf"engine {doomed.name} is dead: .* made no progress"):
            await asyncio.wait_for(wedge, STALL_TIMEOUT_S + 30)
        assert "the last request it accepted was" in str(doomed.death)
        with pytest.raises(EngineDiedError, match=doomed.name):  # a call stuck behind the wedge fails too
            await asyncio.wait_for(waiting, 30)
        only_doomed = RolloutService([doomed], tokenizer).client()
        with pytest.raises(EngineDiedError, match=doomed.name):  # no live engine left: a later call fails at once
            await asyncio.wait_for(only_doomed.completions.create(model="policy", prompt="x", max_tokens=2), 30)
        assert only_doomed.episode.calls == []
        response = await asyncio.wait_for(  # with a live engine left, the episode moves there
            client.completions.create(model="policy", prompt="1 + 1 =", max_tokens=3), 60)
        assert response.choices[0].text is not None
        (call,) = client.episode.calls
        assert call.engine == engine.name
    finally:
        await doomed.shutdown()
