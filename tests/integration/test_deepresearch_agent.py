"""examples/deepresearch agent on the real engine: through the gateway with the real `openai` SDK
(token-exact multi-turn trajectory) and in process as a rollout_fn. The tiny test model is untrained,
so structured outputs script what it writes; everything else (SDK, HTTP, client, engine) is real."""

from __future__ import annotations

import json

import pytest
from openai import AsyncOpenAI
from test_client_chat import spelled

from examples.deepresearch.agent import (
    AgentConfig,
    DeepResearchAgent,
    DeepResearchGenerator,
    run_episode,
    score_episode,
)
from examples.deepresearch.episodes import EpisodeStats
from examples.deepresearch.retrieval import Bm25Index
from examples.deepresearch.reward import RewardConfig
from examples.deepresearch.tools import ResearchTools
from examples.deepresearch.world import WorldSpec, documents, generate_world, questions
from fullasync.client import RolloutService
from fullasync.rollout.generator import EpisodeContext


def escape(text: str) -> str:
    return "".join("\\" + c if c in "\\{}[]().*+?|^$" else c for c in text)


def search_regex(query: str, tool: str = "search") -> str:
    return escape("<tool_call>\n" + json.dumps({"name": tool, "arguments": {"query": query}}) + "\n</tool_call>")


class ScriptedTurns:
    """The real SDK client, with one structured-output regex per turn (what the untrained model may write)."""

    def __init__(self, sdk, regexes):
        self.sdk, self.regexes, self.chat, self.completions = sdk, list(regexes), self, self

    async def create(self, **kwargs):
        turn = sum(1 for m in kwargs["messages"] if m["role"] == "assistant")
        kwargs["extra_body"] = {"structured_outputs": {"regex": self.regexes[turn]}}
        return await self.sdk.chat.completions.create(**kwargs)


@pytest.fixture(scope="module")
def two_hop_row():
    world = generate_world(WorldSpec())
    row = next(r for r in questions(world) if r["kind"] == "founder_birthplace")
    return {**row, "answers": [row["answer"]]}, Bm25Index(documents(world))


def assert_one_token_exact_sequence(client, messages, tools, tokenizer):
    calls = client.episode.calls
    for earlier, later in zip(calls, calls[1:]):
        assert later.prompt_ids[: len(earlier.all_ids)] == earlier.all_ids
    (sequence,) = client.trajectory(reward=0.0).to_sequences()
    assert [sequence.logprobs[i] for i, m in enumerate(sequence.loss_mask) if m] == [
        lp for c in calls for lp in c.output_logprobs]
    assert sum(sequence.loss_mask) == sum(len(c.output_ids) for c in calls)
    rendered = tokenizer.apply_chat_template(list(messages), tools=tools, tokenize=False)
    assert spelled(tokenizer, sequence.token_ids) == rendered.rstrip("\n")


async def test_agent_through_the_gateway_with_the_openai_sdk_is_token_exact(gateway, tokenizer, two_hop_row):
    row, index = two_hop_row
    # room for the scripted text however the (pushed-around) shared engine splits it into tokens
    tools, agent = ResearchTools(index, top_k=3), AgentConfig(max_turns=4, max_tokens=160)
    episode = gateway.open_episode()
    async with AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key) as sdk:
        script = [search_regex(q) for q in row["search_queries"]] + [escape(f"\\boxed{{{row['answer']}}}")]
        log = await run_episode(ScriptedTurns(sdk, script), row["question"], tools, agent)
    gateway.close_episode(episode)
    assert (log.turns, log.stop_reason, log.searches, log.tool_errors) == (3, "answered", 2, 0)
    assert row["answer"] in log.messages[5]["content"]  # the second search result names the answer
    assert score_episode(log, row, RewardConfig()).reward == 1.0
    assert len(episode.client.episode.calls) == 3
    assert_one_token_exact_sequence(episode.client, log.messages, tools.schemas, tokenizer)


async def test_custom_generator_runs_the_agent_through_the_gateway(gateway, tokenizer, two_hop_row):
    row, index = two_hop_row
    stats = EpisodeStats()
    generator = DeepResearchGenerator(
        ResearchTools(index), AgentConfig(max_turns=3, max_tokens=160, extra_body={"structured_outputs": {
            "regex": search_regex(row["search_queries"][0])}}),
        RewardConfig(duplicate_search_penalty=0.25), on_episode=stats)
    episode = gateway.open_episode()
    trajectory = await generator.generate(
        EpisodeContext(episode.episode_id, episode.client, episode.base_url, episode.api_key), row)
    gateway.close_episode(episode)
    assert len(trajectory.calls) == 3 and trajectory.calls == tuple(episode.client.episode.calls)
    assert trajectory.metadata["stop_reason"] == "max_turns" and trajectory.metadata["duplicate_searches"] == 2
    assert trajectory.reward == pytest.approx(-0.5)  # no answer (0) and two repeated searches
    assert stats.summary()["turns"] == {3: 1}


async def test_rollout_fn_in_process_records_tool_errors_and_goes_on(engine, tokenizer, two_hop_row):
    row, index = two_hop_row
    agent = DeepResearchAgent(
        ResearchTools(index), AgentConfig(max_turns=2, max_tokens=160, extra_body={"structured_outputs": {
            "regex": search_regex("x", tool="browse")}}), RewardConfig(tool_error_penalty=0.1))
    client = RolloutService([engine], tokenizer).client()
    trajectory = await agent(client, row)
    assert trajectory.metadata["tool_errors"] == 2 and trajectory.metadata["turns"] == 2
    assert trajectory.reward == pytest.approx(-0.2)
    assert len(trajectory.to_sequences()) == 1
