"""verifiers' legacy API (0.3.1, what the Environments Hub's environments pin), unchanged, in a venv of its own:
its `ReasoningGymEnv` runs 16 concurrent episodes through one client and one base URL for the whole run (the
gateway's run-wide routes), each request naming its episode in the X-Session-ID header verifiers sends from the
rollout state. Every episode records exactly its own call, and verifiers' own rubric scores what the engine said.

Real gateway, template (SmolLM2 + chatml-tools), verifiers and reasoning-gym; only the engine is the edge fake. The
venv (requirements/verifiers-legacy-lock.txt, ~860 MB) is built once per cache: extended tier."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from scripted_engine import chat_tokenizer, script_texts, scripted_gateway
from side_venvs import venv_python

pytestmark = [pytest.mark.slow, pytest.mark.extended]

EPISODES = 16
SIDE = Path(__file__).with_name("verifiers_legacy_side.py")


async def test_a_legacy_verifiers_environment_attributes_every_call_to_its_episode_through_one_client():
    python = venv_python("verifiers-legacy")
    tokenizer = chat_tokenizer()
    async with scripted_gateway(tokenizer, max_model_len=1024) as (gateway, engine):
        script_texts(engine, tokenizer, *(["<answer>146</answer>"] * EPISODES))
        episodes = [gateway.open_episode() for _ in range(EPISODES)]
        spec = json.dumps({"base_url": gateway.run_base_url, "keys": [episode.api_key for episode in episodes]})
        side = await asyncio.create_subprocess_exec(str(python), str(SIDE), spec, stdout=subprocess.PIPE,
                                                    stderr=subprocess.PIPE, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        out, err = await asyncio.wait_for(side.communicate(), 300)
        assert side.returncode == 0, err.decode()[-3000:]
        results = {result["key"]: result for result in json.loads(out.decode().strip().splitlines()[-1])}
        for episode in episodes:
            result = results[episode.api_key]
            assert result["error"] is None
            (call,) = episode.client.episode.calls  # exactly its own call, none of another episode's
            assert result["question"].strip() in tokenizer.decode(call.prompt_ids)
            assert tokenizer.decode(call.output_ids, skip_special_tokens=True) == "<answer>146</answer>"
            # verifiers' rubric (reasoning-gym's scorer) on what the engine said: 1 where 146 is the row's answer
            assert result["reward"] == (1.0 if result["oracle"] == "146" else 0.0)
            gateway.close_episode(episode)
        assert sum(result["reward"] for result in results.values()) >= 1.0
        assert len(engine.requests) == EPISODES
