"""How a config field is declared, and what can be read back from its declaration.

Owns: `setting(...)` and `section(...)`, which declare a dataclass field with its one-line help and
whether a resumed run may set it differently (field metadata, which Hydra and OmegaConf ignore), the
readers of that metadata (`field_help`, `may_change_on_resume`), the walk over a config tree in
declaration order (`config_fields`), and `shared_settings`, which hands a component the values of its
own section under the names both declare. Does not own: any config (`fullasync.config.run`) or how help is
printed (`fullasync.config.doc`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

HELP = "help"
RESUME_MAY_CHANGE = "resume_may_change"


def setting(default: T, help: str, *, resume_may_change: bool = False) -> T:
    """A config field: its default, its one-line help, and whether a resumed run may change it.

    A dict or list default is copied for every instance (as `field(default_factory=...)` would)."""
    metadata = {HELP: help, RESUME_MAY_CHANGE: resume_may_change}
    if isinstance(default, (dict, list)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(factory: Callable[[], T], help: str, *, resume_may_change: bool = False) -> T:
    """A nested section (a dataclass made by `factory`); `resume_may_change` frees every field under it."""
    return dataclasses.field(default_factory=factory, metadata={HELP: help, RESUME_MAY_CHANGE: resume_may_change})


def _metadata(config_type: type, name: str) -> Mapping[str, Any]:
    """The metadata of field `name`: the nearest declaration that has any (a subclass may redeclare a field with
    another default only, keeping the help and the resume rule of the class it extends)."""
    for klass in config_type.__mro__:
        declared = getattr(klass, "__dataclass_fields__", {}).get(name)
        if declared is not None and declared.metadata:
            return declared.metadata
    return {}


def field_help(config_type: type, name: str) -> str:
    """The one-line help of field `name` of `config_type` ("" when it has none)."""
    return str(_metadata(config_type, name).get(HELP, ""))


def may_change_on_resume(config_type: type, name: str) -> bool:
    """Whether a resumed run may set field `name` of `config_type` differently from its checkpoint."""
    return bool(_metadata(config_type, name).get(RESUME_MAY_CHANGE, False))


@dataclass(frozen=True)
class ConfigField:
    """One field of a config tree, as documentation shows it."""

    name: str  # dotted: section.field
    type: str  # as declared
    value: Any  # in the instance walked (the defaults, when that is a default instance)
    help: str
    resume_may_change: bool  # set on the field or on a section above it
    section: str  # dotted name of the section holding it ("" = the top level)


@dataclass(frozen=True)
class ConfigSection:
    """A section of a config tree (the top level has name "")."""

    name: str
    type: type
    help: str
    resume_may_change: bool


def config_sections(config: Any, prefix: str = "", help: str = "", free: bool = False) -> Iterator[ConfigSection]:
    """Every section of the config instance `config`, the top level first, in declaration order."""
    yield ConfigSection(prefix, type(config), help, free)
    for declared in dataclasses.fields(config):
        value = getattr(config, declared.name)
        if dataclasses.is_dataclass(value):
            yield from config_sections(value, f"{prefix}{declared.name}.",
                                       field_help(type(config), declared.name),
                                       free or may_change_on_resume(type(config), declared.name))


def config_fields(config: Any, prefix: str = "", free: bool = False) -> Iterator[ConfigField]:
    """Every leaf field of the config instance `config` (sections walked in place), in declaration order."""
    config_type = type(config)
    for declared in dataclasses.fields(config):
        value = getattr(config, declared.name)
        free_here = free or may_change_on_resume(config_type, declared.name)
        if dataclasses.is_dataclass(value):
            yield from config_fields(value, f"{prefix}{declared.name}.", free_here)
        else:
            yield ConfigField(f"{prefix}{declared.name}", _type_name(declared.type), value,
                              field_help(config_type, declared.name), free_here, prefix.removesuffix("."))


def _type_name(declared: Any) -> str:
    """The declared type as written (a string under `from __future__ import annotations`)."""
    return declared.__name__ if isinstance(declared, type) else str(declared)


def shared_settings(section_value: Any, component_type: type) -> dict[str, Any]:
    """The fields of `section_value` that `component_type` declares under the same name, with their values
    (dicts and lists copied): how a component's config is made from its section with no field copied by hand."""
    wanted = {f.name for f in dataclasses.fields(component_type)}
    return {f.name: copy.copy(getattr(section_value, f.name)) for f in dataclasses.fields(section_value)
            if f.name in wanted}
