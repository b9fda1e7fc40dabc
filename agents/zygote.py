"""The harness side of an out-of-process harness: a warm process that forks one process per episode.

Owns: `serve(import_harness, run_episode)` — import the harness once (seconds of CPU for litellm and
friends), print `READY`, then for every JSON spec line on stdin fork an episode process and answer
`{"pid": ...}`. Each episode process starts a session of its own, becomes the subreaper of everything
it starts, logs to `spec["log_path"]`, writes `run_episode(spec)` (a JSON-able dict) atomically to
`spec["result_path"]`, kills its leftovers and exits. Stdlib plus `fullasync.rollout.processes` only,
so it runs in any interpreter a harness needs (the Terminus-2 harness runs it under Python 3.12).
Does not own: time limits or the hard kill (`fullasync_agents.launcher`), nor what an episode does.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fullasync.rollout.processes import become_subreaper, descendants

READY = "ready"  # the zygote's first line on stdout once the harness is imported


def write_result(path: str, result: dict[str, Any]) -> None:
    staging = f"{path}.partial"
    Path(staging).write_text(json.dumps(result))
    os.replace(staging, path)  # the launcher reads whole results only


def kill_leftovers() -> None:
    """Kill whatever this episode process started and left running (background jobs, new sessions)."""
    for _ in range(20):
        left = descendants(os.getpid())
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # ended on its own meanwhile
                continue
        for pid in left:  # reap our zombies so the next sweep sees the orphans they left
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # not our direct child
                continue


def _episode_process(spec: dict[str, Any], run_episode: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The forked child: own session, subreaper, logs to a file; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        become_subreaper()
        log = os.open(spec["log_path"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        write_result(spec["result_path"], run_episode(spec))
        code = 0
    except BaseException:  # the process must end with os._exit whatever happened: log it for the launcher
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        kill_leftovers()
        os._exit(code)


def _reap(signum, frame) -> None:
    """SIGCHLD in the zygote: collect finished episode processes (and orphans it inherited as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(import_harness: Callable[[], None], run_episode: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """The zygote loop: one JSON spec per stdin line → fork an episode process → print {"pid": ...}."""
    import_harness()
    become_subreaper()
    signal.signal(signal.SIGCHLD, _reap)
    print(READY, flush=True)
    while line := sys.stdin.readline():
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _episode_process(spec, run_episode)
        print(json.dumps({"pid": pid}), flush=True)
