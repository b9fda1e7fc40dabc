"""Token-exactness on a real tokenizer and template (SmolLM2-135M-Instruct + chatml-tools), as a property.

Random multi-turn tool conversations go through the real `RolloutClient`; only the engine is an
edge fake that "samples" scripted tokens: the template's own text for a random assistant message,
tokenized the way the model might have produced it (canonically in isolation, or split at random
character boundaries), ended by EOS or cut by max_tokens. For every conversation the recorded
training sequence must spell the template's rendering of the final conversation and carry loss
mask 1 exactly on the sampled tokens. Naive re-tokenization of the same rendering is compared
against it, and the conversations where it drifts are counted (and must exist: that is the bug
this client prevents).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable

import pytest
from scripted_engine import ScriptedEngine

from fullasync.client import RolloutService
from fullasync.client.messages import normalize_messages
from fullasync.models import build_pretrained_model, load_tokenizer, with_chat_template

NUM_CONVERSATIONS = 240
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "search", "description": "Search the notes.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}},
]
FRAGMENTS = ("hello", "world", "The answer is", "42", "3.14", "café", "naïve", "日本語", "数学", "Привет", "🙂",
             "👩‍💻", "→", "≤", "x=1;", "{\"k\": [1, 2]}", "<b>", "a\tb", "end.", "e\u0301", "ﬁ", "  spaced  ",
             "'quoted'", "\"double\"", "C:\\path", "#", "---", "100%")
EDGES = ("", "", "", " ", "  ", "\n", "\n\n", "\t", " \n", "\r\n")


@pytest.fixture(scope="module")
def smollm2_tools_tokenizer():
    return load_tokenizer(with_chat_template(build_pretrained_model("smollm2-135m-instruct"), "chatml-tools"))


def random_text(rng: random.Random, allow_empty: bool = True) -> str:
    words = [rng.choice(FRAGMENTS) for _ in range(rng.randint(0 if allow_empty else 1, 6))]
    separators = [rng.choice((" ", " ", "", "\n", ", ", "  ")) for _ in words]
    body = "".join(w + s for w, s in zip(words, separators)).rstrip(" ") if words else ""
    return rng.choice(EDGES) + body + rng.choice(EDGES)


def random_reply(rng: random.Random, with_tools: bool) -> dict:
    """An assistant message: text (edge whitespace and empty allowed), or tool calls with optional text."""
    if not with_tools or rng.random() < 0.5:
        return {"role": "assistant", "content": random_text(rng)}
    calls = []
    for index in range(rng.choice((1, 1, 2))):
        if rng.random() < 0.5:
            name, arguments = "add", {"a": rng.randint(-50, 999), "b": rng.randint(0, 9)}
        else:
            name, arguments = "search", {"query": random_text(rng, allow_empty=False).strip() or "q"}
        calls.append({"id": f"call-{index}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}})
    content = random_text(rng).strip() if rng.random() < 0.4 else None  # the parser strips text around calls
    return {"role": "assistant", "content": content or None, "tool_calls": calls}


def sampled_ids(rng: random.Random, chat, history: list[dict], reply: dict, tools) -> tuple[list[int], str]:
    """Token ids a model could have sampled for `reply` after `history`, and how they were tokenized."""
    before = chat.render(history, tools, generation_prompt=True)
    with_reply = chat.render(history + [reply], tools, generation_prompt=False)
    text = with_reply[len(before) : with_reply.rindex(chat.eos_text)]
    if rng.random() < 0.6 or len(text) < 2:
        return chat.encode(text), "canonical"
    cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 4))))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    return [i for piece in pieces for i in chat.encode(piece)], "split"


def length_cut(rng: random.Random, chat, ids: list[int]) -> list[int] | None:
    """A prefix of `ids` that decodes cleanly (a turn cut by max_tokens), or None if there is none."""
    cleanly = [k for k in range(1, len(ids)) if "\ufffd" not in chat.tokenizer.decode(ids[:k])]
    return ids[: rng.choice(cleanly)] if cleanly else None


async def run_conversation(seed: int, tokenizer) -> dict:
    """One random episode through the client; returns what the property checks need."""
    rng = random.Random(seed)
    engine = ScriptedEngine()
    client = RolloutService([engine], tokenizer).client()
    chat = client.service.chat_tokens
    tools = TOOLS if rng.random() < 0.8 else None
    messages: list[dict] = []
    if rng.random() < 0.7:
        messages.append({"role": "system", "content": random_text(rng)})
    messages.append({"role": "user", "content": random_text(rng)})
    styles = []
    turns = rng.randint(1, 4)
    for turn in range(turns):
        reply = random_reply(rng, with_tools=tools is not None)
        ids, style = sampled_ids(rng, chat, messages, reply, tools)
        can_cut = turn < turns - 1 and "tool_calls" not in reply and rng.random() < 0.2
        cut = length_cut(rng, chat, ids) if can_cut else None
        if cut is not None:
            engine.script.append(cut)
            max_tokens, style = len(cut), style + "+cut"
        else:
            engine.script.append(ids + [chat.eos_token_id])
            max_tokens = len(ids) + 1 + rng.randint(0, 5)
        styles.append(style)
        response = await client.chat.completions.create(model="policy", messages=messages, tools=tools,
                                                        max_tokens=max_tokens)
        messages.append(response.choices[0].message.model_dump(exclude_none=True))
        if turn == turns - 1:
            break
        for call in response.choices[0].message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": random_text(rng)})
        if not response.choices[0].message.tool_calls or rng.random() < 0.3:
            if rng.random() < 0.1:
                messages.append({"role": "system", "content": random_text(rng)})
            messages.append({"role": "user", "content": random_text(rng)})
    return {"client": client, "chat": chat, "messages": messages, "tools": tools, "styles": styles}


def check_conversation(case: dict, decode: Callable[[list[int]], str]) -> tuple[list[str], bool]:
    """Property violations of one conversation, and whether naive re-tokenization drifts on it."""
    client, chat, messages, tools = case["client"], case["chat"], case["messages"], case["tools"]
    calls = client.episode.calls
    problems = []
    sequences = client.trajectory(reward=0.0).to_sequences()
    if len(sequences) != 1:
        return [f"{len(sequences)} sequences, expected one merged sequence"], False
    (sequence,) = sequences
    ids = list(sequence.token_ids)
    # rendered as the client renders: normalized (tool-call arguments decoded from their JSON strings)
    rendered = chat.render(normalize_messages(messages), tools, generation_prompt=False)
    if not rendered.endswith(chat.eos_text + "\n"):
        problems.append("the rendering does not end with a closed assistant turn")
    if decode(ids) != rendered[: -len("\n")]:
        problems.append(f"decoded sequence != rendering:\n{decode(ids)!r}\n{rendered!r}")
    expected_mask = [0] * len(ids)
    for call in calls:
        start = len(call.prompt_ids)
        if list(ids[start : start + len(call.output_ids)]) != list(call.output_ids):
            problems.append("a call's sampled ids are not where its prompt ends")
        expected_mask[start : start + len(call.output_ids)] = [1] * len(call.output_ids)
    if list(sequence.loss_mask) != expected_mask:
        problems.append("loss mask is not 1 exactly on the sampled tokens")
    naive = chat.encode(rendered[: -len("\n")])
    return problems, naive != ids


async def test_recorded_sequences_spell_the_template_rendering_and_naive_retokenization_drifts(
        smollm2_tools_tokenizer):
    tokenizer = smollm2_tools_tokenizer
    failures, drifted, drifted_canonical = [], 0, 0
    turns = 0
    for seed in range(NUM_CONVERSATIONS):
        case = await run_conversation(seed, tokenizer)
        problems, drifts = check_conversation(case, lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        failures += [f"seed {seed}: {p}" for p in problems]
        drifted += drifts
        drifted_canonical += drifts and all(s == "canonical" for s in case["styles"])
        turns += len(case["client"].episode.calls)
    print(f"\n{NUM_CONVERSATIONS} conversations ({turns} model calls): naive re-tokenization drifts on {drifted} "
          f"({drifted_canonical} where every turn was sampled as its canonical tokenization); ours on 0")
    assert not failures, "\n".join(failures[:5])
    assert drifted_canonical > 0, "expected the real tokenizer to drift at turn boundaries even for canonical turns"
