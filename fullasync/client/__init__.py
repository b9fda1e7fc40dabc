"""The OpenAI-style, token-exact client that harnesses call.

- `rollout_client.py`: `RolloutService` (what every episode shares: tokenizer, router, settings) and
  `RolloutClient` (one episode: `chat.completions.create`, `completions.create`, `responses.create`,
  `messages.create`); `dialects/`: the Responses API and Anthropic Messages translated into the chat path.
- `request_schema.py` / `messages.py`: requests checked and normalised; `chat_tokens.py`: prompt ids that
  continue a turn without re-tokenization; `tool_parsers.py` / `reasoning.py`: every vLLM tool and reasoning
  format; `answers.py` / `streaming.py` / `chat_answers.py`: the answer, streamed or whole.
- `continuation.py`: a call interrupted by a push resubmits its tokens under the new weights; `episode.py`: what
  one episode recorded (its model calls, their versions) and which calls are held.
- `beside.py`: models beside the policy a harness or reward calls (a judge): `RemoteModel`, `ServedModel`,
  `BesideClient` (`client.judge`), never recorded.
- `wire_types.py`: the chat path's data as typed: JSON objects, normalised messages, tools (the openai SDK's type),
  a constraining `tool_choice`.

Does not own: engines (it calls them through `Engine`), HTTP (`gateway`), episodes' scheduling (`rollout`).
May import: `contracts`, `config`, `infra`, `observe`, `engines`, `types`, `errors`.
"""

from fullasync.client.rollout_client import ClientConfig, RolloutClient, RolloutService

__all__ = ["ClientConfig", "RolloutClient", "RolloutService"]
