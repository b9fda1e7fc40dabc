"""The distribution ships every package: pyproject lists them explicitly (to map `agents/` to `fullasync_agents`)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_directory_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "fullasync").rglob("__init__.py")}
    on_disk |= {".".join(("fullasync_agents", *path.parent.relative_to(ROOT / "agents").parts))
                for path in (ROOT / "agents").rglob("__init__.py")}
    on_disk.add("patches")
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages in pyproject.toml"


def test_agents_import_as_fullasync_agents_and_not_as_agents(tmp_path):
    code = ("import importlib.util, fullasync_agents; "
            "print(fullasync_agents.__name__, importlib.util.find_spec('agents') is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["fullasync_agents", "True"]
