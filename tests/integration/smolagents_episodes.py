"""Episodes of smolagents' streaming `ToolCallingAgent`, unchanged, each against one gateway base URL; run by the
interpreter of smolagents' own venv (`test_agents_smolagents.py`), so it imports neither fullasync nor pytest.

    python smolagents_episodes.py EPISODES.json RESULT.json

EPISODES.json: a list of {"base_url", "api_key", "slow_close"}. RESULT.json: per episode, the agent's answer and, per
step, the tool calls it ran on the answer it got.

`slow_close` shapes the harness's timing only (the agent and its SDK are unchanged): the process takes
`SLOW_CLOSE_S` to close each response, as one does among many on a loaded machine, so that what the gateway wrote
after the stream's `[DONE]` (the end of its chunked body, which the SDK does not read) has come in unread when the
close reaches the socket, and TCP resets the connection."""

from __future__ import annotations

import json
import sys
import time

import httpx2  # the openai SDK's HTTP client in this venv
from smolagents import OpenAIServerModel, ToolCallingAgent, tool

SLOW_CLOSE_S = 0.05


class SlowToClose(httpx2.BaseTransport):
    """HTTP as usual, but each response closes `SLOW_CLOSE_S` after its client asks."""

    def __init__(self) -> None:
        self.inner = httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self.inner.handle_request(request)
        return httpx2.Response(response.status_code, headers=response.headers, stream=_SlowClose(response.stream),
                               extensions=response.extensions)

    def close(self) -> None:
        self.inner.close()


class _SlowClose(httpx2.SyncByteStream):
    def __init__(self, stream) -> None:
        self.stream = stream

    def __iter__(self):
        yield from self.stream

    def close(self) -> None:
        time.sleep(SLOW_CLOSE_S)
        self.stream.close()


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return a + b


def episode(base_url: str, api_key: str, slow_close: bool) -> dict:
    client_kwargs = {"max_retries": 0}  # no SDK retries: a retry would hide a lost answer
    if slow_close:
        client_kwargs["http_client"] = httpx2.Client(transport=SlowToClose())
    model = OpenAIServerModel(model_id="policy", api_base=base_url, api_key=api_key, client_kwargs=client_kwargs)
    agent = ToolCallingAgent(tools=[add], model=model, stream_outputs=True, max_steps=6, verbosity_level=0)
    answer = agent.run("What is 1 + 2 + 3 + 4?")
    steps = [[{"name": call.name, "arguments": call.arguments} for call in step.tool_calls or ()]
             for step in agent.memory.steps if getattr(step, "model_output_message", None) is not None]
    return {"answer": str(answer), "steps": steps}


def main() -> None:
    episodes = json.loads(open(sys.argv[1]).read())
    results = [episode(e["base_url"], e["api_key"], e["slow_close"]) for e in episodes]
    with open(sys.argv[2], "w") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
