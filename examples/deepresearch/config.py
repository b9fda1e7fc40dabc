"""The example's configuration: fullasync's `RunConfig` plus the sections this example adds.

Owns: `DeepResearchConfig` (a `RunConfig` subclass, so `AsyncAgentTrainer` takes it as is, and Hydra
overrides such as `mode=fully_async max_staleness=4 agent.max_turns=6` reach both), the sections
(world, data files, retrieval, warm-up, evaluation, harness), and their start-up checks. The values
used by `train.py` live in `config/train.yaml`; every field here is declared with its one-line help
(`train.py --help` prints them all).
"""

from __future__ import annotations

from dataclasses import dataclass

from examples.deepresearch.agent import AgentConfig
from examples.deepresearch.reward import RewardConfig
from examples.deepresearch.warmup import WarmupSpec
from examples.deepresearch.world import WorldSpec
from fullasync.config import RunConfig, section, setting, shared_settings

BUILTIN_POLICY = "builtin:deepresearch"  # the tiny policy warmed up by warmup.py (built offline, cached)
HARNESSES = ("function", "gateway")
RETRIEVAL_MODES = ("local", "server", "url")


@dataclass
class WorldSection:
    """The `WorldSpec` to generate: its fields, with their defaults."""

    seed: int = setting(WorldSpec.seed, "seeds the generated world and its split")
    people: int = setting(WorldSpec.people, "people in the world (organisations are founded by some of them)")
    organisations: int = setting(WorldSpec.organisations, "organisations in the world")
    cities: int = setting(WorldSpec.cities, "cities in the world")
    countries: int = setting(WorldSpec.countries, "countries in the world")
    events: int = setting(WorldSpec.events, "distractor documents")
    held_out_fraction: float = setting(WorldSpec.held_out_fraction,
                                       "share of people (and their organisations) held out")

    def spec(self) -> WorldSpec:
        return WorldSpec(**shared_settings(self, WorldSpec))


@dataclass
class FilesSection:
    train: str = setting("", "JSONL training questions (\"\" = the generated world's train split)")
    heldout: str = setting("", "JSONL held-out questions (\"\" = the generated world's held-out split)")
    corpus: str = setting("", "JSONL corpus for the in-process BM25 (\"\" = the generated world's documents)")


@dataclass
class RetrievalSection:
    mode: str = setting("local", "local: BM25 in process | server: BM25 behind HTTP on loopback | url: your own "
                        "service")
    url: str = setting("", "mode=url: base URL of a service with POST /retrieve and POST /open")
    snippet_words: int = setting(12, "words of each document shown in a search result")
    timeout_s: float = setting(10.0, "HTTP modes: per request")
    retries: int = setting(3, "HTTP modes: further attempts after a connection error, timeout or 5xx")


@dataclass
class WarmupSection:
    """The `WarmupSpec` knobs of the warm-up: its fields, with their defaults (the world and the agent's prompt
    come from their own sections)."""

    copy_steps: int = setting(WarmupSpec.copy_steps, "supervised steps on the question and first search call only "
                              "(learns to copy names)")
    copy_batch_size: int = setting(WarmupSpec.copy_batch_size, "batch size of the copy steps")
    short_steps: int = setting(WarmupSpec.short_steps, "then whole trajectories without the system prompt and tool "
                               "list (cheap)")
    short_batch_size: int = setting(WarmupSpec.short_batch_size, "batch size of the short steps")
    steps: int = setting(WarmupSpec.steps, "then supervised steps on the full prompts the agent sends")
    batch_size: int = setting(WarmupSpec.batch_size, "batch size of the full-prompt steps")
    lr: float = setting(WarmupSpec.lr, "learning rate of the warm-up (2e-3 never formed the copy circuit)")
    name_scale: float = setting(WarmupSpec.name_scale, "spread of the name tokens' embeddings over the model's other "
                                "rows (tied: sharper copies)")
    unboxed_share: float = setting(WarmupSpec.unboxed_share, "deliberate mistake: final answer without \\boxed{}")
    stop_early_share: float = setting(WarmupSpec.stop_early_share, "deliberate mistake: multi-hop answered after too "
                                      "few searches")
    repeat_search_share: float = setting(WarmupSpec.repeat_search_share, "deliberate mistake: the same search twice "
                                         "in a row")

    def spec(self, world: WorldSpec, agent: AgentConfig) -> WarmupSpec:
        return WarmupSpec(world=world, tools=tuple(agent.tools), top_k=agent.top_k, system_prompt=agent.system_prompt,
                          **shared_settings(self, WarmupSpec))


@dataclass
class EvaluationSection:
    questions: int = setting(100, "first N held-out questions scored before and after training (0 = all)")
    samples_per_row: int = setting(2, "episodes per question (standard errors are over questions)")
    concurrency: int = setting(64, "episodes evaluated at once")


@dataclass
class DeepResearchConfig(RunConfig):
    harness: str = setting("function", "function: rollout_fn on the in-process client | gateway: openai SDK over "
                           "HTTP")
    world: WorldSection = section(WorldSection, "the generated world the questions and documents come from")
    files: FilesSection = section(FilesSection, "your own question and corpus files instead of the world's")
    retrieval: RetrievalSection = section(RetrievalSection, "where the search tool's BM25 runs")
    agent: AgentConfig = section(AgentConfig, "the search agent: turns, tokens, tools")
    reward: RewardConfig = section(RewardConfig, "what an episode earns")
    warmup: WarmupSection = section(WarmupSection, "the supervised warm-up of the tiny builtin:deepresearch policy")
    evaluation: EvaluationSection = section(EvaluationSection, "the held-out evaluation before and after training")

    def validate(self) -> None:
        super().validate()
        self.agent.validate()
        self.reward.validate()
        if self.harness not in HARNESSES:
            raise ValueError(f"harness={self.harness!r} must be one of {HARNESSES}")
        if self.retrieval.mode not in RETRIEVAL_MODES:
            raise ValueError(f"retrieval.mode={self.retrieval.mode!r} must be one of {RETRIEVAL_MODES}")
        if self.retrieval.mode == "url" and not self.retrieval.url:
            raise ValueError("retrieval.mode=url needs retrieval.url=http://host:port of your retrieval service")
        if self.data.task:
            raise ValueError(f"data.task={self.data.task!r}: this example brings its own rows and rollout_fn; "
                             "set data.task=''")
        if self.agent.max_context_tokens > self.engine.max_model_len:
            raise ValueError(f"agent.max_context_tokens={self.agent.max_context_tokens} exceeds "
                             f"engine.max_model_len={self.engine.max_model_len}; lower one or raise the other")
        if self.agent.model != self.model.served_name:
            raise ValueError(f"agent.model={self.agent.model!r} is not the served model.served_name="
                             f"{self.model.served_name!r}; set agent.model={self.model.served_name}")
        if self.evaluation.samples_per_row < 1:
            raise ValueError("evaluation.samples_per_row must be >= 1")
