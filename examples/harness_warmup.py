"""What the harness examples' warm-ups (`examples/mini_swe/warmup.py`, `examples/terminus/warmup.py`) share.

Owns: encoding a demonstration conversation as the client records it (assistant turns glued to the
template's turn boundaries, never re-tokenized; labels on assistant tokens only), the supervised
loop on such demonstrations (AdamW on random batches, then the model and tokenizer saved), with
single-token names and a copy phase first when the tasks' variable parts are names, and the copy
probe (`copy_accuracy`). Plain
PyTorch on CPU, deterministic for a given seed. Does not own: what a demonstration says, the spec or
its cache (each example's warm-up; `fullasync.tasks.warmup.cached_warm_policy`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def first_turn(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """A demonstration cut after its first assistant turn, without the system prompt: the copy phase's example."""
    first = next(index for index, message in enumerate(messages) if message["role"] == "assistant")
    return [message for message in messages[: first + 1] if message["role"] != "system"]


def train_on_demonstrations(spec, base: Path, out_dir: Path, demonstrate: Callable[[random.Random], list[dict]],
                            name: str, log_every: int, names: tuple[str, ...] = (),
                            probe: Callable[[Any, Any], float] | None = None,
                            copy_example: Callable[[list[dict]], list[dict]] = first_turn) -> Any:
    """Fine-tune the model in `base` on `spec.examples` conversations `demonstrate(rng)` for `spec.steps` steps
    (`spec.batch_size`, `spec.lr`, `spec.seed`) and save it with its tokenizer to `out_dir`; returns
    (model, tokenizer).

    With `names`, each becomes one token (`extend_vocabulary`, `spec.name_scale`; rows moving together,
    `share_updates`), the loss adds the mean over the labelled names to the mean over all labelled tokens (with
    every token weighed alike, a name was 1 of ~60 and the copy did not form in 800 steps; with names alone
    labelled it formed, and the first steps on the other tokens undid it), and `spec.copy_steps` steps of
    `spec.copy_batch_size` first turns (`copy_example`: by default `first_turn`, which drops the system prompt —
    the copy forms in a short context and carries over to the full one) come first at a constant rate; the rate
    then decays linearly to 10% (gradients clipped at norm 1). Without names: a constant rate, unclipped.
    The tokens a batch's examples all start with (a harness's long fixed prompt) run once per step
    (`shared_prefix_batch`, `prefix_logits`: the same values and gradients as the padded forward).
    """
    import torch
    from transformers import AutoModelForCausalLM

    from fullasync.tasks.warmup import extend_vocabulary, fine_tune, prefix_logits, share_updates, shared_prefix_batch

    torch.manual_seed(spec.seed)
    tokenizer = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    copy_steps = getattr(spec, "copy_steps", 0) if names else 0
    if names:
        rows = extend_vocabulary(tokenizer, model, list(names), spec.seed, spec.name_scale)
        model.get_input_embeddings().weight.register_hook(share_updates(rows))
    rng = random.Random(spec.seed)
    conversations = [demonstrate(rng) for _ in range(spec.examples)]
    examples = [encode_turns(tokenizer, messages) for messages in conversations]
    first_turns = [encode_turns(tokenizer, copy_example(messages)) for messages in conversations] if copy_steps else []
    name_ids = torch.tensor(tokenizer.convert_tokens_to_ids(list(names)), dtype=torch.long)
    started = time.monotonic()

    def loss_of(phase: str) -> torch.Tensor:
        pool, size = (first_turns, spec.copy_batch_size) if phase == "copy" else (examples, spec.batch_size)
        batch = [pool[rng.randrange(len(pool))] for _ in range(size)]
        prefix, input_ids, attention, labels = shared_prefix_batch(batch)
        return _loss(prefix_logits(model, prefix, input_ids, attention), labels, name_ids)

    def on_log(step: int, steps: int, phase: str, loss: float) -> None:
        probed = f" probe {probe(model, tokenizer):.2f}" if probe is not None else ""
        log.info("%s warm-up step %4d/%d (%s) loss %.3f%s (%.0f s)", name, step, steps, phase, loss, probed,
                 time.monotonic() - started)

    # with names: constant through the copy phase, then a linear decay to 10%, gradients clipped
    rate = (lambda s: min(1.0, (s + 1) / 50) * max(0.1, 1 - max(0, s - copy_steps) / max(1, spec.steps))) if names \
        else None
    fine_tune(model, ["copy"] * copy_steps + ["full"] * spec.steps, loss_of, lr=spec.lr, rate=rate,
              clip_norm=1.0 if names else None, log_every=log_every, on_log=on_log)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return model, tokenizer


def train_with_copy_probe(spec, base: Path, out_dir: Path, demonstrate: Callable[[random.Random], list[dict]],
                          name: str, log_every: int, names: tuple[str, ...],
                          probes: list[tuple[list[dict[str, str]], str]],
                          copy_example: Callable[[list[dict]], list[dict]] = first_turn) -> None:
    """`train_on_demonstrations` with `names`, logging `copy_accuracy` on 10 of `probes` as it goes and on all of
    them at the end, which goes with the build's seconds to `out_dir/warmup.json`."""
    started = time.monotonic()
    model, tokenizer = train_on_demonstrations(
        spec, base, out_dir, demonstrate, name=name, log_every=log_every, names=names,
        probe=lambda model, tokenizer: copy_accuracy(model, tokenizer, probes[:10]), copy_example=copy_example)
    accuracy = copy_accuracy(model, tokenizer, probes)
    log.info("%s warm-up: held-out copy accuracy %.2f (%.0f s)", name, accuracy, time.monotonic() - started)
    (out_dir / "warmup.json").write_text(json.dumps({"heldout_copy_accuracy": accuracy,
                                                     "seconds": time.monotonic() - started}) + "\n")


def _loss(logits, labels, name_ids):
    """Mean next-token loss on the labelled tokens, plus the mean on the labelled names (if any): the names weigh
    as much as all other tokens together, so the copy forms and later phases keep it."""
    import torch

    logits, targets = logits[:, :-1], labels[:, 1:]
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                               ignore_index=-100, reduction="none").view_as(targets)
    labelled, named = targets != -100, torch.isin(targets, name_ids)
    loss = losses[labelled].mean()
    return loss + losses[named].mean() if named.any() else loss


def copy_accuracy(model, tokenizer, probes: list[tuple[list[dict[str, str]], str]]) -> float:
    """Share of `probes` (a conversation whose assistant turns contain `name`, and the name) where, teacher-forced,
    the name's token is the most likely one at its last occurrence in an assistant turn: the step RL cannot teach,
    copying a name never trained on."""
    import torch

    hits = 0
    with torch.no_grad():
        for messages, copied in probes:
            ids, labels = encode_turns(tokenizer, messages)
            token = tokenizer.convert_tokens_to_ids(copied)
            position = max(i for i, (t, label) in enumerate(zip(ids, labels, strict=True))
                           if t == token and label != -100)
            logits = model(input_ids=torch.tensor([ids[:position]])).logits[0, -1]
            hits += int(logits.argmax().item() == token)
    return hits / max(1, len(probes))
