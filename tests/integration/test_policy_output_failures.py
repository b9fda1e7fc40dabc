"""A policy output that breaks the next request is the policy's failure, trained as such (real vLLM, the gateway,
the openai SDK): the policy writes a tool call with no name, the harness sends it back, the gateway answers 400,
the harness raises the SDK's error — and the episode is trained with the call it made and reward 0, kind
`model`, instead of being dropped as the harness's failure."""

from __future__ import annotations

import asyncio
import json

from openai import AsyncOpenAI
from test_client_chat import TOOLS

from fullasync.client import ClientConfig, RolloutService
from fullasync.gateway import Gateway
from fullasync.rollout.generator import CustomGenerator
from fullasync.rollout.rollouter import Rollouter, RolloutSettings, RowOutcome
from fullasync.rollout.staleness import StalenessManager
from fullasync.run.assemble import episodes_on
from fullasync.run.queue import MessageQueue

NAMELESS_CALL = "<tool_call>\n" + json.dumps({"name": "", "arguments": {}}).replace("{", r"\{").replace(
    "}", r"\}") + "\n</tool_call>"


class EchoesItsToolCall(CustomGenerator):
    """A harness that sends back the assistant turn it received, as every tool-calling harness does."""

    uses_gateway = True

    async def generate(self, episode, row) -> float:
        sdk = AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key, max_retries=0, timeout=120)
        messages = [{"role": "user", "content": "Add 2 and 3 with the tool."}]
        reply = await sdk.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=80,
                                                  extra_body={"structured_outputs": {"regex": NAMELESS_CALL}})
        turn = reply.choices[0].message  # the constrained text is 54 characters: room for one token each
        assert turn.tool_calls and turn.tool_calls[0].function.name == ""  # the policy's malformed call, as parsed
        messages.append(turn.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": turn.tool_calls[0].id, "content": "no such tool"})
        await sdk.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=4)  # 400
        return 1.0


async def test_a_malformed_turn_the_policy_wrote_is_trained_with_reward_zero_as_kind_model(engine, tokenizer):
    service = RolloutService([engine], tokenizer, ClientConfig(max_model_len=2048))
    gateway = Gateway(service)
    await gateway.start()
    try:
        queue = MessageQueue(100)
        rollouter = Rollouter(EchoesItsToolCall(), service, queue, StalenessManager(100, 2, 4, version=lambda: 0),
                              RolloutSettings(n=2, max_running_rows=4, episode_timeout_s=120),
                              episode_context=episodes_on(gateway))
        rollouter.start([("row-0", {})])
        async with asyncio.timeout(300):
            while not rollouter.exhausted:
                await asyncio.sleep(0.05)
        rollouter.check()
        report = rollouter.report()
    finally:
        await gateway.stop()
    assert report.row_outcomes == {"row-0": RowOutcome.QUEUED.value}  # trained, not dropped
    assert report.failure_kinds == {"model": 2}
    (group,) = await queue.snapshot()
    for trajectory in group.trajectories:
        assert trajectory.reward == 0.0 and trajectory.metadata["failure"] == "model"
        (call,) = trajectory.calls  # the malformed call it made (the refused request recorded nothing)
        assert "<tool_call>" in tokenizer.decode(list(call.output_ids))
    assert gateway.answered[400] == 2
