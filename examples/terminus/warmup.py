"""The starting policy of the Terminus example: the tiny model taught Terminus-2's JSON replies, sloppily.

Owns: synthetic demonstrations of Terminus-2's own conversation — harbor's prompt template and its
"are you sure" confirmation, both read from the installed harbor (never retyped here) — on the
`settings` task family's task (`fullasync_agents.terminal_tasks.settings`) with names from its warm-up
pool (never a task's own name, train or held-out), and a supervised warm-up on them, cached on disk.
A demonstration is right (the hinted command as keystrokes ending in a newline, `task_complete` twice)
only `correct_share` of the time; otherwise it makes one deliberate mistake that the tests score 0:
the keystrokes without the newline (typed, never run), the command on `defaults.ini`, or no command at
all. The model's context is 4,096 tokens (harbor's prompt alone is ~1,600 of the tiny tokenizer's).
Loss only on assistant tokens.

Every task name is one token of the policy's tokenizer and a copy phase on first turns comes first
(`harness_warmup.train_on_demonstrations`, as in the mini-swe warm-up): fixing a task is copying one
token from the hint. At the end `copy_accuracy` probes the held-out tasks (teacher-forced, the name is
the most likely token); it is logged and written to `warmup.json` in the policy's directory.
"""

from __future__ import annotations

import json
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

from examples.harness_warmup import train_with_copy_probe
from fullasync.models import TinyModelSpec
from fullasync.tasks.warmup import cached_warm_policy, spec_key
from fullasync_agents.swe_tasks.settings import ALL_NAMES, WARMUP_NAMES
from fullasync_agents.terminal_tasks import hint_for
from fullasync_agents.terminal_tasks.settings import (
    DEFAULTS_FILE,
    SETTINGS_FILE,
    instruction,
    oracle_command,
    setting_rows,
)
from fullasync_agents.terminus.interpreter import HARBOR_VERSION, harbor_python, harness_environment

WARMUP_FORMAT = 2  # bump when the procedure changes; part of the cache key
MISTAKES = ("no_newline", "wrong_file", "nothing")
HOSTS = ("vm", "box", "node", "ci", "dev")
TASK_HEADING = "Task Description:"  # where harbor's prompt template turns to the task
HARBOR_TEXTS = """
import importlib.resources, json, types
from harbor.agents.terminus_2.terminus_2 import Terminus2
template = importlib.resources.files("harbor.agents.terminus_2").joinpath("templates/terminus-json-plain.txt")
confirm = Terminus2._get_completion_confirmation_message(
    types.SimpleNamespace(options=types.SimpleNamespace(parser_name="json")), "{terminal}")
print(json.dumps({"prompt": template.read_text(), "confirm": confirm}))
"""


@dataclass(frozen=True)
class TerminusWarmupSpec:
    """What determines the warm-started policy."""

    model: TinyModelSpec = TinyModelSpec(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    correct_share: float = 0.4  # share of demonstrations that solve their task; the rest make a deliberate mistake
    examples: int = 2000  # generated demonstrations
    copy_steps: int = 600  # first phase: first turns cut to the task (`task_turn`)
    copy_batch_size: int = 32
    steps: int = 200  # second phase: whole demonstrations, harbor's full prompt
    batch_size: int = 8
    lr: float = 5e-4
    name_scale: float = 8.0  # name embeddings' spread over the other rows' (extend_vocabulary)
    pane_height: int = 24  # screen rows shown in the demonstrations' terminal states (agent.pane_height)
    seed: int = 0

    def key(self) -> str:
        return spec_key(WARMUP_FORMAT, self, HARBOR_VERSION)


def harbor_texts() -> dict[str, str]:
    """Terminus-2's prompt template and confirmation message, as the installed harbor writes them."""
    python = harbor_python()
    done = subprocess.run([str(python), "-c", HARBOR_TEXTS], capture_output=True, text=True, check=True,
                          env=harness_environment(Path("/nonexistent")), timeout=120)
    return json.loads(done.stdout)


def reply(keystrokes: list[str]) -> str:
    commands = [{"keystrokes": keys, "duration": 0.5} for keys in keystrokes]
    return json.dumps({"analysis": "", "plan": "", "commands": commands, "task_complete": True})


def fix_keystrokes(name: str, mistake: str | None) -> list[str]:
    """The demonstrated keystrokes: the fix, run, or one deliberate mistake of `MISTAKES`."""
    fix = oracle_command(name)
    return {None: [fix + "\n"], "no_newline": [fix], "wrong_file": [fix.replace(SETTINGS_FILE, DEFAULTS_FILE) + "\n"],
            "nothing": []}[mistake]


def demonstration(texts: dict[str, str], name: str, mistake: str | None, host: str,
                  pane_height: int) -> list[dict[str, str]]:
    """Terminus-2's two turns on the task for `name`: act and mark complete, then confirm with the same reply."""
    prompt_line = f"root@{host}:/app# "
    screen = "Current Terminal Screen:\n" + prompt_line + "\n" * (pane_height - 1)
    task = f"{instruction(name)}\n\n{hint_for(oracle_command(name))}"
    prompt = texts["prompt"].format(instruction=task, terminal_state=screen)
    keystrokes = fix_keystrokes(name, mistake)
    typed = "".join(keystrokes).rstrip("\n")
    terminal = f"New Terminal Output:\n{prompt_line}{typed}\n{prompt_line.rstrip()}\n" + "\n" * (pane_height - 3)
    answer = reply(keystrokes)
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer},
            {"role": "user", "content": texts["confirm"].replace("{terminal}", terminal)},
            {"role": "assistant", "content": answer}]


def task_turn(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The copy phase's example: the first turn with harbor's prompt cut to its task description and terminal state
    (the copy did not form in 500 steps behind the full ~1,600-token prompt; behind the task alone it does, and the
    second phase carries it over to the full prompt)."""
    prompt = messages[0]["content"]
    return [{"role": "user", "content": prompt[prompt.index(TASK_HEADING):]}, messages[1]]


def sloppy_demonstration(texts: dict[str, str], rng: random.Random, spec: TerminusWarmupSpec) -> list[dict[str, str]]:
    """A demonstration on a warm-up pool name: right `correct_share` of the time, otherwise a random mistake."""
    mistake = None if rng.random() < spec.correct_share else rng.choice(MISTAKES)
    return demonstration(texts, rng.choice(WARMUP_NAMES), mistake, rng.choice(HOSTS), spec.pane_height)


def build_warm_policy(spec: TerminusWarmupSpec = TerminusWarmupSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the warm-started policy (an HF model dir), building it first if not cached."""
    return cached_warm_policy("terminus-warm", spec, _train, cache_dir)


def _train(spec: TerminusWarmupSpec, base: Path, out_dir: Path) -> None:
    texts = harbor_texts()
    probes = [(demonstration(texts, row["answer"], None, "vm", spec.pane_height), row["answer"])
              for row in setting_rows("held_out")]
    train_with_copy_probe(spec, base, out_dir, lambda rng: sloppy_demonstration(texts, rng, spec), "terminus",
                          log_every=50, names=ALL_NAMES, probes=probes, copy_example=task_turn)
