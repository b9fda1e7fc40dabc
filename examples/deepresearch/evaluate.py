"""Score the agent on held-out questions: F1 and exact match with standard errors.

Owns: running episodes over rows with bounded concurrency, and the report (means over questions,
standard errors over questions, so several samples of one question are not counted as independent).
Works against any OpenAI-compatible endpoint:

    python -m examples.deepresearch.evaluate --base-url http://127.0.0.1:8000/v1 --model policy --limit 100

and in process on fullasync's client (`evaluate_on_service`, what train.py uses before and after).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from examples.deepresearch.agent import AgentConfig, EpisodeLog, run_episode
from examples.deepresearch.reward import score_answer
from examples.deepresearch.tools import ResearchTools

RunOne = Callable[[dict[str, Any], int], Awaitable[EpisodeLog]]  # (row, sample index) → episode


@dataclass(frozen=True)
class EvalReport:
    questions: int
    episodes: int
    f1: float  # mean over questions of the mean over their samples
    f1_stderr: float  # standard error of that mean, over questions
    exact_match: float
    exact_match_stderr: float
    boxed_share: float  # episodes whose final reply had a \boxed{} answer
    failed_episodes: int  # raised (counted as 0)
    turns: dict[int, int]  # model calls per episode → episodes

    def line(self) -> str:
        return (f"F1 {self.f1:.3f} ± {self.f1_stderr:.3f} | "
                f"EM {self.exact_match:.3f} ± {self.exact_match_stderr:.3f} | boxed {self.boxed_share:.2f} | "
                f"{self.questions} questions × {self.episodes // self.questions} | turns {self.turns} | "
                f"failed {self.failed_episodes}")


def _mean_and_stderr(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    stderr = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return mean, stderr


async def evaluate_rows(run_one: RunOne, rows: list[dict[str, Any]], samples_per_row: int = 1,
                        concurrency: int = 32) -> EvalReport:
    """Run `samples_per_row` episodes per row; an episode that raises scores 0 and is counted."""
    if not rows or samples_per_row < 1:
        raise ValueError("evaluate_rows needs at least one row and samples_per_row >= 1")
    limit = asyncio.Semaphore(concurrency)

    async def one(row: dict[str, Any], sample: int) -> EpisodeLog | None:
        async with limit:
            try:
                return await run_one(row, sample)
            except Exception:  # a failed episode is a zero in the report, not a crash of the evaluation
                return None

    logs = await asyncio.gather(*(one(row, s) for row in rows for s in range(samples_per_row)))
    f1s, ems, boxed, turns = [], [], 0, Counter()
    for index, row in enumerate(rows):
        scores = [score_answer(log.final_text, row["answers"]) if log is not None else None
                  for log in logs[index * samples_per_row : (index + 1) * samples_per_row]]
        f1s.append(statistics.fmean(s.f1 if s else 0.0 for s in scores))
        ems.append(statistics.fmean(s.exact_match if s else 0.0 for s in scores))
        boxed += sum(1 for s in scores if s is not None and s.boxed is not None)
    turns.update(log.turns for log in logs if log is not None)
    f1, f1_stderr = _mean_and_stderr(f1s)
    em, em_stderr = _mean_and_stderr(ems)
    return EvalReport(len(rows), len(logs), f1, f1_stderr, em, em_stderr, boxed / len(logs),
                      sum(log is None for log in logs), dict(sorted(turns.items())))


async def evaluate_on_service(service: Any, rows: list[dict[str, Any]], tools: ResearchTools, agent: AgentConfig,
                              samples_per_row: int = 1, concurrency: int = 64) -> EvalReport:
    """In process on fullasync's `RolloutService` (engines shared with training, nothing recorded for it)."""

    async def run_one(row: dict[str, Any], sample: int) -> EpisodeLog:
        client = service.client(f"eval-{row['id']}-{sample}")
        try:
            return await run_episode(client, row["question"], tools, agent)
        finally:
            client.close()

    return await evaluate_rows(run_one, rows, samples_per_row, concurrency)


async def _main(args: argparse.Namespace) -> EvalReport:
    from openai import AsyncOpenAI

    from examples.deepresearch.data import load_corpus, load_questions
    from examples.deepresearch.retrieval import Bm25Index
    from examples.deepresearch.server import HttpRetriever
    from examples.deepresearch.world import WorldSpec, ensure_world

    world_dir = ensure_world(WorldSpec()) if not (args.questions and (args.corpus or args.retrieval_url)) else None
    rows = load_questions(args.questions or world_dir / "heldout.jsonl", limit=args.limit)
    retriever = (HttpRetriever(args.retrieval_url) if args.retrieval_url
                 else Bm25Index(load_corpus(args.corpus or world_dir / "corpus.jsonl")))
    agent = AgentConfig(max_turns=args.max_turns, max_tokens=args.max_tokens, temperature=args.temperature,
                        top_k=args.top_k, tools=args.tools.split(","), model=args.model)
    agent.validate()
    tools = ResearchTools(retriever, agent.top_k, agent.tools)
    async with AsyncOpenAI(base_url=args.base_url, api_key=args.api_key) as sdk:
        report = await evaluate_rows(lambda row, _: run_episode(sdk, row["question"], tools, agent), rows,
                                     args.samples, args.concurrency)
    if isinstance(retriever, HttpRetriever):
        await retriever.aclose()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description="Score an OpenAI-compatible model as the search agent.")
    parser.add_argument("--base-url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="EMPTY")
    parser.add_argument("--model", default="policy")
    parser.add_argument("--questions", default="", help="JSONL questions (default: the generated held-out split)")
    parser.add_argument("--corpus", default="", help="JSONL corpus for the in-process BM25 (default: generated)")
    parser.add_argument("--retrieval-url", default="", help="use this retrieval service instead of in-process BM25")
    parser.add_argument("--limit", type=int, default=100, help="first N questions (0 = all)")
    parser.add_argument("--samples", type=int, default=1, help="episodes per question")
    parser.add_argument("--max-turns", type=int, default=AgentConfig.max_turns)
    parser.add_argument("--max-tokens", type=int, default=AgentConfig.max_tokens)
    parser.add_argument("--temperature", type=float, default=AgentConfig.temperature)
    parser.add_argument("--top-k", type=int, default=AgentConfig.top_k)
    parser.add_argument("--tools", default="search", help="comma-separated: search,open")
    parser.add_argument("--concurrency", type=int, default=16)
    report = asyncio.run(_main(parser.parse_args()))
    print(report.line())
    print(json.dumps(asdict(report)))


if __name__ == "__main__":
    main()
