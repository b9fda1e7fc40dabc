"""Directories fullasync builds once and caches: models, warmed-up policies, generated task data.

Owns: `cached_build(target, build_into)`. A directory is complete iff it holds `BUILD_MARKER`,
written last. A build happens in a temporary sibling directory that is published with one atomic
`os.rename`, so a reader never sees half a build and several processes may build at once (the first
to publish wins, the others discard their copy). Files are made world-readable: the cache is shared.
Does not own: what is built, or where the cache root is (`tiny.default_cache_root`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

BUILD_MARKER = "fullasync_build.json"  # written last into a built dir: its presence means complete


def is_complete_build(directory: Path) -> bool:
    """True iff `directory` holds a finished build (its marker file exists)."""
    return (directory / BUILD_MARKER).is_file()


def cached_build(target: Path, build_into: Callable[[Path], Mapping[str, object]]) -> Path:
    """`target`, built first by `build_into(empty_dir)` if not complete; its returned record becomes the marker."""
    if is_complete_build(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the published dir is world-readable
    try:
        record = build_into(staging)
        for written in staging.rglob("*"):
            if not written.is_symlink():  # a link's target belongs to another build (maybe another user)
                executable = written.is_dir() or written.stat().st_mode & 0o100  # scripts (task files) stay runnable
                written.chmod(0o755 if executable else 0o644)  # transformers writes weights owner-only
        (staging / BUILD_MARKER).write_text(json.dumps(dict(record), indent=2, sort_keys=True, default=str) + "\n")
        _publish(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


def _publish(staging: Path, target: Path) -> None:
    """Atomically move a finished build into place unless a complete one got there first."""
    for _attempt in range(3):
        try:
            os.rename(staging, target)
            return
        except OSError:
            if not target.exists():
                raise
        if is_complete_build(target):
            return  # another process won the race; the caller discards `staging`
        _discard_incomplete(target)
    raise RuntimeError(
        f"could not publish the build to {target}: an incomplete directory kept reappearing there; "
        "remove it by hand and retry"
    )


def _discard_incomplete(target: Path) -> None:
    """Move an incomplete dir out of the way (atomically) and delete it.

    Our own builds never leave one (publication is a single rename); this only recovers from a
    directory damaged or created by hand.
    """
    trash = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
    try:
        os.rename(target, trash / "built")
    except FileNotFoundError:
        return  # a concurrent builder already moved it away
    finally:
        shutil.rmtree(trash)
