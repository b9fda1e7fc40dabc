"""Claude Code (the `@anthropic-ai/claude-code` CLI, 2.1.328 as locked in requirements/coding-agents/) run once for
an episode against the episode's gateway base URL (Anthropic Messages: `POST {base}/v1/messages?beta=true`).

Owns: `ClaudeCodeConfig` (a frozen dataclass, also a Hydra structured config; each field's comment is its help),
the command line (`claude_code_command`: print mode, stream-json transcript, the tool set given and pre-approved
with `--permission-mode dontAsk` — nothing prompts, which also works as root, where Claude Code refuses
--dangerously-skip-permissions — a turn cap, no session files, no MCP servers, no slash commands, no settings files
but the adapter's own), the environment (`claude_code_environment`: the gateway as ANTHROPIC_BASE_URL, the episode
key, every model alias set to the served model name, the output budget, non-essential traffic, telemetry, error
reporting, the auto-updater, experimental betas, thinking, auto-memory and the non-streaming fallback off; a private
HOME and CLAUDE_CONFIG_DIR), and `run_claude_code`, one run to a `CodingAgentRun`. With these settings it makes no
connection but to the gateway (checked in a network namespace holding only loopback; see
tests/fixtures/coding_agents/README.md for what it sends). Does not own: the gateway, recording, rewards or
training — this runs the CLI, nothing more.

    run = await run_claude_code(ClaudeCodeConfig(), CodingAgentEpisode.from_context(episode, workdir, task))
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

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

BINARY = "node_modules/.bin/claude"  # under the setup target's prefix
# Model aliases Claude Code resolves on its own (background calls, sub-agents): all point at the served model.
MODEL_VARIABLES = ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                   "ANTHROPIC_DEFAULT_SONNET_MODEL", "ANTHROPIC_DEFAULT_OPUS_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")
BACKGROUND_VARIABLES = ("ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL")  # its small, fast model
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # no update checks, metrics, feedback, api.anthropic.com lookups
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "CLAUDE_CODE_DISABLE_EXPERIMENTAL_BETAS": "1",  # no context_management, no deferred-tool placeholder
    "MAX_THINKING_TOKENS": "0",  # no `thinking` field
    "CLAUDE_CODE_DISABLE_AUTO_MEMORY": "1",  # no memory section (and no memory directory) in the system prompt
    "CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK": "1",  # a broken stream is an error, not a second, unstreamed call
    "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",  # no first system block that changes with the prompt (cc_version=...)
}
# No co-authored-by reminder in the first user message.
SETTINGS = {"includeCoAuthoredBy": False, "attribution": {"commit": "", "pr": ""}}


@dataclass(frozen=True)
class ClaudeCodeConfig:
    binary: str = ""  # the `claude` executable; "" = the one `make setup-coding-agents` installed
    model: str = "policy"  # the served model name sent as `model` (every alias Claude Code uses is set to it)
    # the name of Claude Code's small, fast model (titles, command checks): "" = `model` (trained like the rest); give
    # the gateway the same name as an untrained model (`Gateway(untrained_models=...)`) to answer those calls untrained
    background_model: str = ""
    tools: list[str] = field(default_factory=lambda: ["Bash", "Read", "Write"])  # --tools: the built-in tools offered
    allowed_tools: list[str] = field(default_factory=list)  # --allowedTools, run without asking; [] = all of `tools`
    max_turns: int = 8  # --max-turns: model calls of the agent loop
    max_output_tokens: int = 1024  # CLAUDE_CODE_MAX_OUTPUT_TOKENS: `max_tokens` of every model call
    max_retries: int = 0  # CLAUDE_CODE_MAX_RETRIES: resends of a failed model call
    time_limit_s: float = 300.0  # the CLI and everything it started are killed after this long
    system_prompt: str = ""  # --system-prompt: replaces Claude Code's own ("" = keep its own)
    append_system_prompt: str = ""  # --append-system-prompt: added to the end of the system prompt
    bare: bool = False  # --bare: a two-line system prompt, only Bash, Edit and Read (no Write): not the real harness
    extra_args: list[str] = field(default_factory=list)  # more command-line flags, after the adapter's
    launcher: list[str] = field(default_factory=list)  # a command the CLI runs under (a sandbox, a network namespace)
    extra_env: dict[str, str] = field(default_factory=dict)  # more environment variables (win over the adapter's)
    path: str = ""  # PATH of the CLI and of the commands it runs ("" = this process's PATH)
    home_parent: str = ""  # where the private HOME is made ("" = the system temp dir)
    keep_home: bool = False  # keep the private HOME after the run (debugging)

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.max_retries < 0 or self.time_limit_s <= 0:
            raise ValueError("max_retries must be >= 0 and time_limit_s > 0")
        if not self.tools:
            raise ValueError("tools=[] offers the agent no tools; name some, e.g. ['Bash', 'Read', 'Write']")
        if unknown := set(self.allowed_tools) - set(self.tools):
            raise ValueError(f"allowed_tools names {sorted(unknown)}, which are not in tools={self.tools}")


def anthropic_base_url(base_url: str) -> str:
    """Claude Code appends /v1/messages itself: the gateway's `.../sessions/KEY/v1` without its `/v1`."""
    trimmed = base_url.rstrip("/")
    return trimmed[:-len("/v1")] if trimmed.endswith("/v1") else trimmed


def claude_code_command(config: ClaudeCodeConfig) -> list[str]:
    """The command line; the prompt goes on stdin."""
    allowed = config.allowed_tools or config.tools
    argv = [str(installed_binary(BINARY, config.binary)), "-p", "--output-format", "stream-json", "--verbose",
            "--model", config.model, "--tools", ",".join(config.tools), "--allowedTools", ",".join(allowed),
            "--permission-mode", "dontAsk", "--max-turns", str(config.max_turns), "--no-session-persistence",
            "--strict-mcp-config", "--disable-slash-commands", "--setting-sources=",
            "--settings", json.dumps(SETTINGS, separators=(",", ":"))]
    if config.bare:
        argv.append("--bare")
    if config.system_prompt:
        argv += ["--system-prompt", config.system_prompt]
    if config.append_system_prompt:
        argv += ["--append-system-prompt", config.append_system_prompt]
    return argv + list(config.extra_args)


def claude_code_environment(config: ClaudeCodeConfig, episode: CodingAgentEpisode, home: Path) -> dict[str, str]:
    """The CLI's whole environment (nothing inherited but PATH)."""
    env = base_environment(home, config.path or None)
    env.update({"CLAUDE_CONFIG_DIR": str(home / ".claude"), "ANTHROPIC_BASE_URL": anthropic_base_url(episode.base_url),
                "ANTHROPIC_API_KEY": episode.api_key,
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(config.max_output_tokens),
                "CLAUDE_CODE_MAX_RETRIES": str(config.max_retries), **QUIET})
    env.update(dict.fromkeys(MODEL_VARIABLES, config.model))
    if config.background_model:
        env.update(dict.fromkeys(BACKGROUND_VARIABLES, config.background_model))
    env.update(config.extra_env)
    return env


def claude_code_status(transcript: Sequence[Mapping[str, object]]) -> str:
    """The subtype of the transcript's last `result` event (success, error_max_turns, error_during_execution, ...)."""
    results = [event for event in transcript if event.get("type") == "result"]
    return str(results[-1].get("subtype", "")) if results else ""


async def run_claude_code(config: ClaudeCodeConfig, episode: CodingAgentEpisode) -> CodingAgentRun:
    """Claude Code once on `episode.prompt` in `episode.workdir`, its model calls to the episode's gateway."""
    argv = claude_code_command(config)
    require_binary(Path(argv[0]), "Claude Code")
    argv = [*config.launcher, *argv]
    home = new_home("fullasync-claude-code-", config.home_parent)
    env = claude_code_environment(config, episode, home)
    returncode, timed_out, stdout, stderr = await run_cli(argv, env, episode.workdir, episode.prompt,
                                                          config.time_limit_s, home, config.keep_home)
    transcript = parse_transcript(stdout)
    return CodingAgentRun(returncode, timed_out, claude_code_status(transcript), transcript, stderr)
