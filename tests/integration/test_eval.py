"""`fullasync eval`: a model's held-out score through the harness, on one weight version, with per-row rewards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx

from fullasync.cli.evaluate import evaluate_model
from fullasync.config import ModelSection, RunConfig
from fullasync.rollout.generator import CustomGenerator, EpisodeContext
from fullasync.tasks import arithmetic

ROOT = Path(__file__).resolve().parents[2]


class OverHTTP(CustomGenerator):
    """A harness that reaches the policy only through its episode's base URL (set up and torn down once)."""

    uses_gateway = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lifecycle: list[str] = []

    async def setup(self) -> None:
        self.lifecycle.append("setup")

    async def teardown(self) -> None:
        self.lifecycle.append("teardown")

    async def generate(self, episode: EpisodeContext, row) -> float:
        assert episode.base_url is not None
        async with httpx.AsyncClient(base_url=episode.base_url, timeout=60,
                                     headers={"Authorization": f"Bearer {episode.api_key}"}) as http:
            reply = await http.post("/chat/completions", json={
                "model": "policy", "max_tokens": 4, "messages": [{"role": "user", "content": row["question"]}]})
        reply.raise_for_status()
        self.calls.append(episode.episode_id)
        return float(reply.json()["choices"][0]["message"]["content"].strip() == str(row["answer"]))


async def test_eval_scores_every_row_through_the_harness_on_one_weight_version(engine, tiny_model_path, tmp_path):
    rows = arithmetic.ArithmeticTask().rows("val")[:6]
    config = RunConfig(model=ModelSection(path=tiny_model_path), val_samples_per_row=3, output_dir=str(tmp_path),
                       eval_keep=["learning", "unsolved"])
    report = await evaluate_model(config, rollout_fn=arithmetic.rollout_fn, rows=rows, engines=[engine])
    assert report.rows == 6 and report.samples_per_row == 3 and report.failed == 0
    assert [len(rewards) for rewards in report.row_rewards] == [3] * 6
    assert report.score == sum(map(sum, report.row_rewards)) / 18 and report.weight_version == await engine.version()
    written = json.loads((tmp_path / "eval.json").read_text())
    assert written["score"] == report.score and len(written["per_row"]) == 6
    assert written["per_row"][0]["rewards"] == list(report.row_rewards[0])
    kept = [json.loads(line) for line in (tmp_path / "kept_rows.jsonl").read_text().splitlines()]
    assert kept == [row for row, rewards in zip(rows, report.row_rewards) if min(rewards) < 0.5]  # not all passed

    harness = OverHTTP()  # a CustomGenerator that uses the gateway: set up, served by URL, torn down
    report = await evaluate_model(config, rollout_fn=harness, rows=rows[:2], engines=[engine])
    assert report.rows == 2 and report.failed == 0 and len(harness.calls) == 6 == len(set(harness.calls))
    assert harness.lifecycle == ["setup", "teardown"]


def test_eval_without_a_harness_says_what_to_set():
    done = subprocess.run([sys.executable, "-m", "fullasync.cli", "eval", "data.task="], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2 and "no rollout_fn to evaluate with: set data.rollout_fn" in done.stderr
