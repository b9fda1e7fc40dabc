"""The starting policy of the built-in task: a short supervised warm-up with a sloppy answer format.

Owns: building (once, cached next to the tiny models) a policy that knows its sums but answers in
the exact format the reward wants ("7") only `exact_format_share` of the time; otherwise it writes
"7." or "= 7", which score 0. RL then has a clear, checkable margin to gain on held-out questions:
the format is one behaviour shared by all questions, so what RL learns on the training rows
carries over. Plain PyTorch on CPU, deterministic for a given spec; about half a minute.

The long-tail variant's starting policy (`LongTailWarmupSpec`) is the same warm-up with each answer followed by
filler tokens instead of the end token. Also owns what every warm-up shares: the supervised loop (`fine_tune`), the
cache (`cached_warm_policy`, `spec_key`), single-token names for copying (`extend_vocabulary`, `share_updates`),
padded (prompt, answer) batches (`pad_examples`), and batches whose shared prompt prefix runs once
(`shared_prefix_batch`, `prefix_logits`), used by the examples' warm-ups.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from fullasync.models import TinyModelSpec, build_tiny_model, cached_build, default_cache_root, load_tokenizer
from fullasync.models.tiny import VOCAB_MULTIPLE
from fullasync.tasks.arithmetic import FILLER, ArithmeticTask, messages

if TYPE_CHECKING:
    import torch
    from _typeshed import DataclassInstance
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    class WarmupBuild(DataclassInstance, Protocol):
        """A warm-up spec: a dataclass whose `model` is the tiny model it starts from, with a cache key of its own."""

        @property
        def model(self) -> TinyModelSpec: ...

        def key(self) -> str: ...

SpecT = TypeVar("SpecT", bound="WarmupBuild")

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


@dataclass(frozen=True)
class LongTailWarmupSpec(WarmupSpec):
    """The starting policy of the long-tail variant (`arithmetic.LongTail`): the same warm-up, every label's answer
    followed by `filler_tokens` FILLER tokens and no end token, so that a reply goes on with its working-out."""

    filler_tokens: int = 4  # few: the loss of the warm-up stays on the answers (the run continues the pattern)


def spec_key(build_format: int, spec: WarmupBuild, *extra: object) -> str:
    """Cache key of a warm-up spec (a dataclass with a `model` that has `key()`): its format, fields and model, and
    anything else the build reads (`extra`, e.g. the harness version whose prompt it copies)."""
    text = json.dumps([build_format, dataclasses.asdict(spec), spec.model.key(), *extra], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_warm_policy(spec: WarmupSpec = WarmupSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the warm-started policy (an HF model dir), building it first if not cached."""
    return cached_warm_policy("arith-long-tail-warm" if isinstance(spec, LongTailWarmupSpec) else "arith-warm", spec,
                              _train, cache_dir)


def cached_warm_policy(name: str, spec: SpecT, train: Callable[[SpecT, Path, Path], None],
                       cache_dir: Path | None = None) -> Path:
    """`<cache>/models/<name>-<spec.key()>`: `train(spec, tiny_model_dir, out_dir)` run once on the tiny
    model of `spec.model` and cached (the built-in task's and the examples' warm-ups all use it)."""
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()

    def build_into(out_dir: Path) -> dict:
        train(spec, build_tiny_model(spec.model, cache_dir=cache_dir), out_dir)
        return dataclasses.asdict(spec)

    return cached_build(root / "models" / f"{name}-{spec.key()}", build_into)


def extend_vocabulary(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel, names: list[str], seed: int,
                      scale: float = 1.0) -> torch.Tensor:
    """Give every name its own token with a random embedding, `scale` times the spread of the
    existing rows; returns their ids (a tensor).

    The scale matters because the embeddings are tied: a name's logit is the final hidden state's dot
    product with its row, so larger rows let a copied name stand out among the others.

    During the warm-up the rows only move together (`share_updates`): each is its random identity plus
    one learned "this is a name" offset, so a held-out name's token is statistically the same as a
    training name's and the policy must learn to copy names from its context, not to recall them
    (the deepresearch and harness examples' warm-ups).
    """
    import torch
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(name, single_word=True, normalized=False) for name in names])
    old_rows = _embedding_weight(model).shape[0]
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=VOCAB_MULTIPLE, mean_resizing=False)
    ids = torch.tensor(tokenizer.convert_tokens_to_ids(names))
    weight = _embedding_weight(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        std = weight[:old_rows].std().item()
        weight[ids] = torch.normal(0.0, std * scale, (len(names), weight.shape[1]), generator=generator)
    return ids


def _embedding_weight(model: PreTrainedModel) -> torch.Tensor:
    import torch

    weight = model.get_input_embeddings().weight
    assert isinstance(weight, torch.Tensor)
    return weight


def share_updates(rows: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """A gradient hook giving all `rows` of a parameter the same gradient (their mean)."""

    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad.index_copy(0, rows, grad[rows].mean(dim=0, keepdim=True).expand(len(rows), -1))

    return hook


def shared_prefix_batch(examples: list[tuple[list[int], list[int]]]
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, labels) examples as (prefix_ids [P], rest_ids [B, L], rest_attention [B, L], rest_labels [B, L]): the
    tokens all of them start with (up to, not into, the first labelled token; at least one left in each rest) once,
    then each example's rest, right-padded."""
    import torch

    first = examples[0][0]
    first_labels = (next((i for i, label in enumerate(labels) if label != -100), len(labels)) for _, labels in examples)
    shared = min(min(len(ids) for ids, _ in examples), min(first_labels))
    for ids, _ in examples:
        shared = next((i for i in range(shared) if ids[i] != first[i]), shared)
    shared = max(0, shared - 1)
    length = max(len(ids) for ids, _ in examples) - shared
    input_ids = torch.zeros(len(examples), length, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for row, (ids, row_labels) in enumerate(examples):
        rest = len(ids) - shared
        input_ids[row, :rest] = torch.tensor(ids[shared:])
        attention[row, :rest] = 1
        labels[row, :rest] = torch.tensor(row_labels[shared:])
    return torch.tensor(first[:shared], dtype=torch.long), input_ids, attention, labels


def prefix_logits(model: PreTrainedModel, prefix_ids: torch.Tensor, input_ids: torch.Tensor, attention: torch.Tensor
                  ) -> torch.Tensor:
    """The logits over a `shared_prefix_batch`'s rests: the prefix runs once (batch 1) and its KV cache is repeated
    for the batch, gradients included — the plain padded forward's values and gradients at a fraction of the cost
    when the prefix is long (a harness's fixed prompt). The prefix's last token predicts each rest's first token,
    which is never labelled."""
    import torch

    if not len(prefix_ids):
        return model(input_ids=input_ids, attention_mask=attention).logits
    batch = input_ids.shape[0]
    cache = model(input_ids=prefix_ids[None], use_cache=True).past_key_values
    cache.batch_repeat_interleave(batch)
    full_attention = torch.cat([torch.ones(batch, len(prefix_ids), dtype=attention.dtype), attention], dim=1)
    return model(input_ids=input_ids, attention_mask=full_attention, past_key_values=cache).logits


def fine_tune(model: PreTrainedModel, plan: Sequence[str], loss_of: Callable[[str], torch.Tensor], *, lr: float,
              weight_decay: float = 0.01, rate: Callable[[int], float] | None = None, clip_norm: float | None = None,
              log_every: int = 100, on_log: Callable[[int, int, str, float], None] | None = None) -> None:
    """The supervised loop of every warm-up: one AdamW step (`lr`, `weight_decay`) per entry of `plan` (the step's
    phase) on `loss_of(phase)` (which draws its batch), gradients clipped at `clip_norm` when given, the rate
    multiplied by `rate(step)` when given; `on_log(step, steps, phase, loss)` every `log_every` steps and at the
    last."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate) if rate is not None else None
    for step, phase in enumerate(plan):
        loss = loss_of(phase)
        optimizer.zero_grad()
        loss.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        if on_log is not None and (step % log_every == 0 or step == len(plan) - 1):
            on_log(step, len(plan), phase, loss.item())


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

    def loss_of(phase: str) -> torch.Tensor:
        picks = [rng.randrange(len(rows)) for _ in range(spec.batch_size)]
        examples = [(list(prompts[i]), _sloppy_label(tokenizer, rows[i]["answer"], spec, rng)) for i in picks]
        input_ids, attention, labels = pad_examples(examples)
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss

    fine_tune(model, ["sums"] * spec.steps, loss_of, lr=spec.lr,
              on_log=lambda step, steps, _, loss: log.info("warm-up step %4d/%d loss %.3f", step, steps, loss))
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _sloppy_label(tokenizer, answer: int, spec: WarmupSpec, rng: random.Random) -> list[int]:
    text = str(answer) if rng.random() < spec.exact_format_share else rng.choice((f"{answer}.", f"= {answer}"))
    end = (tokenizer.encode(FILLER, add_special_tokens=False) * spec.filler_tokens
           if isinstance(spec, LongTailWarmupSpec) else [tokenizer.eos_token_id])
    return tokenizer.encode(text, add_special_tokens=False) + end


def pad_examples(examples: Sequence[tuple[list[int], list[int]]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(prompt ids, answer ids) examples as right-padded (input_ids, attention, labels), the loss on the answers."""
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
