"""The harness side of an out-of-process harness: a warm process that forks one process per episode.

Owns: `serve(import_harness, run_episode, spec_type)` — import the harness once (seconds of CPU for litellm
and friends), print `READY`, then for every `EpisodeRequest` line on stdin check it and its spec (a
`spec_type` record), fork an episode process and answer a `ForkReply` with its pid — or, for a request that
does not match its types, with the error and no process. Each episode process starts a session of its own,
becomes the subreaper of everything it starts, logs to the request's `log_path`, writes `run_episode(spec)`
(the harness's result record) atomically to its `result_path`, kills its leftovers and exits. Stdlib plus
`fullasync.rollout.processes` and `fullasync.types` only, so it runs in any interpreter a harness needs (the
Terminus-2 harness runs it under Python 3.12).
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
from types import FrameType
from typing import TypeVar

from fullasync.rollout.processes import become_subreaper, descendants
from fullasync_agents.messages import EpisodeRequest, ForkReply, Message

READY = "ready"  # the zygote's first line on stdout once the harness is imported
SpecT = TypeVar("SpecT", bound=Message)


def write_result(path: str, result: Message) -> None:
    staging = f"{path}.partial"
    Path(staging).write_text(json.dumps(result.to_json()))
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


def _episode_process(request: EpisodeRequest, spec: SpecT, run_episode: Callable[[SpecT], Message]) -> None:
    """The forked child: own session, subreaper, logs to a file; never returns."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        become_subreaper()
        log = os.open(request.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        write_result(request.result_path, run_episode(spec))
        code = 0
    except BaseException:  # the process must end with os._exit whatever happened: log it for the launcher
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        kill_leftovers()
        os._exit(code)


def _reap(signum: int, frame: FrameType | None) -> None:
    """SIGCHLD in the zygote: collect finished episode processes (and orphans it inherited as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def serve(import_harness: Callable[[], None], run_episode: Callable[[SpecT], Message], spec_type: type[SpecT]) -> None:
    """The zygote loop: one `EpisodeRequest` per stdin line → fork an episode process → print a `ForkReply`."""
    import_harness()
    become_subreaper()
    signal.signal(signal.SIGCHLD, _reap)
    print(READY, flush=True)
    while line := sys.stdin.readline():
        try:
            request = EpisodeRequest.from_json(json.loads(line))
            spec = spec_type.from_json(request.spec)
        except ValueError as error:  # a MessageError, or a line that is not JSON: refuse it, serve the next
            _reply(ForkReply(error=str(error)))
            continue
        pid = os.fork()
        if pid == 0:
            _episode_process(request, spec, run_episode)
        _reply(ForkReply(pid=pid))


def _reply(reply: ForkReply) -> None:
    print(json.dumps(reply.to_json()), flush=True)
