"""Model artifacts fullasync builds itself (the tiny offline Qwen2-style model, named pretrained models
converted offline, chat-template overrides), and the build cache they share.

- `tiny.py`: the tiny model and its tokenizer; `pretrained.py` / `hub.py`: a real model shipped in a registry
  package, and hub ids; `chat_templates.py`: built-in templates; `cache.py`: atomic, complete-or-absent builds.

Does not own: serving or training a model. May import: `contracts`, `config`, `infra`, `types`, `errors`.
"""

from fullasync.models.cache import BUILD_MARKER, cached_build, is_complete_build
from fullasync.models.chat_templates import (
    BUILTIN_CHAT_TEMPLATES,
    check_chat_setup,
    read_chat_template_source,
    with_chat_template,
)
from fullasync.models.pretrained import (
    PRETRAINED_MODELS,
    MissingModelPackageError,
    PretrainedModelSpec,
    build_pretrained_model,
)
from fullasync.models.tiny import (
    BUILD_FORMAT,
    CACHE_DIR_ENV,
    TinyModelSpec,
    build_tiny_model,
    default_cache_root,
    load_tokenizer,
    read_chat_template,
)

__all__ = [
    "BUILD_FORMAT",
    "BUILD_MARKER",
    "BUILTIN_CHAT_TEMPLATES",
    "CACHE_DIR_ENV",
    "PRETRAINED_MODELS",
    "MissingModelPackageError",
    "PretrainedModelSpec",
    "TinyModelSpec",
    "build_pretrained_model",
    "build_tiny_model",
    "cached_build",
    "check_chat_setup",
    "default_cache_root",
    "is_complete_build",
    "load_tokenizer",
    "read_chat_template",
    "read_chat_template_source",
    "with_chat_template",
]
