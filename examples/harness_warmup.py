"""What the harness examples' warm-ups (`examples/mini_swe/warmup.py`, `examples/terminus/warmup.py`) share.

Owns: encoding a demonstration conversation as the client records it (assistant turns glued to the
template's turn boundaries, never re-tokenized; labels on assistant tokens only) and the supervised
loop on such demonstrations (AdamW on random batches, then the model and tokenizer saved). Plain
PyTorch on CPU, deterministic for a given seed. Does not own: what a demonstration says, the spec or
its cache (each example's warm-up; `fullasync.tasks.warmup.cached_warm_policy`).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path

from fullasync.models import load_tokenizer

log = logging.getLogger("fullasync")


def encode_turns(tokenizer, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    """(ids, labels) with labels on assistant tokens only; turns glued as the client glues them (no re-tokenizing).
    Messages alternate assistant / user from the first assistant turn on."""
    render = tokenizer.apply_chat_template
    first = next(index for index, message in enumerate(messages) if message["role"] == "assistant")
    ids = tokenizer.encode(render(messages[:first], tokenize=False, add_generation_prompt=True),
                           add_special_tokens=False)
    labels = [-100] * len(ids)
    for k in range(first, len(messages), 2):
        answer = tokenizer.encode(messages[k]["content"], add_special_tokens=False) + [tokenizer.eos_token_id]
        ids += answer
        labels += answer
        if k + 1 < len(messages):
            with_turn = render(messages[: k + 1], tokenize=False)
            extended = render(messages[: k + 2], tokenize=False, add_generation_prompt=True)
            glue = tokenizer.encode("\n" + extended[len(with_turn):], add_special_tokens=False)
            ids += glue
            labels += [-100] * len(glue)
    return ids, labels


def train_on_demonstrations(spec, base: Path, out_dir: Path, demonstrate: Callable[[random.Random], list[dict]],
                            name: str, log_every: int) -> None:
    """Fine-tune the model in `base` on `spec.examples` conversations `demonstrate(rng)` for `spec.steps` steps
    (`spec.batch_size`, `spec.lr`, `spec.seed`) and save it with its tokenizer to `out_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    tokenizer = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    rng = random.Random(spec.seed)
    examples = [encode_turns(tokenizer, demonstrate(rng)) for _ in range(spec.examples)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    for step in range(spec.steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(spec.batch_size)]
        input_ids, attention, labels = _pad(batch)
        loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % log_every == 0 or step == spec.steps - 1:
            log.info("%s warm-up step %4d/%d loss %.3f", name, step, spec.steps, loss.item())
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _pad(batch):
    import torch

    length = max(len(ids) for ids, _ in batch)
    input_ids = torch.zeros(len(batch), length, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for row, (ids, targets) in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        labels[row, : len(ids)] = torch.tensor(targets)
    return input_ids, attention, labels
