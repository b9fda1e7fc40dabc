"""Response and tool-call ids: OpenAI's shape, unique without a uuid per response."""

from __future__ import annotations

import re
import subprocess
import sys

from fullasync.client import chat_answers
from fullasync.client.tool_parsers import ParsedToolCall


def test_response_ids_are_unique_and_shaped_like_openai_ids():
    ids = [chat_answers.response_id("chatcmpl") for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"chatcmpl-[0-9a-f]{32}", i) for i in ids)
    calls = chat_answers.tool_call_objects([ParsedToolCall("f", {"x": 1})] * 3)
    assert len({c.id for c in calls}) == 3
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c.id) for c in calls)


def test_another_process_draws_other_ids():
    """Ids from two driver processes (two runs writing one log) do not collide: the prefix is random."""
    code = "from fullasync.client import chat_answers; print(chat_answers.response_id('cmpl'))"
    first, second = (subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
                     for _ in range(2))
    assert first.startswith("cmpl-") and first != second
