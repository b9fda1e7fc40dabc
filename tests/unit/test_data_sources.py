"""Rows from files, saved datasets, hub names and functions (`fullasync.data.load_rows`), and what a bad one says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from fullasync.data import load_rows

ROWS = [{"question": f"{a} + {a} =", "answer": 2 * a} for a in range(6)]
ROOT = Path(__file__).resolve().parents[2]


def write_all_formats(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (folder / "rows.json").write_text(json.dumps(ROWS))
    table = datasets.Dataset.from_list(ROWS)
    table.to_parquet(str(folder / "rows.parquet"))
    table.to_csv(str(folder / "rows.csv"), index=False)


@pytest.mark.parametrize("name", ["rows.jsonl", "rows.json", "rows.parquet", "rows.csv"])
def test_every_file_format_gives_the_same_rows_as_dicts(tmp_path, name):
    write_all_formats(tmp_path)
    assert [dict(r) for r in load_rows(str(tmp_path / name), "data.train_dataset")] == ROWS


def test_globs_and_lists_of_files_are_read_in_order(tmp_path):
    (tmp_path / "a").mkdir()
    for index in range(3):
        (tmp_path / "a" / f"part{index}.jsonl").write_text(json.dumps(ROWS[index]) + "\n")
    assert list(load_rows(str(tmp_path / "a" / "part*.jsonl"), "data.train_dataset")) == ROWS[:3]
    both = f"{tmp_path / 'a' / 'part2.jsonl'},{tmp_path / 'a' / 'part0.jsonl'}"
    assert list(load_rows(both, "data.train_dataset")) == [ROWS[2], ROWS[0]]


def test_a_saved_dataset_and_the_split_of_a_saved_dataset_dict(tmp_path):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "flat"))
    assert list(load_rows(str(tmp_path / "flat"), "data.train_dataset")) == ROWS
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:4]),
                                   "test": datasets.Dataset.from_list(ROWS[4:])})
    splits.save_to_disk(str(tmp_path / "dict"))
    assert list(load_rows(str(tmp_path / "dict"), "data.train_dataset")) == ROWS[:4]  # train by default
    assert list(load_rows(f"{tmp_path / 'dict'}@test", "data.val_dataset", default_split=None)) == ROWS[4:]
    with pytest.raises(ValueError, match=r"has splits \['test', 'train'\]: name one with .*@<split>"):
        load_rows(str(tmp_path / "dict"), "data.val_dataset", default_split=None)  # validation must name it
    with pytest.raises(ValueError, match=r"has splits \['test', 'train'\], not 'dev'"):
        load_rows(f"{tmp_path / 'dict'}@dev", "data.val_dataset", default_split=None)


def test_bad_sources_say_what_was_wrong(tmp_path):
    with pytest.raises(ValueError, match=r"data.train_dataset='.*missing.jsonl': '.*missing.jsonl' matches no file"):
        load_rows(str(tmp_path / "missing.jsonl"), "data.train_dataset")
    with pytest.raises(ValueError, match="no such file or folder, and not a dataset name"):
        load_rows(str(tmp_path / "notes.txt"), "data.train_dataset")
    (tmp_path / "broken.jsonl").write_text('{"question": "1 + 1 ="}\nnot json\n')
    with pytest.raises(ValueError, match="broken.jsonl' could not be read"):
        load_rows(str(tmp_path / "broken.jsonl"), "data.train_dataset")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="is a folder but not a saved dataset"):
        load_rows(str(tmp_path / "plain"), "data.train_dataset")


def test_a_hub_dataset_that_is_not_cached_offline_is_refused_with_the_reason(tmp_path):
    code = ("from fullasync.data import load_rows\n"
            "try: load_rows('fullasync-test/absent:main@train', 'data.train_dataset')\n"
            "except ValueError as e: print(e)")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=env)
    assert "data.train_dataset='fullasync-test/absent': the dataset could not be loaded" in done.stdout, done.stderr
    assert "only datasets in the HF cache load" in done.stdout


def test_a_function_in_a_module_of_the_current_folder(tmp_path):
    # run as a console script is: sys.path[0] is the script's folder, not the current one
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "my_rows.py").write_text(f"def rows():\n    return {ROWS!r}\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "runner.py").write_text(
        "from fullasync.data import load_rows\nprint(len(list(load_rows('my_rows:rows', 'data.train_dataset'))))\n")
    done = subprocess.run([sys.executable, str(tmp_path / "bin" / "runner.py")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path / "work", env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip() == str(len(ROWS)), done.stderr


def test_a_folder_of_harbor_tasks_is_a_row_per_task_and_a_split_selects_by_metadata(tmp_path):
    from fullasync_agents.terminal_tasks import TASKS_DIR, rows

    shipped = load_rows(str(TASKS_DIR), "data.train_dataset")
    assert [row["id"] for row in shipped] == [row["id"] for row in rows()]  # the shipped tasks, as the loader reads
    held_out = load_rows(f"{TASKS_DIR}@held_out", "data.val_dataset")
    assert {row["family"] for row in held_out} == {"select"} and all(
        (Path(row["task_dir"]) / "tests" / "test.sh").is_file() for row in held_out)
    nested = tmp_path / "bench" / "easy" / "hello"  # terminal-bench style: any depth, no [metadata] needed
    (nested / "tests").mkdir(parents=True)
    (nested / "task.toml").write_text('version = "1.0"\n')
    (nested / "instruction.md").write_text("Print hello.\n")
    (row,) = load_rows(str(tmp_path / "bench"), "data.train_dataset")
    assert row == {"id": "hello", "task_dir": str(nested.resolve()), "instruction": "Print hello."}
    with pytest.raises(ValueError, match="no task there has split = 'train'"):
        load_rows(f"{tmp_path / 'bench'}@train", "data.train_dataset")
    (nested / "task.toml").write_text("version = \n")
    with pytest.raises(ValueError, match="a harbor task could not be read"):
        load_rows(str(tmp_path / "bench"), "data.train_dataset")
