"""A user's own model, data and harness, from a folder of their own: a hub ID in an offline HF cache, a jsonl file,
and `my_agent:rollout_fn` next to the data — and the one-line message of each bad variant."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hub_cache import hub_cache

AGENT = '''
async def rollout_fn(client, row):
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["question"]}], max_tokens=4)
    return float(reply.choices[0].message.content.strip() == str(row["answer"]))
'''


def fullasync(work: Path, home: Path, *args: str, timeout: int = 900, terminal: bool = False,
              environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`fullasync train ARGS` in `work`; `terminal`: with stdout and stderr on a pseudo-terminal (read back as
    `stdout`), as a person at a terminal runs it."""
    script = Path(sys.executable).parent / "fullasync"  # the console script: sys.path[0] is not the current folder
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "COLUMNS": "160", "TERM": "xterm"}
    env.pop("HF_HUB_CACHE", None)
    env.pop("FULLASYNC_PLAIN", None)
    env.update(environment or {})
    command = [str(script), "train", *args]
    if not terminal:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=work, env=env)
    controller, device = pty.openpty()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=device, stderr=device, cwd=work, env=env)
    os.close(device)
    shown = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        readable, _, _ = select.select([controller], [], [], 1.0)
        if readable:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed: every process holding it exited
                break
            if not chunk:
                break
            shown += chunk
    os.close(controller)
    returncode = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    return subprocess.CompletedProcess(command, returncode, shown.decode(errors="replace"), "")


@pytest.mark.slow
def test_a_hub_model_a_jsonl_file_and_a_local_harness_train_from_a_folder_of_ones_own(tiny_model_path, tmp_path):
    home, work = tmp_path / "hf", tmp_path / "work"
    hub_cache(home, "fullasync-test/tiny", Path(tiny_model_path))
    work.mkdir()
    (work / "my_agent.py").write_text(AGENT)
    (work / "train.jsonl").write_text("".join(json.dumps({"question": f"{a} + {a} =", "answer": 2 * a}) + "\n"
                                              for a in range(10)))
    common = ("data.task=", "data.rollout_fn=my_agent:rollout_fn", "output_dir=out", "rollout.batch_size=2",
              "rollout.n=2", "total_steps=2", "checkpoint.every=0", "engine.max_model_len=512")
    done = fullasync(work, home, "model.path=fullasync-test/tiny", "data.train_dataset=train.jsonl", *common,
                     "data.val_dataset=train.jsonl", "val_samples_per_row=2", "engine.vllm.max_num_seqs=7",
                     "engine.vllm.max_num_batched_tokens=1536", terminal=True)
    assert done.returncode == 0, done.stdout[-3000:]
    # vLLM's own arguments reach the engine: the start-up line reads them back from the running engine's config
    assert "engines hold vLLM's max_num_seqs=7, enable_prefix_caching=True, max_num_batched_tokens=1536" in done.stdout
    assert json.loads((work / "out" / "result.json").read_text())["steps"] == 2
    # on a terminal: each start-up phase as it happens, and live bars (rich) under the lines
    shown = done.stdout
    phases = ["model ready: fullasync-test/tiny", "Ray ready:", "engine 1/1 ready:", "trainer ready: 1 worker",
              "held-out accuracy before training", "step    2/2"]
    positions = [shown.find(phase) for phase in phases]
    assert -1 not in positions, [phase for phase, at in zip(phases, positions) if at == -1]
    assert "━" in shown and "\x1b[" in shown  # a bar, drawn with terminal control sequences
    assert "engines" in shown and "validation" in shown  # bars (the lines say "engine 1/1 ready")

    bad = fullasync(work, home, "model.path=fullasync-test/absent", "data.train_dataset=train.jsonl", *common)
    assert bad.returncode == 2 and "is not in the Hugging Face cache" in bad.stderr and "Traceback" not in bad.stderr
    bad = fullasync(work, home, "model.path=fullasync-test/tiny", "data.train_dataset=missing.jsonl", *common)
    assert bad.returncode == 2 and "'missing.jsonl' matches no file" in bad.stderr and "Traceback" not in bad.stderr
    bad = fullasync(work, home, "model.path=fullasync-test/tiny", "data.train_dataset=train.jsonl",
                    "logging.loggers=[wandb]", *common, timeout=120,
                    environment={"HOME": str(tmp_path), "WANDB_MODE": "", "WANDB_API_KEY": ""})
    assert bad.returncode == 2 and "no W&B credentials" in bad.stderr and "Traceback" not in bad.stderr
    # one bad setting per place the run checks it (~25 s a command): the Hydra layer (an undeclared name),
    # vLLM's own arguments, and the model's tool parser against its tokenizer; the other messages of each place
    # are tested in-process (test_config, test_config_components, test_tool_formats, test_real_model_templates)
    for setting, says in [("+engine.gpu_memory_utilization=0.5", "engine.gpu_memory_utilization is not a setting "
                           "(did you mean engine.vllm.gpu_memory_utilization?)"),
                          ("engine.vllm.max_model_len=4096", "engine.vllm.max_model_len: the run sets it; set "
                           "engine.max_model_len"),
                          ("model.tool_parser=llama3_json", "could not locate the bot token '<|python_tag|>'")]:
        bad = fullasync(work, home, "model.path=fullasync-test/tiny", "data.train_dataset=train.jsonl", setting,
                        *common, timeout=120)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]
        assert len(bad.stderr.strip().splitlines()) == 1
