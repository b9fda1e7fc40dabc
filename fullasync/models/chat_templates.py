"""Chat-template overrides for a model directory, and the start-up check of template + tool parser.

Owns: the built-in templates (`BUILTIN_CHAT_TEMPLATES`, Jinja files next to this module), reading a
`model.chat_template` value (a built-in name or a file path), `with_chat_template(model_dir, value)`
— a cached copy of the directory whose tokenizer carries that template — and
`check_chat_setup(tokenizer, tool_parser)`, which fails at start-up on a template that cannot render
a conversation, or that shows tools but writes tool calls the chosen parser cannot read back.
Does not own: rendering at request time (`fullasync.client.chat_tokens`), tool-call parsing
(`fullasync.client.tool_parsers`).

Why a copy of the directory rather than a template passed around: every process that loads the
tokenizer (the client, the gateway, the trainer, vLLM) then sees the same template, with no
setting to forget. The copy links the weights (symlinks) and rewrites only `tokenizer_config.json`;
it lives in the cache at `<root>/models/<base name>+<key>/`, where the key hashes the base
directory's path, its tokenizer config and the template text.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
from pathlib import Path
from typing import TYPE_CHECKING

from fullasync.config.checks import BUILTIN_CHAT_TEMPLATES
from fullasync.contracts.tokenizer import Tokenizer, text
from fullasync.models.cache import BUILD_MARKER, cached_build
from fullasync.models.tiny import default_cache_root

if TYPE_CHECKING:  # the client's parsers, as the caller makes them (`fullasync.launch.parts`)
    from openai.types.chat import ChatCompletionFunctionToolParam

    from fullasync.client.reasoning import ReasoningSplitter
    from fullasync.client.tool_parsers import ToolParser

TOKENIZER_CONFIG = "tokenizer_config.json"
OVERLAY_FORMAT = 1  # bump whenever the overlay's layout changes; part of its cache key
_REPLACED = {TOKENIZER_CONFIG, "chat_template.jinja", "chat_template.json", BUILD_MARKER}

# The conversation every template is checked with at start-up.
PROBE_TOOL: ChatCompletionFunctionToolParam = {"type": "function", "function": {
    "name": "probe_lookup", "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}
PROBE_ARGUMENTS = {"word": "ünïcode \"quoted\""}
PROBE_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Look up a word."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call-0", "type": "function", "function": {"name": "probe_lookup", "arguments": PROBE_ARGUMENTS}}]},
    {"role": "tool", "tool_call_id": "call-0", "content": "found"},
]


def read_chat_template_source(value: str) -> str:
    """The template text `value` names: a built-in name, or a path to a Jinja file."""
    if value in BUILTIN_CHAT_TEMPLATES:
        resource = importlib.resources.files(__package__).joinpath(BUILTIN_CHAT_TEMPLATES[value])
        return resource.read_text(encoding="utf-8")
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"model.chat_template={value!r} is neither a built-in template "
                         f"({', '.join(sorted(BUILTIN_CHAT_TEMPLATES))}) nor a readable file")
    return path.read_text(encoding="utf-8")


def with_chat_template(model_dir: Path | str, value: str, cache_dir: Path | None = None) -> Path:
    """`model_dir` itself when `value` is empty; else a cached copy whose tokenizer has template `value`."""
    if not value:
        return Path(model_dir)
    base = Path(model_dir).resolve()
    template = read_chat_template_source(value)
    config_path = base / TOKENIZER_CONFIG
    if not config_path.is_file():
        raise ValueError(f"model.chat_template is set but {base} has no {TOKENIZER_CONFIG} to carry it")
    config_text = config_path.read_text(encoding="utf-8")
    payload = json.dumps({"format": OVERLAY_FORMAT, "base": str(base), "tokenizer_config": config_text,
                          "template": template}, sort_keys=True)
    key = hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return cached_build(root / "models" / f"{base.name}+{key}",
                        lambda out_dir: _overlay_into(base, json.loads(config_text), template, value, out_dir))


def _overlay_into(base: Path, tokenizer_config: dict, template: str, value: str, out_dir: Path) -> dict:
    for entry in sorted(base.iterdir()):
        if entry.name not in _REPLACED:
            (out_dir / entry.name).symlink_to(entry)
    tokenizer_config["chat_template"] = template
    (out_dir / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    return {"format": OVERLAY_FORMAT, "base": str(base), "chat_template": value}


def renders_tools(tokenizer: Tokenizer) -> bool:
    """True iff the tokenizer's template shows the model the tools it is given."""
    rendered = text(tokenizer.apply_chat_template(PROBE_MESSAGES[:2], tools=[PROBE_TOOL], tokenize=False,
                                                  add_generation_prompt=True))
    return PROBE_TOOL["function"]["name"] in rendered


def check_chat_setup(tokenizer: Tokenizer, tool_parser: ToolParser, template_name: str = "the model's chat template",
                     reasoning: ReasoningSplitter | None = None) -> None:
    """Fail with a message naming the fix when the template and the tool parser do not fit together.

    Checks: the template renders a plain conversation; if it shows the model its tools, it also
    renders a tool call and a tool result, its assistant turn extends its generation prompt, and
    the parser reads back the call the template writes (name and arguments). A template that
    ignores tools passes (runs without tools are fine); the client refuses requests with tools for
    it (`fullasync.client.chat_tokens`). With a reasoning parser: it splits its own markers' thinking from the
    answer, and, where the template shows an assistant turn's `reasoning_content`, the turn the template writes.
    """
    if reasoning is not None:
        _check_reasoning(tokenizer, reasoning, template_name)
    if not tokenizer.chat_template:
        raise ValueError(f"{template_name} is missing: the tokenizer has no chat_template; set model.chat_template "
                         f"to a file or one of {sorted(BUILTIN_CHAT_TEMPLATES)}")
    plain = [*PROBE_MESSAGES[:2], {"role": "assistant", "content": "Done."}, {"role": "user", "content": "Thanks."}]
    try:
        tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=True)
        shows_tools = renders_tools(tokenizer)
    except Exception as error:  # jinja raises many types; what matters is that this template refused
        raise ValueError(f"{template_name} cannot render a plain system/user/assistant conversation "
                         f"({error}); set model.chat_template to a file or chatml-tools") from error
    if not shows_tools:
        return
    try:
        before = text(tokenizer.apply_chat_template(PROBE_MESSAGES[:2], tools=[PROBE_TOOL], tokenize=False,
                                                    add_generation_prompt=True))
        with_call = text(tokenizer.apply_chat_template(PROBE_MESSAGES[:3], tools=[PROBE_TOOL], tokenize=False))
        tokenizer.apply_chat_template(PROBE_MESSAGES, tools=[PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    except Exception as error:  # as above
        raise ValueError(f"{template_name} shows tools but cannot render a tool call and its result ({error}); "
                         "set model.chat_template=chatml-tools (or a file)") from error
    if not with_call.startswith(before):
        raise ValueError(f"{template_name} renders an assistant turn that does not extend its generation prompt, "
                         "so sampled turns cannot be continued token-exactly; use a prefix-stable template")
    written = with_call[len(before):]
    eos = tokenizer.eos_token or ""
    written = written[: written.rfind(eos)] if eos and eos in written else written
    _content, calls = tool_parser.parse(written, [PROBE_TOOL])
    if [(call.name, call.arguments) for call in calls] != [("probe_lookup", PROBE_ARGUMENTS)]:
        raise ValueError(f"the tool parser {type(tool_parser).__name__} does not read back the tool call that "
                         f"{template_name} writes ({written!r}); choose model.tool_parser for this format or "
                         "model.chat_template=chatml-tools (Hermes format, read by tool_parser=hermes)")


def _check_reasoning(tokenizer: Tokenizer, reasoning: ReasoningSplitter, template_name: str) -> None:
    """The reasoning parser reads back thinking written with its markers, and the thinking the template writes."""
    name = f"the reasoning parser {reasoning.name!r}"
    texts = [f"{reasoning.start or ''}probe thought{reasoning.end}Done."]
    turn = {"role": "assistant", "content": "Done.", "reasoning_content": "probe thought"}
    before = text(tokenizer.apply_chat_template(PROBE_MESSAGES[:2], tokenize=False, add_generation_prompt=True))
    written = text(tokenizer.apply_chat_template([*PROBE_MESSAGES[:2], turn], tokenize=False))
    if "probe thought" in written and written.startswith(before):
        eos = tokenizer.eos_token or ""
        texts.append(written[len(before) : written.rfind(eos) if eos and eos in written else None])
    for sample in texts:
        thought, answer = reasoning.split(sample, {})
        if "probe thought" not in (thought or "") or "Done." not in (answer or "") or "probe" in (answer or ""):
            raise ValueError(f"{name} does not split the thinking from the answer in {text!r} (got reasoning "
                             f"{thought!r}, content {answer!r}); choose model.reasoning_parser for the markers "
                             f"{template_name} writes")
