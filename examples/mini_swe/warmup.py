"""The starting policy of the mini-swe example: the tiny model taught mini-swe-agent's action format, sloppily.

Owns: synthetic demonstrations of the harness's text action format (```mswea_bash_command blocks) on the
`settings` task family's issue (`fullasync_agents.swe_tasks.settings`) with names from its warm-up pool —
never a task's own name, train or held-out — and a supervised warm-up on them, cached on disk.
A demonstration is the right one (`sed` MODE to the hinted name, then submit) only `correct_share` of the
time; otherwise it makes one of the deliberate mistakes (the visible test edited instead of the module,
the value written without quotes, or submitting without a fix), which the hidden tests score 0. RL then
has a margin to gain, and because what it unlearns are habits shared by every task, it carries over to
held-out names. Loss only on assistant tokens, built turn by turn as the client does.

Every task name is one token of the policy's tokenizer (`extend_vocabulary`: a random identity 8× the
other rows' spread, all names moving together during the warm-up), and a copy phase on first turns comes
first (`harness_warmup.train_on_demonstrations`), as in the deepresearch warm-up: so fixing a task is
copying one token from the issue, which a 2-layer model learns, and a held-out name can only be produced
by copying it. At the end `copy_accuracy` probes the held-out tasks (teacher-forced, the right fix's name
is the most likely token); it is logged and written to `warmup.json` in the policy's directory.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from examples.harness_warmup import train_with_copy_probe
from fullasync.models import TinyModelSpec
from fullasync.tasks.warmup import cached_warm_policy, spec_key
from fullasync_agents.mini_swe.config import OBSERVATION_TEMPLATE, SUBMIT_COMMAND, SYSTEM_TEMPLATE
from fullasync_agents.swe_tasks.settings import (
    ALL_NAMES,
    PATH,
    TEST_PATH,
    WARMUP_NAMES,
    instruction,
    oracle_command,
    setting_rows,
)

WARMUP_FORMAT = 4  # bump when the procedure changes; part of the cache key
MISTAKES = ("test_file", "unquoted", "no_fix")


@dataclass(frozen=True)
class MiniSweWarmupSpec:
    """What determines the warm-started policy."""

    model: TinyModelSpec = TinyModelSpec(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)
    correct_share: float = 0.6  # share of demonstrations that fix the bug; the rest make a deliberate mistake
    examples: int = 4000  # generated demonstrations
    copy_steps: int = 600  # first phase: first turns labelled on the name only (the copy formed at 300-400 here)
    copy_batch_size: int = 32
    steps: int = 200  # second phase: whole demonstrations
    batch_size: int = 16
    lr: float = 5e-4  # the deepresearch warm-up's measured rate for forming the copy (2e-3 never formed it)
    name_scale: float = 8.0  # name embeddings' spread over the other rows' (extend_vocabulary)
    seed: int = 0

    def key(self) -> str:
        return spec_key(WARMUP_FORMAT, self)


def action(command: str) -> str:
    return f"```mswea_bash_command\n{command}\n```"


def observation(output: str = "") -> str:
    return OBSERVATION_TEMPLATE.replace("{{output.returncode}}", "0").replace("{{output.output}}", output)


def fix_commands(name: str, mistake: str | None) -> list[str]:
    """The demonstrated commands: the fix and the submission, or one deliberate mistake of `MISTAKES`."""
    fix = oracle_command(name)
    return {None: [fix, SUBMIT_COMMAND], "test_file": [fix.replace(PATH, TEST_PATH), SUBMIT_COMMAND],
            "unquoted": [fix.replace(f'"{name}"', name), SUBMIT_COMMAND], "no_fix": [SUBMIT_COMMAND]}[mistake]


def demonstration(name: str, mistake: str | None) -> list[dict[str, str]]:
    """system, issue, then the assistant's actions with their observations."""
    messages = [{"role": "system", "content": SYSTEM_TEMPLATE}, {"role": "user", "content": instruction(name)}]
    commands = fix_commands(name, mistake)
    for index, command in enumerate(commands):
        messages.append({"role": "assistant", "content": action(command)})
        if index < len(commands) - 1:
            messages.append({"role": "user", "content": observation()})
    return messages


def sloppy_demonstration(rng: random.Random, correct_share: float) -> list[dict[str, str]]:
    """A demonstration on a warm-up pool name: right `correct_share` of the time, otherwise a random mistake."""
    mistake = None if rng.random() < correct_share else rng.choice(MISTAKES)
    return demonstration(rng.choice(WARMUP_NAMES), mistake)


def build_warm_policy(spec: MiniSweWarmupSpec = MiniSweWarmupSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the warm-started policy (an HF model dir), building it first if not cached."""
    return cached_warm_policy("mini-swe-warm", spec, _train, cache_dir)


def _train(spec: MiniSweWarmupSpec, base: Path, out_dir: Path) -> None:
    probes = [(demonstration(row["answer"], None), row["answer"]) for row in setting_rows("held_out")]
    train_with_copy_probe(spec, base, out_dir, lambda rng: sloppy_demonstration(rng, spec.correct_share), "mini-swe",
                          log_every=100, names=ALL_NAMES, probes=probes)
