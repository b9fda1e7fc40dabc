"""vLLM's own engine arguments as a run passes them (`engine.vllm`): checked against the installed vLLM's
`EngineArgs` before anything starts, and split between the engine's own fields and the rest.

Owns: which arguments the run sets from its own settings (`SET_BY_RUN`, refused under `engine.vllm` with the
setting to use), `check_engine_args` (an unknown name, a refused one or a value of the wrong type: one line) and
`engine_arg_names` (the names a "did you mean" may offer). Does not own: starting an engine (`actor.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fullasync.config.fields import nearest_name
from fullasync.infra.cache_root import default_cache_root

SECTION = "engine.vllm"

# EngineArgs the run sets from its own settings (the setting to use), or needs as they are (why)
SET_BY_RUN = {
    "model": "model.path", "tokenizer": "model.path", "served_model_name": "model.served_name",
    "dtype": "engine.dtype", "seed": "seed", "max_model_len": "engine.max_model_len",
    "tensor_parallel_size": "engine.tensor_parallel_size", "max_logprobs": "engine.max_logprobs",
    "kv_cache_memory_bytes": "engine.kv_cache_mb",
    "logprobs_mode": "nothing: the corrections need the log-probs of the sampling policy (processed_logprobs)",
    "scheduling_policy": "nothing: the rollouter schedules by priority (the rows nearest the staleness bound first)",
    "weight_transfer_config": "nothing: the weight pushes need the run's own transfer backend",
}


@functools.cache
def _engine_arg_types() -> dict[str, object]:
    """Each EngineArgs field of the installed vLLM, with its type where it can be read (else None)."""
    import vllm.engine.arg_utils as arg_utils

    types: dict[str, object] = {}
    for declared in dataclasses.fields(arg_utils.EngineArgs):
        kind = declared.type
        if isinstance(kind, str):
            try:
                kind = eval(kind, vars(arg_utils))  # vLLM's own annotation, read in vLLM's namespace
            except NameError:  # an annotation naming what the module imports only for type checkers
                kind = None
        types[declared.name] = kind
    return types


def engine_arg_names(cache: Path | None = None) -> list[str]:
    """`engine.vllm.<name>` for every argument the installed vLLM's EngineArgs declares (none without vLLM),
    read from vLLM once per installed copy of its `arg_utils.py` and kept in `cache` (default `<cache root>/vllm`):
    importing vLLM's arguments takes ~16 s here, and a mistyped setting's "did you mean" should not wait for it."""
    source = _arg_utils_file()
    if source is None:
        return []
    stat = source.stat()
    copy = hashlib.sha256(f"{source}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    kept = (cache if cache is not None else default_cache_root() / "vllm") / f"engine-args-{copy}.json"
    names = _kept_names(kept)
    if names is None:
        try:
            names = list(_engine_arg_types())
        except ImportError:
            return []
        _keep_names(kept, names)
    return [f"{SECTION}.{name}" for name in names]


def _arg_utils_file() -> Path | None:
    """vLLM's `engine/arg_utils.py`, found without importing vLLM (None when vLLM is not installed)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / "engine" / "arg_utils.py"
    return source if source.is_file() else None


def _kept_names(path: Path) -> list[str] | None:
    try:
        names = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return names if isinstance(names, list) and all(isinstance(name, str) for name in names) else None


def _keep_names(path: Path, names: list[str]) -> None:
    """Written whole or not at all (another process may read it meanwhile); a cache that cannot be written is
    skipped: the names are read from vLLM again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        partial.write_text(json.dumps(names))
        partial.replace(path)
    except OSError:
        pass


def check_engine_args(args: Mapping[str, object]) -> None:
    """Raise ValueError (one line) when an argument is not vLLM's, is one the run sets itself, or has a value
    vLLM's declared type does not take (vLLM imported only when there is something to check)."""
    if not args:
        return
    from pydantic import TypeAdapter, ValidationError
    from pydantic.errors import PydanticSchemaGenerationError

    types = _engine_arg_types()
    for name, value in args.items():
        if name in SET_BY_RUN:
            raise ValueError(f"{SECTION}.{name}: the run sets it; set {SET_BY_RUN[name]}")
        if name not in types:
            guess = nearest_name(f"{SECTION}.{name}", engine_arg_names())
            raise ValueError(f"{SECTION}.{name} is not an argument of the installed vLLM's EngineArgs"
                             + (f" (did you mean {guess}?)" if guess else ""))
        if types[name] is None:
            continue
        try:
            TypeAdapter(types[name]).validate_python(value)  # type: ignore[arg-type]  # vLLM's annotation, read at run time
        except PydanticSchemaGenerationError:  # a type pydantic cannot check; vLLM checks it when the engine starts
            continue
        except ValidationError as error:
            raise ValueError(f"{SECTION}.{name}={value!r}: vLLM takes {_type_name(types[name])} "
                             f"({error.errors()[0]['msg']})") from None


def split_engine_args(args: Mapping[str, object], own_fields: set[str]) -> tuple[dict[str, Any], dict[str, object]]:
    """(the arguments the engine config declares as fields of its own, the rest), after `check_engine_args` (which
    checked their types against vLLM's: the fields' values are typed as the config needs them)."""
    check_engine_args(args)
    own = {name: value for name, value in args.items() if name in own_fields}
    return own, {name: value for name, value in args.items() if name not in own_fields}


def _type_name(kind: object) -> str:
    return kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")
