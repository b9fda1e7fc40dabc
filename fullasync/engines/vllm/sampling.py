"""Pure translation between our records and vLLM's: a `GenerateRequest`'s sampling options as vLLM's
`SamplingParams`, and vLLM's weight-version spans as per-token versions (the older of the weights that sampled a
token and the KV it read; see `actor.py`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fullasync.contracts.engine import GenerateRequest

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.logprobs import Logprob
    from vllm.outputs import WeightVersionSpan


def compact_json_grammar(schema: Any) -> str:
    """An EBNF grammar of the JSON values `schema` admits, written without whitespace between tokens."""
    import xgrammar

    return str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":")))


def sampling_params(request: GenerateRequest) -> SamplingParams:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    opts = request.sampling
    structured = None
    if opts.structured is not None:
        kind, spec = opts.structured
        value = list(spec) if kind == "choice" and isinstance(spec, tuple) else spec
        if kind == "compact_json":  # vLLM's whitespace switch is per engine; a grammar holds one request to it
            structured = StructuredOutputsParams(grammar=compact_json_grammar(value))
        else:
            structured = StructuredOutputsParams(**{kind: value})  # type: ignore[arg-type]  # `kind` names the field
    return SamplingParams(
        max_tokens=request.max_tokens,
        temperature=opts.temperature,
        top_p=opts.top_p,
        top_k=opts.top_k if opts.top_k > 0 else 0,
        min_p=opts.min_p,
        stop=list(opts.stop) or None,
        stop_token_ids=list(opts.stop_token_ids) or None,
        ignore_eos=opts.ignore_eos,
        seed=opts.seed,
        logprobs=opts.num_top_logprobs,
        prompt_logprobs=0 if opts.score_prompt else None,  # 0: the prompt token's own log-prob, no alternatives
        output_kind=RequestOutputKind.DELTA,
        detokenize=bool(opts.stop),
        structured_outputs=structured,
    )


def prompt_token_logprobs(prompt_ids: Sequence[int],
                          entries: Sequence[Mapping[int, Logprob] | None]) -> tuple[float, ...]:
    """vLLM's prompt log-probs (None for the first token, then each position's entries, the prompt token's among
    them) as the log-prob of each prompt token after the first."""
    if len(entries) != len(prompt_ids):
        raise RuntimeError(f"vLLM returned prompt log-probs for {len(entries)} of {len(prompt_ids)} prompt tokens")
    return tuple(float(entry[token].logprob) for token, entry in zip(prompt_ids[1:], entries[1:], strict=True)
                 if entry is not None)


def versions_from_spans(spans: list[WeightVersionSpan] | None, num_tokens: int, fallback: int) -> tuple[int, ...]:
    if not spans:
        return (fallback,) * num_tokens
    versions: list[int] = []
    for span in spans:
        versions += [int(span.version)] * (span.end - span.start)
    if len(versions) != num_tokens:
        raise RuntimeError(f"vLLM weight-version spans cover {len(versions)} of {num_tokens} tokens")
    return tuple(versions)


def oldest_versions(weight_versions: tuple[int, ...], kv_version: int, recomputed: list[int]) -> tuple[int, ...]:
    """Each token's version: the older of its weights' and its KV's — the KV's being the version the request was
    submitted under, or that of the latest "recompute" push before the token was sampled."""
    if not recomputed:
        return tuple(min(version, kv_version) for version in weight_versions)
    return tuple(min(version, max([kv_version, *(r for r in recomputed if r <= version)]))
                 for version in weight_versions)
