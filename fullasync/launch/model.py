"""The model directory of a run: `model.path` resolved, the chat template applied.

Owns: `resolve_model_path` and `resolve_model` (any setting's model, a served judge's too). Loads neither the
client nor an engine (exporting a checkpoint needs only this and the trainer). Does not own: checking the
template against the client's parsers (`parts.check_chat_setup`).
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
    return str(with_chat_template(resolve_model(model.path, model.revision), model.chat_template))


def resolve_model(path: str, revision: str = "", setting: str = "model.path") -> Path:
    """The directory of `path`: a local model directory, a hub ID (org/name, at `revision`), the built-in warm
    policy or a named model (converted and cached on first use); InvalidModelError naming `setting` otherwise."""
    if path == BUILTIN_MODEL:
        from fullasync.tasks.warmup import build_warm_policy  # trains the built-in policy on first use: only then

        return build_warm_policy()
    if path in PRETRAINED_MODELS:
        return build_pretrained_model(path)
    if Path(path).is_dir():
        return Path(path)
    if looks_like_hub_id(path):
        return resolve_hub_model(path, revision)
    raise InvalidModelError(f"{setting}={path!r} is not a local model directory, a hub ID (org/name), "
                            f"{BUILTIN_MODEL} or a named model ({', '.join(sorted(PRETRAINED_MODELS))})")
