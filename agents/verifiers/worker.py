"""A verifiers environment served to fullasync: runs in an interpreter with verifiers (0.3.1, its legacy API: what
the Environments Hub's environments pin), imports only the standard library, httpx, openai and verifiers, never
fullasync. Started by `VerifiersGenerator` (one per run, restarted if it dies); `rows` mode lists the datasets.

    python worker.py rows SPEC    # one JSON line per row: {"split": "train" | "eval", "row": {...}}, then {"end": n}
    python worker.py serve SPEC   # first line {"ready": {...}}, then one reply per request line, by id

SPEC is JSON: {"env_id", "env_args", "base_url", "model", "sampling_args", "client_type"}. The environment runs
unchanged (`vf.load_environment(env_id, **env_args)`) with ONE model client for every episode, on the gateway's
run-wide base URL: each request names its episode in the X-Session-ID header, set from the episode running in
the asyncio task that sent it (a context variable), so no environment's state shape matters.

Requests (one JSON object per line, served concurrently):
    {"id": 1, "op": "rollout", "key": "<episode key>", "row": {...}}
        -> {"id": 1, "reward": float | null (a group rubric: scored by score_group), "metrics": {...},
            "turns": int} or {"id": 1, "error": "...", "error_type": "...", "infra": bool}
    {"id": 2, "op": "score_group", "keys": [...]}  -> {"id": 2, "rewards": [...], "metrics": [{...}, ...]}
    {"id": 3, "op": "drop", "keys": [...]}          -> {"id": 3}  (states of episodes that will never be scored)
    {"id": 4, "op": "stats"}                        -> {"id": 4, "running": requests in progress, "states": kept}
    {"op": "cancel", "of": 1}                       (no reply: request 1's work is stopped, its reply never sent)
The environment's prints go to stderr: stdout carries the replies only.
"""

import asyncio
import contextvars
import functools
import json
import math
import os
import sys
import traceback

SESSION_HEADER = "X-Session-ID"
EPISODE = contextvars.ContextVar("fullasync_episode_key", default="")
READ_LIMIT = 64 * 1024 * 1024  # one request line (a row) at most
MAX_STATES = 65536  # a group rubric's finished episodes kept for their groups' scoring


def load(spec):
    import verifiers.legacy as vf

    return vf, vf.load_environment(spec["env_id"], **spec.get("env_args", {}))


def model_client(spec):
    """One verifiers client over one HTTP client for the whole run; each request carries its episode's key."""
    import httpx
    from openai import AsyncOpenAI
    from verifiers.legacy.clients import OpenAIChatCompletionsClient, OpenAICompletionsClient, OpenAIResponsesClient

    kinds = {"openai_chat_completions": OpenAIChatCompletionsClient, "openai_completions": OpenAICompletionsClient,
             "openai_responses": OpenAIResponsesClient}
    kind = spec.get("client_type", "openai_chat_completions")
    if kind not in kinds:
        raise ValueError(f"client_type {kind!r} is not served: use one of {sorted(kinds)}")

    async def name_the_episode(request):
        key = EPISODE.get()
        if key:
            request.headers[SESSION_HEADER] = key

    http = httpx.AsyncClient(event_hooks={"request": [name_the_episode]}, timeout=httpx.Timeout(None),
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64), trust_env=False)
    openai = AsyncOpenAI(base_url=spec["base_url"], api_key="fullasync-run", max_retries=0, http_client=http)
    return kinds[kind](openai)


def listed(value):
    """`value` as JSON can carry it (a dataset's rows hold lists, dicts, numbers and strings)."""
    return json.loads(json.dumps(value, default=str))


def rows(spec):
    vf, env = load(spec)
    out = sys.stdout
    sys.stdout = sys.stderr
    count = 0
    for split, build in (("train", env.build_dataset), ("eval", env.build_eval_dataset)):
        for row in build() or ():  # None: the environment has no such split
            out.write(json.dumps({"split": split, "row": listed(dict(row))}) + "\n")
            count += 1
    out.write(json.dumps({"end": count, "requires_group": bool(env.requires_group_rollouts)}) + "\n")
    out.flush()


class Server:
    def __init__(self, spec, channel):
        self.vf, self.env = load(spec)
        self.client = model_client(spec)
        self.model = spec.get("model", "policy")
        self.sampling_args = spec.get("sampling_args") or {}
        self.channel = channel
        self.states = {}  # episode key -> the state of a group rubric's episode, until its group is scored
        self.running = {}  # request id -> the task answering it

    def reply(self, message):
        self.channel.write(json.dumps(message, default=str) + "\n")
        self.channel.flush()

    async def serve(self):
        reader = asyncio.StreamReader(limit=READ_LIMIT)
        await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        self.reply({"ready": {"requires_group": bool(self.env.requires_group_rollouts),
                              "provides_advantages": bool(self.env.provides_advantages),
                              "verifiers": self.vf.__version__ if hasattr(self.vf, "__version__") else ""}})
        while line := await reader.readline():
            request = json.loads(line)
            if request.get("op") == "cancel":  # the episode was given up on (its timeout): stop its work
                task = self.running.get(request.get("of"))
                if task is not None:
                    task.cancel()
                continue
            request_id = request.get("id")
            task = asyncio.create_task(self.answer(request))
            self.running[request_id] = task
            task.add_done_callback(functools.partial(self.finished, request_id))
        for task in list(self.running.values()):
            task.cancel()

    def finished(self, request_id, task):
        self.running.pop(request_id, None)

    async def answer(self, request):
        try:
            handler = {"rollout": self.rollout, "score_group": self.score_group, "drop": self.drop,
                       "stats": self.stats}[request["op"]]
            self.reply({"id": request["id"], **await handler(request)})
        except Exception as error:  # the request failed, not the worker: said in the reply
            traceback.print_exc()
            self.reply({"id": request.get("id"), "error": f"{type(error).__name__}: {error}",
                        "error_type": type(error).__name__, "infra": isinstance(error, self.vf.InfraError)})

    async def rollout(self, request):
        EPISODE.set(request["key"])
        state = await self.env.rollout(request["row"], self.client, self.model, self.sampling_args)
        turns = len(state.get("trajectory") or [])
        error = state.get("error")
        if error is not None:
            await self.env.rubric.cleanup(state)
            return {"error": f"{type(error).__name__}: {error}", "error_type": type(error).__name__,
                    "infra": isinstance(error, self.vf.InfraError), "turns": turns}
        if self.env.requires_group_rollouts:
            self.keep(request["key"], state)
            return {"reward": None, "metrics": {}, "turns": turns}
        try:
            await (self.env.rubric.score_rollout if self.env.score_rollouts
                   else self.env.rubric.dummy_score_rollout)(state)
            reward = finite(state["reward"])
        except Exception as error:  # a rubric's failure (a judge that did not answer) is the infrastructure's
            traceback.print_exc()
            return {"error": f"scoring failed: {type(error).__name__}: {error}", "error_type": type(error).__name__,
                    "infra": True, "turns": turns}
        finally:
            await self.env.rubric.cleanup(state)
        return {"reward": reward, "metrics": numbers(state.get("metrics")), "turns": turns}

    def keep(self, key, state):
        """Keep a group rubric's finished episode until its group is scored; the oldest goes past MAX_STATES (a
        row that ended without its group being scored never asks for its states)."""
        self.states[key] = state
        while len(self.states) > MAX_STATES:
            oldest = next(iter(self.states))
            print(f"fullasync verifiers worker: dropping the unscored state of episode {oldest} (more than "
                  f"{MAX_STATES} kept)", file=sys.stderr)
            self.states.pop(oldest)

    async def score_group(self, request):
        missing = [key for key in request["keys"] if key not in self.states]
        if missing:
            raise KeyError(f"no finished episode {missing[0]!r} to score (a worker restarted since it ran?)")
        states = [self.states.pop(key) for key in request["keys"]]
        try:
            await self.env.rubric.score_group(states)
        finally:
            for state in states:
                await self.env.rubric.cleanup(state)
        return {"rewards": [finite(state["reward"]) for state in states],
                "metrics": [numbers(state.get("metrics")) for state in states]}

    async def stats(self, request):
        return {"running": len(self.running) - 1, "states": len(self.states)}  # less this request's own task

    async def drop(self, request):
        for key in request["keys"]:
            state = self.states.pop(key, None)
            if state is not None:
                await self.env.rubric.cleanup(state)
        return {}


def finite(value):
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"the rubric's reward is {value!r}")
    return value


def numbers(metrics):
    return {str(name): float(value) for name, value in (metrics or {}).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)}


def main():
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    if mode == "rows":
        rows(spec)
        return
    channel = os.fdopen(os.dup(1), "w")  # the replies; fd 1 (prints, libraries' output) goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    asyncio.run(Server(spec, channel).serve())


if __name__ == "__main__":
    main()
