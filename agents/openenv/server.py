"""An OpenEnv environment's server for one run: runs in an interpreter with openenv (its own: `make setup-openenv`),
imports only the standard library, uvicorn and openenv (with the environment's package), never fullasync. Started
by `OpenEnvGenerator` (one per run, restarted if it dies).

    python server.py SPEC

SPEC is JSON: {"module": "<package>", "environment": "<module:Class>", "action": "<module:Class>", "observation":
"<module:Class>", "sessions": N}. The environment runs unchanged, served by openenv's own `create_app` with
`max_concurrent_envs=N` (a package's `server/app.py` fixes its own, one session by default: the run needs as many
as it has episodes at once), on 127.0.0.1 at a port of the system's choosing. The classes not named are found in
`<package>.server.app`, the module openenv's template serves: the one Environment, Action and Observation subclass
it holds. One line on stdout: {"ready": {"port", "environment", "action", "observation", "sessions"}} once it
listens, or {"error": "..."} if it cannot start; it ends at the end of its input (its parent's death included).
"""

import asyncio
import importlib
import inspect
import json
import os
import socket
import sys

HOST = "127.0.0.1"


def named(path):
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"{path!r} does not name a class: write module:Class")
    return getattr(importlib.import_module(module), name)


def found(module, base, what):
    """The one subclass of `base` (not openenv's own) that `module` holds."""
    candidates = {value for value in vars(module).values()
                  if inspect.isclass(value) and issubclass(value, base) and not value.__module__.startswith("openenv.")}
    if len(candidates) != 1:
        listed = ", ".join(sorted(f"{c.__module__}:{c.__name__}" for c in candidates)) or "none"
        raise ValueError(f"{module.__name__} holds {len(candidates)} {what} classes ({listed}): name the one to serve "
                         f"in data.task_args.{what} (module:Class)")
    return candidates.pop()


def classes(spec):
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation

    chosen = {}
    app_module = None
    for what, base in (("environment", Environment), ("action", Action), ("observation", Observation)):
        if spec.get(what):
            chosen[what] = named(spec[what])
            continue
        if app_module is None:
            if not spec.get("module"):
                raise ValueError(f"name the environment's package (data.task=openenv:<package>) or its {what} class")
            app_module = importlib.import_module(f"{spec['module']}.server.app")
        chosen[what] = found(app_module, base, what)
    return chosen


async def serve(spec, channel):
    import uvicorn
    from openenv.core.env_server.http_server import create_app

    chosen = classes(spec)
    sessions = int(spec.get("sessions") or 1)
    app = create_app(chosen["environment"], chosen["action"], chosen["observation"],
                     env_name=spec.get("module") or chosen["environment"].__name__, max_concurrent_envs=sessions)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((HOST, 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=64 * 1024 * 1024,
                                           timeout_graceful_shutdown=5))
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        if serving.done():
            serving.result()  # its error
            raise RuntimeError("the server ended before it listened")
        await asyncio.sleep(0.05)
    channel.write(json.dumps({"ready": {"port": listener.getsockname()[1], "sessions": sessions, **{
        what: f"{cls.__module__}:{cls.__name__}" for what, cls in chosen.items()}}}) + "\n")
    channel.flush()
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes it or dies
    server.should_exit = True
    await serving


def main():
    spec = json.loads(sys.argv[1])
    channel = os.fdopen(os.dup(1), "w")  # the one status line; fd 1 (prints, libraries' output) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        asyncio.run(serve(spec, channel))
    except Exception as error:
        import traceback

        traceback.print_exc()
        channel.write(json.dumps({"error": f"{type(error).__name__}: {error}"}) + "\n")
        channel.flush()
        sys.exit(1)


if __name__ == "__main__":
    main()
