"""The HTTP gateway (OpenAI chat and Responses, Anthropic Messages) for harnesses that only take a base URL.
One URL per episode.

- `server.py`: `Gateway` (episodes' keys and lifetimes, the server's start and stop); `routes.py`: the routes, one
  path for every dialect (`dialects.py`: chat completions, completions, the Responses API, Anthropic Messages);
  `wire.py`: error bodies, statuses and SSE; `delivery.py`: a call counts only once its answer reached the
  harness, and an identical retry joins it; `http.py`: uvicorn on loopback as a task of the caller's loop.

Does not own: generation, recording or continuation (the client does all of that, the same for in-process
and HTTP harnesses). May import: `contracts`, `config`, `infra`, `observe`, `client`, `types`, `errors`.
"""

from fullasync.gateway.server import Gateway, GatewayEpisode

__all__ = ["Gateway", "GatewayEpisode"]
