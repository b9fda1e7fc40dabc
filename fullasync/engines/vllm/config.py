"""How one vLLM engine is started (`VLLMEngineConfig`) and what its watchdog probe reads (`EngineHealth`).

Owns: the engine's settings and their checks; the stream tick (`STREAM_DELTA_S`). Pure: no Ray, no vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

from fullasync.config import EngineSection, ModelSection, RunConfig
from fullasync.config.checks import check_ray_resources, parse_cpus
from fullasync.config.run import TORCH_DTYPE_NAMES

if TYPE_CHECKING:
    import torch

# Streamed requests' new tokens go to the driver at most this often, all of an engine's streams in one Ray object
# (at once after a quiet spell): a Ray object per vLLM step, or per stream, costs the driver CPU per streamed token
# that one per engine does not (the figures: docs/benchmarks/figures.md).
STREAM_DELTA_S = 0.02

# AsyncEngineArgs the engine sets from its own fields (model_path is vLLM's `model`) or needs as they are (priority
# scheduling, the weight-transfer backend): `extra_engine_kwargs` may not name them
SET_BY_ENGINE = ("model", "served_model_name", "dtype", "max_model_len", "max_num_seqs", "enable_prefix_caching",
                 "logprobs_mode", "seed", "max_logprobs", "tensor_parallel_size", "scheduling_policy",
                 "weight_transfer_config")
DEFAULT_MAX_NUM_SEQS = 128  # concurrent sequences per engine (`engine.vllm.max_num_seqs`)

EngineDType = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]  # vLLM's model dtypes
LogprobsMode = Literal["raw_logits", "raw_logprobs", "processed_logits", "processed_logprobs"]


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype of one of vLLM's dtype names (auto: float32, the largest the weights can arrive in)."""
    import torch

    return getattr(torch, {"auto": "float32", **TORCH_DTYPE_NAMES}.get(dtype, dtype))


@dataclass(frozen=True)
class VLLMEngineConfig:
    """How to start one vLLM engine.

    A run makes it from its `engine` section (`fullasync.launch.parts.engine_config`: every field both declare, plus the
    model's path and served name and the run's seed); the settings a run has take their defaults from there, so
    an engine started on its own gets the same ones. Their help is in `fullasync.config.run` (docs/config.md)."""

    model_path: str  # local HF model directory
    served_model_name: str = ModelSection.served_name
    dtype: str = "float32"  # a run's `engine.dtype=auto` is the trainer's precision (`launch.parts.engine_config`)
    max_model_len: int = EngineSection.max_model_len
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    enable_prefix_caching: bool = True  # reuse KV of shared prefixes (multi-turn, resumed requests)
    logprobs_mode: str = "processed_logprobs"  # log-probs after temperature/top-p, i.e. of the sampling policy
    seed: int = RunConfig.seed
    max_logprobs: int = EngineSection.max_logprobs
    tensor_parallel_size: int = EngineSection.tensor_parallel_size
    extra_engine_kwargs: Mapping[str, Any] = field(default_factory=dict)  # more AsyncEngineArgs, passed as they are
    start_timeout_s: float = EngineSection.start_timeout_s
    call_timeout_s: float = 120.0  # bound on control calls (pause, resume, update, version)
    generate_timeout_s: float = 1800.0  # bound on one generate call
    probe_interval_s: float = EngineSection.probe_interval_s
    stall_timeout_s: float = EngineSection.stall_timeout_s
    starved_interruptions: int = EngineSection.starved_interruptions  # the starvation rule (`actor.py`)
    starved_wait_s: float = EngineSection.starved_wait_s
    ray_resources: Mapping[str, float] = field(default_factory=dict)  # custom Ray resources per engine: pins its node
    cpus: str = EngineSection.cpus  # Linux CPU list the engine's processes are bound to; "" = every core
    weight_bucket_bytes: int = 64 * 2**20  # weights pass to the engine core in buckets of whole layers this big

    def __post_init__(self) -> None:
        check_ray_resources("VLLMEngineConfig.ray_resources", self.ray_resources)
        parse_cpus("VLLMEngineConfig.cpus", self.cpus)
        for name, kind in (("dtype", EngineDType), ("logprobs_mode", LogprobsMode)):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"engine {name}={getattr(self, name)!r} is not one vLLM knows; choose one of "
                                 f"{list(get_args(kind))}")
        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int) \
                or self.tensor_parallel_size < 1:
            raise ValueError(f"engine tensor_parallel_size must be an integer >= 1, got {self.tensor_parallel_size!r}")
        clashing = sorted(set(self.extra_engine_kwargs) & set(SET_BY_ENGINE))
        if clashing:
            raise ValueError(f"VLLMEngineConfig.extra_engine_kwargs names {clashing}, which the engine sets itself: "
                             "pass them as VLLMEngineConfig's own fields")
        if self.weight_bucket_bytes <= 0:
            raise ValueError(f"VLLMEngineConfig.weight_bucket_bytes must be > 0, got {self.weight_bucket_bytes}")


@dataclass(frozen=True)
class EngineHealth:
    """One watchdog probe: is the engine core alive, and has it produced anything lately."""

    in_flight: int
    paused: bool
    core_errored: bool
    seconds_without_progress: float  # since the last token, resume, or first in-flight request
    last_request_id: str | None
