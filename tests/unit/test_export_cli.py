"""`fullasync export ... --push-to-hub REPO` refuses, in a second and before the export's work, an upload that
cannot start: offline mode, no token, a malformed repo id (this machine reaches no Hub, so the upload itself
runs only where one is reachable)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def export(tmp_path, *args, **env):
    environment = {**os.environ, "HF_HOME": str(tmp_path / "hf"), **env}
    environment.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "fullasync.cli", "export", str(tmp_path / "no-checkpoint"),
                           str(tmp_path / "out"), *args], capture_output=True, text=True, timeout=120,
                          env=environment)


@pytest.mark.parametrize(("args", "env", "message"), [
    (("--push-to-hub", "me/model"), {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE is set"),
    (("--push-to-hub", "me/model"), {"HF_HUB_OFFLINE": "0"}, "needs a Hugging Face token: run `hf auth login`"),
    (("--push-to-hub", "model-without-owner"), {"HF_HUB_OFFLINE": "0"}, "name the owner too"),
    (("--push-to-hub", "me/bad name!"), {"HF_HUB_OFFLINE": "0"}, "is not a repo id"),
    ((), {}, "no-checkpoint"),  # no upload asked: the export itself reports the missing checkpoint
])
def test_an_upload_that_cannot_start_is_refused_before_the_export(tmp_path, args, env, message):
    done = export(tmp_path, *args, **env)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


def test_exporting_loads_neither_the_client_nor_an_engine_nor_a_run():
    """`fullasync export` resolves the model (`launch.model`) and reads a checkpoint (`run/checkpoint.py`): neither
    pulls in the client (its parsers, the openai and anthropic SDKs), vLLM, Ray or the run's wiring."""
    probe = ("import sys\n"
             "from fullasync.cli.export import export_checkpoint\n"
             "from fullasync.launch.model import resolve_model_path\n"
             "heavy = ('fullasync.client', 'fullasync.gateway', 'fullasync.run.assemble', 'fullasync.engines', "
             "'vllm', 'ray', 'openai', 'anthropic')\n"
             "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
