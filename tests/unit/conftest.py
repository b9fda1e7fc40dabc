"""The unit tier: pure Python (torch and transformers allowed), no Ray, vLLM or verl; the whole tier runs in
under 90 s. Every test in this directory is marked `unit`; a session that collected only unit tests fails if
one of them (or what it imports) imported Ray, vLLM or verl: such a test belongs in `integration/`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FORBIDDEN = ("ray", "vllm", "verl")
ONLY_UNIT = pytest.StashKey[bool]()  # every collected test (before -m/-k deselection) is in this directory


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    config.stash[ONLY_UNIT] = all(HERE in Path(item.path).parents for item in items)
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.unit)


def pytest_sessionfinish(session, exitstatus):
    """Fail a unit-only session in which Ray, vLLM or verl got imported (other tiers may import anything)."""
    if not session.config.stash.get(ONLY_UNIT, False):
        return
    imported = [name for name in FORBIDDEN if name in sys.modules]
    if imported:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        session.config.get_terminal_writer().line(
            f"the unit tier imported {imported}: a test in tests/unit needs Ray/vLLM/verl; move it to "
            "tests/integration", red=True, bold=True)
