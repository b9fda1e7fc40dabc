"""The toy task sets as SWE-bench-style records, for episodes in containers.

Owns: turning a toy row (`tasks.py`, `settings.py`) into the record format of SWE-bench / SWE-Gym / SWE-smith
(`instance_id`, `problem_statement`, `FAIL_TO_PASS`, `PASS_TO_PASS`, `test_patch`; an `image_recipe` instead of
an image, since nothing can be pulled here: the repository committed on the local Python image), and the shipped
file of them, `toy_swe.jsonl` (`python -m fullasync_agents.swe_tasks.records` writes it again; a unit test checks
it matches). Such a record runs like any SWE-bench one: `swe_row`, then `environment_class=container`.
Does not own: the tasks themselves or how a record is run (`swebench.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fullasync_agents.swe_tasks.settings import setting_rows
from fullasync_agents.swe_tasks.tasks import rows

SHIPPED = Path(__file__).with_name("toy_swe.jsonl")
FAMILIES = {"settings": setting_rows, "bugs": rows}


def new_file_patch(files: Mapping[str, str]) -> str:
    """A unified diff (`git apply` reads it) that creates `files` (path → text)."""
    parts = []
    for name, text in files.items():
        lines = text.splitlines()
        body = "".join(f"+{line}\n" for line in lines)
        parts.append(f"diff --git a/{name} b/{name}\nnew file mode 100644\n--- /dev/null\n+++ b/{name}\n"
                     f"@@ -0,0 +1,{len(lines)} @@\n{body}")
    return "".join(parts)


def swe_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """One toy row as a SWE-bench-style record: the hidden tests arrive as the test patch and are FAIL_TO_PASS."""
    return {
        "instance_id": f"toy__{row['id']}",
        "repo": "fullasync/toy",
        "base_commit": "",
        "problem_statement": row["instruction"],
        "image_recipe": {"files": dict(row["files"])},
        "test_patch": new_file_patch(row["hidden_tests"]),
        "FAIL_TO_PASS": json.dumps(sorted(row["hidden_tests"])),  # JSON text, as SWE-bench stores it
        "PASS_TO_PASS": "[]",
        "family": row["family"],
        "split": row["split"],
    }


def swe_records(tasks: str = "settings", split: str | None = None, hint: bool = True) -> list[dict[str, Any]]:
    """The records of a toy family (`settings`: what the tiny policy learns; `bugs`) and split."""
    return [swe_record(row) for row in FAMILIES[tasks](split, hint=hint)]


def shipped(split: str | None = None) -> list[dict[str, Any]]:
    """The records in `toy_swe.jsonl` (both families; hints on), of `split` when given."""
    records = [json.loads(line) for line in SHIPPED.read_text().splitlines() if line.strip()]
    return [r for r in records if split is None or r["split"] == split]


def write_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    path.write_text("".join(json.dumps(record, sort_keys=True) + "\n" for record in records))


if __name__ == "__main__":
    write_jsonl(SHIPPED, [*swe_records("settings"), *swe_records("bugs")])
    print(f"wrote {SHIPPED}")
