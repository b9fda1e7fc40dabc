"""The OpenAI Agents SDK 0.24, unchanged, through the gateway: its default model speaks the Responses API; an agent
with a function tool runs its episode (the SDK executes the tool) streamed and not, and every answer it received is
recorded token-exactly as one training sequence. The SDK runs in a venv of its own (`side_venvs`; it imports as
`agents`, which the repository's folder would shadow) with tracing off; the engine is the edge fake that samples what
the test scripted; the gateway and the client are real."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from scripted_engine import ScriptedEngine, assert_one_exact_sequence, script_texts
from side_venvs import venv_python

from fullasync.client import ClientConfig, RolloutService
from fullasync.gateway import Gateway
from fullasync.models import build_pretrained_model, load_tokenizer, with_chat_template

EPISODE = Path(__file__).parent / "agents_sdk_episode.py"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


@pytest.mark.parametrize("stream", [False, True])
async def test_the_agents_sdk_default_model_runs_a_tool_episode_recorded_token_exactly(stream):
    python = venv_python("openai-agents")
    tokenizer = load_tokenizer(with_chat_template(build_pretrained_model("smollm2-135m-instruct"), "chatml-tools"))
    engine = ScriptedEngine()
    script_texts(engine, tokenizer, CALL, "The answer is 7.")
    gateway = Gateway(RolloutService([engine], tokenizer, ClientConfig(model_name="policy", max_model_len=4096)))
    await gateway.start()
    try:
        episode = gateway.open_episode()
        run = await asyncio.create_subprocess_exec(
            str(python), str(EPISODE), episode.base_url, episode.api_key, "stream" if stream else "whole",
            cwd=EPISODE.parent, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(run.communicate(), timeout=120)
        assert run.returncode == 0, err.decode()[-3000:]
        assert json.loads(out.decode().strip().splitlines()[-1]) == {"final": "The answer is 7."}
        gateway.close_episode(episode)
        assert gateway.answered == {200: 2} and engine.script == []  # the SDK ran the tool between its two calls
        assert_one_exact_sequence(episode.client, calls=2)
    finally:
        await gateway.stop()
