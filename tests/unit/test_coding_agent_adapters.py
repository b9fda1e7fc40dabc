"""The coding-agent CLI adapters' command lines, environments and Codex's config.toml, built without running a CLI
or a gateway (what the CLIs send with these settings is recorded in tests/fixtures/coding_agents/)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from fullasync_agents.claude_code import ClaudeCodeConfig, claude_code_command, claude_code_environment
from fullasync_agents.codex import CodexConfig, codex_command, codex_config, codex_environment, to_toml
from fullasync_agents.coding_agents import CodingAgentEpisode, parse_transcript

BASE_URL = "http://127.0.0.1:8123/sessions/abc/v1"


def _episode(tmp_path: Path) -> CodingAgentEpisode:
    return CodingAgentEpisode(BASE_URL, "abc", str(tmp_path), "Fix the bug.")


def test_an_episode_refuses_a_gateway_that_is_not_on_loopback(tmp_path):
    for url in ("http://10.0.0.5:8123/sessions/abc/v1", "https://api.anthropic.com", "not a url"):
        with pytest.raises(ValueError, match="loopback"):
            CodingAgentEpisode(url, "abc", str(tmp_path), "x")
    for url in ("http://localhost:1/v1", "http://[::1]:1/v1", BASE_URL):
        CodingAgentEpisode(url, "abc", str(tmp_path), "x")


def test_claude_code_runs_in_print_mode_with_only_the_tools_given_and_no_prompts(tmp_path):
    argv = claude_code_command(ClaudeCodeConfig(binary="/opt/claude", tools=["Bash", "Read"], max_turns=3,
                                                append_system_prompt="Be brief."))
    assert argv[0] == "/opt/claude" and argv[1] == "-p"
    assert "--dangerously-skip-permissions" not in argv  # refused as root: tools are pre-approved instead
    assert argv[argv.index("--output-format") + 1] == "stream-json" and "--verbose" in argv
    assert argv[argv.index("--tools") + 1] == "Bash,Read" == argv[argv.index("--allowedTools") + 1]
    assert argv[argv.index("--permission-mode") + 1] == "dontAsk"
    assert argv[argv.index("--max-turns") + 1] == "3"
    assert argv[argv.index("--append-system-prompt") + 1] == "Be brief."
    assert json.loads(argv[argv.index("--settings") + 1])["includeCoAuthoredBy"] is False
    assert {"--no-session-persistence", "--strict-mcp-config", "--setting-sources="} <= set(argv)
    assert "Fix the bug." not in argv  # the prompt goes on stdin


def test_claude_code_environment_points_every_model_at_the_gateway_and_inherits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "the-users-own-key")
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    home = tmp_path / "home"
    env = claude_code_environment(ClaudeCodeConfig(model="served", max_output_tokens=200), _episode(tmp_path), home)
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8123/sessions/abc"  # Claude Code appends /v1/messages
    assert env["ANTHROPIC_API_KEY"] == "abc" and "HTTPS_PROXY" not in env
    assert env["HOME"] == str(home) and env["CLAUDE_CONFIG_DIR"] == str(home / ".claude")
    assert (home / "tmp").is_dir() and env["TMPDIR"] == str(home / "tmp")
    assert {env[name] for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "CLAUDE_CODE_SUBAGENT_MODEL")} \
        == {"served"}
    assert env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "200"
    for name in ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING",
                 "DISABLE_AUTOUPDATER"):
        assert env[name] == "1"
    assert all(name in ("PATH", "HOME", "TMPDIR", "LANG") or name.startswith(
        ("ANTHROPIC_", "CLAUDE_", "DISABLE_", "MAX_THINKING")) for name in env)


def test_claude_code_config_names_the_field_to_fix():
    with pytest.raises(ValueError, match="allowed_tools"):
        ClaudeCodeConfig(tools=["Read"], allowed_tools=["Bash"])
    with pytest.raises(ValueError, match="max_turns"):
        ClaudeCodeConfig(max_turns=0)


def test_codex_config_toml_has_the_gateway_provider_and_everything_else_off(tmp_path):
    config = CodexConfig(model="served", model_context_window=8192,
                         extra_config={"features": {"unified_exec": False}, "model_verbosity": "low"})
    toml = tomllib.loads(to_toml(codex_config(config, _episode(tmp_path))))
    assert toml["model"] == "served" and toml["model_provider"] == "fullasync"
    provider = toml["model_providers"]["fullasync"]
    assert provider["base_url"] == BASE_URL and provider["wire_api"] == "responses"
    assert provider["env_key"] == "FULLASYNC_API_KEY" and provider["supports_websockets"] is False
    assert toml["approval_policy"] == "never" and toml["web_search"] == "disabled"
    assert toml["analytics"]["enabled"] is False and toml["otel"]["exporter"] == "none"
    assert toml["skills"]["bundled"]["enabled"] is False and toml["model_context_window"] == 8192
    assert toml["features"]["plugins"] is False and toml["features"]["unified_exec"] is False  # merged, not replaced
    assert toml["model_verbosity"] == "low"
    assert toml["agents"]["enabled"] is False  # sub-agents only when asked for
    with_sub_agents = tomllib.loads(to_toml(codex_config(CodexConfig(sub_agents=True), _episode(tmp_path))))
    assert with_sub_agents["agents"]["enabled"] is True


def test_toml_strings_survive_quotes_newlines_and_emoji():
    text = 'say "hi"\n\tthen 🤖 \\ done'
    assert tomllib.loads(to_toml({"developer_instructions": text}))["developer_instructions"] == text


def test_codex_command_and_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "the-users-own-key")
    episode = _episode(tmp_path)
    argv = codex_command(CodexConfig(binary="/opt/codex"), episode)
    assert argv[:2] == ["/opt/codex", "exec"] and argv[-1] == "-"  # the prompt on stdin
    assert {"--json", "--ephemeral", "--strict-config", "--skip-git-repo-check"} <= set(argv)
    assert argv[argv.index("-C") + 1] == str(tmp_path)
    env = codex_environment(CodexConfig(), episode, tmp_path / "home")
    assert env["CODEX_HOME"] == str(tmp_path / "home" / "codex") and env["FULLASYNC_API_KEY"] == "abc"
    assert "OPENAI_API_KEY" not in env
    with pytest.raises(ValueError, match="sandbox_mode"):
        CodexConfig(sandbox_mode="none")


def test_a_transcript_keeps_lines_that_are_not_json():
    events = parse_transcript('{"type": "turn.started"}\nReading additional input from stdin...\n\n[1]\n')
    assert events == [{"type": "turn.started"}, {"type": "non_json", "line": "Reading additional input from stdin..."},
                      {"type": "non_json", "line": "[1]"}]
