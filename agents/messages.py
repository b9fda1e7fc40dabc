"""The records that cross the zygote boundary — a JSON line to the zygote, a JSON file back — typed on both sides.

Owns: `Message`, the base of those records (frozen dataclasses): `to_json()` gives JSON-ready data, and
`from_json(data)` rebuilds the record and checks every field against its annotation — `str`, `int`, `float`,
`bool`, `None`, unions of them, `list[...]`, `dict[str, ...]`, nested messages, and `JsonValue` where the value
is free-form (a harness's own configuration, its chat messages) — raising `MessageError`, which names the
record, the field, what was expected and what came. Also the zygote's own records: `EpisodeRequest` (one
episode to fork) and `ForkReply`. Stdlib plus `fullasync.types` (itself stdlib only), so it loads in any
interpreter a harness runs in. Does not own: what a harness's spec and result hold (each adapter's `messages`
module) or how they travel (`zygote`, `launcher`).
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from fullasync.types import JsonValue

M = TypeVar("M", bound="Message")


class MessageError(ValueError):
    """A record that crossed the zygote boundary does not match its type; the message says where and how."""


class _FreeJson:
    """Stands for `JsonValue` in a resolved annotation: any value JSON can hold."""


@dataclass(frozen=True)
class Message:
    """Base of the records exchanged with a harness process; subclasses are frozen dataclasses."""

    _annotations: ClassVar[dict[type, dict[str, object]]] = {}  # resolved field annotations, per class

    def to_json(self) -> dict[str, JsonValue]:
        """The record as JSON-ready data (nested messages as objects)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls: type[M], data: object, where: str = "") -> M:
        """The record `data` describes; `MessageError` naming the field when it does not match."""
        name = where or cls.__name__
        if not isinstance(data, Mapping):
            raise MessageError(f"{name}: expected a JSON object, got {_shown(data)}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise MessageError(f"{name}: unknown field(s) {unknown}; expected only {sorted(fields)}")
        values = {}
        annotations = _resolved(cls)
        for field_name, field in fields.items():
            if field_name in data:
                values[field_name] = _checked(data[field_name], annotations[field_name], f"{name}.{field_name}")
            elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise MessageError(f"{name}.{field_name} is missing")
        return cls(**values)


@dataclass(frozen=True)
class EpisodeRequest(Message):
    """One line to the zygote: fork an episode process that runs `spec` (the harness's own spec record)."""

    spec: dict[str, JsonValue]
    result_path: str  # where the episode writes its result record (atomically)
    log_path: str  # the episode process's stdout and stderr


@dataclass(frozen=True)
class ForkReply(Message):
    """The zygote's answer to an `EpisodeRequest`: the episode's pid, or why the request was refused."""

    pid: int = 0
    error: str = ""  # non-empty: the request or its spec did not match its type; no process was started


def _resolved(cls: type[Message]) -> dict[str, object]:
    """The field annotations of `cls` as objects, `JsonValue` as `_FreeJson` (our own annotations, evaluated once)."""
    if cls not in Message._annotations:
        namespace = {**vars(sys.modules[cls.__module__]), "JsonValue": _FreeJson}
        Message._annotations[cls] = {f.name: eval(f.type, namespace) if isinstance(f.type, str) else f.type
                                     for f in dataclasses.fields(cls)}
    return Message._annotations[cls]


def _checked(value: object, annotation: object, where: str) -> object:
    """`value` checked against `annotation` (nested messages built, JSON integers accepted as floats)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is _FreeJson:
        if not _is_json(value):
            raise MessageError(f"{where}: expected a JSON value, got {_shown(value)}")
        return value
    if origin in (typing.Union, types.UnionType):
        for choice in args:
            try:
                return _checked(value, choice, where)
            except MessageError:
                continue
        raise MessageError(f"{where}: expected {_named(annotation)}, got {_shown(value)}")
    if annotation is None or annotation is type(None):
        if value is not None:
            raise MessageError(f"{where}: expected null, got {_shown(value)}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise MessageError(f"{where}: expected a number, got {_shown(value)}")
        return float(value)
    if annotation in (str, int, bool):
        if type(value) is not annotation:
            raise MessageError(f"{where}: expected {_named(annotation)}, got {_shown(value)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise MessageError(f"{where}: expected a list, got {_shown(value)}")
        return [_checked(item, args[0], f"{where}[{index}]") for index, item in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
            raise MessageError(f"{where}: expected an object with string keys, got {_shown(value)}")
        return {key: _checked(item, args[1], f"{where}[{key!r}]") for key, item in value.items()}
    if isinstance(annotation, type) and issubclass(annotation, Message):
        return annotation.from_json(value, where)
    raise TypeError(f"{where}: a message field cannot be annotated {annotation!r}")


def _is_json(value: object) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_json(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and _is_json(item) for key, item in value.items())
    return False


def _named(annotation: object) -> str:
    if annotation is _FreeJson:
        return "a JSON value"
    return annotation.__name__ if isinstance(annotation, type) else str(annotation).replace("NoneType", "None")


def _shown(value: object) -> str:
    text = repr(value)
    return f"{text[:80]}{'...' if len(text) > 80 else ''} ({type(value).__name__})"
