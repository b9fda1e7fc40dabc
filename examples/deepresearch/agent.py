"""The search agent: harness code written against the OpenAI chat API only, and its two training adapters.

Owns: `run_episode(client, question, tools, config)` — system + user message, then up to
`max_turns` chat calls with the tools declared as OpenAI function tools; tool calls are executed
and their results fed back as `tool` messages; a reply without tool calls is the final answer
(expected in `\\boxed{}`). `client` is anything shaped like `openai.AsyncOpenAI`: the real SDK
against any OpenAI-compatible server, or fullasync's in-process `RolloutClient`.

For training, the same loop runs two ways (pick either; both record token-exact trajectories):

    DeepResearchAgent(tools, agent, reward)      # rollout_fn(client, row): in process, no HTTP
    DeepResearchGenerator(tools, agent, reward)  # CustomGenerator: the real openai SDK through the gateway

Does not own: retrieval, the reward's arithmetic (`reward.py`), or episode statistics (`episodes.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from examples.deepresearch.reward import RewardBreakdown, RewardConfig, compute_reward
from examples.deepresearch.tools import ResearchTools, ToolOutcome
from fullasync.config import ModelSection, setting
from fullasync.rollout.generator import CustomGenerator, EpisodeContext
from fullasync.types import Trajectory

SYSTEM_PROMPT = "Answer the question. Use the search tool to look up names. Give the final answer as \\boxed{answer}."


@dataclass
class AgentConfig:
    max_turns: int = setting(6, "model calls per episode; the last one should answer")
    max_tokens: int = setting(48, "tokens per model call")
    temperature: float = setting(1.0, "sampling temperature of every call")
    top_k: int = setting(3, "search results shown per query")
    max_calls_per_turn: int = setting(1, "tool calls run per reply; further ones get an error (0 = no limit)")
    tools: list[str] = setting(["search"], "tools declared to the model: search, open")
    model: str = setting(ModelSection.served_name, "the `model` name sent with each request (= model.served_name)")
    max_context_tokens: int = setting(2048, "stop before a call could need more than this (prompt + max_tokens)")
    system_prompt: str = setting(SYSTEM_PROMPT, "the system message")
    extra_body: dict[str, Any] = setting({}, "sent with every request (e.g. vLLM's top_k)")

    def validate(self) -> None:
        if self.max_turns < 1 or self.max_tokens < 1:
            raise ValueError(f"agent.max_turns={self.max_turns} and agent.max_tokens={self.max_tokens} must be >= 1")
        if self.max_calls_per_turn < 0:
            raise ValueError(f"agent.max_calls_per_turn={self.max_calls_per_turn} must be >= 0 (0 = no limit)")
        if self.max_context_tokens <= self.max_tokens:
            raise ValueError(f"agent.max_context_tokens={self.max_context_tokens} must exceed "
                             f"agent.max_tokens={self.max_tokens}")


@dataclass(frozen=True)
class EpisodeLog:
    """What one episode did, as seen through the OpenAI API."""

    question: str
    turns: int  # model calls made
    final_text: str | None  # the reply without tool calls (None: the episode ended without one)
    stop_reason: str  # answered | max_turns | context
    tool_outcomes: tuple[ToolOutcome, ...]
    duplicate_searches: int  # searches repeating an earlier query of the episode
    excess_calls: int  # tool calls beyond the per-turn limit (not run)
    messages: tuple[dict[str, Any], ...]  # the whole conversation, final answer included

    @property
    def tool_errors(self) -> int:
        return sum(1 for outcome in self.tool_outcomes if outcome.error is not None)

    @property
    def searches(self) -> int:
        return sum(1 for outcome in self.tool_outcomes if outcome.name == "search")


def assistant_message(message: Any) -> dict[str, Any]:
    """The reply as a message to send back (what the OpenAI API returned, without null fields)."""
    return message.model_dump(exclude_none=True)


async def run_episode(client: Any, question: str, tools: ResearchTools, config: AgentConfig) -> EpisodeLog:
    """One episode of the agent on `client` (any `openai.AsyncOpenAI`-shaped client)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": config.system_prompt},
                                      {"role": "user", "content": question}]
    outcomes: list[ToolOutcome] = []
    seen_queries: set[str] = set()
    turns = duplicates = excess = used_tokens = 0
    final, stop = None, "max_turns"
    while turns < config.max_turns:
        if used_tokens + config.max_tokens > config.max_context_tokens:
            stop = "context"
            break
        response = await client.chat.completions.create(
            model=config.model, messages=messages, tools=tools.schemas, max_tokens=config.max_tokens,
            temperature=config.temperature, extra_body=config.extra_body or None)
        turns += 1
        used_tokens = response.usage.total_tokens if response.usage is not None else used_tokens
        message = response.choices[0].message
        messages.append(assistant_message(message))
        if not message.tool_calls:
            final, stop = message.content, "answered"
            break
        for index, call in enumerate(message.tool_calls):
            if config.max_calls_per_turn and index >= config.max_calls_per_turn:
                error = f"too many tool calls in one turn (limit {config.max_calls_per_turn}); this one was not run"
                outcome = ToolOutcome(call.function.name, call.function.arguments, f"error: {error}", error=error)
                excess += 1
            else:
                outcome = await tools.run(call.function.name, call.function.arguments)
            if outcome.query is not None:
                duplicates += outcome.query in seen_queries
                seen_queries.add(outcome.query)
            outcomes.append(outcome)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": outcome.content})
    return EpisodeLog(question, turns, final, stop, tuple(outcomes), duplicates, excess, tuple(messages))


def score_episode(log: EpisodeLog, row: dict[str, Any], reward: RewardConfig) -> RewardBreakdown:
    return compute_reward(reward, log.final_text, row["answers"], log.duplicate_searches, log.excess_calls,
                          log.tool_errors)


def episode_metadata(log: EpisodeLog, breakdown: RewardBreakdown) -> dict[str, Any]:
    """Per-episode facts stored on the trajectory."""
    return {"f1": breakdown.answer.f1, "exact_match": breakdown.answer.exact_match, "boxed": breakdown.answer.boxed,
            "penalty": breakdown.penalty, "turns": log.turns, "searches": log.searches,
            "tool_errors": log.tool_errors, "duplicate_searches": log.duplicate_searches,
            "excess_calls": log.excess_calls, "stop_reason": log.stop_reason}


EpisodeSink = Callable[[Trajectory], None]  # receives every finished episode's trajectory (statistics)


class DeepResearchAgent:
    """`rollout_fn(client, row)` on fullasync's in-process client; returns the scored trajectory."""

    def __init__(self, tools: ResearchTools, agent: AgentConfig, reward: RewardConfig,
                 on_episode: EpisodeSink | None = None) -> None:
        agent.validate()
        reward.validate()
        self.tools, self.agent, self.reward, self.on_episode = tools, agent, reward, on_episode

    async def __call__(self, client: Any, row: dict[str, Any]) -> Trajectory:
        log = await run_episode(client, row["question"], self.tools, self.agent)
        breakdown = score_episode(log, row, self.reward)
        trajectory = client.trajectory(breakdown.reward, episode_metadata(log, breakdown))
        if self.on_episode is not None:
            self.on_episode(trajectory)
        return trajectory


class DeepResearchGenerator(CustomGenerator):
    """The same agent as an out-of-client harness: the real `openai` SDK against the episode's gateway URL."""

    uses_gateway = True

    def __init__(self, tools: ResearchTools, agent: AgentConfig, reward: RewardConfig,
                 on_episode: EpisodeSink | None = None, request_timeout_s: float = 600.0) -> None:
        agent.validate()
        reward.validate()
        self.tools, self.agent, self.reward, self.on_episode = tools, agent, reward, on_episode
        self.request_timeout_s = request_timeout_s

    async def generate(self, episode: EpisodeContext, row: dict[str, Any]) -> Trajectory:
        from openai import AsyncOpenAI

        if episode.base_url is None:
            raise RuntimeError("DeepResearchGenerator needs the gateway (uses_gateway=True) to give a base URL")
        async with AsyncOpenAI(base_url=episode.base_url, api_key=episode.api_key,
                               timeout=self.request_timeout_s) as sdk:
            log = await run_episode(sdk, row["question"], self.tools, self.agent)
        breakdown = score_episode(log, row, self.reward)
        trajectory = episode.client.trajectory(breakdown.reward, episode_metadata(log, breakdown))
        if self.on_episode is not None:
            self.on_episode(trajectory)
        return trajectory
