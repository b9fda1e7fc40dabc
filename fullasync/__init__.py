"""fullasync: agent-harness-agnostic, fully asynchronous RL post-training of LLMs."""

__version__ = "0.1.0"
