"""The starting policy on this machine: a tiny model warmed up on synthetic search trajectories with
deliberate mistakes, so RL has a margin to win.

Owns: `WarmupSpec` (what determines the policy), writing correct-strategy trajectories for training
questions (search each entity of the gold chain by name, read the top hit, answer in `\\boxed{}`)
with real BM25 results from the corpus, the mistakes mixed into them, supervised training on the
assistant tokens only, and the cache (`<cache>/models/deepresearch-warm-<key>/`, published
atomically). Held-out questions are never used.

The deliberate mistakes, each drawn independently per trajectory, so the policy learns them as
habits shared by all questions (which is what RL can then unlearn on training questions and carry
over to held-out ones):

- unboxed: the final answer is written as "the answer is X." — the reward gives 0 without a box;
- stops early: on a multi-hop question, answers with the entity found after the first hop(s);
- repeats a search: issues the same query twice in a row (wasted turn; penalised when switched on).

To make copying names cheap for a tiny model, every entity name becomes one token
(`extend_vocabulary`) whose embedding is a random identity, 8× the spread of the other rows, plus one
shared learned offset (`share_updates`), so a held-out name can only be produced by copying it from
the context. Training runs in three phases: the question and the first search call only (the copy
phase: short, every example's loss dominated by copying the name), then whole conversations without
the system prompt and tool list, then the full prompts; the prompt prefix all conversations share is
run once per batch (`shared_prefix_loss`). At the end `copy_accuracy` probes held-out questions
(never trained on): the share whose first query's name token, teacher-forced, is the most likely one,
printed and written to `warmup.json` in the policy's directory.

Measured on this machine (2 layers, width 128, 200 held-out probes), what the defaults rest on:
- the copy circuit forms abruptly after a plateau at the entropy of guessing among ~2,000 names. At
  lr 2e-3 it did not form in 1,500 copy steps, nor at 1e-3 in 1,000; at 5e-4 and 3e-4 it formed
  after ~800–850 (held-out copy accuracy 0.00 → 0.94);
- with the names' embeddings at the other rows' spread, the copied name is the argmax but gets
  probability ~0.01 (tied embeddings: small rows, small logit gaps), so a policy sampled at T = 1
  almost never searches the right name (held-out F1 0.000). At 8× the spread the circuit forms after
  ~400 steps and the name gets probability 0.95 after 1,000;
- reading the right name out of three results (the question's relation among distractor snippets)
  did not form in 800 conversation steps, and training on it undid the first copy (0.93 → 0.05);
  with one result per search it did (0.72 / 0.65 / 1.0 teacher-forced by hop). So the tiny policy
  reads one result per search (`agent.top_k=1` in `config/train.yaml`); a real model takes more.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from examples.deepresearch.agent import SYSTEM_PROMPT
from examples.deepresearch.retrieval import Bm25Index
from examples.deepresearch.tools import SCHEMAS, format_hits
from examples.deepresearch.world import World, WorldSpec, documents, generate_world, questions
from fullasync.models import TinyModelSpec, load_tokenizer
from fullasync.tasks.warmup import (
    cached_warm_policy,
    extend_vocabulary,
    fine_tune,
    prefix_logits,
    share_updates,
    shared_prefix_batch,
    spec_key,
)

WARMUP_FORMAT = 3  # bump when the procedure changes; part of the cache key
ASSISTANT_OPEN = "<|im_start|>assistant\n"
TURN_END = "<|im_end|>"
PHASES = ("copy", "short", "full")  # the warm-up's phases, in order (see `_Batcher.batch`)


@dataclass(frozen=True)
class WarmupSpec:
    """What determines the warmed-up policy (the cache key covers every field)."""

    model: TinyModelSpec = TinyModelSpec(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)
    world: WorldSpec = WorldSpec()
    tools: tuple[str, ...] = ("search",)  # tools declared in the prompts (must match agent.tools)
    top_k: int = 1  # results per search (must match agent.top_k)
    system_prompt: str = SYSTEM_PROMPT
    unboxed_share: float = 0.5  # final answers written without \boxed{}
    stop_early_share: float = 0.4  # multi-hop trajectories that answer with an intermediate entity
    repeat_search_share: float = 0.1  # searches issued twice in a row
    copy_steps: int = 800  # first phase: the question and the first search call only (learns to copy names)
    copy_batch_size: int = 32
    short_steps: int = 1200  # second phase: whole conversations without the system prompt and tool list
    short_batch_size: int = 16
    steps: int = 200  # third phase: the full prompts the agent sends
    batch_size: int = 16
    lr: float = 5e-4  # 2e-3 never formed the copy circuit here (see the module docstring)
    name_scale: float = 8.0  # name embeddings' spread over the tiny model's other rows (see extend_vocabulary)
    seed: int = 0

    def key(self) -> str:
        return spec_key(WARMUP_FORMAT, self)


def search_call(query: str, call_id: str) -> dict[str, Any]:
    """The assistant message that searches `query`, as the agent's client returns it."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": "search", "arguments": json.dumps({"query": query})}}]}


def synthetic_conversation(row: dict[str, Any], index: Bm25Index, spec: WarmupSpec, rng: random.Random,
                           with_system: bool = True) -> list[dict[str, Any]]:
    """One trajectory for `row` in the agent's message format, mistakes drawn from `rng`."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": spec.system_prompt}] if with_system else []
    messages.append({"role": "user", "content": row["question"]})
    queries = row["search_queries"]
    hops = len(queries)
    if hops > 1 and rng.random() < spec.stop_early_share:
        hops = rng.randrange(1, hops)
    for query in queries[:hops]:
        repeats = 2 if rng.random() < spec.repeat_search_share else 1
        for _ in range(repeats):
            call_id = f"call_{len(messages)}"
            messages.append(search_call(query, call_id))
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": format_hits(index.search_now(query, spec.top_k))})
    answer = row["answer"] if hops == len(queries) else queries[hops]
    final = f"the answer is {answer}." if rng.random() < spec.unboxed_share else f"\\boxed{{{answer}}}"
    messages.append({"role": "assistant", "content": final})
    return messages


def assistant_spans(text: str) -> list[tuple[int, int]]:
    """Character spans the model generates: after each assistant header, through its <|im_end|>."""
    spans, position = [], 0
    while (start := text.find(ASSISTANT_OPEN, position)) >= 0:
        begin = start + len(ASSISTANT_OPEN)
        end = text.index(TURN_END, begin) + len(TURN_END)
        spans.append((begin, end))
        position = end
    return spans


def tokenize_conversation(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
                          ) -> tuple[list[int], list[int]]:
    """Token ids of the rendered conversation and labels (-100 outside the assistant spans)."""
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False).rstrip("\n")
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    spans = assistant_spans(text)
    labels = [token if any(b <= start and end <= e for b, e in spans) else -100
              for token, (start, end) in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True)]
    return list(encoded["input_ids"]), labels


def build_warm_policy(spec: WarmupSpec = WarmupSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the warmed-up policy (an HF model dir), training it first if not cached."""
    return cached_warm_policy("deepresearch-warm", spec, _train, cache_dir)


@dataclass
class _Batcher:
    """Draws training conversations and pads them into tensors."""

    spec: WarmupSpec
    tokenizer: Any
    rows: list[dict[str, Any]]
    index: Bm25Index
    rng: random.Random
    tools: list[dict[str, Any]] = field(init=False)
    by_hops: dict[int, list[dict[str, Any]]] = field(init=False)

    def __post_init__(self) -> None:
        self.tools = [SCHEMAS[name] for name in self.spec.tools]
        self.by_hops = {}
        for row in self.rows:
            self.by_hops.setdefault(row["hops"], []).append(row)

    def batch(self, phase: str = "full") -> tuple[Any, Any, Any, Any]:
        """A batch of questions with the same number of hops (similar lengths: little padding) for one
        of `PHASES`: "copy" (the question and the first search call only) and "short" (whole
        conversations) run without the system prompt and tool list (the template's default system line
        only), "full" with them.

        Returns the prefix every conversation shares (system prompt and tools) once, then the
        right-padded rest: (prefix_ids [P], rest_ids [B, L], rest_attention [B, L], rest_labels [B, L]).
        """
        hops = sorted(self.by_hops)
        rows = self.by_hops[self.rng.choices(hops, [len(self.by_hops[h]) for h in hops])[0]]
        full = phase == "full"
        sizes = (self.spec.copy_batch_size, self.spec.short_batch_size, self.spec.batch_size)
        size = dict(zip(PHASES, sizes, strict=True))[phase]
        examples = []
        for _ in range(size):
            messages = synthetic_conversation(rows[self.rng.randrange(len(rows))], self.index, self.spec, self.rng,
                                              with_system=full)
            if phase == "copy":  # up to and including the first reply (the first search call)
                messages = messages[:next(i for i, m in enumerate(messages) if m["role"] == "assistant") + 1]
            examples.append(tokenize_conversation(self.tokenizer, messages, self.tools if full else None))
        return shared_prefix_batch(examples)


def shared_prefix_loss(model: Any, prefix_ids: Any, input_ids: Any, attention: Any, labels: Any) -> Any:
    """Mean next-token loss on labelled tokens; the shared prefix runs once (batch 1) and its KV cache
    is repeated for the batch, gradients included. Same value as the plain padded forward, less compute."""
    import torch

    logits = prefix_logits(model, prefix_ids, input_ids, attention)
    # the prefix's last token predicts the first rest token, which is never labelled (a user turn follows)
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                             labels[:, 1:].reshape(-1), ignore_index=-100)


def entity_names(world: World) -> list[str]:
    names = {p.name for p in world.people.values()} | {o.name for o in world.organisations.values()}
    return sorted(names | {name for name, _ in world.cities.values()} | set(world.countries.values()))


def _train(spec: WarmupSpec, base: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    world = generate_world(spec.world)
    train_rows = [row for row in questions(world) if row["split"] == "train"]
    tokenizer = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    names = extend_vocabulary(tokenizer, model, entity_names(world), spec.seed, spec.name_scale)
    model.get_input_embeddings().weight.register_hook(share_updates(names))
    batcher = _Batcher(spec, tokenizer, train_rows, Bm25Index(documents(world)), random.Random(spec.seed))
    steps_per_phase = (spec.copy_steps, spec.short_steps, spec.steps)
    plan = [phase for phase, steps in zip(PHASES, steps_per_phase, strict=True) for _ in range(steps)]
    decay = spec.short_steps + spec.steps
    started = time.monotonic()

    def on_log(step: int, steps: int, phase: str, loss: float) -> None:
        print(f"[warm-up] step {step:>4}/{steps} ({phase}) loss {loss:.3f} ({time.monotonic() - started:.0f} s)",
              flush=True)

    # constant through the copy phase (the circuit forms abruptly, late), then a linear decay to 10%
    fine_tune(model, plan, lambda phase: shared_prefix_loss(model, *batcher.batch(phase)), lr=spec.lr,
              weight_decay=0.0, rate=lambda s: min(1.0, (s + 1) / 50) * max(
                  0.1, 1 - max(0, s - spec.copy_steps) / max(1, decay)), clip_norm=1.0, log_every=50, on_log=on_log)
    heldout = [row for row in questions(world) if row["split"] == "heldout"]
    accuracy = copy_accuracy(model, tokenizer, random.Random(spec.seed).sample(heldout, min(100, len(heldout))),
                             spec)
    print(f"[warm-up] held-out first-query copy accuracy {accuracy:.2f} ({time.monotonic() - started:.0f} s)",
          flush=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / "warmup.json").write_text(json.dumps({"heldout_copy_accuracy": accuracy,
                                                     "seconds": time.monotonic() - started,
                                                     **built_on(out_dir / "model.safetensors")}) + "\n")


def built_on(weights: Path) -> dict[str, object]:
    """The weights' digest and what their bytes depend on: torch's version, its threads and the vector
    instructions its CPU kernels chose (another CPU of the same kind may round differently)."""
    import hashlib

    import torch

    return {"weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def copy_accuracy(model: Any, tokenizer: Any, rows: list[dict[str, Any]], spec: WarmupSpec) -> float:
    """Share of `rows` where, under the full prompt and the first search call's tokens up to its query
    (teacher-forced), the most likely next token is the question's entity name: the step RL cannot
    teach, copying an unseen name."""
    import torch

    tools = [SCHEMAS[name] for name in spec.tools]
    hits = 0
    with torch.no_grad():
        for row in rows:
            name = row["search_queries"][0]
            messages = [{"role": "system", "content": spec.system_prompt}, {"role": "user", "content": row["question"]},
                        search_call(name, "call_2")]
            ids, _ = tokenize_conversation(tokenizer, messages, tools)
            position = max(i for i, token in enumerate(ids) if token == tokenizer.convert_tokens_to_ids(name))
            logits = model(input_ids=torch.tensor([ids[:position]])).logits[0, -1]
            hits += int(logits.argmax().item() == ids[position])
    return hits / max(1, len(rows))
