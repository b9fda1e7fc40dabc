"""`RayEngine` satisfies the `Engine` protocol structurally — every method with the protocol's parameters and
kind (coroutine, or async generator for `generate_stream`), as `unit/test_typed_seams.py` checks the simulator's
engine; nothing is started: the handle is checked, not an engine."""

from __future__ import annotations

import inspect

from fullasync.contracts.engine import Engine
from fullasync.engines.vllm import RayEngine, VLLMEngineConfig


def test_the_ray_engine_satisfies_the_engine_protocol():
    methods = {name for name, value in vars(Engine).items() if not name.startswith("_") and callable(value)}
    for name in methods:
        expected, actual = getattr(Engine, name), getattr(RayEngine, name)
        assert list(inspect.signature(actual).parameters) == list(inspect.signature(expected).parameters), name
        kind = {"generate_stream": inspect.isasyncgenfunction, "mark_dead": inspect.isfunction}.get(
            name, inspect.iscoroutinefunction)
        assert kind(actual), f"RayEngine.{name} is not {kind.__name__.removeprefix('is')}"
    handle = RayEngine(None, "engine-x", VLLMEngineConfig(model_path="/nonexistent"))
    assert isinstance(handle, Engine) and handle.death is None
