"""A judge for the deepresearch example: a tiny model warmed up offline to score an answer against the reference,
and the `reward_fn` that asks it — the example trained by a judge instead of its F1 reward.

Owns: `JudgeSpec` (what determines the judge; the cache key covers it and the warm policy it starts from), the
judge's prompt (`judge_messages`), its supervised warm-up on training questions' answers only (the reference, and a
candidate: the reference itself, or with a full stop, another entity of the training questions, an
entity of the question's chain, the reference with another name after it; its label `score: round(10 · F1)` by the
example's own token F1; the names' embeddings move together, so it learns to compare names rather than know them),
its agreement with F1 on held-out questions' candidates (written to `judge.json` in its directory), the cache
(`<cache>/models/deepresearch-judge-<key>/`), and `judged(judge, row, trajectory)`: the boxed answer of a training
episode scored by the run's judge (`beside.judge.path=<judge>`), 0 without a box as F1 gives.

    python -m examples.deepresearch.judge                    # build (once, cached) and print its directory
    python -m examples.deepresearch.train beside.judge.path=<that directory> \\
        data.reward_fn=examples.deepresearch.judge:judged      # train by the judge; held-out evaluation stays F1

It starts from the example's warm policy, whose tokenizer has one token per entity name, so that comparing the two
names is comparing two tokens. Does not own: serving it (`beside`), or the held-out evaluation (F1 as always).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from examples.deepresearch.reward import token_f1
from examples.deepresearch.warmup import WarmupSpec, build_warm_policy, entity_names
from examples.deepresearch.world import World, generate_world, questions
from fullasync.client.beside import BesideClient
from fullasync.models import load_tokenizer
from fullasync.types import Trajectory

JUDGE_FORMAT = 2  # bump when the procedure changes; part of the cache key
JUDGE_PROMPT = "Score the answer against the reference from 0 to 10."


@dataclass(frozen=True)
class JudgeSpec:
    """What determines the judge (with the warm policy it starts from)."""

    policy: WarmupSpec = WarmupSpec()
    steps: int = 4000
    batch_size: int = 32
    lr: float = 5e-4
    probes: int = 400  # held-out candidates its agreement with F1 is measured on
    seed: int = 0

    def key(self, start: Path) -> str:
        text = json.dumps([JUDGE_FORMAT, dataclasses.asdict(self), start.name], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def judge_messages(reference: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": JUDGE_PROMPT},
            {"role": "user", "content": f"Reference: {reference}\nAnswer: {answer}"}]


def label(reference: str, answer: str) -> str:
    return f"score: {round(10 * token_f1(answer, reference))}"


def candidate(row: dict[str, Any], names: list[str], world: World, rng: random.Random) -> str:
    """An answer to judge against `row`'s: right (as written, or with a full stop), another entity, an entity of the
    question's own chain (the policy's early stop), or right with another name after it."""
    reference, draw = row["answer"], rng.random()
    if draw < 0.4:
        return reference
    if draw < 0.5:
        return f"{reference}."
    if draw < 0.75:
        return rng.choice(names)
    if draw < 0.9:
        return world.name(rng.choice(row["gold_doc_ids"]))
    return f"{reference} {rng.choice(names)}"


def names_in(rows: list[dict[str, Any]]) -> list[str]:
    """The entity names `rows` ask about or answer with: the candidates' other entities come from the same split."""
    return sorted({row["answer"] for row in rows} | {name for row in rows for name in row["search_queries"]})


def build_judge(spec: JudgeSpec = JudgeSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the judge (an HF model dir), trained first if not cached."""
    from fullasync.models.cache import cached_build
    from fullasync.models.tiny import default_cache_root

    start = build_warm_policy(spec.policy, cache_dir)
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()

    def build_into(out_dir: Path) -> dict[str, object]:
        return _train(spec, start, out_dir)

    return cached_build(root / "models" / f"deepresearch-judge-{spec.key(start)}", build_into)


def _prompt_ids(tokenizer: Any, reference: str, answer: str) -> list[int]:
    return list(tokenizer.apply_chat_template(judge_messages(reference, answer), tokenize=True,
                                              add_generation_prompt=True, return_dict=False))


def _train(spec: JudgeSpec, start: Path, out_dir: Path) -> dict[str, object]:
    import torch
    from transformers import AutoModelForCausalLM

    from fullasync.tasks.warmup import fine_tune, share_updates

    torch.manual_seed(spec.seed)
    world = generate_world(spec.policy.world)
    rows = {split: [row for row in questions(world) if row["split"] == split] for split in ("train", "heldout")}
    names = {split: names_in(split_rows) for split, split_rows in rows.items()}
    tokenizer = load_tokenizer(start)
    model = AutoModelForCausalLM.from_pretrained(str(start), dtype=torch.float32)
    # every name's row moves with the others (as in the policy's warm-up): the judge learns to compare names, not
    # to know them
    name_ids = [tokenizer.convert_tokens_to_ids(name) for name in entity_names(world)]
    if all(isinstance(i, int) and i != tokenizer.unk_token_id for i in name_ids):
        model.get_input_embeddings().weight.register_hook(share_updates(torch.tensor(name_ids)))
    rng = random.Random(spec.seed)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    started = time.monotonic()

    def loss_of(_: str) -> torch.Tensor:
        examples = []
        for row in rng.sample(rows["train"], spec.batch_size):
            answer = candidate(row, names["train"], world, rng)
            target = tokenizer.encode(label(row["answer"], answer), add_special_tokens=False) + [end]
            examples.append((_prompt_ids(tokenizer, row["answer"], answer), target))
        length = max(len(prompt) + len(target) for prompt, target in examples)
        input_ids = torch.zeros(len(examples), length, dtype=torch.long)
        attention, labels = torch.zeros_like(input_ids), torch.full_like(input_ids, -100)
        for index, (prompt, target) in enumerate(examples):
            sequence = prompt + target
            input_ids[index, :len(sequence)] = torch.tensor(sequence)
            attention[index, :len(sequence)] = 1
            labels[index, len(prompt):len(sequence)] = torch.tensor(target)
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss

    def on_log(step: int, steps: int, _: str, loss: float) -> None:
        print(f"[judge] step {step:>4}/{steps} loss {loss:.3f} ({time.monotonic() - started:.0f} s)", flush=True)

    # constant until the comparison forms (abruptly, after ~1,500 steps here), then a linear decay to 10 %
    fine_tune(model, ["judge"] * spec.steps, loss_of, lr=spec.lr, weight_decay=0.0, clip_norm=1.0, log_every=100,
              on_log=on_log, rate=lambda step: max(0.1, min(1.0, 2 - 2 * step / spec.steps)))
    agreement = _agreement(model, tokenizer, rows["heldout"], names["heldout"], world, spec)
    print(f"[judge] held-out agreement with F1: {agreement} ({time.monotonic() - started:.0f} s)", flush=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    record = {"heldout": agreement, "seconds": round(time.monotonic() - started, 1), "start": str(start)}
    (out_dir / "judge.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def _agreement(model: Any, tokenizer: Any, heldout: list[dict[str, Any]], names: list[str], world: World,
               spec: JudgeSpec) -> dict[str, float]:
    """On held-out questions' candidates (greedy): the share whose score equals round(10 · F1), the mean |score/10 −
    F1|, and the share with no readable score."""
    import torch

    from fullasync.client.beside import last_number

    rng = random.Random(spec.seed + 1)
    exact = unread = 0
    error = 0.0
    for row in rng.sample(heldout, spec.probes):
        answer = candidate(row, names, world, rng)
        prompt = torch.tensor([_prompt_ids(tokenizer, row["answer"], answer)])
        with torch.no_grad():
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False)
        score = last_number(tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True))
        truth = token_f1(answer, row["answer"])
        if score is None:
            unread += 1
            error += truth
            continue
        exact += round(score) == round(10 * truth)
        error += abs(min(max(score / 10, 0.0), 1.0) - truth)
    return {"exact": exact / spec.probes, "mean_abs_error": round(error / spec.probes, 4),
            "unreadable": unread / spec.probes}


async def judged(judge: BesideClient, row: dict[str, Any], trajectory: Trajectory) -> float:
    """A training episode's reward by the judge: its boxed answer scored against the row's first answer, / 10 (in
    [0, 1]); 0 without a box (as F1 gives). The judge answers greedily; an answer with no number is asked again
    (`score_retries`), then the episode is the infrastructure's failure (run again), never scored 0."""
    boxed = trajectory.metadata.get("boxed")
    if boxed is None:
        return 0.0
    reference = (row.get("answers") or [row["answer"]])[0]
    score = await judge.score(judge_messages(reference, str(boxed)), temperature=0.0, max_tokens=12)
    return min(max(score / 10, 0.0), 1.0)


if __name__ == "__main__":
    spec = JudgeSpec(**{k: int(v) for k, v in (arg.split("=", 1) for arg in sys.argv[1:])})
    print(build_judge(spec))
