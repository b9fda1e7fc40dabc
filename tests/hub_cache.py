"""A Hugging Face hub cache built here, in the hub's layout, from a local model folder (the hub is not reachable)."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(home: Path, repo_id: str, model_dir: Path, commit: str = COMMIT) -> Path:
    """`model_dir` as `HF_HOME=home` holds a downloaded snapshot: refs/main -> snapshots/<commit>/<files>."""
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot
