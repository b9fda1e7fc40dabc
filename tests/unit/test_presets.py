"""The presets: each composes on the command line of `fullasync train` and of the examples, fits the node shape its
name gives (the placement planner, with logical GPUs), and trains a real model with real values; a real model run
with the built-in task's values is warned about, naming the presets."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir, initialize_config_module

from fullasync.config import RunConfig
from fullasync.config.compose import build_config
from fullasync.infra.placement import LayoutError, gpu_blocks, plan_gpus
from fullasync.presets import REAL_MODEL_BYTES, builtin_values_warning, preset_config, preset_names, weights_bytes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SHAPE = re.compile(r"gpu-(\d+)x(\d+)-")


def test_the_command_line_composes_a_preset_as_python_gets_it():
    from fullasync.cli.main import _register

    _register()
    with initialize_config_module(config_module="fullasync.presets", version_base=None):
        composed = compose(config_name="train", overrides=["preset=gpu-1x8-8b", "engine.vllm.max_num_seqs=64"])
    assert build_config(composed, RunConfig) == preset_config("gpu-1x8-8b", ["engine.vllm.max_num_seqs=64"])
    with pytest.raises(ValueError, match=r"no preset 'gpu-1x9'; the presets: \['gpu-1x2-1.5b', 'gpu-1x8-8b'"):
        preset_config("gpu-1x9")


def test_presets_ship_for_a_node_of_eight_and_for_the_smallest_gpu_layout():
    assert {"gpu-1x8-8b", "gpu-1x2-1.5b"} <= set(preset_names())


@pytest.mark.parametrize("name", preset_names())
def test_a_preset_fills_the_node_its_name_gives_with_real_training_values(name):
    config = preset_config(name)
    nodes, gpus = (int(part) for part in SHAPE.match(name).groups())  # type: ignore[union-attr]
    blocks = gpu_blocks(config.engine.num_engines, config.engine.tensor_parallel_size, config.trainer.num_workers)
    assert sum(count for _, count in blocks) == nodes * gpus  # every GPU used, none asked for twice
    plan = plan_gpus(blocks, {f"node {index}": gpus for index in range(nodes)})
    assert set(plan) == {component for component, count in blocks if count}
    with pytest.raises(LayoutError):  # one GPU fewer does not fit: the planner is the proof, not the arithmetic
        plan_gpus(blocks, {f"node {index}": gpus - (index == 0) for index in range(nodes)})
    assert config.trainer.model_dtype == "bf16" and config.trainer.lr <= 1e-5 and config.trainer.gradient_checkpointing
    assert config.engine.max_model_len >= 16384 and config.model.path != RunConfig().model.path
    # a whole episode of the context fits a micro-batch, whose log-probs never hold [tokens, vocab] logits
    assert config.trainer.max_tokens_per_micro_batch >= config.engine.max_model_len
    assert config.trainer.chunked_logprobs
    assert builtin_values_warning(config, 16 * 2**30) is None  # validated in test_config_components (loads verl)


def test_an_example_takes_a_preset_over_its_own_values():
    importlib.import_module("examples.mini_swe.train")  # registers the schema
    from examples.mini_swe.config import MiniSweTrainConfig

    with initialize_config_dir(config_dir=str(EXAMPLES / "mini_swe" / "config"), version_base=None):
        config = build_config(compose(config_name="train", overrides=["preset=gpu-1x8-8b", "trainer.lr=2e-6"]),
                              MiniSweTrainConfig)
    assert (config.engine.num_engines, config.trainer.num_workers, config.trainer.lr) == (4, 4, 2e-6)
    assert config.agent == MiniSweTrainConfig().agent and config.total_steps == 25  # the example's own, kept


def test_a_real_model_with_the_builtin_task_values_is_warned_about_naming_the_presets():
    config = RunConfig()
    assert builtin_values_warning(config, 64 * 2**30) is None  # the built-in policy
    config.model.path = "Qwen/Qwen3-8B"
    assert builtin_values_warning(config, REAL_MODEL_BYTES // 2) is None  # a small model: a test policy
    said = builtin_values_warning(config, 16 * 2**30)
    assert said is not None
    for part in ("Qwen/Qwen3-8B (16.0 GiB of weights)", "trainer.lr=0.0005", "trainer.model_dtype=fp32",
                 "trainer.micro_batch_size=32", "engine.max_model_len=1024", "preset=gpu-1x8-8b",
                 "preset=gpu-1x2-1.5b"):
        assert part in said, (part, said)
    config.trainer.lr, config.trainer.model_dtype = 1e-6, "bf16"
    config.trainer.micro_batch_size, config.engine.max_model_len = 2, 16384
    assert builtin_values_warning(config, 16 * 2**30) is None


def test_the_weights_of_a_model_directory_are_what_its_weight_files_hold(tmp_path):
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"w" * 300)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"w" * 200)
    (tmp_path / "pytorch_model.bin").write_bytes(b"w" * 7)
    (tmp_path / "tokenizer.json").write_text("{}" * 100)
    assert weights_bytes(tmp_path) == 507
