"""The starting policy of the mini-swe example: the tiny model taught mini-swe-agent's action format, sloppily.

Owns: synthetic demonstrations of the harness's text action format (```mswea_bash_command blocks) on
*generated* bug reports — random packages, functions and expressions in the shape of the training bug
families, never the task set's own repositories — and a short supervised warm-up on them, cached on disk.
A demonstration is the right one (`sed` the hinted fix, then submit) only `correct_share` of the time;
otherwise it makes one of the deliberate mistakes (the replacement the wrong way round, the visible test
edited instead of the module, or submitting without a fix), which the hidden tests score 0. RL then has
a margin to gain, and because the right behaviour is "copy the hint into a sed command", it can carry over
to the held-out families. Loss only on assistant tokens, built turn by turn as the client does.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path

from examples.harness_warmup import train_on_demonstrations
from fullasync.models import TinyModelSpec
from fullasync.tasks.warmup import cached_warm_policy, spec_key
from fullasync_agents.mini_swe.config import OBSERVATION_TEMPLATE, SUBMIT_COMMAND, SYSTEM_TEMPLATE
from fullasync_agents.swe_tasks.catalog import Bug
from fullasync_agents.swe_tasks.tasks import instruction, oracle_command

WARMUP_FORMAT = 1  # bump when the procedure changes; part of the cache key
WORDS = ("alpha", "beta", "calc", "cart", "data", "grid", "item", "list", "money", "node", "order", "price", "queue",
         "rate", "score", "shape", "stock", "text", "time", "unit", "value", "width", "count", "total", "size")
SHAPES = (  # (right, wrong) templates in the shape of the training families
    ("return {a} + {b}", "return {a} - {b}"), ("return {a} * {b}", "return {a} + {b}"),
    ("return {a} - {b}", "return {a} + {b}"), ("range({a} + 1)", "range({a})"),
    ("range({n}, {a} + 1)", "range({n}, {a})"),
    ("return len({a}) - 1", "return len({a})"), ("return {a} >= {n}", "return {a} > {n}"),
    ("return {a} < {b}", "return {a} > {b}"), ("return {a} <= {b}", "return {a} < {b}"),
    ("{c} = {n}", "{c} = {m}"), ("{a} = 1", "{a} = 0"), ("{a} % 2 == 0", "{a} % 2 == 1"),
)


@dataclass(frozen=True)
class MiniSweWarmupSpec:
    """What determines the warm-started policy."""

    model: TinyModelSpec = TinyModelSpec(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)
    correct_share: float = 0.4  # share of demonstrations that fix the bug; the rest make a deliberate mistake
    examples: int = 4000  # generated demonstrations
    steps: int = 250  # optimizer steps (loss ≈ 0.26 at 150 here)
    batch_size: int = 16
    lr: float = 2e-3
    seed: int = 0

    def key(self) -> str:
        return spec_key(WARMUP_FORMAT, self)


def synthetic_bug(rng: random.Random) -> Bug:
    """A made-up bug report in the training families' shape (the repository is never built)."""
    right, wrong = rng.choice(SHAPES)
    values = {"a": rng.choice(WORDS), "b": rng.choice(WORDS), "c": rng.choice(WORDS).upper(),
              "n": str(rng.randint(0, 99)), "m": str(rng.randint(100, 199))}
    package, module, function = rng.choice(WORDS), rng.choice(WORDS) + ".py", rng.choice(WORDS)
    symptom = f"{function}({rng.randint(0, 9)}) returns {rng.randint(0, 99)} instead of {rng.randint(0, 99)}."
    return Bug("synthetic", package, module, function, "", right.format(**values), wrong.format(**values), symptom,
               "", ())


def action(command: str) -> str:
    return f"```mswea_bash_command\n{command}\n```"


def observation(output: str = "") -> str:
    return OBSERVATION_TEMPLATE.replace("{{output.returncode}}", "0").replace("{{output.output}}", output)


def demonstration(bug: Bug, rng: random.Random, correct_share: float) -> list[dict[str, str]]:
    """system, issue, then the assistant's actions with their observations (right, or one deliberate mistake)."""
    messages = [{"role": "system", "content": SYSTEM_TEMPLATE}, {"role": "user", "content": instruction(bug)}]
    if rng.random() < correct_share:
        commands = [oracle_command(bug), SUBMIT_COMMAND]
    else:
        mistake = rng.choice(("swapped", "test_file", "no_fix"))
        swapped = dataclasses.replace(bug, right=bug.wrong, wrong=bug.right)
        commands = {"swapped": [oracle_command(swapped), SUBMIT_COMMAND],
                    "test_file": [oracle_command(bug).replace(bug.path, f"tests/test_{bug.module}"), SUBMIT_COMMAND],
                    "no_fix": [SUBMIT_COMMAND]}[mistake]
    for index, command in enumerate(commands):
        messages.append({"role": "assistant", "content": action(command)})
        if index < len(commands) - 1:
            messages.append({"role": "user", "content": observation()})
    return messages


def build_warm_policy(spec: MiniSweWarmupSpec = MiniSweWarmupSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the warm-started policy (an HF model dir), building it first if not cached."""
    return cached_warm_policy("mini-swe-warm", spec, _train, cache_dir)


def _train(spec: MiniSweWarmupSpec, base: Path, out_dir: Path) -> None:
    train_on_demonstrations(spec, base, out_dir, lambda rng: demonstration(synthetic_bug(rng), rng, spec.correct_share),
                            name="mini-swe", log_every=50)
