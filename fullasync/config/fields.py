"""How a config field is declared, and what can be read back from its declaration.

Owns: `setting(...)` and `section(...)`, which declare a dataclass field with its one-line help and
whether a resumed run may set it differently (field metadata, which Hydra and OmegaConf ignore), the
readers of that metadata (`field_help`, `may_change_on_resume`), the walk over a config tree in
declaration order (`config_fields`), `shared_settings`, which hands a component the values of its
own section under the names both declare, and the names a composed config holds that no field declares
(`undeclared_settings`, with `nearest_name` for the "did you mean"). Does not own: any config
(`fullasync.config.run`) or how help is printed (`fullasync.config.doc`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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


def _metadata(config_type: type, name: str) -> Mapping[str, object]:
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


def config_sections(config: object, prefix: str = "", help: str = "", free: bool = False) -> Iterator[ConfigSection]:
    """Every section of the config instance `config`, the top level first, in declaration order."""
    if not dataclasses.is_dataclass(config):  # as dataclasses.fields would refuse it
        raise TypeError("must be called with a dataclass type or instance")
    yield ConfigSection(prefix, type(config), help, free)
    for declared in dataclasses.fields(config):
        value = getattr(config, declared.name)
        if dataclasses.is_dataclass(value):
            yield from config_sections(value, f"{prefix}{declared.name}.",
                                       field_help(type(config), declared.name),
                                       free or may_change_on_resume(type(config), declared.name))


def config_fields(config: object, prefix: str = "", free: bool = False) -> Iterator[ConfigField]:
    """Every leaf field of the config instance `config` (sections walked in place), in declaration order."""
    if not dataclasses.is_dataclass(config):  # as dataclasses.fields would refuse it
        raise TypeError("must be called with a dataclass type or instance")
    config_type = type(config)
    for declared in dataclasses.fields(config):
        value = getattr(config, declared.name)
        free_here = free or may_change_on_resume(config_type, declared.name)
        if dataclasses.is_dataclass(value):
            yield from config_fields(value, f"{prefix}{declared.name}.", free_here)
        else:
            yield ConfigField(f"{prefix}{declared.name}", _type_name(declared.type), value,
                              field_help(config_type, declared.name), free_here, prefix.removesuffix("."))


def _type_name(declared: object) -> str:
    """The declared type as written (a string under `from __future__ import annotations`)."""
    return declared.__name__ if isinstance(declared, type) else str(declared)


def shared_settings(section_value: DataclassInstance, component_type: type[DataclassInstance]) -> dict[str, Any]:
    """The fields of `section_value` that `component_type` declares under the same name, with their values
    (dicts and lists copied): how a component's config is made from its section with no field copied by hand.
    (`Any`: keyword arguments for `component_type`, each of the type both fields declare.)"""
    wanted = {f.name for f in dataclasses.fields(component_type)}
    return {f.name: copy.copy(getattr(section_value, f.name)) for f in dataclasses.fields(section_value)
            if f.name in wanted}


def undeclared_settings(values: Mapping[str, object], config_type: type) -> list[str]:
    """The dotted names in `values` (a composed config as plain dicts) that no field of `config_type` declares,
    sections walked in place; a dict-valued field (ray_resources, engine.vllm) holds names of its own."""
    sections = {section.name: section.type for section in config_sections(config_type())}

    def walk(here: Mapping[str, object], prefix: str) -> Iterator[str]:
        declared = {f.name for f in dataclasses.fields(sections[prefix])}
        for key, value in here.items():
            if key not in declared:
                yield f"{prefix}{key}"
            elif f"{prefix}{key}." in sections and isinstance(value, Mapping):
                yield from walk(value, f"{prefix}{key}.")

    return list(walk(values, ""))


def nearest_name(name: str, candidates: Iterable[str]) -> str | None:
    """The declared dotted name `name` most likely meant: one with the same last part (the closest of those),
    else the closest whole name, else the one whose last part is closest; None when nothing is close."""
    candidates = list(candidates)
    leaf = name.rsplit(".", 1)[-1]
    same_leaf = [candidate for candidate in candidates if candidate.rsplit(".", 1)[-1] == leaf]
    if same_leaf:
        return max(same_leaf, key=lambda candidate: difflib.SequenceMatcher(None, name, candidate).ratio())
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
    if close:
        return close[0]
    by_leaf = {candidate.rsplit(".", 1)[-1]: candidate for candidate in candidates}
    close = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75)
    return by_leaf[close[0]] if close else None
