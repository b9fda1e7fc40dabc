"""Rows from wherever a user keeps them: files, a saved dataset, a hub dataset, or a function.

Owns: `load_rows(spec, what)`, which reads `data.train_dataset` / `data.val_dataset`:

    train.jsonl, data/*.parquet, a.csv,b.csv    files (jsonl, json, parquet, csv; paths, globs, comma-separated),
                                                 read through HF `datasets` (Arrow, memory-mapped: large files
                                                 are not held in Python objects)
    path/to/saved                                a `Dataset.save_to_disk` folder; `path/to/saved@test` picks a split
                                                 of a saved `DatasetDict`
    path/to/tasks                                a folder of harbor / terminal-bench tasks (each a directory with
                                                 task.toml, at any depth): a row per task (`harbor_task_row`);
                                                 `path/to/tasks@train` keeps those whose [metadata] split is train
    org/name, org/name:config@split              a dataset on the hub (the HF cache first; HF_HUB_OFFLINE=1 = cache
                                                 only); split `train` for training rows unless named
    package.module:function                      a function returning rows (as before); modules in the current
                                                 folder are importable

Every row reaches `rollout_fn` as a dict. A bad path, a split that does not exist or an unreadable file is one
`ValueError` naming the setting and what to do. Does not own: which rows a run takes (`data.max_train_rows`,
epochs: `fullasync.api`).
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

FILE_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
FUNCTION = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
HUB_DATASET = re.compile(r"^(?P<name>[\w.-]+(?:/[\w.-]+)?)(?::(?P<config>[\w.-]+))?(?:@(?P<split>[\w.-]+))?$")

T = TypeVar("T")


def resolve_dotted(path: str, what: str) -> Any:
    """`package.module:name` → the object, with the current folder importable; the error says what was looked for.

    Any: whatever the user's module holds under that name; the caller checks it as what it must be (`as_generator`
    for a rollout_fn, iteration for rows)."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{what}={path!r} must look like 'package.module:name'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # `my_agent:rollout_fn` next to where the command runs
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"{what}={path!r} could not be resolved: {error}") from error


def load_rows(spec: str, what: str, default_split: str | None = "train") -> Iterable[object]:
    """The rows `spec` names (module docstring); `default_split`: the split of a multi-split source when `spec`
    names none (None: the source must have one split, or name it)."""
    if FUNCTION.match(spec):
        return resolve_dotted(spec, what)()
    base, _, split = spec.rpartition("@") if "@" in spec else (spec, "", "")
    files = _files(base)
    if files is not None:
        return _from_files(files, spec, what)
    if Path(base).is_dir() and next(Path(base).rglob("task.toml"), None) is not None:
        return harbor_task_rows(Path(base), split or None, what)
    if Path(base).is_dir():
        return _from_disk(Path(base), split or None, default_split, what)
    hub = HUB_DATASET.match(spec)
    if hub and "/" in hub["name"] and not Path(hub["name"]).exists():
        return _from_hub(hub["name"], hub["config"], hub["split"] or default_split, what)
    raise ValueError(f"{what}={spec!r}: no such file or folder, and not a dataset name (org/name[:config][@split]) "
                     "or a function (package.module:function); files may be .jsonl, .json, .parquet or .csv")


def harbor_task_row(task_dir: Path) -> dict[str, object]:
    """A harbor task directory as a row: `id` (the folder's name), `task_dir`, `instruction` (instruction.md) and
    the task's `[metadata]` table (author, difficulty, category, ...; a `split` there is what `@split` selects)."""
    config = tomllib.loads((task_dir / "task.toml").read_text())
    instruction = task_dir / "instruction.md"
    return {**config.get("metadata", {}), "id": task_dir.name, "task_dir": str(task_dir.resolve()),
            "instruction": instruction.read_text().strip() if instruction.is_file() else ""}


def harbor_task_rows(folder: Path, split: str | None, what: str) -> list[dict[str, object]]:
    """Every harbor task under `folder` (sorted by path), those of `split` only when one is named."""
    try:
        rows = [harbor_task_row(path.parent) for path in sorted(folder.rglob("task.toml"))]
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ValueError(f"{what}={str(folder)!r}: a harbor task could not be read: {error}") from error
    if split is not None:
        rows = [row for row in rows if row.get("split") == split]
        if not rows:
            raise ValueError(f"{what}={str(folder)}@{split}: no task there has split = {split!r} in its [metadata]; "
                             f"drop @{split} to take every task")
    return rows


def _files(spec: str) -> list[str] | None:
    """The files `spec` names (paths or globs, comma-separated), if it names files by their suffix; else None."""
    parts = [part.strip() for part in spec.split(",") if part.strip()]
    if not parts or not all(Path(part).suffix.lower() in FILE_FORMATS for part in parts):
        return None
    return parts


def _from_files(parts: list[str], spec: str, what: str) -> Iterable[dict[str, object]]:
    import datasets

    formats = {FILE_FORMATS[Path(part).suffix.lower()] for part in parts}
    if len(formats) > 1:
        raise ValueError(f"{what}={spec!r} mixes file formats ({sorted(formats)}): give files of one format")
    found = [path for part in parts for path in sorted(glob.glob(part))]
    missing = [part for part in parts if not glob.glob(part)]
    if missing:
        raise ValueError(f"{what}={spec!r}: {missing[0]!r} matches no file (relative paths are from "
                         f"{os.getcwd()})")
    try:
        return datasets.load_dataset(formats.pop(), data_files=found, split="train")
    except Exception as error:  # the reader's own error (a malformed line, a bad header), named with the setting
        raise ValueError(f"{what}={spec!r} could not be read: {type(error).__name__}: {error}") from error


def _pick_split(splits: dict[str, T], split: str | None, default: str | None, what: str, spec: str) -> T:
    if split is None and len(splits) == 1:
        return next(iter(splits.values()))
    chosen = split or default
    if chosen not in splits:
        raise ValueError(f"{what}={spec!r} has splits {sorted(splits)}"
                         + (f", not {chosen!r}" if chosen else "") + f": name one with {spec.split('@')[0]}@<split>")
    return splits[chosen]


def _from_disk(folder: Path, split: str | None, default: str | None, what: str) -> Iterable[dict[str, object]]:
    import datasets

    try:
        saved = datasets.load_from_disk(str(folder))
    except FileNotFoundError as error:
        raise ValueError(f"{what}={str(folder)!r} is a folder but not a saved dataset (Dataset.save_to_disk): "
                         f"{error}") from error
    if isinstance(saved, datasets.DatasetDict):
        return _pick_split(dict(saved), split, default, what, str(folder))
    if split:
        raise ValueError(f"{what}={str(folder)}@{split}: the saved dataset has no splits; drop @{split}")
    return saved


def _from_hub(name: str, config: str | None, split: str | None, what: str) -> Iterable[dict[str, object]]:
    import datasets

    try:
        loaded = datasets.load_dataset(name, config)
    except Exception as error:  # not cached and offline, no such dataset, a config it lacks: the library says which
        raise ValueError(f"{what}={name!r}: the dataset could not be loaded ({type(error).__name__}: {error}); "
                         "offline (HF_HUB_OFFLINE=1) only datasets in the HF cache load") from error
    return _pick_split(dict(loaded), split, split, what, name)
