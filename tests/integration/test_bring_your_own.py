"""A user's own model, data and harness, from a folder of their own: a hub ID in an offline HF cache, a jsonl file,
and `my_agent:rollout_fn` next to the data — and the one-line message of each bad variant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_cache import hub_cache

AGENT = '''
async def rollout_fn(client, row):
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": row["question"]}], max_tokens=4)
    return float(reply.choices[0].message.content.strip() == str(row["answer"]))
'''


def fullasync(work: Path, home: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "fullasync"  # the console script: sys.path[0] is not the current folder
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([str(script), "train", *args], capture_output=True, text=True, timeout=timeout, cwd=work,
                          env=env)


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
    done = fullasync(work, home, "model.path=fullasync-test/tiny", "data.train_dataset=train.jsonl", *common)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert json.loads((work / "out" / "result.json").read_text())["steps"] == 2

    bad = fullasync(work, home, "model.path=fullasync-test/absent", "data.train_dataset=train.jsonl", *common)
    assert bad.returncode == 2 and "is not in the Hugging Face cache" in bad.stderr and "Traceback" not in bad.stderr
    bad = fullasync(work, home, "model.path=fullasync-test/tiny", "data.train_dataset=missing.jsonl", *common)
    assert bad.returncode == 2 and "'missing.jsonl' matches no file" in bad.stderr and "Traceback" not in bad.stderr
