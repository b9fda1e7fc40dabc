"""Checks of single config values that need no component: Ray resource requests, logger names, chat-template
names. Owns the rules and the choice lists (`LOGGERS`, `BUILTIN_CHAT_TEMPLATES`, `PREDEFINED_RESOURCES`); the
components that act on the values (`fullasync.infra.placement`, `fullasync.observe.tracking`,
`fullasync.models.chat_templates`) import them from here, so the config stays a leaf.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

LOGGERS = ("wandb", "mlflow", "swanlab", "tensorboard")

BUILTIN_CHAT_TEMPLATES = {
    "chatml-tools": "chatml_tools.jinja",  # ChatML + Hermes/Qwen tool calls, for any ChatML model
    "qwen2.5-tools": "chat_template.jinja",  # the tiny model's own: Qwen2.5 style, default system prompt
}


# Ray's own resources are asked for through num_cpus / num_gpus / memory, never through `resources`.
PREDEFINED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_ray_resources(field_name: str, resources: Mapping[str, float]) -> None:
    """Raise ValueError naming `field_name` unless `resources` is a valid Ray custom-resource request.

    Names are non-empty strings other than Ray's predefined resources; amounts are finite and > 0,
    and whole numbers when above 1 (Ray's rule for fractional resources).
    """
    if not isinstance(resources, Mapping):
        raise ValueError(f"{field_name}={resources!r} must be a mapping of resource name to amount, "
                         'e.g. {"engine_node": 0.01}')
    for name, amount in resources.items():
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{field_name}: resource name {name!r} must be a non-empty string")
        if name in PREDEFINED_RESOURCES:
            raise ValueError(f"{field_name}: {name!r} is one of Ray's predefined resources; list only custom "
                             "resources here (CPUs and GPUs are set by the component's own fields)")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise ValueError(f"{field_name}[{name!r}]={amount!r} must be a number")
        if not math.isfinite(amount) or amount <= 0:
            raise ValueError(f"{field_name}[{name!r}]={amount!r} must be finite and > 0")
        if amount > 1 and amount != int(amount):
            raise ValueError(f"{field_name}[{name!r}]={amount!r}: Ray allows fractions only up to 1; "
                             "use a whole number or a fraction <= 1")


def validate_logger_names(loggers: Sequence[str]) -> None:
    """Known names, each once (a cheap check of the config; `check_loggers` checks the environment)."""
    unknown = [name for name in loggers if name not in LOGGERS]
    if unknown:
        raise ValueError(f"logging.loggers={list(loggers)}: {unknown} unknown; choose from {list(LOGGERS)} "
                         "(metrics.jsonl and the console line are always written)")
    if len(set(loggers)) != len(loggers):
        raise ValueError(f"logging.loggers={list(loggers)} names a logger twice")


def check_chat_template_name(value: str) -> None:
    """`model.chat_template` names a built-in template or a readable file (read once the model is loaded)."""
    if value in BUILTIN_CHAT_TEMPLATES or Path(value).expanduser().is_file():
        return
    raise ValueError(f"model.chat_template={value!r} is neither a built-in template "
                     f"({', '.join(sorted(BUILTIN_CHAT_TEMPLATES))}) nor a readable file")


def check_gateway_host(host: str) -> None:
    """`rollout.gateway_host` must be one address a harness can be pointed at (not a wildcard bind)."""
    if host in ("", "0.0.0.0", "::"):
        raise ValueError(f"rollout.gateway_host={host!r} binds every address, and no base URL can name that; give "
                         "the one address the harnesses reach (127.0.0.1 on this machine)")
    if any(c in host for c in "/@ ") or host.startswith("["):
        raise ValueError(f"rollout.gateway_host={host!r} is not an address or host name (no scheme, port or "
                         "brackets: e.g. 127.0.0.1, ::1 or 10.0.0.5)")


def parse_cpus(field_name: str, text: str) -> list[int]:
    """The CPU ids of a Linux CPU list (`0`, `0-3`, `0-3,6,8-9`; "" = none given), sorted; a ValueError naming
    `field_name` and the expected form otherwise."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")) if text.strip() else ():
        low, dash, high = part.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()) or (dash and int(high) < int(low)):
            raise ValueError(f"{field_name}={text!r} is not a CPU list: write ids and ranges such as 0, 0-3 or "
                             "0-3,6 (as taskset -c takes them)")
        cpus.update(range(int(low), int(high if dash else low) + 1))
    return sorted(cpus)
