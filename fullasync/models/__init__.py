"""Model artifacts fullasync builds itself (the tiny offline Qwen2-style model), and the build cache they share."""

from fullasync.models.cache import BUILD_MARKER, cached_build, is_complete_build
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
    "CACHE_DIR_ENV",
    "TinyModelSpec",
    "build_tiny_model",
    "cached_build",
    "default_cache_root",
    "is_complete_build",
    "load_tokenizer",
    "read_chat_template",
]
