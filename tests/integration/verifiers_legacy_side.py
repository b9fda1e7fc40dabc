"""Run in verifiers 0.3.1's venv (side_venvs): its legacy ReasoningGymEnv, unchanged, through ONE client for every
episode, the gateway's run-wide base URL, each request naming its episode in X-Session-ID from the rollout state
(`extra_headers_from_state`: the state's `example_id`, set to the episode's key). argv[1]: JSON {base_url, keys}.
Prints one JSON line: per episode, its key, the rubric's reward, the state's error, the row's question and
reasoning-gym's answer to it."""

import asyncio
import json
import os
import sys

import verifiers.legacy as vf
from verifiers.legacy.clients import resolve_client
from verifiers.legacy.envs.integrations.reasoninggym_env import ReasoningGymEnv


async def main() -> None:
    spec = json.loads(sys.argv[1])
    env = ReasoningGymEnv(gym="leg_counting", num_train_examples=len(spec["keys"]), num_eval_examples=2, seed=0)
    os.environ["FULLASYNC_RUN_KEY"] = "one-key-for-the-run"
    client = resolve_client(vf.ClientConfig(api_base_url=spec["base_url"], api_key_var="FULLASYNC_RUN_KEY",
                                            max_retries=0, extra_headers_from_state={"X-Session-ID": "example_id"}))
    rows = env.get_dataset()

    async def episode(index: int, key: str) -> dict:
        row = {**rows[index], "example_id": key}
        out = await env.run_rollout(row, client, "policy", {"max_tokens": 16})
        error = out.get("error")
        return {"key": key, "reward": out.get("reward"), "error": None if error is None else str(error),
                "question": rows[index]["prompt"][-1]["content"],
                "oracle": env.rg_dataset[int(rows[index]["answer"])]["answer"]}

    results = await asyncio.gather(*(episode(i, key) for i, key in enumerate(spec["keys"])))
    print(json.dumps(results))


asyncio.run(main())
