"""What real harness code makes of the gateway's errors (litellm, mini-swe-agent's released code).

A prompt over the context must read as a context-window error to litellm, so that mini-swe-agent stops
at once instead of retrying with back-off, and Terminus-style harnesses can summarise.
"""

from __future__ import annotations

import asyncio
import os

import pytest

LONG_TASK = "Count the words in this text. " + "word " * 3000


@pytest.fixture(scope="module")
def offline_harness_env(tmp_path_factory):
    """mini-swe-agent and litellm configured as on this offline machine (no cost-map download, no config file)."""
    settings = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_SILENT_STARTUP": "1",
                "MSWEA_COST_TRACKING": "ignore_errors",
                "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path_factory.mktemp("mswea-config"))}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


async def test_litellm_maps_a_prompt_over_the_context_to_context_window_exceeded(gateway, offline_harness_env):
    import litellm

    episode = gateway.open_episode()
    with pytest.raises(litellm.ContextWindowExceededError):
        await litellm.acompletion(model="hosted_vllm/policy", api_base=episode.base_url, api_key=episode.api_key,
                                  messages=[{"role": "user", "content": LONG_TASK}], max_tokens=16, num_retries=0)
    assert episode.client.episode.calls == []


async def test_mini_swe_agent_stops_at_once_on_a_prompt_over_the_context(gateway, offline_harness_env, tmp_path):
    import litellm
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments.local import LocalEnvironment
    from minisweagent.models.litellm_model import LitellmModel

    episode = gateway.open_episode()
    model = LitellmModel(model_name="hosted_vllm/policy", cost_tracking="ignore_errors",
                         model_kwargs={"api_base": episode.base_url, "api_key": episode.api_key, "max_tokens": 16})
    agent = DefaultAgent(model, LocalEnvironment(cwd=str(tmp_path)), system_template="You are a helpful agent.",
                         instance_template="{{task}}", step_limit=3)
    before = gateway.answered[400]
    with pytest.raises(litellm.ContextWindowExceededError):
        await asyncio.wait_for(asyncio.to_thread(agent.run, LONG_TASK), 120)  # synchronous harness: off the loop
    assert gateway.answered[400] - before == 1  # one request, no retries
    assert episode.client.episode.calls == []
