"""The harness side: mini-swe-agent's released classes, run unchanged for one episode in a process of its own.

Owns: `run_episode(spec)` — build `LitellmTextbasedModel` or `LitellmModel`, the configured environment
(`LocalEnvironment` by default) and `DefaultAgent` from a JSON-able spec, run the task, return
`{"exit_status", "submission", "n_calls", "error"}` — and the zygote (`python -m
fullasync_agents.mini_swe.runner`): a process that imports mini-swe-agent and litellm once (about 4 s
of CPU on this machine) and then forks one episode process per spec line on stdin, answering its pid.
Each episode process starts a session of its own, is the subreaper of everything it starts, writes its
result file, kills its leftovers and exits; the launcher kills its whole tree at the time limit.
Runs with the environment the launcher gives the zygote (offline litellm, mini-swe-agent's config dir).
Does not own: timeouts, scoring or the gateway.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from fullasync.rollout.processes import become_subreaper, descendants

READY = "ready"  # the zygote's first line on stdout once the harness is imported


def import_harness() -> None:
    """Import what every episode uses, so forked episodes start warm."""
    import litellm  # noqa: F401
    import minisweagent.agents.default  # noqa: F401
    import minisweagent.environments  # noqa: F401
    import minisweagent.environments.local  # noqa: F401
    import minisweagent.models.litellm_model  # noqa: F401
    import minisweagent.models.litellm_textbased_model  # noqa: F401


def build_model(spec: dict[str, Any]):
    from minisweagent.models.litellm_model import LitellmModel
    from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel

    model_class = LitellmTextbasedModel if spec["action_format"] == "text" else LitellmModel
    model_kwargs = {"api_base": spec["base_url"], "api_key": spec["api_key"], **spec["model_kwargs"]}
    extra = {key: spec[key] for key in ("observation_template", "format_error_template") if spec.get(key)}
    return model_class(model_name=spec["model_name"], model_kwargs=model_kwargs, cost_tracking="ignore_errors", **extra)


def build_environment(spec: dict[str, Any]):
    from minisweagent.environments import get_environment

    return get_environment(dict(spec["environment"]), default_type="local")


def run_episode(spec: dict[str, Any]) -> dict[str, Any]:
    """One mini-swe-agent episode; an exception of the harness is reported, not raised."""
    from minisweagent.agents.default import DefaultAgent

    agent = DefaultAgent(build_model(spec), build_environment(spec), **spec["agent"])
    try:
        outcome = agent.run(spec["task"])
    except Exception as error:  # DefaultAgent records the exit, then re-raises: report it to the launcher
        return {"exit_status": type(error).__name__, "submission": "", "n_calls": agent.n_calls,
                "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    return {"exit_status": outcome.get("exit_status", ""), "submission": outcome.get("submission", ""),
            "n_calls": agent.n_calls, "error": None}


def _write_result(path: str, result: dict[str, Any]) -> None:
    staging = f"{path}.partial"
    Path(staging).write_text(json.dumps(result))
    os.replace(staging, path)  # the launcher reads whole results only


def _kill_leftovers() -> None:
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


def _episode_process(spec: dict[str, Any]) -> None:
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
        _write_result(spec["result_path"], run_episode(spec))
        code = 0
    except BaseException:  # the process must end with os._exit whatever happened: log it for the launcher
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        _kill_leftovers()
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


def serve() -> None:
    """The zygote loop: one JSON spec per stdin line → fork an episode process → print {"pid": ...}."""
    import_harness()
    become_subreaper()
    signal.signal(signal.SIGCHLD, _reap)
    print(READY, flush=True)
    while line := sys.stdin.readline():
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _episode_process(spec)
        print(json.dumps({"pid": pid}), flush=True)


if __name__ == "__main__":
    serve()
