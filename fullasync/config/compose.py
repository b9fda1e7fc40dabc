"""How a config class meets Hydra: the node registered for composition, and the composed config turned back into
an instance with nothing dropped on the way.

Owns: `schema_node` (a config class as the structured node a `ConfigStore` holds, its dict-valued fields open so
that `engine.vllm.enforce_eager=true` needs no `+`) and `build_config` (a composed config as an instance of its
class; a name no field declares, such as `+engine.gpu_memory_utilization=0.5`, which OmegaConf would drop without a
word, is refused in one line naming the nearest declared name).
Does not own: the fields (`fullasync.config.run`, `fullasync.config.trainer`, the examples' config modules) or the
names of arguments outside the config (a caller passes them: vLLM's engine arguments under `engine.vllm`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from omegaconf import DictConfig, OmegaConf

from fullasync.config.fields import config_fields, nearest_name, undeclared_settings

T = TypeVar("T")


class UndeclaredSettingError(ValueError):
    """A composed config names a setting no field declares."""


def schema_node(config_type: type) -> DictConfig:
    """`config_type` as a structured node for `ConfigStore.store`, its dict-valued fields (engine.vllm,
    ray_resources) open to new keys on the command line without `+`."""
    node = OmegaConf.structured(config_type)
    for field in config_fields(config_type()):
        if isinstance(field.value, dict):
            held = OmegaConf.select(node, field.name)
            assert isinstance(held, DictConfig)  # a dict-valued field's node
            OmegaConf.set_struct(held, False)
    return node


def build_config(composed: DictConfig, config_type: type[T],
                 more_names: Callable[[], Iterable[str]] = lambda: ()) -> T:
    """The instance of `config_type` that `composed` (Hydra's composition of it) describes. A name no field
    declares raises UndeclaredSettingError naming it and the nearest declared name, drawn from the fields and
    from `more_names()` (dotted names a dict-valued field accepts, asked for only when something is wrong)."""
    plain = OmegaConf.to_container(composed, resolve=False)
    assert isinstance(plain, dict)
    unknown = undeclared_settings({str(key): value for key, value in plain.items()}, config_type)
    if unknown:
        names = [field.name for field in config_fields(config_type())] + list(more_names())
        raise UndeclaredSettingError("; ".join(_refusal(name, nearest_name(name, names)) for name in unknown))
    built = OmegaConf.to_object(composed)
    assert isinstance(built, config_type)  # the schema Hydra composed
    return built


def _refusal(name: str, nearest: str | None) -> str:
    guess = f" (did you mean {nearest}?)" if nearest else ""
    return f"{name} is not a setting{guess}; --help lists every setting"
