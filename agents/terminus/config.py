"""How Terminus-2 is run for an episode: `TerminusConfig` (a frozen dataclass, also a Hydra structured config).

Owns: every knob of the adapter (each field's comment is its help), their start-up checks (errors name
the field and the fix), and the harbor configuration they turn into: the `terminus-2` agent's
constructor kwargs (`agent_kwargs`) and the environment entry (`environment_entry`). Terminus-2's
prompt is harbor's own template, not configurable here. Does not own: running anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from fullasync.types import JsonValue
from fullasync_agents.containers import ContainerSettings

LOCAL_ENVIRONMENT = "fullasync_agents.terminus.sandbox_environment:LocalNamespaceEnvironment"
CONTAINER_ENVIRONMENT = "fullasync_agents.terminus.container_environment:TaskContainerEnvironment"
STARTED_ENVIRONMENT = "fullasync_agents.terminus.started_environment:StartedContainerEnvironment"
PARSERS = ("json", "xml")  # Terminus-2's two response formats


@dataclass(frozen=True)
class TerminusConfig:
    model_name: str = "hosted_vllm/policy"  # litellm model name; the part after the provider is the served model name
    temperature: float = 1.0  # sampling temperature of every model call
    max_tokens: int = 256  # output budget of a call (a cut-off reply is Terminus-2's "too long" turn); 0 = the context
    context_length: int = 2048  # the policy's context; litellm's model_info.max_input_tokens for hosted_vllm/
    max_turns: int = 4  # Terminus-2 max_turns: agent turns per episode, then the trial is verified
    parser: str = "json"  # json | xml: Terminus-2's response format
    pane_width: int = 80  # tmux pane columns (Terminus-2's default is 160; a smaller screen is a shorter prompt)
    pane_height: int = 24  # tmux pane rows (Terminus-2's default is 40)
    agent_timeout_s: float = 0.0  # harbor's agent timeout (the trial is still verified after it); 0 = the task's own
    verifier_timeout_s: float = 0.0  # harbor's verifier timeout; 0 = the task's own
    episode_timeout_s: float = 300.0  # hard limit: the harness and every process it started are killed, episode failed
    summarize: bool = True  # harbor's enable_summarize: a full context hands over to a fresh one with a summary
    # (each context trains as its own sequence); off, an overflowing call ends the episode, scored 0
    summarize_below_free_tokens: int = 0  # proactive summary once fewer free tokens remain (harbor uses 8000 for
    # its 32k+ contexts); 0 = only when a call overflows the context
    environment_type: str = "local"  # local (namespace sandbox, no daemon) | container (the task's image, no
    # network, `container`'s limits, budgets and warm pool, on this host or the Ray nodes: container.placement;
    # make setup-containers) | another harbor type, e.g. docker
    container: ContainerSettings = field(default_factory=ContainerSettings)  # environment_type=container only
    environment_import_path: str = ""  # a harbor BaseEnvironment as "module:Class" (wins over environment_type)
    environment: dict[str, Any] = field(default_factory=dict)  # extra environment kwargs (EnvironmentConfig.kwargs)
    llm_call_kwargs: dict[str, Any] = field(default_factory=dict)  # extra kwargs of every model call (e.g. extra_body)
    agent_kwargs: dict[str, Any] = field(default_factory=dict)  # further Terminus2 constructor kwargs (win over these)
    harbor_python: str = ""  # interpreter with harbor==0.24.0; "" = $FULLASYNC_HARBOR_PYTHON or <checkout>/.venv-harbor
    sandbox_parent: str = ""  # where local sandboxes are created ("" = the episode's own directory)

    def __post_init__(self) -> None:
        if "/" not in self.model_name:
            raise ValueError(f"model_name={self.model_name!r} needs a litellm provider, e.g. 'hosted_vllm/policy'")
        if self.parser not in PARSERS:
            raise ValueError(f"parser={self.parser!r}; choose one of {PARSERS}")
        for name in ("context_length", "max_turns", "pane_width", "pane_height"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_tokens < 0:
            raise ValueError(f"max_tokens={self.max_tokens} must be >= 0 (0 = up to the end of the context)")
        if self.max_tokens >= self.context_length:
            raise ValueError(f"max_tokens={self.max_tokens} must be below context_length={self.context_length}")
        if self.episode_timeout_s <= 0:
            raise ValueError(f"episode_timeout_s={self.episode_timeout_s} must be > 0")
        if self.agent_timeout_s < 0 or self.verifier_timeout_s < 0:
            raise ValueError("agent_timeout_s and verifier_timeout_s must be >= 0 (0 = the task's own)")
        if not 0 <= self.summarize_below_free_tokens < self.context_length:
            raise ValueError(f"summarize_below_free_tokens={self.summarize_below_free_tokens} must be in [0, "
                             f"context_length={self.context_length}) (0 = summarise only when a call overflows)")
        if self.container.placement == "cluster" and (self.environment_type != "container"
                                                      or self.environment_import_path):
            raise ValueError(f"container.placement=cluster places the task containers of environment_type=container "
                             f"on the Ray nodes; environment_type={self.environment_type!r}"
                             f"{' with environment_import_path' if self.environment_import_path else ''} starts "
                             "none: set environment_type=container (or placement=local)")
        if self.agent_timeout_s >= self.episode_timeout_s:
            raise ValueError(f"agent_timeout_s={self.agent_timeout_s} must be below episode_timeout_s="
                             f"{self.episode_timeout_s} (the hard kill would come first and the trial would fail "
                             "unverified); lower agent_timeout_s or raise episode_timeout_s")

    def agent_kwargs_for(self, base_url: str, api_key: str,
                         llm_call_kwargs: dict[str, JsonValue]) -> dict[str, JsonValue]:
        """Terminus2's constructor kwargs for one episode on the gateway."""
        return {
            "api_base": base_url, "temperature": self.temperature, "max_turns": self.max_turns,
            "parser_name": self.parser, "collect_rollout_details": True, "store_all_messages": True,
            "enable_summarize": self.summarize, "proactive_summarization_threshold": self.summarize_below_free_tokens,
            "record_terminal_session": False,  # asciinema is not needed (and not installed)
            "suppress_max_turns_warning": True,
            "tmux_pane_width": self.pane_width, "tmux_pane_height": self.pane_height,
            "model_info": {"max_input_tokens": self.context_length,
                           "max_output_tokens": self.max_tokens or self.context_length,
                           "input_cost_per_token": 0.0, "output_cost_per_token": 0.0},
            "llm_kwargs": {"api_key": api_key, **({"max_tokens": self.max_tokens} if self.max_tokens else {})},
            "llm_call_kwargs": llm_call_kwargs,
            **self.agent_kwargs,
        }

    def environment_entry(self, sandbox_parent: str, labels: dict[str, str] | None = None, slots_dir: str = "",
                          started_container: tuple[str, str] | None = None) -> dict[str, JsonValue]:
        """harbor's `EnvironmentConfig` fields: the local namespace sandbox, the task's container (with `labels`
        and the start slots in `slots_dir`, for a compose task; or `started_container`: the id and the executable to
        `exec` into the one `fullasync_agents.sandboxes` started), or a harbor environment type."""
        if started_container is not None:
            container_id, executable = started_container
            return {"import_path": STARTED_ENVIRONMENT, "delete": False,
                    "kwargs": {"container_id": container_id, "executable": executable, **self.environment}}
        if self.environment_type == "container" and not self.environment_import_path:
            kwargs = {"container": asdict(self.container), "labels": dict(labels or {}), "slots_dir": slots_dir,
                      **self.environment}
            return {"import_path": CONTAINER_ENVIRONMENT, "kwargs": kwargs, "delete": False}  # keep the task image
        if self.environment_import_path or self.environment_type == "local":
            kwargs = dict(self.environment)
            if not self.environment_import_path:
                kwargs.setdefault("sandbox_parent", self.sandbox_parent or sandbox_parent)
            return {"import_path": self.environment_import_path or LOCAL_ENVIRONMENT, "kwargs": kwargs}
        return {"type": self.environment_type, "kwargs": dict(self.environment)}
