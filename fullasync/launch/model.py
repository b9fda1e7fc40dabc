"""The model directory of a run: `model.path` resolved, the chat template applied.

Owns: `resolve_model_path`. Loads neither the client nor an engine (exporting a checkpoint needs only this and the
trainer). Does not own: checking the template against the client's parsers (`parts.check_chat_setup`).
"""

from __future__ import annotations

from pathlib import Path

from fullasync.config import BUILTIN_MODEL, RunConfig
from fullasync.models import PRETRAINED_MODELS, build_pretrained_model, with_chat_template
from fullasync.models.hub import InvalidModelError, looks_like_hub_id, resolve_hub_model


def resolve_model_path(config: RunConfig) -> str:
    """The directory engines and trainer load: `model.path` resolved (a named model is converted and cached on first
    use) with `model.chat_template` applied. Whether template and parsers fit is `parts.check_chat_setup`'s."""
    model = config.model
    model.validate()
    if model.path == BUILTIN_MODEL:
        from fullasync.tasks.warmup import build_warm_policy  # trains the built-in policy on first use: only then

        base = build_warm_policy()
    elif model.path in PRETRAINED_MODELS:
        base = build_pretrained_model(model.path)
    elif Path(model.path).is_dir():
        base = Path(model.path)
    elif looks_like_hub_id(model.path):
        base = resolve_hub_model(model.path, model.revision)
    else:
        raise InvalidModelError(f"model.path={model.path!r} is not a local model directory, a hub ID (org/name), "
                                f"{BUILTIN_MODEL} or a named model ({', '.join(sorted(PRETRAINED_MODELS))})")
    return str(with_chat_template(base, model.chat_template))
