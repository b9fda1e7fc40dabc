"""The tiny local model: a small Qwen2-style causal LM built offline and cached on disk.

Owns: `TinyModelSpec` (what to build), the deterministic build of tokenizer + weights from a
seed, and where it is cached (its publication is `cache.cached_build`'s). Tests, benchmarks and
examples use it wherever a real model is needed without a model hub.

Does not own: serving or training the model (vLLM / the trainer load the returned directory like
any Hugging Face checkpoint), nor the chat template's text, which lives next to this module in
`chat_template.jinja`.

Cache layout: `<root>/models/tiny-<spec.key()>/`, where root is `$FULLASYNC_CACHE_DIR` or
`~/.cache/fullasync`, complete iff it holds `cache.BUILD_MARKER`; any number of processes may
build the same spec at once. torch/transformers/tokenizers are imported inside the build functions so that finding
an already-built model stays cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.resources
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fullasync.infra.cache_root import CACHE_DIR_ENV as CACHE_DIR_ENV
from fullasync.infra.cache_root import default_cache_root
from fullasync.models.cache import cached_build

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen2ForCausalLM

BUILD_FORMAT = 1  # bump whenever the build procedure changes its output; part of every cache key

ENDOFTEXT_TOKEN = "<|endoftext|>"  # pad token (and bos id in the model config, as in Qwen2.5)
IM_START_TOKEN = "<|im_start|>"  # opens a chat turn
IM_END_TOKEN = "<|im_end|>"  # closes a chat turn; the eos token
SPECIAL_TOKENS = (ENDOFTEXT_TOKEN, IM_START_TOKEN, IM_END_TOKEN)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

# Head sizes accepted by vLLM's CPU attention backend (vllm/v1/attention/backends/cpu_attn.py).
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# Qwen2's pre-tokenizer split: contractions, letter runs, single digits, punctuation, whitespace.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
VOCAB_MULTIPLE = 64  # the embedding matrix has a row count rounded up to this multiple
CORPUS_DOCUMENTS = 6000  # number of generated training documents for the tokenizer


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines the built model; equal specs build byte-identical directories."""

    vocab_size: int = 1024  # tokenizer size target incl. special and tool tokens
    hidden_size: int = 64  # residual stream width
    intermediate_size: int = 128  # SwiGLU MLP width
    num_hidden_layers: int = 2  # decoder layers
    num_attention_heads: int = 2  # query heads; head_dim = hidden_size / num_attention_heads
    num_key_value_heads: int = 1  # key/value heads (grouped-query attention as in Qwen2.5)
    max_position_embeddings: int = 2048  # longest sequence (also the tokenizer's model_max_length)
    tie_word_embeddings: bool = True  # lm_head shares the input embedding, as in Qwen2.5-0.5B
    seed: int = 0  # seeds both the tokenizer corpus and the weight init

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"TinyModelSpec.hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.head_dim not in VLLM_CPU_HEAD_SIZES:
            raise ValueError(
                f"TinyModelSpec head_dim = hidden_size / num_attention_heads = {self.head_dim} is "
                f"not supported by vLLM's CPU attention; choose sizes giving one of "
                f"{VLLM_CPU_HEAD_SIZES}"
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"TinyModelSpec.num_attention_heads={self.num_attention_heads} must be a multiple "
                f"of num_key_value_heads={self.num_key_value_heads}"
            )
        minimum_vocab = 256 + len(SPECIAL_TOKENS) + len(TOOL_TOKENS)
        if self.vocab_size <= minimum_vocab:
            raise ValueError(
                f"TinyModelSpec.vocab_size={self.vocab_size} must exceed {minimum_vocab} "
                f"(256 byte tokens + special and tool tokens)"
            )

    @property
    def head_dim(self) -> int:
        """Per-head width of queries, keys and values."""
        return self.hidden_size // self.num_attention_heads

    def key(self) -> str:
        """Short content hash of this spec, BUILD_FORMAT and the chat template: the cache dir name."""
        payload = json.dumps(
            {
                "build_format": BUILD_FORMAT,
                "spec": dataclasses.asdict(self),
                "chat_template": read_chat_template(),
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


def read_chat_template() -> str:
    """The Qwen2.5-style Jinja chat template shipped as package data next to this module."""
    resource = importlib.resources.files(__package__).joinpath("chat_template.jinja")
    return resource.read_text(encoding="utf-8")


def build_tiny_model(spec: TinyModelSpec = TinyModelSpec(), cache_dir: Path | None = None) -> Path:
    """Return the directory of the tiny model for `spec`, building it first if not cached.

    The directory loads with `transformers.AutoModelForCausalLM/AutoTokenizer.from_pretrained`
    and with `vllm.LLM(model=...)`. `cache_dir` overrides the cache root (see module docstring).
    Safe to call from several processes at once.
    """
    root = Path(cache_dir) if cache_dir is not None else default_cache_root()
    return cached_build(root / "models" / f"tiny-{spec.key()}", lambda out_dir: _build_into(spec, out_dir))


def load_tokenizer(model_dir: Path | str) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a built tiny model (any HF model dir works) with AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


def _build_into(spec: TinyModelSpec, out_dir: Path) -> dict:
    """Write tokenizer, weights and configs into `out_dir`; the build record is the return value."""
    tokenizer = _build_tokenizer(spec)
    tokenizer.save_pretrained(str(out_dir), save_jinja_files=False)
    model = _build_model(spec, tokenizer)
    model.save_pretrained(str(out_dir))
    return {"build_format": BUILD_FORMAT, "key": spec.key(), "spec": dataclasses.asdict(spec)}


def _build_tokenizer(spec: TinyModelSpec) -> PreTrainedTokenizerBase:
    """Train a byte-level BPE on a generated corpus and wrap it as a fast HF tokenizer.

    Byte-level, so every string encodes without unknown tokens and
    `decode(encode(s)) == unicodedata.normalize("NFC", s)`; exactly `s` for NFC text.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    # The same pipeline transformers' Qwen2Tokenizer rebuilds when AutoTokenizer (and thus vLLM)
    # loads any model_type=qwen2 dir, NFC included, so tokenizer.json is what actually runs.
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size - len(TOOL_TOKENS),
        min_frequency=2,
        show_progress=False,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=sorted(pre_tokenizers.ByteLevel.alphabet()),
    )
    bpe.train_from_iterator(generate_corpus(spec.seed), trainer=trainer)
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END_TOKEN,
        pad_token=ENDOFTEXT_TOKEN,
        bos_token=None,
        unk_token=None,
        chat_template=read_chat_template(),
        clean_up_tokenization_spaces=False,
        model_max_length=spec.max_position_embeddings,
    )


def _build_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerBase) -> Qwen2ForCausalLM:
    """Instantiate a float32 Qwen2ForCausalLM with weights drawn from a generator seeded by spec."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    endoftext_id, im_end_id = _token_id(tokenizer, ENDOFTEXT_TOKEN), _token_id(tokenizer, IM_END_TOKEN)
    config = Qwen2Config(
        vocab_size=-(-len(tokenizer) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        max_window_layers=spec.num_hidden_layers,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=endoftext_id,
        eos_token_id=im_end_id,
        pad_token_id=endoftext_id,
        dtype="float32",
    )
    # transformers wraps `to` with functools.wraps, whose typeshed type does not bind `self` on a method
    model = Qwen2ForCausalLM(config).to(torch.float32)  # type: ignore[arg-type]
    _init_weights(model, spec.seed, std=config.initializer_range)
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext_id,
        eos_token_id=[im_end_id, endoftext_id],
        pad_token_id=endoftext_id,
    )
    return model


def _token_id(tokenizer: PreTrainedTokenizerBase, token: str) -> int:
    """The id of one token of the vocabulary."""
    token_id = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(token_id, int):
        raise TypeError(f"the tokenizer gave {token_id!r} as the id of the single token {token!r}")
    return token_id


def _init_weights(model: Qwen2ForCausalLM, seed: int, std: float) -> None:
    """Overwrite every parameter: N(0, std) matrices, ones for norms, zeros for biases.

    Uses a private generator and a fixed (name-sorted) order, so the bytes depend only on the
    seed and the shapes, not on the global RNG or on transformers' own init code.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        # named_parameters() yields a tied lm_head/embedding only once.
        for name, parameter in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                parameter.fill_(1.0)
            elif name.endswith(".bias"):
                parameter.zero_()
            else:
                parameter.copy_(
                    torch.normal(0.0, std, parameter.shape, generator=generator)
                )


# ---------------------------------------------------------------- tokenizer training corpus

COMMON_WORDS = (
    "the of and to in is it you that he was for on are with as they be at one have this from "
    "or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like "
    "so these her long make thing see him two has look more day could go come did number "
    "sound no most people my over know water than call first who may down side been now find "
    "any new work part take get place made live where after back little only round man year "
    "came show every good me give our under name very through just form sentence great think "
    "say help low line differ turn cause much mean before move right boy old too same tell "
    "does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need "
    "house picture try us again animal point mother world near build self earth father answer "
    "question step reason problem equation result value function tool call search weather "
    "hello please thanks sure let first next finally total sum product difference multiply"
).split()
SYLLABLES = ("ka", "lo", "mi", "ren", "tas", "vo", "qui", "ber", "nal", "sto", "pre", "dun")
TOOL_NAMES = ("add", "subtract", "multiply", "divide", "search", "get_weather", "lookup")
UNICODE_WORDS = ("café", "naïve", "über", "señor", "日本", "数学", "Привет", "αβγ", "🙂", "→", "≤")


def generate_corpus(seed: int, documents: int = CORPUS_DOCUMENTS) -> list[str]:
    """Deterministic English-like, arithmetic, countdown, JSON tool-call and chat text."""
    rng = random.Random(seed)
    makers = (_sentence, _arithmetic, _countdown, _tool_call_json, _chat)
    return [makers[index % len(makers)](rng) for index in range(documents)]


def _word(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.85:
        return rng.choice(COMMON_WORDS)
    if roll < 0.97:
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))
    return rng.choice(UNICODE_WORDS)


def _sentence(rng: random.Random) -> str:
    sentences = []
    for _ in range(rng.randint(1, 4)):
        words = [_word(rng) for _ in range(rng.randint(3, 12))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
        text = " ".join(words)
        sentences.append(text[0].upper() + text[1:] + rng.choice(".!?.,;"))
    return " ".join(sentences)


def _expression(rng: random.Random, depth: int) -> tuple[str, int]:
    if depth == 0 or rng.random() < 0.4:
        value = rng.randint(0, 100)
        return str(value), value
    left, left_value = _expression(rng, depth - 1)
    right, right_value = _expression(rng, depth - 1)
    operator = rng.choice("+-*")
    value = {"+": left_value + right_value, "-": left_value - right_value}.get(
        operator, left_value * right_value
    )
    return f"({left} {operator} {right})", value


def _arithmetic(rng: random.Random) -> str:
    text, value = _expression(rng, depth=rng.randint(1, 3))
    if text.startswith("(") and text.endswith(")") and rng.random() < 0.5:
        text = text[1:-1]
    return f"{text} = {value}"


def _countdown(rng: random.Random) -> str:
    numbers = [rng.randint(1, 100) for _ in range(rng.randint(3, 5))]
    expression = " + ".join(str(n) for n in numbers[:2])
    target = sum(numbers[:2])
    return (
        f"Using the numbers {numbers}, create an equation that equals {target}. "
        f"You can use basic arithmetic operations (+, -, *, /) and each number can only be "
        f"used once. <answer>{expression}</answer>"
    )


def _tool_call_json(rng: random.Random) -> str:
    name = rng.choice(TOOL_NAMES)
    if name in ("search", "lookup", "get_weather"):
        arguments: dict[str, object] = {"query": " ".join(_word(rng) for _ in range(2))}
    else:
        arguments = {"a": rng.randint(0, 999), "b": rng.randint(0, 999)}
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    if rng.random() < 0.5:
        return call
    return f"<tool_call>\n{call}\n</tool_call>"


def _chat(rng: random.Random) -> str:
    turns = [f"{IM_START_TOKEN}system\nYou are a helpful assistant.{IM_END_TOKEN}"]
    turns.append(f"{IM_START_TOKEN}user\n{_sentence(rng)}{IM_END_TOKEN}")
    if rng.random() < 0.5:
        turns.append(f"{IM_START_TOKEN}assistant\n{_tool_call_json(rng)}{IM_END_TOKEN}")
        turns.append(
            f"{IM_START_TOKEN}user\n<tool_response>\n{rng.randint(0, 2000)}\n"
            f"</tool_response>{IM_END_TOKEN}"
        )
    turns.append(f"{IM_START_TOKEN}assistant\n{_arithmetic(rng)}{IM_END_TOKEN}")
    return "\n".join(turns) + "\n"
