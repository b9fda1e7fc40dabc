"""The OpenAI-compatible HTTP gateway for harnesses that only take a base URL."""

from fullasync.gateway.server import Gateway, GatewayEpisode

__all__ = ["Gateway", "GatewayEpisode"]
