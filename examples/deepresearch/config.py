"""The example's configuration: fullasync's `RunConfig` plus the sections this example adds.

Owns: `DeepResearchConfig` (a `RunConfig` subclass, so `AsyncAgentTrainer` takes it as is, and Hydra
overrides such as `mode=fully_async max_staleness=4 agent.max_turns=6` reach both), the sections
(world, data files, retrieval, warm-up, evaluation, harness), and their start-up checks. The values
used by `train.py` live in `config/train.yaml`; every field here has a one-line help.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from examples.deepresearch.agent import AgentConfig
from examples.deepresearch.reward import RewardConfig
from examples.deepresearch.warmup import WarmupSpec
from examples.deepresearch.world import WorldSpec
from fullasync.config import RunConfig

BUILTIN_POLICY = "builtin:deepresearch"  # the tiny policy warmed up by warmup.py (built offline, cached)
HARNESSES = ("function", "gateway")
RETRIEVAL_MODES = ("local", "server", "url")


@dataclass
class WorldSection:
    seed: int = 0  # seeds the generated world and its split
    people: int = 1200  # people in the world (organisations are founded by some of them)
    organisations: int = 500
    cities: int = 240
    countries: int = 16
    events: int = 800  # distractor documents
    held_out_fraction: float = 0.2  # share of people (and their organisations) held out

    def spec(self) -> WorldSpec:
        return WorldSpec(seed=self.seed, countries=self.countries, cities=self.cities, people=self.people,
                         organisations=self.organisations, events=self.events,
                         held_out_fraction=self.held_out_fraction)


@dataclass
class FilesSection:
    train: str = ""  # JSONL training questions ("" = the generated world's train split)
    heldout: str = ""  # JSONL held-out questions ("" = the generated world's held-out split)
    corpus: str = ""  # JSONL corpus for the in-process BM25 ("" = the generated world's documents)


@dataclass
class RetrievalSection:
    mode: str = "local"  # local: BM25 in process | server: BM25 behind HTTP on loopback | url: your own service
    url: str = ""  # mode=url: base URL of a service with POST /retrieve and POST /open
    snippet_words: int = 12  # words of each document shown in a search result
    timeout_s: float = 10.0  # HTTP modes: per request
    retries: int = 3  # HTTP modes: further attempts after a connection error, timeout or 5xx


@dataclass
class WarmupSection:
    copy_steps: int = 800  # supervised steps on the question and first search call only (learns to copy names)
    copy_batch_size: int = 32
    short_steps: int = 1200  # then whole trajectories without the system prompt and tool list (cheap)
    short_batch_size: int = 16
    steps: int = 200  # then supervised steps on the full prompts the agent sends
    batch_size: int = 16
    lr: float = 5e-4  # 2e-3 never formed the copy circuit on this machine
    name_scale: float = 8.0  # spread of the name tokens' embeddings over the model's other rows (tied: sharper copies)
    unboxed_share: float = 0.5  # deliberate mistake: final answer without \boxed{}
    stop_early_share: float = 0.4  # deliberate mistake: multi-hop answered after too few searches
    repeat_search_share: float = 0.1  # deliberate mistake: the same search twice in a row

    def spec(self, world: WorldSpec, agent: AgentConfig) -> WarmupSpec:
        return WarmupSpec(world=world, tools=tuple(agent.tools), top_k=agent.top_k, system_prompt=agent.system_prompt,
                          unboxed_share=self.unboxed_share, stop_early_share=self.stop_early_share,
                          repeat_search_share=self.repeat_search_share, copy_steps=self.copy_steps,
                          copy_batch_size=self.copy_batch_size, short_steps=self.short_steps,
                          short_batch_size=self.short_batch_size, steps=self.steps,
                          batch_size=self.batch_size, lr=self.lr, name_scale=self.name_scale)


@dataclass
class EvaluationSection:
    questions: int = 100  # first N held-out questions scored before and after training (0 = all)
    samples_per_row: int = 2  # episodes per question (standard errors are over questions)
    concurrency: int = 64  # episodes evaluated at once


@dataclass
class DeepResearchConfig(RunConfig):
    harness: str = "function"  # function: rollout_fn on the in-process client | gateway: openai SDK over HTTP
    world: WorldSection = field(default_factory=WorldSection)
    files: FilesSection = field(default_factory=FilesSection)
    retrieval: RetrievalSection = field(default_factory=RetrievalSection)
    agent: AgentConfig = field(default_factory=AgentConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    warmup: WarmupSection = field(default_factory=WarmupSection)
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)

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
        if self.evaluation.samples_per_row < 1:
            raise ValueError("evaluation.samples_per_row must be >= 1")
