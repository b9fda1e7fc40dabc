"""The package's shape: which package may import which, how long a module may grow, how many modules sit at the
top level, how often `Any` is written, and that docs/architecture.md names only packages that exist."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fullasync"
MAX_MODULE_LINES = 500
MAX_TOP_LEVEL_MODULES = 6  # besides __init__.py
MAX_FUNCTION_LINES = 75  # a function's lines, its docstring and nested functions included; lower it as they go
ANY_CEILING = 97  # `Any` names in fullasync/ (368 before the layout pass, 334 before typing); never raise it

LEAVES = {"types", "errors"}
BASE = LEAVES | {"contracts", "config"}
# What each package (or top-level module) may import besides itself. Lower layers first; `trainer` never imports
# `engines` (weights travel through `weights`), `rollout` never imports `trainer` or `gateway`, `run` wires what it
# is handed and imports neither engines nor trainer.
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "errors": set(),
    "data": set(),
    "contracts": LEAVES,
    "config": LEAVES | {"contracts"},
    "presets": BASE,
    "infra": BASE,
    "observe": BASE | {"infra"},
    "models": BASE | {"infra"},
    "tasks": BASE | {"infra", "models"},
    "weights": BASE | {"infra", "observe"},
    "engines": BASE | {"infra", "observe", "weights"},
    "trainer": BASE | {"infra", "observe", "weights"},
    "client": BASE | {"infra", "observe", "engines"},
    "gateway": BASE | {"infra", "observe", "client"},
    "rollout": BASE | {"infra", "observe", "client"},
    "run": BASE | {"infra", "observe", "weights", "client", "gateway", "rollout"},
    "sim": BASE | {"infra", "observe", "weights", "client", "rollout", "run"},
    "launch": BASE | {"infra", "observe", "weights", "engines", "trainer", "client", "models", "tasks", "presets"},
    "api": BASE | {"infra", "observe", "weights", "engines", "trainer", "client", "gateway", "rollout", "run", "models",
                   "tasks", "data", "presets", "launch"},
    "cli": BASE | {"infra", "observe", "weights", "engines", "trainer", "client", "gateway", "rollout", "run", "models",
                   "tasks", "data", "api", "presets", "launch"},
    "__init__": {"api", "config", "rollout"},
}


def _modules() -> Iterator[Path]:
    yield from sorted(PACKAGE.rglob("*.py"))


def _owner(module: str) -> str:
    """`fullasync.engines.vllm.actor` → `engines`; `fullasync.api` → `api`; `fullasync` → `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_packages(source: str) -> set[str]:
    """The fullasync packages a module's source imports at run time (anywhere in it; `if TYPE_CHECKING:` blocks
    name types only and bind no load order, so they are left out)."""
    tree = ast.parse(source)
    skipped = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
               for inner in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "fullasync" else [f"fullasync.{a.name}" for a in node.names]
        found |= {_owner(name) for name in names if name.startswith("fullasync.")}
    return found


def layering_violations(owner: str, source: str) -> list[str]:
    allowed = ALLOWED[owner] | {owner}
    return sorted(imported_packages(source) - allowed)


def test_every_package_imports_only_the_layers_below_it():
    wrong = {}
    for path in _modules():
        owner = _owner(_module_name(path))
        assert owner in ALLOWED, f"{owner}: a new package or top-level module; give it a place in ALLOWED"
        if bad := layering_violations(owner, path.read_text()):
            wrong[_module_name(path)] = bad
    assert not wrong, f"imports that point up the layering (module: packages it may not import): {wrong}"


def test_the_layering_check_catches_an_inverted_import():
    inverted = "from fullasync.engines.vllm import launch_vllm_engines\n"
    assert layering_violations("trainer", inverted) == ["engines"]
    assert layering_violations("config", "def f():\n    from fullasync.trainer import VerlTrainer\n") == ["trainer"]
    assert layering_violations("contracts", "from fullasync import weights\n") == ["weights"]
    guarded = "if TYPE_CHECKING:\n    from fullasync.weights.stream import StreamPlan\n"
    assert layering_violations("contracts", guarded) == []


def test_no_module_passes_500_lines():
    long = {_module_name(p): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {long}"


def test_the_top_level_holds_at_most_six_modules():
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"top-level modules {top}: put new code in a package"


def any_count(source: str) -> int:
    return sum(1 for tok in tokenize.generate_tokens(io.StringIO(source).readline)
               if tok.type == tokenize.NAME and tok.string == "Any")


def test_any_does_not_rise_above_its_ceiling():
    count = sum(any_count(p.read_text()) for p in _modules())
    assert count <= ANY_CEILING, f"`Any` is written {count} times in fullasync/ (ceiling {ANY_CEILING}): type it"
    assert any_count("from typing import Any\nx: dict[str, Any] = {}  # Any\n") == 2


def test_architecture_page_names_only_packages_that_exist_and_every_package():
    page = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`(fullasync(?:/[a-z_]+)+/)`", page))
    assert named, "docs/architecture.md lists no package as `fullasync/<name>/`"
    missing = sorted(name for name in named if not (ROOT / name / "__init__.py").is_file())
    assert not missing, f"docs/architecture.md names packages that do not exist: {missing}"
    packages = {f"{p.parent.relative_to(ROOT).as_posix()}/" for p in PACKAGE.rglob("*/__init__.py")}
    assert not packages - named, f"packages docs/architecture.md does not describe: {sorted(packages - named)}"


# a probe: `getattr(<an engine or a loop>, "name", default)`: asking whether the object has what a contract should say
PROBES = re.compile(r"getattr\((?:engine|e|self\.engine|asyncio\.get_running_loop\(\)|loop),\s*\"\w+\",")


def test_nothing_probes_the_engine_contract_or_an_event_loop_with_getattr():
    """What callers use of an engine is in the `Engine` protocol, and a loop that runs work in place says so by its
    type (`infra.offload.RunsBlockingInline`): no `getattr(engine, "name", default)` (nor of a loop) anywhere."""
    found = [f"{path.relative_to(ROOT)}:{number}" for path in _modules()
             for number, line in enumerate(path.read_text().splitlines(), 1) if PROBES.search(line)]
    assert not found, f"run-time probing where a contract should say it: {found}"
    assert PROBES.search('capacity = getattr(engine, "kv_tokens", None)')
    assert PROBES.search('inline = getattr(asyncio.get_running_loop(), "run_blocking_inline", None)')
    assert not PROBES.search('if getattr(engine, name) < 1:')  # a config section's fields by name: not a probe


def test_architecture_page_names_every_module_of_run_and_only_those():
    page = (ROOT / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`run/([a-z_]+\.py)`", page))
    modules = {p.name for p in (PACKAGE / "run").glob("*.py") if p.name != "__init__.py"}
    assert named == modules, f"run/ modules the page omits: {sorted(modules - named)}; gone: {sorted(named - modules)}"


def test_no_constructor_in_run_takes_more_than_eight_parameters():
    """Components of `run/` are built from settings records, not from long parameter lists (dataclass records,
    which hold settings, are what they take)."""
    wide = {}
    for path in sorted((PACKAGE / "run").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                args = node.args
                count = len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs) - 1  # without self
                if count > 8:
                    wide[f"{path.name}:{node.lineno}"] = count
    assert not wide, f"constructors over 8 parameters: {wide}"


def test_each_package_says_what_it_does_not_own_and_may_import_exactly_what_the_layering_allows():
    """Each package's `__init__` docstring has a 'Does not own' and a 'May import:' naming the packages ALLOWED
    gives it: the page a newcomer reads and the rule this file enforces are the same list."""
    wrong = {}
    for init in sorted(PACKAGE.rglob("*/__init__.py")):
        name = _module_name(init)
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        said = re.search(r"May import:(.*?)(?:\n\n|$)", doc, re.S)
        if "Does not own" not in doc or said is None:
            wrong[name] = "no 'Does not own' / 'May import:' in its docstring"
            continue
        named = set(re.findall(r"`([a-z_]+)`", said.group(1)))
        if named != ALLOWED[_owner(name)]:
            wrong[name] = f"says {sorted(named)}, the layering allows {sorted(ALLOWED[_owner(name)])}"
    assert not wrong, f"package docstrings out of step with ALLOWED: {wrong}"


def _function_lengths(source: str) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            yield node.end_lineno - node.lineno + 1, f"{node.name} (line {node.lineno})"


def test_no_function_grows_past_the_ceiling():
    long = [f"{p.relative_to(ROOT)}: {name}, {n} lines" for p in _modules()
            for n, name in _function_lengths(p.read_text()) if n > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them): {long}"
    assert max(n for n, _ in _function_lengths("def f():\n    def g():\n        pass\n    return g\n")) == 4
