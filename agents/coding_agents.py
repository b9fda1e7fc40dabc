"""What the coding-agent CLI adapters share (`fullasync_agents.claude_code`, `fullasync_agents.codex`).

Owns: `CodingAgentEpisode` (one episode as a CLI sees it: the gateway's base URL and key, refused unless the host is
loopback; the working directory; the prompt), where `make setup-coding-agents` put the CLIs (`installed_binary`),
the environment every CLI starts from (`base_environment`: a private HOME and TMPDIR, nothing of the caller's
environment but PATH and what the adapter adds, so no credentials, proxies or configuration of the user leak in), and
running one CLI to its end under a time limit (`run_cli`, over `fullasync.rollout.generator.run_process`: the CLI in a
process group of its own, killed with everything it started at the limit) into a `CodingAgentRun` — its exit status
and its JSON-lines transcript. Stdlib plus `fullasync.rollout.generator`. Does not own: the CLIs' flags, environment
and configuration (each adapter), the gateway, recording, rewards or training; nothing here trains anything.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fullasync.rollout.generator import EpisodeContext, run_process

PREFIX_ENV = "FULLASYNC_CODING_AGENTS"  # overrides where `make setup-coding-agents` installed the CLIs
DEFAULT_PREFIX = Path(__file__).resolve().parent.parent / ".coding-agents"  # the repository's git-ignored prefix
SETUP_HINT = "run `make setup-coding-agents` (installs the CLIs pinned in requirements/coding-agents/)"
STDERR_TAIL_CHARS = 4000


class CodingAgentMissingError(FileNotFoundError):
    """The CLI is not installed where the adapter looks for it."""


@dataclass(frozen=True)
class CodingAgentEpisode:
    """One episode for a CLI: where its model calls go (the episode's gateway base URL `.../sessions/KEY/v1` and
    key), the directory it works in, and the task it is given."""

    base_url: str
    api_key: str
    workdir: str
    prompt: str

    def __post_init__(self) -> None:
        host = urlsplit(self.base_url).hostname
        if not host or not _is_loopback(host):
            raise ValueError(f"base_url={self.base_url!r}: a coding agent talks to the gateway on loopback only "
                             "(127.0.0.1, ::1 or localhost); start the gateway on loopback")
        if not Path(self.workdir).is_dir():
            raise ValueError(f"workdir={self.workdir!r} is not a directory")

    @classmethod
    def from_context(cls, episode: EpisodeContext, workdir: str, prompt: str) -> CodingAgentEpisode:
        """The episode of a `CustomGenerator` with `uses_gateway = True`."""
        if episode.base_url is None or episode.api_key is None:
            raise ValueError(f"episode {episode.episode_id} has no gateway base URL: the generator needs "
                             "uses_gateway = True")
        return cls(episode.base_url, episode.api_key, workdir, prompt)


@dataclass(frozen=True)
class CodingAgentRun:
    """How one CLI run ended. `returncode` is None when it was killed at the time limit (`timed_out`; the output
    of a killed run is not kept). `status` is the CLI's own last word in its transcript ("" when it has none)."""

    returncode: int | None
    timed_out: bool
    status: str
    transcript: list[dict[str, Any]] = field(default_factory=list)  # the CLI's JSON-lines output, one event each
    stderr: str = ""  # its last STDERR_TAIL_CHARS characters


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def installed_binary(relative: str, configured: str = "") -> Path:
    """`configured` if given, else `relative` under the setup target's prefix ($FULLASYNC_CODING_AGENTS or the
    repository's .coding-agents/)."""
    if configured:
        return Path(configured)
    return Path(os.environ.get(PREFIX_ENV) or DEFAULT_PREFIX) / relative


def require_binary(path: Path, name: str) -> None:
    if not os.access(path, os.X_OK):
        raise CodingAgentMissingError(f"{name} is not installed at {path}: {SETUP_HINT}, or set its `binary`")


def base_environment(home: Path, path: str | None = None) -> dict[str, str]:
    """The environment a CLI starts from: a private HOME and TMPDIR under `home`, PATH, a UTF-8 locale; nothing
    else of this process's environment."""
    tmp = home / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return {"HOME": str(home), "TMPDIR": str(tmp), "LANG": "C.UTF-8",
            "PATH": path if path is not None else os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")}


def new_home(prefix: str, parent: str = "") -> Path:
    """A fresh directory for a CLI's HOME (and its own configuration directory), removed by `run_cli`."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent or None))


def parse_transcript(stdout: str) -> list[dict[str, Any]]:
    """One event per JSON line; a line that is not a JSON object is kept as {"type": "non_json", "line": ...}."""
    events: list[dict[str, Any]] = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            event = None
        events.append(event if isinstance(event, dict) else {"type": "non_json", "line": line})
    return events


async def run_cli(argv: Sequence[str], env: Mapping[str, str], cwd: str, prompt: str, time_limit_s: float,
                  home: Path, keep_home: bool = False) -> tuple[int | None, bool, str, str]:
    """Run `argv` in `cwd` with `prompt` on its stdin; at `time_limit_s` it is killed with every process it started.
    (returncode or None, timed_out, stdout, stderr); `home` is removed afterwards unless `keep_home`."""
    try:
        async with asyncio.timeout(time_limit_s):
            done = await run_process(*argv, cwd=cwd, env=env, stdin=prompt.encode())
    except TimeoutError:
        return None, True, "", ""
    finally:
        if not keep_home:
            shutil.rmtree(home, ignore_errors=True)
    return done.returncode, False, done.stdout, done.stderr[-STDERR_TAIL_CHARS:]
