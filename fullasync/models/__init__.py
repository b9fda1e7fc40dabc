"""Model artifacts fullasync builds itself; today the tiny offline Qwen2-style test model."""

from fullasync.models.tiny import (
    BUILD_FORMAT,
    BUILD_MARKER,
    CACHE_DIR_ENV,
    TinyModelSpec,
    build_tiny_model,
    default_cache_root,
    is_complete_build,
    load_tokenizer,
    read_chat_template,
)

__all__ = [
    "BUILD_FORMAT",
    "BUILD_MARKER",
    "CACHE_DIR_ENV",
    "TinyModelSpec",
    "build_tiny_model",
    "default_cache_root",
    "is_complete_build",
    "load_tokenizer",
    "read_chat_template",
]
