"""The starting policy of the Terminus example: the tiny model taught Terminus-2's JSON replies, sloppily.

Owns: synthetic demonstrations of Terminus-2's own conversation — harbor's prompt template and its
"are you sure" confirmation, both read from the installed harbor (never retyped here) — on *generated*
terminal tasks in the shape of the training families (random file names and words, never the task set's
own), and a short supervised warm-up on them, cached on disk. A demonstration is right (the hinted
command as keystrokes ending in a newline, `task_complete` twice) only `correct_share` of the time;
otherwise it makes one deliberate mistake that the tests score 0: the keystrokes without the newline
(typed, never run), the command on the wrong file, or no command at all. The model's context is 4,096
tokens (harbor's prompt alone is ~1,600 of the tiny tokenizer's). Loss only on assistant tokens.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

from examples.harness_warmup import train_on_demonstrations
from fullasync.models import TinyModelSpec
from fullasync.tasks.warmup import cached_warm_policy
from fullasync_agents.terminal_tasks import hint_for
from fullasync_agents.terminus.interpreter import HARBOR_VERSION, harbor_python, harness_environment

WARMUP_FORMAT = 1  # bump when the procedure changes; part of the cache key
WORDS = ("alpha", "beta", "notes", "data", "report", "items", "names", "log", "queue", "stock", "words", "lines",
         "output", "result", "draft", "final", "config", "backup", "src", "build", "cache", "input", "list", "todo")
SHAPES = (  # (instruction, command) in the shape of the training families
    ("Create the file /app/{a}.txt containing the single line `{w}`.", "echo '{w}' > {a}.txt"),
    ("Create the file /app/{a}.txt containing the single line `{w}`.", 'echo "{w}" > {a}.txt'),
    ("Rename /app/{a}.md to /app/{b}.md, keeping its content.", "mv {a}.md {b}.md"),
    ("Create the directory /app/{a}/{b}, including its parent directories.", "mkdir -p {a}/{b}"),
    ("Copy /app/{a}/{b}.ini to /app/{c}/{b}.ini and keep the original.", "mkdir -p {c} && cp {a}/{b}.ini {c}/"),
    ("Make the script /app/{a}.sh executable.", "chmod +x {a}.sh"),
    ("Sort the lines of /app/{a}.txt alphabetically and write them to /app/{b}.txt.", "sort {a}.txt > {b}.txt"),
    ("Write the distinct lines of /app/{a}.txt, sorted, to /app/{b}.txt.", "sort -u {a}.txt > {b}.txt"),
    ("Convert /app/{a}.txt to upper case and write the result to /app/{b}.txt.", "tr a-z A-Z < {a}.txt > {b}.txt"),
    ("Write the first {n} lines of /app/{a}.txt to /app/{b}.txt.", "head -n {n} {a}.txt > {b}.txt"),
    ("In /app/{a}.txt replace every `{w}` with `{v}`, editing the file in place.", "sed -i 's/{w}/{v}/g' {a}.txt"),
    ("Write the number of lines in /app/{a}.txt to /app/{b}.txt.", "wc -l < {a}.txt > {b}.txt"),
    ("Write the number of words in /app/{a}.txt to /app/{b}.txt.", "wc -w < {a}.txt > {b}.txt"),
    ("/app/{a}.txt has one integer per line. Write their sum to /app/{b}.txt.",
     "awk '{{s += $1}} END {{print s}}' {a}.txt > {b}.txt"),
    ("Write how many lines of /app/{a}.log contain `{W}` to /app/{b}.txt.", "grep -c {W} {a}.log > {b}.txt"),
    ("Write the number of `.{e}` files anywhere under /app/{a} to /app/{b}.txt.",
     "find {a} -name '*.{e}' | wc -l > {b}.txt"),
)
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
    steps: int = 200  # optimizer steps
    batch_size: int = 8
    lr: float = 2e-3
    pane_height: int = 24  # screen rows shown in the demonstrations' terminal states (agent.pane_height)
    seed: int = 0

    def key(self) -> str:
        text = json.dumps([WARMUP_FORMAT, HARBOR_VERSION, dataclasses.asdict(self), self.model.key()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def harbor_texts() -> dict[str, str]:
    """Terminus-2's prompt template and confirmation message, as the installed harbor writes them."""
    python = harbor_python()
    done = subprocess.run([str(python), "-c", HARBOR_TEXTS], capture_output=True, text=True, check=True,
                          env=harness_environment(Path("/nonexistent")), timeout=120)
    return json.loads(done.stdout)


def synthetic_task(rng: random.Random) -> tuple[str, str]:
    """A made-up (instruction, command) in the training families' shape."""
    instruction, command = rng.choice(SHAPES)
    a, b, c = rng.sample(WORDS, 3)
    values = {"a": a, "b": b, "c": c, "w": rng.choice(WORDS), "v": rng.choice(WORDS), "W": rng.choice(WORDS).upper(),
              "n": rng.randint(1, 9), "e": rng.choice(("py", "md", "txt", "csv"))}
    return instruction.format(**values), command.format(**values)


def reply(keystrokes: list[str]) -> str:
    commands = [{"keystrokes": keys, "duration": 0.5} for keys in keystrokes]
    return json.dumps({"analysis": "", "plan": "", "commands": commands, "task_complete": True})


def demonstration(texts: dict[str, str], rng: random.Random, spec: TerminusWarmupSpec) -> list[dict[str, str]]:
    """Terminus-2's two turns on a generated task: act and mark complete, then confirm with the same reply."""
    instruction, command = synthetic_task(rng)
    host = f"root@{rng.choice(('vm', 'box', 'node', 'ci', 'dev'))}:/app# "
    screen = "Current Terminal Screen:\n" + host + "\n" * (spec.pane_height - 1)
    prompt = texts["prompt"].format(instruction=f"{instruction}\n\n{hint_for(command)}", terminal_state=screen)
    if rng.random() < spec.correct_share:
        keystrokes = [command + "\n"]
    else:
        mistake = rng.choice(("no_newline", "wrong_file", "nothing"))
        keystrokes = {"no_newline": [command], "wrong_file": [command.replace(".txt", "2.txt") + "\n"],
                      "nothing": []}[mistake]
    typed = "".join(keystrokes).rstrip("\n")
    terminal = f"New Terminal Output:\n{host}{typed}\n{host.rstrip()}\n" + "\n" * (spec.pane_height - 3)
    answer = reply(keystrokes)
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer},
            {"role": "user", "content": texts["confirm"].replace("{terminal}", terminal)},
            {"role": "assistant", "content": answer}]


def build_warm_policy(spec: TerminusWarmupSpec = TerminusWarmupSpec(), cache_dir: Path | None = None) -> Path:
    """Directory of the warm-started policy (an HF model dir), building it first if not cached."""
    return cached_warm_policy("terminus-warm", spec, _train, cache_dir)


def _train(spec: TerminusWarmupSpec, base: Path, out_dir: Path) -> None:
    texts = harbor_texts()
    train_on_demonstrations(spec, base, out_dir, lambda rng: demonstration(texts, rng, spec), name="terminus",
                            log_every=25)
