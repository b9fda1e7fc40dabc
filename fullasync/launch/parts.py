"""A run's parts from its config: the engines' and the client's settings, the chat check, the trainer's start.

Owns: which config fields make a `VLLMEngineConfig` and a `ClientConfig`, the start-up check of the chat template
against the client's parsers, starting a trainer (with its ready line) and the layout line. Does not own: the model
directory (`model.py`) or the run (`fullasync.run`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fullasync.client import ClientConfig
from fullasync.client.reasoning import ReasoningSplitter
from fullasync.client.tool_parsers import make_tool_parser
from fullasync.config import RunConfig, shared_settings
from fullasync.engines.vllm import RayEngine, VLLMEngineConfig
from fullasync.engines.vllm.args import split_engine_args
from fullasync.infra.placement import layout_table
from fullasync.models import check_chat_setup as check_template
from fullasync.models import load_tokenizer
from fullasync.models.hub import InvalidModelError
from fullasync.observe.logs import progress

if TYPE_CHECKING:
    from fullasync.trainer.verl_trainer import VerlTrainer

log = logging.getLogger("fullasync")

# Fields of the `engine` section that are the run's, not an engine's (every other one is a VLLMEngineConfig field;
# `vllm` is split between VLLMEngineConfig's fields and its extra_engine_kwargs, `kv_cache_mb` goes to the latter).
RUN_ENGINE_FIELDS = ("num_engines", "restart_on_failure", "kv_cache_mb", "vllm")
RESTART_GRACE_S = 60.0  # a call whose engines all died waits for a restart this much beyond engine.start_timeout_s


def engine_config(config: RunConfig, model_path: str) -> VLLMEngineConfig:
    """The engines a run of `config` starts (for callers that start them themselves and pass them in): the
    `engine` section's fields that VLLMEngineConfig declares, the model's served name and the run's seed, and
    vLLM's own arguments of `engine.vllm` (checked against the installed vLLM; those VLLMEngineConfig declares,
    such as max_num_seqs, as its fields)."""
    section = config.engine
    settings = shared_settings(section, VLLMEngineConfig)
    settings["dtype"] = config.engine_dtype
    own, extra = split_engine_args(section.vllm, {f.name for f in dataclasses.fields(VLLMEngineConfig)})
    kv_cache = {"kv_cache_memory_bytes": section.kv_cache_mb * 2**20} if section.kv_cache_mb else {}
    return VLLMEngineConfig(model_path=model_path, served_model_name=config.model.served_name, seed=config.seed,
                            extra_engine_kwargs={**kv_cache, **extra}, **settings, **own)


def client_config(config: RunConfig) -> ClientConfig:
    """The client of a run of `config`: it serves the engines' context length and `top_logprobs` limit (the same
    fields), the model's name and tool-call format, and waits for interrupted and restarting engines."""
    engine = config.engine
    return ClientConfig(
        model_name=config.model.served_name, tool_parser=config.model.tool_parser,
        reasoning_parser=config.model.reasoning_parser,
        max_model_len=engine.max_model_len, max_top_logprobs=engine.max_logprobs,
        resume_timeout_s=config.rollout.resume_timeout_s, stream_interval=config.rollout.stream_interval,
        kv_routing=config.rollout.kv_routing, max_answer_tokens=config.rollout.max_answer_tokens,
        restart_wait_s=engine.start_timeout_s + RESTART_GRACE_S if engine.restart_on_failure else 0.0,
    )


def check_chat_setup(config: RunConfig, model_path: str) -> None:
    """Raise `InvalidModelError` (the user's setting to fix, not a crash) if the chat template of `model_path` and the
    configured tool and reasoning parsers do not fit; before anything starts."""
    model = config.model
    tokenizer = load_tokenizer(model_path)
    try:
        tool_parser = make_tool_parser(model.tool_parser, tokenizer)
        reasoning = ReasoningSplitter(model.reasoning_parser, tokenizer) if model.reasoning_parser else None
    except ValueError as error:
        raise InvalidModelError(f"model.tool_parser={model.tool_parser!r} / model.reasoning_parser="
                                f"{model.reasoning_parser!r}: {error}") from None
    try:
        check_template(tokenizer, tool_parser, f"model.chat_template={model.chat_template}" if model.chat_template
                       else f"the chat template of {model.path}", reasoning)
    except ValueError as error:
        raise InvalidModelError(str(error)) from None


async def log_layout(engines: Sequence[RayEngine], trainer: VerlTrainer | None) -> None:
    """What runs where (node, GPU ids), as Ray placed the engines and trainer ranks this run started."""
    rows = [(engine.name, *await engine.placement()) for engine in engines]
    if trainer is not None:
        rows += [(f"trainer rank {rank}", node, gpus) for rank, (node, gpus) in enumerate(await trainer.placement())]
    if rows:
        log.info("layout:\n%s", layout_table(rows))


async def start_trainer(trainer: VerlTrainer) -> None:
    began = time.perf_counter()
    await trainer.start()
    workers = trainer.config.num_workers
    took = time.perf_counter() - began
    runs = await trainer.describe()
    budget = trainer.config.max_tokens_per_micro_batch
    log.info("trainer ready: %d worker%s (%.1f s): %s master weights, %s compute, %s attention, %s micro-batches "
             "%s, log-probs %s, sequence parallel %s, gradient checkpointing %s, trained parameters %s, rank 0 on "
             "cores %s with %s threads", workers,
             "s" * (workers != 1), took, runs["master_dtype"], runs["compute_dtype"], runs["attention"],
             "packed" if runs["padding_free"] == "true" else "padded",
             f"of up to {budget} tokens" if budget else f"of {trainer.config.micro_batch_size} sequences",
             "in chunks" if runs["chunked_logprobs"] == "true" else "from full logits", runs["sequence_parallel"],
             "on" if runs["gradient_checkpointing"] == "true" else "off", runs["trained_parameters"], runs["cpus"],
             runs["threads"], extra=progress("trainer", 1, 1))
