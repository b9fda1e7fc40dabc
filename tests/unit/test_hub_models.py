"""Models by hub ID, resolved through a Hugging Face cache built here in the hub's layout (the hub is offline)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_cache import COMMIT, hub_cache

from fullasync.models.hub import looks_like_hub_id

ROOT = Path(__file__).resolve().parents[2]
def resolve(home: Path, repo_id: str, revision: str = "", cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from fullasync.models.hub import resolve_hub_model, InvalidModelError\n"
            "try: print(resolve_hub_model(sys.argv[1], sys.argv[2]))\n"
            "except InvalidModelError as e: print('ERROR', e); sys.exit(2)")
    env = {**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", code, repo_id, revision], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def test_a_hub_id_resolves_to_its_cached_snapshot_offline(tiny_model_path, tmp_path):
    snapshot = hub_cache(tmp_path / "hf", "fullasync-test/tiny", Path(tiny_model_path))
    done = resolve(tmp_path / "hf", "fullasync-test/tiny")
    assert done.returncode == 0, done.stdout + done.stderr
    assert Path(done.stdout.strip()) == snapshot and (snapshot / "config.json").exists()
    assert Path(resolve(tmp_path / "hf", "fullasync-test/tiny", COMMIT).stdout.strip()) == snapshot


def test_an_uncached_hub_id_offline_says_what_to_do(tmp_path):
    done = resolve(tmp_path / "hf", "fullasync-test/absent")
    assert done.returncode == 2
    assert "is not in the Hugging Face cache" in done.stdout and "HF_HUB_OFFLINE=1" in done.stdout
    assert "hf download fullasync-test/absent" in done.stdout


@pytest.mark.parametrize("path, hub", [("Qwen/Qwen2.5-0.5B-Instruct", True), ("HuggingFaceTB/SmolLM2-135M", True),
                                       ("./model", False), ("/abs/model", False), ("a/b/c", False),
                                       ("builtin:arithmetic", False), ("smollm2-135m-instruct", False)])
def test_hub_ids_are_told_from_paths(path, hub):
    assert looks_like_hub_id(path) is hub
