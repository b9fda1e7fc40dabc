"""The tiny offline model: deterministic build, cache behaviour, tokenizer, chat template, loading.

vLLM loading is exercised by the engine tests; here everything runs on transformers/tokenizers.
"""

from __future__ import annotations

import json
import os
import random
import unicodedata
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from fullasync.models import (
    BUILD_MARKER,
    CACHE_DIR_ENV,
    TinyModelSpec,
    build_tiny_model,
    default_cache_root,
    load_tokenizer,
)
from fullasync.models.cache import _publish, cached_build

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fullasync-cache")


@pytest.fixture(scope="module")
def built_model_dir(cache_root: Path) -> Path:
    return build_tiny_model(TinyModelSpec(), cache_dir=cache_root)


@pytest.fixture(scope="module")
def built_tokenizer(built_model_dir: Path):
    return load_tokenizer(built_model_dir)


def _render(tokenizer, messages, add_generation_prompt: bool, tools=None) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def test_build_is_byte_identical_across_cache_dirs(built_model_dir: Path, tmp_path: Path) -> None:
    second = build_tiny_model(TinyModelSpec(), cache_dir=tmp_path)
    assert second != built_model_dir and second.name == built_model_dir.name
    names = sorted(p.name for p in built_model_dir.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert {"tokenizer.json", "model.safetensors", "config.json", BUILD_MARKER} <= set(names)
    for name in names:
        assert (built_model_dir / name).read_bytes() == (second / name).read_bytes(), name


def test_cached_build_is_reused(built_model_dir: Path, cache_root: Path, monkeypatch) -> None:
    marker = (built_model_dir / BUILD_MARKER).stat()
    assert build_tiny_model(TinyModelSpec(), cache_dir=cache_root) == built_model_dir
    monkeypatch.setenv(CACHE_DIR_ENV, str(cache_root))
    assert default_cache_root() == cache_root
    assert build_tiny_model() == built_model_dir
    after = (built_model_dir / BUILD_MARKER).stat()
    assert (after.st_mtime_ns, after.st_ino) == (marker.st_mtime_ns, marker.st_ino)
    # Published atomically: no staging directories are left behind.
    assert [p.name for p in (cache_root / "models").iterdir()] == [built_model_dir.name]


def test_publish_keeps_the_first_complete_build_and_replaces_incomplete_ones(
    tmp_path: Path,
) -> None:
    def staged(name: str, complete: bool) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "weights").write_text(name)
        if complete:
            (directory / BUILD_MARKER).write_text("{}")
        return directory

    target = tmp_path / "tiny-key"
    _publish(staged("first", complete=True), target)
    _publish(staged("second", complete=True), target)  # lost the race: target untouched
    assert (target / "weights").read_text() == "first"

    (target / BUILD_MARKER).unlink()  # an interrupted or foreign directory
    _publish(staged("third", complete=True), target)
    assert (target / "weights").read_text() == "third"
    assert (target / BUILD_MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["second", "tiny-key"]


def test_spec_key_and_validation() -> None:
    key = TinyModelSpec().key()
    assert key == TinyModelSpec().key() and len(key) == 16
    assert TinyModelSpec(seed=1).key() != key
    assert TinyModelSpec(tie_word_embeddings=False).key() != key
    with pytest.raises(ValueError, match="head_dim"):
        TinyModelSpec(hidden_size=48, num_attention_heads=2)
    with pytest.raises(ValueError, match="num_key_value_heads"):
        TinyModelSpec(num_attention_heads=2, num_key_value_heads=3)


def test_special_tokens(built_tokenizer, built_model_dir: Path) -> None:
    config = json.loads((built_model_dir / "config.json").read_text())
    assert built_tokenizer.eos_token == "<|im_end|>" and built_tokenizer.pad_token == "<|endoftext|>"
    assert built_tokenizer.encode("<|im_end|>", add_special_tokens=False) == [built_tokenizer.eos_token_id]
    assert config["eos_token_id"] == built_tokenizer.eos_token_id
    assert config["pad_token_id"] == built_tokenizer.pad_token_id
    for token in ("<|im_start|>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        ids = built_tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and built_tokenizer.convert_ids_to_tokens(ids) == [token]
    # Tool markup is an added, non-special token: it survives skip_special_tokens.
    ids = built_tokenizer.encode("<|im_start|><tool_call>x</tool_call>", add_special_tokens=False)
    assert built_tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"
    assert built_tokenizer.encode("hi", add_special_tokens=True) == built_tokenizer.encode(
        "hi", add_special_tokens=False
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world",
        "  leading, trailing  and  double spaces  ",
        "tabs\tand\r\nnewlines\n\n\n",
        "37 + 48 = 85 and (3 * 4) - 5 = 7",
        '{"name": "add", "arguments": {"a": 3, "b": 4}}',
        "café naïve über señor",
        "日本語のテキスト, Привет мир, αβγ",
        "emoji 🙂👍🏽 and a ZWJ sequence 👩‍💻",
        "\x00\x01\x7f control bytes",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
        "<tool_call>\n{}\n</tool_call>mixed<|endoftext|>text<tool_response>",
    ],
)
def test_encode_decode_round_trip(built_tokenizer, text: str) -> None:
    ids = built_tokenizer.encode(text, add_special_tokens=False)
    assert built_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_round_trip_of_random_unicode_is_exact_up_to_nfc(built_tokenizer) -> None:
    rng = random.Random(1234)
    ranges = [(0x00, 0x7F), (0x80, 0xD7FF), (0xE000, 0x10FFFF)]
    for _ in range(300):
        text = "".join(
            chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 40))
        )
        ids = built_tokenizer.encode(text, add_special_tokens=False)
        assert built_tokenizer.decode(ids) == unicodedata.normalize("NFC", text), repr(text)


def test_chat_template_renders_tools_tool_calls_and_grouped_tool_responses(built_tokenizer) -> None:
    messages = [
        {"role": "user", "content": "What is 3 + 4 and 5 + 6?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}},
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 5, "b": 6}'}},
            ],
        },
        {"role": "tool", "content": "7"},
        {"role": "tool", "content": "11"},
        {"role": "assistant", "content": "7 and 11."},
    ]
    expected = (
        "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(ADD_TOOL)
        + "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is 3 + 4 and 5 + 6?<|im_end|>\n"
        "<|im_start|>assistant\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n7\n</tool_response>\n"
        "<tool_response>\n11\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n7 and 11.<|im_end|>\n"
    )
    assert _render(built_tokenizer, messages, False, tools=[ADD_TOOL]) == expected
    assert _render(built_tokenizer, messages, True, tools=[ADD_TOOL]) == (
        expected + "<|im_start|>assistant\n"
    )


def test_chat_template_system_message_and_content_parts(built_tokenizer) -> None:
    # vLLM detects the 'openai' content format and passes every content as a list of parts.
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": [{"type": "text", "text": ""}], "tool_calls": [call]},
        {"role": "tool", "content": [{"type": "text", "text": "3"}]},
    ]
    assert _render(built_tokenizer, messages, True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n3\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


PREFIX_CASES = [
    (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        [{"role": "user", "content": "and now?"}],
        None,
    ),
    (
        [
            {"role": "system", "content": "Solve it."},
            {"role": "user", "content": "Using [3, 7, 25], make 35."},
            {"role": "assistant", "content": "<answer>3 + 7 + 25</answer>"},
        ],
        [{"role": "user", "content": "Again."}, {"role": "assistant", "content": "ok"}],
        None,
    ),
    (
        [
            {"role": "user", "content": "add 3 and 4"},
            {
                "role": "assistant",
                "content": "Calling.",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": '{"a": 3, "b": 4}'}}],
            },
        ],
        [{"role": "tool", "content": "7"}, {"role": "tool", "content": "extra"}],
        [ADD_TOOL],
    ),
    (
        [
            {"role": "user", "content": "add"},
            {"role": "assistant", "tool_calls": [{"function": {"name": "add", "arguments": {"a": 1, "b": 2}}}]},
            {"role": "tool", "content": "3"},
            {"role": "assistant", "content": "3"},
        ],
        [{"role": "system", "content": "late system"}, {"role": "user", "content": "thanks"}],
        [ADD_TOOL],
    ),
]


@pytest.mark.parametrize(("conversation", "extension", "tools"), PREFIX_CASES)
def test_chat_template_rendering_is_prefix_stable(built_tokenizer, conversation, extension, tools) -> None:
    assert conversation[-1]["role"] == "assistant"
    prefix = _render(built_tokenizer, conversation, False, tools=tools)
    extended = _render(built_tokenizer, conversation + extension, True, tools=tools)
    assert extended.startswith(prefix) and len(extended) > len(prefix)
    assert prefix.endswith("<|im_end|>\n")


def test_transformers_forward_pass(built_model_dir: Path, built_tokenizer) -> None:
    model = AutoModelForCausalLM.from_pretrained(built_model_dir)
    vocab = model.config.vocab_size
    assert vocab % 64 == 0 and vocab >= len(built_tokenizer)
    assert model.dtype == torch.float32
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    assert head_dim == 32  # one of the head sizes vLLM's CPU attention supports
    assert model.model.layers[0].self_attn.k_proj.out_features == head_dim
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = built_tokenizer.apply_chat_template(
        [{"role": "user", "content": "37 + 48 ="}], add_generation_prompt=True, return_tensors="pt"
    )
    input_ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits
    assert logits.shape == (1, input_ids.shape[1], vocab)
    assert torch.isfinite(logits).all()


def test_untied_variant_builds_and_loads(tmp_path: Path, built_model_dir: Path) -> None:
    untied = build_tiny_model(TinyModelSpec(tie_word_embeddings=False), cache_dir=tmp_path)
    assert untied.name != built_model_dir.name
    with safe_open(os.fspath(untied / "model.safetensors"), framework="pt") as weights:
        assert "lm_head.weight" in weights.keys()
    with safe_open(os.fspath(built_model_dir / "model.safetensors"), framework="pt") as weights:
        assert "lm_head.weight" not in weights.keys()
    model = AutoModelForCausalLM.from_pretrained(untied)
    assert not model.config.tie_word_embeddings
    assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.shape == (1, 3, model.config.vocab_size)


def test_a_cached_build_is_world_readable_and_its_scripts_stay_runnable(tmp_path: Path) -> None:
    def build(staging: Path) -> dict:
        (staging / "task").mkdir()
        (staging / "task" / "weights").write_text("w")
        (staging / "task" / "weights").chmod(0o600)  # as transformers writes them
        (staging / "task" / "test.sh").write_text("#!/bin/bash\n")
        (staging / "task" / "test.sh").chmod(0o700)
        return {}

    built = cached_build(tmp_path / "built", build)
    modes = {path.name: path.stat().st_mode & 0o777 for path in built.rglob("*")}
    assert modes == {"task": 0o755, "weights": 0o644, "test.sh": 0o755, BUILD_MARKER: 0o644}
