"""Text completions (`client.completions.create`, `POST /v1/completions`): a prompt of text or token ids continued.

Owns: the completion request's prompt ids (token ids as sent; text tokenized, or extending the episode's last
completion exactly when the text goes on from it), and its answer (`openai.types.Completion`, whole or streamed).
Does not own: validation (`request_schema`), generation and recording (the client's `prepare` / `sample` / `record`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from openai.types import Completion

from fullasync.client import chat_answers
from fullasync.client.request_schema import parse_completion
from fullasync.client.streaming import completion_stream
from fullasync.client.wire_types import JSON
from fullasync.errors import InvalidRequestError
from fullasync.types import FinishReason

if TYPE_CHECKING:
    from fullasync.client.rollout_client import RolloutClient


class TextCompletions:
    """`client.completions`: `create(**fields)` as `openai.AsyncOpenAI().completions`."""

    def __init__(self, client: RolloutClient) -> None:
        self._client = client

    def _prompt_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return list(prompt)
        chat_tokens = self._client.service.chat_tokens
        last = self._client.episode.last_completion
        if last is not None and prompt.startswith(last[0]):
            rest = prompt[len(last[0]) :]
            return list(last[1]) + (chat_tokens.encode(rest) if rest else [])
        return chat_tokens.encode(prompt)

    async def create(self, **fields: object) -> Completion | AsyncIterator[Completion]:
        """`openai.AsyncOpenAI().completions.create`: the fields and their allowed values are
        `request_schema.CompletionRequest`'s; vLLM extras may come at the top level or in `extra_body`."""
        with self._client.noting_faults():
            return await self._create(fields)

    async def _create(self, fields: JSON) -> Completion | AsyncIterator[Completion]:
        client, service = self._client, self._client.service
        asked = service.accept(parse_completion(fields))
        prompt, model, logprobs = asked.prompt, asked.model, asked.logprobs
        if isinstance(prompt, list) and min(prompt) < 0:
            raise InvalidRequestError(f"token ids must be >= 0, got {min(prompt)}", param="prompt")
        request = client.prepare(
            self._prompt_ids(prompt), asked, max_tokens=asked.max_tokens, num_top_logprobs=logprobs or 0,
            with_logprobs=logprobs is not None, prompt_field="prompt",
        )
        include_usage = bool(asked.stream_options and asked.stream_options.include_usage)
        if asked.stream:
            return completion_stream(
                client.sample_stream(request), chat_tokens=service.chat_tokens, model=model,
                prompt_ids=request.prompt_ids,
                stop=request.sampling.stop, token_ids=request.token_ids, include_usage=include_usage,
                on_done=lambda generation: client.record(request.prompt_ids, generation),
            )
        generations = await client.sample(request)
        response = chat_answers.completion(
            service.chat_tokens, model, request.prompt_ids, generations, request.with_logprobs, request.token_ids,
            request.tokens_as_ids)
        for generation in generations:
            client.record(request.prompt_ids, generation)
        first = generations[0]
        raw_text = service.chat_tokens.decode(first.output_ids, skip_special_tokens=False)
        extendable = first.finish_reason is FinishReason.LENGTH and raw_text == response.choices[0].text
        if isinstance(prompt, str) and extendable:
            # only an output whose text is exactly its ids can be extended by text later
            client.remember(last_completion=(prompt + raw_text, tuple(request.prompt_ids) + tuple(first.output_ids)))
        return response
