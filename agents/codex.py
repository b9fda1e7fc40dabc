"""The Codex CLI (`@openai/codex`, 0.169.0 as locked in requirements/coding-agents/) run once for an episode against
the episode's gateway base URL (OpenAI Responses: `POST {base_url}/responses`, streamed).

Owns: `CodexConfig` (a frozen dataclass, also a Hydra structured config; each field's comment is its help), the
`config.toml` written into a private CODEX_HOME (`codex_config`: a `fullasync` model provider at the episode's base
URL with `wire_api = "responses"` and the key in an environment variable, no retries, no websockets; approvals never
asked; the sandbox mode; web search, analytics, feedback, OpenTelemetry export, history, bundled skills and the
features that add tools or reach the network (apps, plugins, goals, image generation, browser and computer use, view
image, hooks) off; sub-agents on request), the command line (`codex_command`: `codex exec --json --ephemeral
--strict-config`, the prompt on stdin), the environment (`codex_environment`: a private HOME and CODEX_HOME,
nothing of the caller's), and `run_codex`, one run to a `CodingAgentRun`. Codex 0.169 sends no output-token cap in
its requests (it has no setting for one): the context, or `rollout.max_answer_tokens`, is the budget (Codex ends a
turn whose answer was cut there as failed). With this configuration it makes no connection but to the gateway
(checked in a network namespace holding only loopback; see tests/fixtures/coding_agents/README.md). Does not own:
the gateway, recording, rewards or training — this runs the CLI, nothing more.

    run = await run_codex(CodexConfig(), CodingAgentEpisode.from_context(episode, workdir, task))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fullasync_agents.coding_agents import (
    CodingAgentEpisode,
    CodingAgentRun,
    base_environment,
    installed_binary,
    new_home,
    parse_transcript,
    require_binary,
    run_cli,
)

BINARY = "node_modules/.bin/codex"  # under the setup target's prefix (a Node launcher of the native binary)
PROVIDER = "fullasync"
KEY_VARIABLE = "FULLASYNC_API_KEY"  # the provider's env_key: the episode key, sent as `Authorization: Bearer`
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
FEATURES_OFF = ["apps", "plugins", "goals", "image_generation", "browser_use", "computer_use", "view_image",
                "shell_snapshot", "hooks"]


@dataclass(frozen=True)
class CodexConfig:
    binary: str = ""  # the `codex` executable; "" = the one `make setup-coding-agents` installed
    model: str = "policy"  # the served model name sent as `model`
    # Codex's own sandbox for the commands it runs; the episode's isolation is the sandbox or container it runs in
    sandbox_mode: str = "danger-full-access"
    features_off: list[str] = field(default_factory=lambda: list(FEATURES_OFF))  # [features] <name> = false
    # Codex's sub-agent tools (the multi_agent_v1 namespace: spawn_agent, wait_agent, send_input, ...); each
    # sub-agent is a context of its own and trains as a lineage of its own
    sub_agents: bool = False
    model_context_window: int = 0  # the context Codex assumes it has (compaction, truncation); 0 = its default
    auto_compact_token_limit: int = 0  # model_auto_compact_token_limit; 0 = Codex's default
    tool_output_token_limit: int = 2000  # tokens of one tool output kept in the conversation
    stream_idle_timeout_ms: int = 300_000  # a stream silent this long is a failed call
    time_limit_s: float = 300.0  # the CLI and everything it started are killed after this long
    extra_config: dict[str, Any] = field(default_factory=dict)  # more config.toml keys (tables as dicts) over ours
    extra_args: list[str] = field(default_factory=list)  # more `codex exec` flags, after the adapter's
    launcher: list[str] = field(default_factory=list)  # a command the CLI runs under (a sandbox, a network namespace)
    extra_env: dict[str, str] = field(default_factory=dict)  # more environment variables (win over the adapter's)
    path: str = ""  # PATH of the CLI (its launcher needs `node`) and of the commands it runs ("" = this PATH)
    home_parent: str = ""  # where the private HOME/CODEX_HOME is made ("" = the system temp dir)
    keep_home: bool = False  # keep the private HOME after the run (debugging)

    def __post_init__(self) -> None:
        if self.sandbox_mode not in SANDBOX_MODES:
            raise ValueError(f"sandbox_mode={self.sandbox_mode!r}; choose one of {SANDBOX_MODES}")
        for name in ("model_context_window", "auto_compact_token_limit"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 0 (0: Codex's default)")
        if self.tool_output_token_limit < 1 or self.stream_idle_timeout_ms < 1 or self.time_limit_s <= 0:
            raise ValueError("tool_output_token_limit and stream_idle_timeout_ms must be >= 1, time_limit_s > 0")


def codex_config(config: CodexConfig, episode: CodingAgentEpisode) -> dict[str, Any]:
    """config.toml as data: top-level keys, then tables."""
    settings: dict[str, Any] = {
        "model": config.model, "model_provider": PROVIDER, "approval_policy": "never",
        "sandbox_mode": config.sandbox_mode, "check_for_update_on_startup": False, "web_search": "disabled",
        "model_reasoning_summary": "none", "hide_agent_reasoning": True, "show_raw_agent_reasoning": False,
        "project_doc_max_bytes": 0, "tool_output_token_limit": config.tool_output_token_limit,
    }
    if config.model_context_window:
        settings["model_context_window"] = config.model_context_window
    if config.auto_compact_token_limit:
        settings["model_auto_compact_token_limit"] = config.auto_compact_token_limit
    settings["model_providers"] = {PROVIDER: {
        "name": "fullasync gateway", "base_url": episode.base_url.rstrip("/"), "env_key": KEY_VARIABLE,
        "wire_api": "responses", "request_max_retries": 0, "stream_max_retries": 0,
        "stream_idle_timeout_ms": config.stream_idle_timeout_ms, "supports_websockets": False,
        "requires_openai_auth": False,
    }}
    settings.update({
        "analytics": {"enabled": False}, "feedback": {"enabled": False},
        "otel": {"exporter": "none", "trace_exporter": "none", "metrics_exporter": "none", "log_user_prompt": False},
        "history": {"persistence": "none"}, "agents": {"enabled": config.sub_agents},
        "skills": {"include_instructions": False, "bundled": {"enabled": False}},
        "features": dict.fromkeys(config.features_off, False),
    })
    return _merge(settings, config.extra_config)


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        merged[key] = _merge(merged[key], value) if isinstance(value, Mapping) and isinstance(
            merged.get(key), dict) else value
    return merged


def to_toml(data: Mapping[str, Any], table: str = "") -> str:
    """TOML of strings, booleans, numbers, lists of them and nested tables (all config.toml needs here)."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in data.items() if not isinstance(value, Mapping)]
    text = (f"[{table}]\n" if table and lines else "") + "".join(line + "\n" for line in lines)
    for key, value in data.items():
        if isinstance(value, Mapping):
            text += ("\n" if text else "") + to_toml(value, f"{table}.{key}" if table else key)
    return text


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a TOML basic string: these JSON escapes are TOML's too
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    raise TypeError(f"config.toml value {value!r} is not a string, boolean, number or list")


def codex_command(config: CodexConfig, episode: CodingAgentEpisode) -> list[str]:
    """The command line; `-` reads the prompt from stdin."""
    return [str(installed_binary(BINARY, config.binary)), "exec", "--json", "--ephemeral", "--strict-config",
            "--skip-git-repo-check", "--ignore-rules", "-C", episode.workdir, *config.extra_args, "-"]


def codex_environment(config: CodexConfig, episode: CodingAgentEpisode, home: Path) -> dict[str, str]:
    """The CLI's whole environment (nothing inherited but PATH)."""
    env = base_environment(home, config.path or None)
    env.update({"CODEX_HOME": str(home / "codex"), KEY_VARIABLE: episode.api_key})
    env.update(config.extra_env)
    return env


def codex_status(transcript: Sequence[Mapping[str, object]]) -> str:
    """The type of the transcript's last turn event: turn.completed or turn.failed ("" when there is none)."""
    turns = [event["type"] for event in transcript if event.get("type") in ("turn.completed", "turn.failed")]
    return str(turns[-1]) if turns else ""


async def run_codex(config: CodexConfig, episode: CodingAgentEpisode) -> CodingAgentRun:
    """Codex once on `episode.prompt` in `episode.workdir`, its model calls to the episode's gateway."""
    argv = codex_command(config, episode)
    require_binary(Path(argv[0]), "Codex")
    argv = [*config.launcher, *argv]
    home = new_home("fullasync-codex-", config.home_parent)
    codex_home = home / "codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(to_toml(codex_config(config, episode)))
    env = codex_environment(config, episode, home)
    returncode, timed_out, stdout, stderr = await run_cli(argv, env, episode.workdir, episode.prompt,
                                                          config.time_limit_s, home, config.keep_home)
    transcript = parse_transcript(stdout)
    return CodingAgentRun(returncode, timed_out, codex_status(transcript), transcript, stderr)
