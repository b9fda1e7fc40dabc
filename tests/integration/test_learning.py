"""The learning check: fully async with partial rollouts raises held-out accuracy on the built-in task.

A fresh engine and trainer (the policy must start from the warm-up), the `make run` defaults
(60 steps of 8 groups × 8 episodes, max_staleness 2, the default correction). Seen here: 0.15 →
0.50; asserted: +0.15. Answers are 2–3 tokens, so whether a push lands mid-generation depends on
timing; that partial rollouts resume is asserted in test_training_loop with answers that outlast a step.
"""

from __future__ import annotations

import json

import pytest
from browser import Elements, render
from mlflow.tracking import MlflowClient

from fullasync.api import AsyncAgentTrainer
from fullasync.cli.report import write_report
from fullasync.config import LoggingSection, RunConfig
from fullasync.config.checks import LOGGERS

MARGIN = 0.15


@pytest.mark.slow
@pytest.mark.learning
async def test_fully_async_partial_rollout_raises_held_out_accuracy(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = RunConfig(mode="fully_async", partial_rollout=True, output_dir=str(tmp_path),
                       logging=LoggingSection(loggers=list(LOGGERS), offline=True))
    result = await AsyncAgentTrainer(config).train_async()
    assert result.steps == config.total_steps == 60
    assert result.max_token_staleness <= 2
    assert result.val_after - result.val_before >= MARGIN, (result.val_before, result.val_after)
    # what the run wrote for a person to read: decoded episodes every logging.samples_every (10) steps
    written = sorted(p.name for p in (tmp_path / "rollouts").iterdir())
    assert written == [f"step_{step}.jsonl" for step in (10, 20, 30, 40, 50, 60)]
    episodes = [json.loads(line) for line in (tmp_path / "rollouts" / "step_60.jsonl").read_text().splitlines()]
    assert len(episodes) == config.rollout.batch_size * config.rollout.n
    call = episodes[0]["calls"][0]
    assert "+" in call["prompt"] and call["completion"] and call["completion_tokens"] > 0
    assert 0 <= call["staleness"] <= 2 and episodes[0]["reward"] in (0.0, 1.0)
    # the same steps and samples in every logger the run was asked to log to (offline here)
    ids = json.loads((tmp_path / "tracking.json").read_text())
    assert set(ids) == set(LOGGERS)
    mlflow_history = MlflowClient((tmp_path / "mlruns").as_uri()).get_metric_history(ids["mlflow"], "reward.mean")
    assert [m.step for m in mlflow_history] == list(range(1, 61))
    (wandb_run,) = (tmp_path / "wandb").glob(f"offline-run-*-{ids['wandb']}")
    tables = {path.name.split("_")[1] for path in wandb_run.glob("files/media/table/rollouts_*.table.json")}
    assert tables == {"10", "20", "30", "40", "50", "60"}
    assert list((tmp_path / "swanlog").glob(f"run-*-{ids['swanlab']}"))
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    page = write_report(tmp_path)  # `fullasync report` on this run's output
    assert {"reward.png", "staleness_histogram.png", "throughput.png"} <= {p.name for p in page.parent.iterdir()}
    # its rollout pages in a real browser: every episode, its calls, tokens coloured by version; a filter applied
    step_page = page.parent / "rollouts" / "step_60.html"
    dom = Elements(render(step_page))
    shown = dom.with_class("episode")
    assert len(shown) == len(episodes) and not any("none" in e.get("style", "") for e in shown)
    assert len(dom.with_class("call")) == sum(len(e["calls"]) for e in episodes)
    tokens = dom.with_class("tokens")
    versions = {int(t["data-version"]) for t in tokens}
    assert tokens and all("background:hsl(" in t["style"] for t in tokens)
    assert versions == {v for e in episodes for c in e["calls"] for s in c["segments"] for v in [s["version"]]}
    assert all(episodes[0]["trainer_version"] - v <= 2 for v in versions)
    filtered = Elements(render(step_page, "?min-reward=1")).with_class("episode")
    visible = [e for e in filtered if "none" not in e.get("style", "")]
    assert len(visible) == sum(e["reward"] >= 1 for e in episodes)
    assert all(float(e["data-reward"]) >= 1 for e in visible)
