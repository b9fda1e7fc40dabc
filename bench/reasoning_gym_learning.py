"""Does a run learn a reasoning-gym task? `fullasync train data.task=reasoning_gym:<spec>` over seeds, held-out
before and after.

The task (`bench/reasoning_gym_sums.yaml`): reasoning-gym's `chain_sum` with two one-digit terms (`a + b` or
`a - b`), its `direct` system prompt (the answer between `<answer>` and `</answer>`, nothing else) and its own
scorer on the last `<answer>`; 150 training rows (~107 of the 200 questions) and 60 held-out rows, each another
question.

The starting policy: the tiny model, taught on the training rows only (never a held-out question) by a short
supervised warm-up (`FormatWarmupSpec`, built once and cached like the built-in task's) that writes the answer in
reasoning-gym's format `exact_format_share` of the time and otherwise as `7`, `Answer: 7` or `<answer>7` with no
closing tag, which the scorer reads as no answer. Why: the models that run here do not write the tags unprompted
(SmolLM2-135M-Instruct scored 0.000 on this prompt, so every group's rewards are equal and there is nothing to learn
from). What RL can gain is the format, one behaviour shared by every question, so it carries over to the held-out
questions only as far as the warm-up's sums do.

Runs the real stack (vLLM engine, verl trainer, Ray) once per seed with `seed=S trainer.seed=S`, reads each run's
`result.json` (held-out score before and after, each with its standard error over the held-out episodes) and prints
each seed's gain ± SE (sqrt(SE_before² + SE_after²)), how many are ≥ 3 SE, the mean gain ± its SE over seeds and the
worst; writes one record per seed to bench/results/reasoning_gym_learning/seed<S>.json (a seed with a record is not
run again). A benchmark, not a test: nothing is asserted. What it depends on: the warm-up (its spec is in each
record), `--steps`, and the machine's speed only through the wall time.

    .venv/bin/python bench/reasoning_gym_learning.py                 # seeds 0 1 2, 30 steps
    .venv/bin/python bench/reasoning_gym_learning.py --seeds 3 4 --steps 40
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _report import print_seed_gains, train_seed  # noqa: E402  # bench/ is on sys.path when run as a script

from fullasync.models import TinyModelSpec, load_tokenizer  # noqa: E402
from fullasync.tasks.reasoning_gym import ReasoningGymTask, parse_spec  # noqa: E402
from fullasync.tasks.warmup import WarmupSpec, cached_warm_policy, fine_tune, pad_examples, spec_key  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "reasoning_gym_learning"
TASK = "bench/reasoning_gym_sums.yaml"
TRAIN_ROWS, VAL_ROWS, PROMPT = 150, 60, "direct"
BUILD_FORMAT = 1  # bump when the warm-up's procedure changes; part of its cache key


@dataclass(frozen=True)
class FormatWarmupSpec:
    """The starting policy: the tiny model taught the task's training rows, in reasoning-gym's answer format only
    `exact_format_share` of the time."""

    model: TinyModelSpec = WarmupSpec().model
    task: str = TASK  # the composite YAML (its text is part of the key)
    train_rows: int = TRAIN_ROWS
    prompt: str = PROMPT
    exact_format_share: float = 0.3
    steps: int = 800
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0

    def key(self) -> str:
        return spec_key(BUILD_FORMAT, self, (ROOT / self.task).read_text())


def _sloppy(answer: str, share: float, rng: random.Random) -> str:
    if rng.random() < share:
        return f"<answer>{answer}</answer>"
    return rng.choice((answer, f"Answer: {answer}", f"<answer>{answer}"))


def _train_warmup(spec: FormatWarmupSpec, base: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    task = ReasoningGymTask(parse_spec(str(ROOT / spec.task)), spec.train_rows, 0, prompt=spec.prompt)
    rows = task.rows("train")  # the training rows only: no held-out question is ever taught
    tokenizer = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    prompts = [list(tokenizer.apply_chat_template(
        [{"role": "system", "content": task.system_prompt}, {"role": "user", "content": row["question"]}],
        tokenize=True, add_generation_prompt=True, return_dict=False)) for row in rows]
    rng = random.Random(spec.seed)

    def loss_of(_: str) -> torch.Tensor:
        picks = [rng.randrange(len(rows)) for _ in range(spec.batch_size)]
        examples = [(prompts[i], tokenizer.encode(_sloppy(rows[i]["answer"], spec.exact_format_share, rng),
                                                   add_special_tokens=False) + [tokenizer.eos_token_id])
                    for i in picks]
        input_ids, attention, labels = pad_examples(examples)
        return model(input_ids=input_ids, attention_mask=attention, labels=labels).loss

    fine_tune(model, ["format"] * spec.steps, loss_of, lr=spec.lr,
              on_log=lambda step, steps, _, loss: print(f"warm-up step {step:4d}/{steps} loss {loss:.3f}",
                                                        flush=True))
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def run_seed(seed: int, policy: Path, spec: FormatWarmupSpec, args: argparse.Namespace) -> dict[str, object]:
    out = ROOT / "outputs" / "reasoning_gym_learning" / f"seed{seed}"
    argv = [f"data.task=reasoning_gym:{ROOT / spec.task}", f"data.task_rows={spec.train_rows}",
            f"data.task_val_rows={VAL_ROWS}", f"data.task_prompt={spec.prompt}", f"model.path={policy}",
            f"seed={seed}", f"trainer.seed={seed}", f"total_steps={args.steps}", f"output_dir={out}",
            "checkpoint.every=0", "resume=never", *args.args]
    return {"task": spec.task, "args": args.args, "warmup": dataclasses.asdict(spec) | {"model": spec.model.key()},
            **train_seed(seed, argv, out)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--args", nargs="*", default=[], help="more `fullasync train` overrides")
    args = parser.parse_args()
    spec = FormatWarmupSpec()
    started = time.monotonic()
    policy = cached_warm_policy("reasoning-gym-sums-warm", spec, _train_warmup)
    print(f"starting policy {policy} ({time.monotonic() - started:.0f} s)", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    records = []
    for seed in args.seeds:
        path = RESULTS / f"seed{seed}.json"
        if not path.exists():
            path.write_text(json.dumps(run_seed(seed, policy, spec, args), indent=1) + "\n")
        records.append(json.loads(path.read_text()))
        print(f"seed {seed}: {records[-1]['before']:.3f} -> {records[-1]['after']:.3f}", flush=True)
    print_seed_gains(records)

if __name__ == "__main__":
    main()
