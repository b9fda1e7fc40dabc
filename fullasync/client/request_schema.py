"""One request schema for the in-process client and the HTTP gateway: nothing reaches an engine unchecked.

Owns: which fields a chat or text completion accepts, their types and ranges, the rule for fields
that are accepted but ignored, and turning any violation into an `InvalidRequestError` that names
the field and says what is allowed. The client calls `parse_chat` / `parse_completion` with the
caller's keyword arguments (vLLM-style extras may sit at the top level or in `extra_body`); the
gateway passes the JSON body unchanged, so both paths validate identically.
Does not own: messages and tools (`messages.py`), limits that depend on the tokens (prompt length,
vocabulary) and on the engines (`top_logprobs` maximum) — the client checks those with `check_limits`.

The rule for fields (also in the README):
- implemented: the OpenAI sampling fields, `response_format` (text / json_object / json_schema through
  structured outputs), `tool_choice` (auto, none, required, a named function: the last two through structured
  outputs), `parallel_tool_calls` (with "required") and the vLLM extras in `VLLM_EXTRAS` (`chat_template_kwargs`
  among them); where the OpenAI API and vLLM accept two fields together, so does this, by vLLM's rule: a
  constrained `tool_choice` wins over `response_format` / `structured_outputs` for that call (the OpenAI Agents
  SDK sends both), `max_completion_tokens` over `max_tokens`;
- accepted and ignored on purpose, with one warning per field and process: `IGNORED` — provider
  bookkeeping (`user`, `metadata`, `store`, `session_id`, ...), hints a plain policy cannot honour
  (`reasoning_effort`, `verbosity`), and vLLM's extras that mean nothing here (`VLLM_IGNORED`): `cache_salt` (the
  engines serve one run: no other tenant to hide a prefix from), `priority` and `request_id` (the run schedules
  and names calls by episode), `skip_special_tokens` and `spaces_between_special_tokens` (an answer's text is
  parsed for tool calls and reasoning without special tokens; the exact ids come back with `return_token_ids`);
  SDK transport options (`timeout`, `extra_headers`, `extra_query`) are ignored silently;
- accepted only at their neutral value: `NEUTRAL` (penalties and `logit_bias` would change the
  sampling distribution in a way the trainer's log-probs do not reproduce);
- anything else: 400 naming the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fullasync.client.wire_types import JSON, json_schema
from fullasync.contracts.engine import StructuredSpec
from fullasync.errors import InvalidRequestError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_N = 128  # choices per request (OpenAI's limit)
MAX_STOP = 16  # stop strings per request

VLLM_EXTRAS = frozenset({"return_token_ids", "ignore_eos", "top_k", "min_p", "structured_outputs",
                         "chat_template_kwargs", "return_tokens_as_token_ids", "stop_token_ids"})
# vLLM's extras that mean nothing here (the module docstring says why each is ignored)
VLLM_IGNORED = frozenset({"cache_salt", "priority", "request_id", "skip_special_tokens",
                          "spaces_between_special_tokens"})
IGNORED = frozenset({"user", "metadata", "store", "session_id", "service_tier", "prompt_cache_key",
                     "safety_identifier", "reasoning_effort", "verbosity"}) | VLLM_IGNORED
TRANSPORT = frozenset({"timeout", "extra_headers", "extra_query"})
NEUTRAL: JSON = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "logit_bias": {}}
_EXTRA_BODY_KEYS = VLLM_EXTRAS | VLLM_IGNORED | NEUTRAL.keys()


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class StreamOptions(Strict):
    include_usage: bool | None = Field(None, description="true or false")
    continuous_usage_stats: bool | None = Field(None, description="true or false (ignored)")


class StructuredOutputs(Strict):
    regex: str | None = Field(None, description="a regular expression")
    json_schema: JSON | str | None = Field(None, alias="json", description="a JSON schema object")
    choice: list[str] | None = Field(None, min_length=1, description="a non-empty list of strings")
    json_object: bool | None = Field(None, description="true")


class JsonSchemaFormat(Strict):
    name: str = Field(description="a string")
    schema_: JSON | None = Field(None, alias="schema", description="a JSON schema object")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"] = Field(description="'text', 'json_object' or 'json_schema'")
    json_schema: JsonSchemaFormat | None = Field(None, description="{'name': ..., 'schema': {...}}")


class SamplingRequest(Strict):
    """Fields common to chat and text completions, with their allowed values as descriptions."""

    model: str = Field(description="the served model name")
    n: int = Field(1, ge=1, le=MAX_N, description=f"an integer in [1, {MAX_N}]")
    max_tokens: int | None = Field(None, ge=1, description="a positive integer")
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False, description="a number in [0, 2]")
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False, description="a number in (0, 1]")
    top_k: int | None = Field(None, ge=-1, description="-1 or 0 (off) or a positive integer")
    min_p: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description="a number in [0, 1]")
    stop: str | list[str] | None = Field(
        None, description=f"a non-empty string or a list of at most {MAX_STOP} of them")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX, description="an integer within 64 bits")
    stream: bool | None = Field(None, description="true or false")
    stream_options: StreamOptions | None = Field(None, description="{'include_usage': true|false}")
    return_token_ids: bool | None = Field(None, description="true or false")
    return_tokens_as_token_ids: bool | None = Field(None, description="true or false (log-prob entries name tokens "
                                                                      "'token_id:N')")
    stop_token_ids: list[Annotated[int, Field(ge=0, le=INT64_MAX)]] | None = Field(
        None, description="a list of token ids")
    ignore_eos: bool | None = Field(None, description="true or false")
    structured_outputs: StructuredOutputs | None = Field(
        None, description="one of {'regex': str}, {'json': schema}, {'choice': [str, ...]}, {'json_object': true}")
    response_format: ResponseFormat | None = Field(
        None, description="{'type': 'text'}, {'type': 'json_object'} or {'type': 'json_schema', 'json_schema': {...}}")
    presence_penalty: float | None = Field(None, allow_inf_nan=False, description="0 (penalties are not supported)")
    frequency_penalty: float | None = Field(None, allow_inf_nan=False, description="0 (penalties are not supported)")
    repetition_penalty: float | None = Field(None, allow_inf_nan=False, description="1 (penalties are not supported)")
    logit_bias: dict[str, float] | None = Field(None, description="empty (logit_bias is not supported)")


class NamedFunction(Strict):
    name: str = Field(min_length=1, description="a function name")


class NamedToolChoice(Strict):
    type: Literal["function"] = Field(description="'function'")
    function: NamedFunction = Field(description="{'name': ...}")


# arguments the client passes to the template itself: a request may not set them through chat_template_kwargs
TEMPLATE_OWN = frozenset({"messages", "conversation", "tools", "documents", "add_generation_prompt", "tokenize",
                          "continue_final_message", "chat_template", "return_dict", "return_assistant_tokens_mask"})


class ChatRequest(SamplingRequest):
    messages: list[object] = Field(min_length=1, description="a non-empty list of message objects")
    tools: list[object] | None = Field(None, description="a list of {'type': 'function', 'function': {...}}")
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = Field(
        None, description="'auto', 'none', 'required' or {'type': 'function', 'function': {'name': ...}}")
    parallel_tool_calls: bool | None = Field(None, description="true or false (false: tool_choice 'required' "
                                                               "makes one call)")
    chat_template_kwargs: JSON | None = Field(
        None, description="an object of extra variables for the chat template (e.g. {'enable_thinking': false})")
    max_completion_tokens: int | None = Field(None, ge=1, description="a positive integer")
    logprobs: bool | None = Field(None, description="true or false")
    top_logprobs: int | None = Field(None, ge=0, description="an integer >= 0 (with logprobs: true)")


class CompletionRequest(SamplingRequest):
    prompt: str | list[int] = Field(description="a non-empty string or a non-empty list of token ids")
    max_tokens: int | None = Field(16, ge=1, description="a positive integer")
    logprobs: int | None = Field(None, ge=0, description="an integer >= 0")
    echo: Literal[False] | None = Field(None, description="false (the prompt ids come back in prompt_token_ids)")


Schema = TypeVar("Schema", bound=SamplingRequest)  # the schema a request passed


@dataclass(frozen=True)
class Parsed(Generic[Schema]):
    """A request that passed the schema, and the fields accepted but ignored (for a one-time warning)."""

    request: Schema
    ignored: tuple[str, ...]


_PLAIN = frozenset({int, float, bool, type(None)})


def check_text(value: object, where: str) -> None:
    """Every string must be valid Unicode text (JSON lets a lone surrogate through, tokenizers choke on it)."""
    found = _bad_text(value)
    if found is None:
        return
    parts, error = found
    for part in reversed(parts):
        where += f"[{part}]" if isinstance(part, int) else (f".{part}" if where else str(part))
    raise InvalidRequestError(
        f"{where} holds text that is not valid Unicode ({error.reason} at position {error.start}); "
        "send UTF-8 text without lone surrogates", param=where.split("[")[0].split(".")[0] or None,
    )


def _bad_text(value: object) -> tuple[list[object], UnicodeEncodeError] | None:
    """The first string in `value` that is not valid Unicode: its path (innermost first) and the error.

    On the hot path of every request (a prompt of token ids is a list of thousands of ints), so the
    path is built only for the failing string and a list of plain numbers is passed over in C."""
    kind = type(value)
    if kind in _PLAIN:
        return None
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            return [], error
        return None
    if isinstance(value, (list, tuple)):
        if set(map(type, value)) <= _PLAIN:
            return None
        items: Iterable[tuple[object, object]] = enumerate(value)
    elif isinstance(value, dict) or isinstance(value, Mapping):
        items = value.items()
    elif isinstance(value, BaseModel):  # openai message objects passed in process
        return _bad_text(value.model_dump(exclude_none=True))
    else:
        return None
    for key, item in items:
        found = _bad_text(key) if isinstance(key, str) else None  # a bad key is reported at its object
        if found is None:
            found = _bad_text(item)
            if found is not None:
                found[0].append(key)
        if found is not None:
            return found
    return None


def _merge(fields: Mapping[str, object]) -> JSON:
    """The caller's fields with `extra_body` folded in (the openai SDK's way of sending vLLM extras)."""
    merged = dict(fields)
    extra = merged.pop("extra_body", None)
    if extra is None:
        return merged
    if not isinstance(extra, Mapping):
        raise InvalidRequestError("extra_body must be an object", param="extra_body")
    unknown = sorted(extra.keys() - _EXTRA_BODY_KEYS)
    if unknown:
        raise InvalidRequestError(
            f"unsupported extra_body key(s) {unknown}; supported: {sorted(VLLM_EXTRAS)}", param=unknown[0])
    both = sorted(set(extra) & set(merged))
    if both:
        raise InvalidRequestError(f"{both[0]!r} is given both in extra_body and at the top level; give it once",
                                  param=both[0])
    merged.update(extra)
    return merged


def _loc_path(loc: tuple[int | str, ...]) -> str:
    """`('stop', 'list[str]', 3)` → `stop[3]`: field names and indices, without pydantic's union-member tags."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", part) and part not in ("str", "int", "float", "bool"):
            path += f".{part}" if path else part
    return path


def explain(error: ValidationError, schema: type[BaseModel]) -> InvalidRequestError:
    """A schema's violation as one error naming the field and what it allows (its description)."""
    issues = error.errors()
    extras = sorted({_loc_path(issue["loc"]) for issue in issues if issue["type"] == "extra_forbidden"})
    if extras and len(extras) == len(issues):
        return InvalidRequestError(
            f"unsupported parameter(s) {extras}; remove them (see the request rule in fullasync.client.request_schema)",
            param=extras[0].split(".")[0].split("[")[0])
    issue = next(i for i in issues if i["type"] != "extra_forbidden")
    field = str(issue["loc"][0]) if issue["loc"] else None
    path = _loc_path(issue["loc"])
    if issue["type"] == "missing":
        return InvalidRequestError(f"'{path}' is required", param=field)
    allowed = _allowed(schema, issue["loc"])
    got = repr(issue.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."
    return InvalidRequestError(f"invalid '{path}': {issue['msg'].lower()} (got {got}){allowed}", param=field)


def _allowed(schema: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """What the innermost described field on `loc` allows (`; sampling_params.top_p must be ...`), or ""."""
    model: type[BaseModel] | None = schema
    said, names = "", list[str]()
    for part in loc:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            break
        info = model.model_fields[part]
        names.append(part)
        if info.description:
            said = f"; {'.'.join(names)} must be {info.description}"
        inner = info.annotation
        model = inner if isinstance(inner, type) and issubclass(inner, Strict) else None
    return said


def _parse(schema: type[Schema], fields: Mapping[str, object]) -> Parsed[Schema]:
    merged = _merge(fields)
    try:
        check_text(merged, "")
    except RecursionError:
        raise InvalidRequestError("the request nests objects or lists too deeply") from None
    ignored = tuple(sorted(set(merged) & IGNORED))
    for name in (*ignored, *(set(merged) & TRANSPORT)):
        merged.pop(name)
    try:
        request = schema.model_validate(merged)
    except ValidationError as error:
        raise explain(error, schema) from None
    check_neutral(request)
    check_stop(request.stop)
    check_structured(request)
    return Parsed(request, ignored)


def check_neutral(request: BaseModel) -> None:
    """Penalties and `logit_bias` only at their neutral values (`NEUTRAL`)."""
    for name, neutral in NEUTRAL.items():
        value = getattr(request, name)
        if value is not None and value != neutral:
            raise InvalidRequestError(
                f"{name}={value!r} is not supported: it would change the sampling distribution in a way the "
                f"trainer's log-probs do not reproduce; leave it unset or at {neutral!r}", param=name)


def check_stop(stop: str | list[str] | None) -> None:
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > MAX_STOP or not all(stops):
        raise InvalidRequestError(f"stop must be a non-empty string or a list of at most {MAX_STOP} non-empty "
                                  f"strings, got {stop!r}", param="stop")


def check_structured(request: SamplingRequest) -> None:
    given = request.structured_outputs
    if given is not None:
        kinds = [name for name in ("regex", "json_schema", "choice", "json_object") if getattr(given, name)]
        if len(kinds) != 1:
            raise InvalidRequestError("structured_outputs takes exactly one of 'regex', 'json', 'choice', "
                                      f"'json_object', got {kinds or 'none'}", param="structured_outputs")
        if given.regex is not None:
            try:
                re.compile(given.regex)
            except re.error as error:
                raise InvalidRequestError(f"structured_outputs.regex does not compile: {error}",
                                          param="structured_outputs") from None
        if isinstance(given.json_schema, str):
            try:
                schema = json.loads(given.json_schema)
            except json.JSONDecodeError as error:
                raise InvalidRequestError(f"structured_outputs.json is not valid JSON: {error}",
                                          param="structured_outputs") from None
            if not isinstance(schema, dict):
                raise InvalidRequestError("structured_outputs.json must be a JSON schema object",
                                          param="structured_outputs")
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_schema" and (fmt.json_schema is None or fmt.json_schema.schema_ is None):
        raise InvalidRequestError("response_format of type 'json_schema' needs json_schema.schema (a JSON schema "
                                  "object)", param="response_format")
    if fmt is not None and fmt.type != "text" and given is not None:
        raise InvalidRequestError("give response_format or structured_outputs, not both", param="response_format")


def structured_output(request: SamplingRequest) -> tuple[str, StructuredSpec] | None:
    """The output constraint as (kind, spec): kind is 'regex', 'json', 'choice' or 'json_object'."""
    given = request.structured_outputs
    if given is not None:
        if given.regex is not None:
            return "regex", given.regex
        if given.json_schema is not None:
            spec = given.json_schema
            return "json", json.loads(spec) if isinstance(spec, str) else json_schema(spec)
        if given.choice is not None:
            return "choice", tuple(given.choice)
        return "json_object", True
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return "json_object", True
    assert fmt.json_schema is not None and fmt.json_schema.schema_ is not None  # _check_structured
    return "json", json_schema(fmt.json_schema.schema_)


def parse_chat(fields: Mapping[str, object]) -> Parsed[ChatRequest]:
    """Validate a chat completion request (keyword arguments of `create`, or the HTTP body)."""
    parsed = _parse(ChatRequest, fields)
    request = parsed.request
    _check_tool_choice(request)
    if request.top_logprobs and not request.logprobs:
        raise InvalidRequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    if request.stream and request.n != 1:
        raise InvalidRequestError("stream=True supports n=1 only", param="n")
    return parsed


def parse_completion(fields: Mapping[str, object]) -> Parsed[CompletionRequest]:
    """Validate a text completion request (keyword arguments of `create`, or the HTTP body)."""
    parsed = _parse(CompletionRequest, fields)
    request = parsed.request
    if isinstance(request.prompt, str | list) and not request.prompt:
        raise InvalidRequestError("prompt must be a non-empty string or a list of token ids", param="prompt")
    if request.stream and request.n != 1:
        raise InvalidRequestError("stream=True supports n=1 only", param="n")
    return parsed


def _check_tool_choice(request: ChatRequest) -> None:
    """`tool_choice` and `chat_template_kwargs` beside the rest of the request (the tool names are `messages.py`'s to
    check, against the normalised tools)."""
    constrained = request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice)
    if constrained and not request.tools:
        raise InvalidRequestError("tool_choice 'required' or a named function needs tools", param="tool_choice")
    clash = sorted(set(request.chat_template_kwargs or {}) & TEMPLATE_OWN)
    if clash:
        raise InvalidRequestError(f"chat_template_kwargs may not set {clash}: the client passes them to the template "
                                  "itself", param="chat_template_kwargs")
