"""examples/deepresearch/train.py end to end (slow): Hydra config → warm-up → engines and trainer →
held-out evaluation → training → evaluation, here with the `CustomGenerator` harness (the openai SDK
through the gateway) and the retrieval service over HTTP, for a couple of steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "deepresearch" / "config"


def load_config(*overrides: str):
    from examples.deepresearch import train  # registers the schema

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        return OmegaConf.to_object(compose(config_name="train", overrides=list(overrides))), train


def test_command_line_overrides_reach_run_and_example_sections():
    config, _ = load_config("mode=fully_async", "max_staleness=4", "agent.max_turns=6", "reward.metric=em")
    assert (config.mode, config.staleness, config.agent.max_turns, config.reward.metric) == ("fully_async", 4, 6, "em")
    config.validate()
    config.retrieval.mode = "url"
    with pytest.raises(ValueError, match="retrieval.url"):
        config.validate()


@pytest.mark.slow
@pytest.mark.extended
async def test_train_runs_the_gateway_harness_with_http_retrieval(ray_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("FULLASYNC_CACHE_DIR", str(tmp_path / "cache"))
    config, train = load_config(
        "harness=gateway", "retrieval.mode=server", "total_steps=2", "rollout.n=4", "rollout.batch_size=2",
        "rollout.max_running_rows=4", "evaluation.questions=4", "evaluation.samples_per_row=1", "warmup.steps=5",
        "warmup.short_steps=5", "warmup.copy_steps=5", f"output_dir={tmp_path / 'run'}")
    summary = await train.run(config)
    assert summary["steps"] == 2 and summary["episode_failures"] == 0
    assert summary["episodes"]["episodes"] >= 2 * 4
    assert summary["heldout_before"]["episodes"] == summary["heldout_after"]["episodes"] == 4
    assert (tmp_path / "run" / "summary.json").exists() and (tmp_path / "run" / "episodes.jsonl").exists()
    # the held-out evaluation is the run's own: what the run's account and `fullasync report` read
    assert (summary["val_before"], summary["val_after"]) == (summary["heldout_before"]["f1"],
                                                             summary["heldout_after"]["f1"])
    lines = (tmp_path / "run" / "validation.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 2]
    print(train.report(summary))
