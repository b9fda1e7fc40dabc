"""The distribution ships every package: pyproject lists them explicitly (to map `agents/` to `fullasync_agents`
and `patches/` to `fullasync_patches`)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(path.parent.relative_to(ROOT).parts) for path in (ROOT / "fullasync").rglob("__init__.py")}
    on_disk |= {".".join(("fullasync_agents", *path.parent.relative_to(ROOT / "agents").parts))
                for path in (ROOT / "agents").rglob("__init__.py")}
    on_disk.add("fullasync_patches")
    assert on_disk <= listed, f"add {sorted(on_disk - listed)} to [tool.setuptools] packages in pyproject.toml"


def test_agents_import_as_fullasync_agents_and_not_as_agents(tmp_path):
    code = ("import importlib.util, fullasync_agents; "
            "print(fullasync_agents.__name__, importlib.util.find_spec('agents') is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["fullasync_agents", "True"]


def test_patches_import_as_fullasync_patches_and_not_as_patches(tmp_path):
    code = ("import importlib.util as util; "
            "print(*(util.find_spec(f'fullasync_patches.{m}') is not None for m in ('verl_cpu', 'ray_loopback')), "
            "util.find_spec('patches') is None)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "True"]


def test_verls_external_module_hook_is_given_the_installed_name():
    from fullasync_patches import verl_cpu  # imports torch, not verl

    assert verl_cpu.MODULE_NAME == verl_cpu.__name__ == "fullasync_patches.verl_cpu"
