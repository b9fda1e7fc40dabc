"""Wire dialects over the one chat path (the OpenAI Responses API, Anthropic Messages) and vLLM's token-in calls.

A dialect is a translation at the edge. Its request becomes the chat path's one internal request (messages, tools,
sampling: `RolloutClient.chat.completions.create`), so recording, versions, continuation across pushes, failure
kinds, validation and the token-exact rule for prior turns are the chat path's, not copies; the recorded answer
comes back as that dialect's answer or event stream.

- `turns.py`: what every dialect shares — the dialect-neutral view of an answer (`ChatAnswer`, whole or as
  streamed `Piece`s), the opaque handles (reasoning items' `encrypted_content`, thinking blocks' `signature`) that
  map a prior turn back to the exact text the policy generated, and the checks of a request's top-level fields.
- `openai_responses.py`: `POST /v1/responses` (Codex CLI, the OpenAI Agents SDK's default model).
- `anthropic_messages.py`: `POST /v1/messages` and `/v1/messages/count_tokens` (Claude Code, the `anthropic` SDK).
- `token_in.py`: vLLM's `POST /inference/v1/generate`, `/tokenize` and `/detokenize` (clients that render prompts
  themselves: verifiers' renderer client, prime-rl); its calls take the client's steps (prepare, sample, record)
  directly, with no chat translation, since their prompt is token ids already.

Does not own: HTTP (the gateway routes each dialect and writes its error shape), generation or recording.
May import: `contracts`, `config`, `infra`, `observe`, `engines`, `types`, `errors`, and the client's own modules (the
chat path it translates into); on the wire, the openai and anthropic SDKs' types.
"""
