"""Presets: whole-node layouts and training values for real models, chosen by name on any command line that
composes a run (`fullasync train preset=gpu-1x8-8b ...`, `python -m examples.mini_swe.train preset=...`).

Owns: the preset files (`preset/<name>.yaml`, Hydra's `preset` group: each sets the engines, the trainer's ranks
and its training values so that engines × tensor parallelism + trainer ranks = the node's GPUs), the primary config
of `fullasync train` that offers the group (`train.yaml`), `preset_names`, `preset_config` (a preset as a config,
for Python users: `AsyncAgentTrainer(preset_config("gpu-1x8-8b"), rollout_fn=...)`), and the start-up warning for a
real model run with the built-in task's training values (`builtin_values_warning`, sized by `weights_bytes`).
Does not own: the fields (`fullasync.config`) or placing the actors (`fullasync.infra.placement`).
May import: `contracts`, `config`, `types`, `errors`.

A preset's name reads `gpu-<nodes>x<GPUs per node>-<model size>`; the tests plan each onto that node shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from fullasync.config import BUILTIN_MODEL, RunConfig

T = TypeVar("T")

PRESETS_DIR = Path(__file__).resolve().parent / "preset"
REAL_MODEL_BYTES = 2**30  # weights past this (about 250M fp32 parameters) are a real model, not a test policy
TOY_LR = 1e-4  # a learning rate past this trains a tiny policy in minutes and wrecks a real model


def preset_names() -> list[str]:
    """The presets shipped, by name."""
    return sorted(path.stem for path in PRESETS_DIR.glob("*.yaml"))


def preset_config(name: str, overrides: Sequence[str] = (), config_type: type[T] = RunConfig) -> T:  # type: ignore[assignment]
    """Preset `name` over the defaults of `config_type`, then `overrides` (`key=value`): the config
    `fullasync train preset=<name> <overrides>` runs. Raises ValueError for an unknown preset or setting."""
    from omegaconf import DictConfig, OmegaConf

    from fullasync.config.compose import build_config, schema_node

    if name not in preset_names():
        raise ValueError(f"no preset {name!r}; the presets: {preset_names()}")
    composed = OmegaConf.merge(schema_node(config_type), OmegaConf.load(PRESETS_DIR / f"{name}.yaml"),
                               OmegaConf.from_dotlist(list(overrides)))
    assert isinstance(composed, DictConfig)  # a structured config merged with mappings
    return build_config(composed, config_type)


def weights_bytes(model_dir: Path) -> int:
    """Bytes of the weight files (safetensors, PyTorch) in a model directory."""
    return sum(path.stat().st_size for path in model_dir.iterdir() if path.suffix in (".safetensors", ".bin", ".pt"))


def builtin_values_warning(config: RunConfig, weights_bytes: int) -> str | None:
    """What a run of a real model (`weights_bytes` of weights) keeps of the built-in task's training values, and
    the preset to use; None for the built-in policy, a small one or a run that set its own values."""
    if config.model.path == BUILTIN_MODEL or weights_bytes < REAL_MODEL_BYTES:
        return None
    builtin = RunConfig()
    kept = []
    if config.trainer.lr > TOY_LR:
        kept.append(f"trainer.lr={config.trainer.lr:g} (a real model fine-tunes at ~1e-6)")
    if config.trainer.model_dtype == "fp32":
        kept.append("trainer.model_dtype=fp32 (bf16 halves the activations and the pushes)")
    if config.trainer.micro_batch_size == builtin.trainer.micro_batch_size:
        kept.append(f"trainer.micro_batch_size={config.trainer.micro_batch_size} (sized for 20-token answers)")
    if config.engine.max_model_len == builtin.engine.max_model_len:
        kept.append(f"engine.max_model_len={config.engine.max_model_len} (agent episodes run to 16k-128k tokens)")
    if not kept:
        return None
    return (f"{config.model.path} ({weights_bytes / 2**30:.1f} GiB of weights) runs with the built-in task's "
            f"{'; '.join(kept)}: choose a preset ({', '.join(f'preset={name}' for name in preset_names())}; "
            "docs/config.md) or set these")
