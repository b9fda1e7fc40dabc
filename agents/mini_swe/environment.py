"""mini-swe-agent's own container environment, attached to the episode's container instead of starting one.

Owns: `AttachedContainerEnvironment` — mini-swe-agent's `DockerEnvironment` (its `execute`, its submission check,
podman or docker as `executable`) running every command in a container the generator started for the episode
(`fullasync_agents.containers`: image, limits, labels, no network) and removes after scoring it; the harness neither
starts nor stops it. Loaded in the harness process by class path (`environment_class`).
"""

from __future__ import annotations

from typing import Any

from minisweagent.environments.docker import DockerEnvironment, DockerEnvironmentConfig


class AttachedContainerConfig(DockerEnvironmentConfig):
    container_id: str  # the running container the generator started for this episode


class AttachedContainerEnvironment(DockerEnvironment):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(config_class=AttachedContainerConfig, **kwargs)

    def _start_container(self) -> None:
        self.container_id = self.config.container_id

    def cleanup(self) -> None:
        """Nothing: the generator scores the container after the agent ends, then removes it."""
