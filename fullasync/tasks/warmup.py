"""The starting policy of the built-in task: a short supervised warm-up with a sloppy answer format.

Owns: building (once, cached next to the tiny models) a policy that knows its sums but answers in
the exact format the reward wants ("7") only `exact_format_share` of the time; otherwise it writes
"7." or "= 7", which score 0. RL then has a clear, checkable margin to gain on held-out questions:
the format is one behaviour shared by all questions, so what RL learns on the training rows
carries over. Plain PyTorch on CPU, deterministic for a given spec; about half a minute.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fullasync.models import TinyModelSpec, build_tiny_model, cached_build, default_cache_root, load_tokenizer
from fullasync.tasks.arithmetic import ArithmeticTask, messages

log = logging.getLogger("fullasync")

WARMUP_FORMAT = 2  # bump when the procedure changes; part of the cache key


@dataclass(frozen=True)
class WarmupSpec:
    """What determines the warm-started policy."""

    model: TinyModelSpec = TinyModelSpec(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    task: ArithmeticTask = ArithmeticTask()
    exact_format_share: float = 0.3  # share of warm-up labels in the exact format ("7"); others "7." or "= 7"
    steps: int = 400  # optimizer steps
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0

    def key(self) -> str:
        return spec_key(WARMUP_FORMAT, self)


def spec_key(build_format: int, spec: Any) -> str:
    """Cache key of a warm-up spec (a dataclass with a `model` that has `key()`): its format, fields and model."""
    text = json.dumps([build_format, dataclasses.asdict(spec), spec.model.key()], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_warm_policy(spec: WarmupSpec = WarmupSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the warm-started policy (an HF model dir), building it first if not cached."""
    return cached_warm_policy("arith-warm", spec, _train, cache_dir)


def cached_warm_policy(name: str, spec: Any, train: Callable[[Any, Path, Path], None],
                       cache_dir: Path | None = None) -> Path:
    """`<cache>/models/<name>-<spec.key()>`: `train(spec, tiny_model_dir, out_dir)` run once on the tiny
    model of `spec.model` and cached (the built-in task's and the examples' warm-ups all use it)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()

    def build_into(out_dir: Path) -> dict:
        train(spec, build_tiny_model(spec.model, cache_dir=cache_dir), out_dir)
        return dataclasses.asdict(spec)

    return cached_build(root / "models" / f"{name}-{spec.key()}", build_into)


def _train(spec: WarmupSpec, base: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    tokenizer = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    rng = random.Random(spec.seed)
    rows = spec.task.rows("train")
    prompts = [
        tokenizer.apply_chat_template(messages(row), tokenize=True, add_generation_prompt=True, return_dict=False)
        for row in rows
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    for step in range(spec.steps):
        picks = [rng.randrange(len(rows)) for _ in range(spec.batch_size)]
        examples = [(list(prompts[i]), _sloppy_label(tokenizer, rows[i]["answer"], spec, rng)) for i in picks]
        input_ids, attention, labels = _pad(examples)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0 or step == spec.steps - 1:
            log.info("warm-up step %4d/%d loss %.3f", step, spec.steps, loss.item())
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _sloppy_label(tokenizer, answer: int, spec: WarmupSpec, rng: random.Random) -> list[int]:
    text = str(answer) if rng.random() < spec.exact_format_share else rng.choice((f"{answer}.", f"= {answer}"))
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def _pad(examples):
    import torch

    length = max(len(p) + len(a) for p, a in examples)
    input_ids = torch.zeros(len(examples), length, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for row, (prompt, answer) in enumerate(examples):
        sequence = prompt + answer
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        attention[row, : len(sequence)] = 1
        labels[row, len(prompt) : len(sequence)] = torch.tensor(answer)
    return input_ids, attention, labels
