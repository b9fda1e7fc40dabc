"""Five chat formats as their models write them, built offline (no hub here): each a chat template of ours in the
format's wire form, the special tokens it needs added to the tiny model's tokenizer, and the parsers that read it.

- `qwen3_think`: ChatML, Hermes tool calls (`<tool_call>{json}</tool_call>`), `<think>` reasoning (Qwen3); our
  Hermes parser and vLLM's `qwen3` reasoning parser; `enable_thinking: false` closes thinking in the prompt.
- `qwen3_coder`: ChatML, XML tool calls (`<function=name><parameter=k>v</parameter></function>`); vLLM's parser.
- `llama3_json`: Llama 3.1 headers, `<|eot_id|>` as EOS, calls as `{"name": ..., "parameters": {...}}` joined by
  `; `; vLLM's parser.
- `mistral`: `[INST]` turns, `[TOOL_CALLS]name[ARGS]{json}` (the current Mistral format), `</s>`; vLLM's parser.
- `deepseek_v3`: DeepSeek-V3's full-width markers, arguments in a ```json block; vLLM's parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fullasync.models import load_tokenizer

TEMPLATES = Path(__file__).parent / "chat_formats"  # one Jinja file per format, named by it


@dataclass(frozen=True)
class ChatFormat:
    name: str
    special_tokens: tuple[str, ...]  # added as special tokens (what the format's models declare special)
    eos: str
    tool_parser: str
    reasoning_parser: str = ""
    added_tokens: tuple[str, ...] = ()  # added as plain tokens (Qwen3's <think> markers are not special)
    content_with_calls: bool = True  # the format has text before its calls (Llama 3's JSON calls have none)


FORMATS = {
    "qwen3_think": ChatFormat("qwen3_think", (), "<|im_end|>", "hermes", "qwen3",
                              added_tokens=("<think>", "</think>")),
    "qwen3_coder": ChatFormat("qwen3_coder", (), "<|im_end|>", "qwen3_coder"),
    "llama3_json": ChatFormat("llama3_json", ("<|begin_of_text|>", "<|start_header_id|>",
                              "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>", "<|eom_id|>"), "<|eot_id|>",
                              "llama3_json", content_with_calls=False),
    "mistral": ChatFormat("mistral", ("<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]",
                          "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                          "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]"), "</s>", "mistral"),
    "deepseek_v3": ChatFormat("deepseek_v3", ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                              "<｜User｜>", "<｜Assistant｜>", "<｜System｜>", "<｜tool▁calls▁begin｜>",
                              "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                              "<｜tool▁sep｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>"),
                              "<｜end▁of▁sentence｜>", "deepseek_v3"),
}


def format_tokenizer(model_path, chat_format: ChatFormat):
    """The tiny model's tokenizer with the format's tokens, EOS and template (ids beyond the model's embedding rows
    are never sampled here: the engine in these tests is scripted)."""
    tokenizer = load_tokenizer(model_path)
    if chat_format.special_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": list(chat_format.special_tokens)})
    if chat_format.added_tokens:
        tokenizer.add_tokens(list(chat_format.added_tokens))
    tokenizer.eos_token = chat_format.eos
    tokenizer.chat_template = (TEMPLATES / f"{chat_format.name}.jinja").read_text()
    return tokenizer
