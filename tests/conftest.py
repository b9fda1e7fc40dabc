"""Fixtures every tier shares and that start nothing: the tiny model on disk and its tokenizer.

The heavy fixtures (Ray, a real vLLM engine, the gateway in front of it) live in `integration/conftest.py`,
so collecting `unit/` imports no Ray, vLLM or verl."""

from __future__ import annotations

import pytest

from fullasync.models import build_tiny_model, load_tokenizer


@pytest.fixture(scope="session")
def tiny_model_path() -> str:
    return str(build_tiny_model())


@pytest.fixture(scope="session")
def tokenizer(tiny_model_path):
    return load_tokenizer(tiny_model_path)
