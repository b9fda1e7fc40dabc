"""The OpenAI-style, token-exact client that harnesses call."""

from fullasync.client.rollout_client import ClientConfig, RolloutClient, RolloutService

__all__ = ["ClientConfig", "RolloutClient", "RolloutService"]
