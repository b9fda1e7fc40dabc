"""Checkpoints of a whole run: written atomically, found again, and checked against the run that resumes them.

Owns: the on-disk layout and format, atomic writing (a temporary directory, every file fsynced, one rename;
the newest complete checkpoint is never touched in place), pruning old checkpoints, finding the newest
complete one, and refusing a checkpoint whose run differs in a field that must not change. Does not own:
what the trainer writes into its directory (`Trainer.save_state`), when to checkpoint (`TrainingLoop`),
or how the state is captured and restored (`Run`, `Rollouter.snapshot/restore`, the queue's `snapshot`).

Layout of `<root>/step_00000012/` (root: `<output_dir>/checkpoints`):

    trainer/          the trainer's state; verl: model shard, optimizer, LR scheduler and RNG per rank
    run.json          the loop (step, weight version, the run's first version, metrics history) and the
                      rollout side: dataset cursor, row ledger, failure counts, staleness counters, token costs
    groups.jsonl      every queued `TrajectoryGroup`, one JSON object per line (`fullasync.types.group_to_dict`)
    in_flight.jsonl   every row still generating: {"row_id", "episodes": {index: trajectory or null (failed)}};
                      finished episodes are kept, unfinished ones are generated again on resume
    manifest.json     written last: format, step, version, sizes, the run's fingerprint

Everything but `trainer/` is JSON (log-probs of -inf appear as `-Infinity`) and reads without torch.
A directory without a readable manifest is not a checkpoint; `.step_*.tmp-*` directories are saves a
crash interrupted and are removed when the next run starts.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fullasync.errors import FullasyncError
from fullasync.rollout.state import RolloutState
from fullasync.types import (
    JsonValue,
    TrajectoryGroup,
    group_from_dict,
    group_to_dict,
    trajectory_from_dict,
    trajectory_to_dict,
)

log = logging.getLogger("fullasync")

FORMAT = 1
STEP_DIR = re.compile(r"^step_(\d{8})$")
TEMP_PREFIX = ".step_"
DISK_REFUSALS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG})  # a save fails, the run goes on


class IncompatibleCheckpointError(FullasyncError, ValueError):
    """The checkpoint was written by a run that differs from this one in a field that must not change."""


@dataclass
class LoopState:
    """The training loop at a step boundary."""

    steps: int = 0
    version: int = 0  # the weight version the trainer (and the engines) held
    first_version: int = 0  # the version the run started from (admission counts versions from it)
    trained_samples: int = 0
    train_wall_s: float = 0.0
    max_token_staleness: int = 0
    val_before: float | None = None
    val_failed_episodes: int = 0
    output_tokens: float = 0.0
    idle_s: float = 0.0
    history: list[dict[str, float]] = field(default_factory=list)
    validations: list[dict[str, float]] = field(default_factory=list)  # LoopResult.validations


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where and how often a run saves itself."""

    root: Path  # <output_dir>/checkpoints
    every: int = 0  # steps between checkpoints; 0 = only when stopped by a signal
    keep: int = 2  # newest complete checkpoints kept (0 = all)
    fingerprint: Mapping[str, JsonValue] = field(default_factory=dict)  # what a resuming run must match
    hf_every: int = 0  # steps between Hugging Face copies of the policy (root/../hf/step_N); 0 = none

    def hf_dir(self, step: int) -> Path:
        """Where the policy after `step` goes as a Hugging Face folder: <output_dir>/hf/step_N."""
        return self.root.parent / "hf" / f"step_{step:08d}"


@dataclass
class Checkpoint:
    path: Path
    loop: LoopState
    rollout: RolloutState
    groups: list[TrajectoryGroup]
    fingerprint: dict[str, JsonValue]

    @property
    def trainer_dir(self) -> Path:
        return self.path / "trainer"


@dataclass(frozen=True)
class SavedCheckpoint:
    """What one save wrote, and how long it took."""

    path: Path
    num_bytes: int
    trainer_bytes: int
    seconds: float
    trainer_seconds: float


def write_error(error: BaseException) -> OSError | None:
    """The OSError of a file system that refuses more (full, over quota, read-only, a file too large) behind a save
    that failed, also when a trainer worker raised it (a Ray error names it as its cause); None when the save failed
    for another reason (a bug stays an error)."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_REFUSALS:
            return current
        pending += [current.__cause__, current.__context__, getattr(current, "cause", None)]
    return None


def free_bytes(root: Path) -> int | None:
    """Bytes free to this user on `root`'s file system (None when it cannot be read)."""
    try:
        return shutil.disk_usage(root).free
    except OSError:
        return None


def step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def complete_checkpoints(root: Path) -> list[Path]:
    """The complete checkpoints under `root`, oldest first (a step directory with a readable manifest)."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if match and path.is_dir() and _manifest(path) is not None:
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def remove_interrupted_saves(root: Path) -> list[str]:
    """Delete temporary directories of saves a crash interrupted; their names."""
    removed = []
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith(TEMP_PREFIX) and ".tmp-" in path.name:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
    return removed


def _manifest(path: Path) -> dict[str, Any] | None:
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == FORMAT else None


async def save(root: Path, *, save_trainer: Callable[[str], Awaitable[object]], loop: LoopState, rollout: RolloutState,
               groups: Iterable[TrajectoryGroup], fingerprint: Mapping[str, JsonValue], keep: int) -> SavedCheckpoint:
    """Write a checkpoint of step `loop.steps` atomically, then keep only the newest `keep` (0 = all)."""
    started = time.perf_counter()
    root.mkdir(parents=True, exist_ok=True)
    target = step_dir(root, loop.steps)
    staging = root / f"{TEMP_PREFIX}{loop.steps:08d}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        await save_trainer(str(staging / "trainer"))
        trainer_seconds = time.perf_counter() - started
        # the rest is plain I/O on data captured already: a thread, so generation goes on meanwhile
        num_bytes, trainer_bytes = await asyncio.to_thread(_write_state, staging, loop, rollout, list(groups),
                                                           fingerprint)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # what a save that failed wrote takes no room
        raise
    if target.exists():  # the same step saved before (a resumed run that re-did it): replace, never half-way
        shutil.rmtree(target)
    staging.rename(target)
    _fsync_dir(root)
    if keep > 0:
        for old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return SavedCheckpoint(target, num_bytes, trainer_bytes, time.perf_counter() - started, trainer_seconds)


def _write_state(staging: Path, loop: LoopState, rollout: RolloutState, groups: list[TrajectoryGroup],
                 fingerprint: Mapping[str, JsonValue]) -> tuple[int, int]:
    """Write everything but the trainer's part, the manifest last, and flush it all to disk; (bytes, trainer bytes)."""
    trainer_bytes = _size(staging / "trainer")
    _write_json(staging / "run.json", {"loop": asdict(loop), "rollout": _rollout_to_dict(rollout)})
    _write_lines(staging / "groups.jsonl", (group_to_dict(g) for g in groups))
    _write_lines(staging / "in_flight.jsonl", (
        {"row_id": row_id, "episodes": {str(i): None if t is None else trajectory_to_dict(t) for i, t in eps.items()}}
        for row_id, eps in rollout.in_flight.items()))
    num_bytes = _size(staging)
    _write_json(staging / "manifest.json", {
        "format": FORMAT, "step": loop.steps, "version": loop.version, "written_at": time.time(),
        "queued_groups": len(groups), "in_flight_rows": len(rollout.in_flight), "num_bytes": num_bytes,
        "trainer_bytes": trainer_bytes, "fingerprint": dict(fingerprint),
    })
    _fsync_tree(staging)
    return num_bytes, trainer_bytes


def load(path: Path) -> Checkpoint:
    """Read a complete checkpoint (raises ValueError naming the directory when it is not one)."""
    manifest = _manifest(path)
    if manifest is None:
        raise ValueError(f"{path} is not a complete fullasync checkpoint (no readable manifest.json of format "
                         f"{FORMAT})")
    state = json.loads((path / "run.json").read_text())
    rollout = _rollout_from_dict(state["rollout"])
    for line in _read_lines(path / "in_flight.jsonl"):
        rollout.in_flight[line["row_id"]] = {
            int(i): None if t is None else trajectory_from_dict(t) for i, t in line["episodes"].items()}
    groups = [group_from_dict(line) for line in _read_lines(path / "groups.jsonl")]
    return Checkpoint(path=path, loop=LoopState(**state["loop"]), rollout=rollout, groups=groups,
                      fingerprint=manifest["fingerprint"])


def find_resumable(root: Path, resume: str, fingerprint: Mapping[str, JsonValue]) -> Checkpoint | None:
    """The checkpoint a run continues from: `resume` is "auto" (the newest complete one under `root`, if any),
    "never", or a checkpoint directory. Refuses an incompatible one, and "never" over existing checkpoints."""
    if resume == "never":
        existing = latest_checkpoint(root)
        if existing is not None:
            raise IncompatibleCheckpointError(
                f"resume=never, but {root} holds checkpoints of an earlier run (newest: {existing.name}): pass "
                "resume=auto to continue it, or choose another output_dir (or delete that directory) to start over")
        return None
    path = latest_checkpoint(root) if resume == "auto" else Path(resume)
    if path is None:
        return None
    saved = load(path)
    check_compatible(saved.fingerprint, fingerprint, path)
    return saved


def check_compatible(saved: Mapping[str, JsonValue], current: Mapping[str, JsonValue], where: Path) -> None:
    """Refuse to resume when a fingerprint field differs; the error names every differing field."""
    differing = sorted(key for key in saved.keys() | current.keys() if saved.get(key) != current.get(key))
    if differing:
        details = "; ".join(f"{key}: checkpoint {saved.get(key)!r}, now {current.get(key)!r}" for key in differing)
        raise IncompatibleCheckpointError(
            f"cannot resume from {where}: the run differs in {', '.join(differing)} ({details}). Resume with the "
            "checkpoint's values, or start a new run in another output_dir (or with resume=never)")


def _rollout_to_dict(rollout: RolloutState) -> dict[str, Any]:
    return {f.name: getattr(rollout, f.name) for f in fields(rollout) if f.name != "in_flight"}  # in in_flight.jsonl


def _rollout_from_dict(data: Mapping[str, Any]) -> RolloutState:
    return RolloutState(**{k: v for k, v in data.items() if k != "in_flight"})


def _write_json(path: Path, data: JsonValue) -> None:
    path.write_text(json.dumps(data, indent=1))


def _write_lines(path: Path, items: Iterable[object]) -> None:
    with path.open("w") as out:
        for item in items:
            out.write(json.dumps(item) + "\n")


def _read_lines(path: Path) -> list[Any]:  # JSON as read (json.loads): checked by the readers of each line
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` to disk (before the rename makes it visible)."""
    for directory, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                os.fsync(handle.fileno())
        _fsync_dir(Path(directory))


def _fsync_dir(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
