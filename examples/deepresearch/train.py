"""Train the search agent fully asynchronously (Hydra). Run from the repository root:

    python -m examples.deepresearch.train                                  # defaults: config/train.yaml
    python -m examples.deepresearch.train mode=fully_async max_staleness=4 agent.max_turns=6
    python -m examples.deepresearch.train harness=gateway retrieval.mode=server   # openai SDK over HTTP, HTTP retrieval
    python -m examples.deepresearch.train model.path=/models/qwen files.train=my.jsonl retrieval.mode=url \\
        retrieval.url=http://127.0.0.1:8090
    python -m examples.deepresearch.train --cfg job                        # print the merged config
    python -m examples.deepresearch.train --help                           # every field with its type, default and help

Owns: wiring world, retrieval, agent and reward into `AsyncAgentTrainer`, the held-out evaluation as the run's
own (`evaluate_fn`: F1 with standard errors, on the same engines, before and after training and every `val_every`
steps; so `result.json`, `validation.jsonl` and `fullasync report` show it), and the run summary
(`<output_dir>/summary.json`: evaluations, wall time, turn and length distributions, episodes a
weight push touched). Training itself is fullasync's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore

from examples.deepresearch.config import BUILTIN_POLICY, DeepResearchConfig
from fullasync.config.compose import build_config, schema_node
from fullasync.config.doc import exit_with_help_if_asked
from fullasync.engines.vllm.args import engine_arg_names

ConfigStore.instance().store(name="deepresearch_schema", node=schema_node(DeepResearchConfig))


def data_files(config: DeepResearchConfig) -> dict[str, Path]:
    """The question and corpus files: the user's, else the generated world's (built once, cached)."""
    from examples.deepresearch.world import ensure_world

    chosen = {"train": config.files.train, "heldout": config.files.heldout, "corpus": config.files.corpus}
    world_dir = ensure_world(config.world.spec()) if not all(chosen.values()) else None
    return {name: Path(path) if path else world_dir / f"{name}.jsonl" for name, path in chosen.items()}


def policy_path(config: DeepResearchConfig) -> str:
    if config.model.path != BUILTIN_POLICY:
        return config.model.path
    from examples.deepresearch.warmup import build_warm_policy

    started = time.monotonic()
    path = build_warm_policy(config.warmup.spec(config.world.spec(), config.agent))
    print(f"[deepresearch] policy {path} ready in {time.monotonic() - started:.0f} s", flush=True)
    return str(path)


def policy_built_on(path: str) -> dict[str, Any]:
    """The warmed-up policy's record (its weights' digest, what their bytes depend on, its held-out copy
    accuracy); empty for a model of the user's."""
    record = Path(path) / "warmup.json"
    return json.loads(record.read_text()) if record.exists() else {}


async def open_retriever(config: DeepResearchConfig, corpus: Path) -> tuple[Any, Any]:
    """(retriever, server or None) for retrieval.mode."""
    from examples.deepresearch.data import load_corpus
    from examples.deepresearch.retrieval import Bm25Index
    from examples.deepresearch.server import HttpRetriever, HttpRetrieverConfig, RetrievalServer

    http = HttpRetrieverConfig(timeout_s=config.retrieval.timeout_s, retries=config.retrieval.retries)
    if config.retrieval.mode == "url":
        return HttpRetriever(config.retrieval.url, http), None
    index = Bm25Index(load_corpus(corpus), snippet_words=config.retrieval.snippet_words)
    if config.retrieval.mode == "local":
        return index, None
    server = RetrievalServer(index)
    await server.start()
    print(f"[deepresearch] retrieval service at {server.url}/retrieve", flush=True)
    return HttpRetriever(server.url, http), server


async def run(config: DeepResearchConfig) -> dict[str, Any]:
    from examples.deepresearch.agent import DeepResearchAgent, DeepResearchGenerator
    from examples.deepresearch.data import load_questions
    from examples.deepresearch.episodes import EpisodeStats
    from examples.deepresearch.evaluate import EvalReport, evaluate_on_service
    from examples.deepresearch.tools import ResearchTools
    from fullasync.api import AsyncAgentTrainer, Evaluation
    from fullasync.client import RolloutService
    from fullasync.engines.vllm import launch_vllm_engines
    from fullasync.infra.runtime import init_ray
    from fullasync.launch.parts import engine_config

    started = time.monotonic()
    config.validate()
    files = data_files(config)
    train_rows = load_questions(files["train"])
    heldout_rows = load_questions(files["heldout"], limit=config.evaluation.questions)
    config.model.path = policy_path(config)
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    stats = EpisodeStats(output_dir / "episodes.jsonl")
    retriever, server = await open_retriever(config, files["corpus"])
    tools = ResearchTools(retriever, config.agent.top_k, config.agent.tools)
    harness_type = DeepResearchAgent if config.harness == "function" else DeepResearchGenerator
    harness = harness_type(tools, config.agent, config.reward, on_episode=stats)
    reports: list[EvalReport] = []

    async def evaluate(service: RolloutService) -> Evaluation:
        """The held-out F1 as the run's own evaluation: before training, every `val_every` steps, after."""
        report = await evaluate_on_service(service, heldout_rows, tools, config.agent,
                                           config.evaluation.samples_per_row, config.evaluation.concurrency)
        when = "before training" if not reports else f"evaluation {len(reports) + 1}"
        print(f"[deepresearch] held-out {when}: {report.line()}", flush=True)
        reports.append(report)
        return Evaluation(report.f1, report.f1_stderr, report.failed_episodes,
                          {"exact_match": report.exact_match, "boxed_share": report.boxed_share,
                           "single_turn_share": report.turns.get(1, 0) / max(report.episodes, 1)})

    trainer = AsyncAgentTrainer(config, rollout_fn=harness, train_dataset=train_rows, evaluate_fn=evaluate)
    init_ray()
    engines = await launch_vllm_engines(engine_config(config, config.model.path), config.engine.num_engines)
    try:
        result = await trainer.train_async(engines=engines)
    finally:
        await asyncio.gather(*(engine.shutdown() for engine in engines), return_exceptions=True)
        if server is not None:
            await server.stop()
        stats.close()
    before, after = reports[0], reports[-1]
    summary = {
        "wall_s": time.monotonic() - started,
        "policy": policy_built_on(config.model.path),
        **result.summary(),
        "heldout_before": asdict(before),
        "heldout_after": asdict(after),
        "f1_gain": after.f1 - before.f1,
        "f1_gain_stderr": (before.f1_stderr ** 2 + after.f1_stderr ** 2) ** 0.5,
        "episodes": stats.summary(),
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def report(summary: dict[str, Any]) -> str:
    before, after, episodes = summary["heldout_before"], summary["heldout_after"], summary["episodes"]
    return "\n".join([
        f"[deepresearch] held-out F1 {before['f1']:.3f} ± {before['f1_stderr']:.3f} → {after['f1']:.3f} ± "
        f"{after['f1_stderr']:.3f} (gain {summary['f1_gain']:+.3f} ± {summary['f1_gain_stderr']:.3f}); "
        f"EM {before['exact_match']:.3f} → {after['exact_match']:.3f}",
        f"[deepresearch] {summary['steps']} steps, wall {summary['wall_s']:.0f} s "
        f"(training {summary['train_wall_s']:.0f} s); rows {summary['rows']}; "
        f"episode failures {summary['episode_failures']}",
        f"[deepresearch] training episodes {episodes.get('episodes', 0)}: turns {episodes.get('turns')}, "
        f"≥3 turns {episodes.get('share_3plus_turns', 0):.2f}; interrupted by a push and resumed "
        f"{episodes.get('interrupted_and_resumed', 0)}, spanning weight versions "
        f"{episodes.get('spanning_weight_versions', 0)} (share touched by a push "
        f"{episodes.get('share_push_mid_episode', 0):.2f})",
    ])


@hydra.main(version_base=None, config_path="config", config_name="train")
def main(cfg: Any) -> None:
    try:
        config = build_config(cfg, DeepResearchConfig, engine_arg_names)
        config.validate()
    except ValueError as error:
        print(f"deepresearch: invalid configuration: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(report(asyncio.run(run(config))), flush=True)


if __name__ == "__main__":
    exit_with_help_if_asked(sys.argv[1:], DeepResearchConfig, __doc__ or "",
                            Path(__file__).parent / "config" / "train.yaml")
    main()
