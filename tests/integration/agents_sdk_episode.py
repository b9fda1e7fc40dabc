"""One episode of the OpenAI Agents SDK's default model (the Responses API) against a gateway episode's base URL:
an agent with one function tool, run by the SDK's own `Runner`, streamed or not. Run by
test_agents_sdk.py in a venv of its own (the SDK imports as `agents`, which the repository's folder would shadow);
prints the final output as JSON."""

import asyncio
import json
import sys

from openai import AsyncOpenAI

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def main(base_url: str, api_key: str, stream: bool) -> None:
    set_tracing_disabled(True)  # nothing leaves loopback: the SDK's traces would go to OpenAI
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    agent = Agent(name="adder", instructions="Add with the tool.", tools=[add],
                  model=OpenAIResponsesModel(model="policy", openai_client=client),
                  model_settings=ModelSettings(max_tokens=60))
    if stream:
        result = Runner.run_streamed(agent, "What is 3 + 4?")
        async for _ in result.stream_events():
            continue
    else:
        result = await Runner.run(agent, "What is 3 + 4?")
    print(json.dumps({"final": result.final_output}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] == "stream"))
