"""`VerifiersGenerator`: a verifiers environment, its own released code unchanged, as a run's harness.

Owns: the environment's worker process (`worker.py`, in verifiers' interpreter: started at the first episode on the
gateway's run-wide base URL, restarted when it dies, stopped in `teardown`), the requests an episode and a group make
of it, and what its answers mean here: a reward (the environment's rubric), a group's rewards (a rubric with group
reward functions, through `CustomGenerator.group_rewards`), an error the environment recorded in its state (its
`vf.InfraError`s are the infrastructure's, run again; any other is the episode's failure, of the kind its calls
show), and the rubric's per-function scores as the step's `harness/verifiers/<function>` metrics. Does not own: the
rows (`rows.py`), the interpreter (`interpreter.py`), the gateway or recording.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fullasync.errors import InfraError
from fullasync.rollout.generator import CustomGenerator, EpisodeContext
from fullasync.types import JsonValue, Trajectory
from fullasync_agents.verifiers.interpreter import WORKER, verifiers_python, worker_environment

KEY = "verifiers_key"  # a group rubric's episode: the worker's name for its state, in its trajectory's metadata
START_TIMEOUT_S = 600.0  # loading an environment can build its dataset
READ_LIMIT = 64 * 1024 * 1024

log = logging.getLogger("fullasync")

Reply = dict[str, Any]  # a worker's reply, as worker.py's docstring lays it out (JSON)


class VerifiersWorkerError(InfraError):
    """The environment's worker died or would not start: the episode runs again (`rollout.infra_retries`) on a new
    one. The message names the worker's log."""


class VerifiersEpisodeError(RuntimeError):
    """The environment ended the episode with an error of its own (verifiers' `state["error"]`): counted by the kind
    its calls show (a policy output the gateway refused: `model`), else as the harness's."""


@dataclass(frozen=True)
class VerifiersSpec:
    """What the worker loads and how it reaches the policy."""

    env_id: str  # the environment's module (`vf.load_environment(env_id)`: dashes read as underscores)
    env_args: Mapping[str, JsonValue] = field(default_factory=dict)  # its `load_environment(**env_args)`
    model: str = "policy"  # the model name its requests carry (the run's `model.served_name`)
    sampling_args: Mapping[str, JsonValue] = field(default_factory=dict)  # verifiers' sampling_args for each call
    client_type: str = "openai_chat_completions"  # or openai_completions, openai_responses
    python: str = ""  # verifiers' interpreter; "" = $FULLASYNC_VERIFIERS_PYTHON, else <checkout>/.venv-verifiers

    def argv(self, mode: str, base_url: str = "") -> list[str]:
        spec = {"env_id": self.env_id, "env_args": dict(self.env_args), "base_url": base_url, "model": self.model,
                "sampling_args": dict(self.sampling_args), "client_type": self.client_type}
        return [str(verifiers_python(self.python)), str(WORKER), mode, json.dumps(spec)]


class Worker:
    """One worker process and the replies it owes, by request id."""

    def __init__(self, process: asyncio.subprocess.Process, log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self.ids = itertools.count(1)
        self.pending: dict[int, asyncio.Future[Reply]] = {}
        self.ready: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.reader = asyncio.create_task(self._read())

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.reader.done()

    def failure(self, what: str) -> VerifiersWorkerError:
        tail = self.log_path.read_text(errors="replace").strip().splitlines()[-15:] if self.log_path.exists() else []
        return VerifiersWorkerError(f"the verifiers worker {what} (exit status {self.process.returncode}; its log "
                                    f"{self.log_path}):\n" + "\n".join(tail))

    async def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            while line := await self.process.stdout.readline():
                reply = json.loads(line)
                if "ready" in reply:
                    self.ready.set_result(reply["ready"])
                    continue
                future = self.pending.pop(int(reply.pop("id")), None)
                if future is not None and not future.done():  # a request given up on has no one waiting
                    future.set_result(reply)
        finally:
            await self.process.wait()
            error = self.failure("exited" if self.ready.done() else "exited before it was ready")
            for future in [self.ready, *self.pending.values()]:
                if not future.done():
                    future.set_exception(error)
            self.pending.clear()

    async def call(self, request: Mapping[str, JsonValue]) -> Reply:
        """Send `request`, wait for its reply; cancelled, the worker is told to stop the request's work."""
        if not self.alive:
            raise self.failure("is gone")
        request_id = next(self.ids)
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        self._send({"id": request_id, **request})
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.pending.pop(request_id, None)
            with contextlib.suppress(OSError, RuntimeError):
                self._send({"id": 0, "op": "cancel", "of": request_id})
            raise

    def _send(self, message: Mapping[str, JsonValue]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")

    async def stop(self) -> None:
        if self.process.stdin is not None and self.process.returncode is None:
            self.process.stdin.close()  # the worker ends at the end of its input
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
        await asyncio.gather(self.reader, return_exceptions=True)


class VerifiersGenerator(CustomGenerator):
    """A verifiers environment's episodes: each row's `verifiers` field (a row of the environment's dataset) runs
    through its own `rollout` and is scored by its own rubric (a group rubric: the row's episodes together)."""

    uses_gateway = True

    def __init__(self, spec: VerifiersSpec) -> None:
        self.spec = spec
        self.worker: Worker | None = None
        self.workers_started = 0
        self.requires_group = False
        self._starting = asyncio.Lock()
        self._logs: Path | None = None

    async def worker_for(self, episode: EpisodeContext) -> Worker:
        """The running worker, a new one if there is none (on the episode's run-wide base URL)."""
        async with self._starting:
            if self.worker is not None and self.worker.alive:
                return self.worker
            if episode.run_base_url is None:
                raise RuntimeError("VerifiersGenerator needs the gateway's run-wide base URL (uses_gateway=True)")
            if self.worker is not None:
                log.warning("%s: restarting it", self.worker.failure("died"))
            self._logs = self._logs or Path(tempfile.mkdtemp(prefix="fullasync-verifiers-"))
            self.workers_started += 1
            log_path = self._logs / f"worker-{self.workers_started}.log"
            with open(log_path, "wb") as stderr:
                process = await asyncio.create_subprocess_exec(
                    *self.spec.argv("serve", episode.run_base_url), stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE, stderr=stderr, env=worker_environment(), limit=READ_LIMIT)
            worker = Worker(process, log_path)
            try:
                ready = await asyncio.wait_for(asyncio.shield(worker.ready), START_TIMEOUT_S)
            except BaseException:
                await worker.stop()
                raise
            self.requires_group = bool(ready.get("requires_group"))
            if ready.get("provides_advantages"):
                log.warning("verifiers environment %s computes advantages of its own: fullasync trains with its "
                            "own (its rewards are used)", self.spec.env_id)
            log.info("verifiers environment %s served by worker %d (pid %d, log %s)%s", self.spec.env_id,
                     self.workers_started, process.pid, log_path,
                     ": its rubric scores groups" if self.requires_group else "")
            self.worker = worker
            return worker

    async def generate(self, episode: EpisodeContext, row: Mapping[str, JsonValue]) -> float | Trajectory:
        if not isinstance(row, Mapping) or not isinstance(row.get("verifiers"), Mapping):
            raise TypeError("a verifiers row holds the environment's dataset row under 'verifiers' (data.task="
                            f"verifiers:<id> makes them), got {type(row).__name__} {str(row)[:200]}")
        worker = await self.worker_for(episode)
        reply = await worker.call({"op": "rollout", "key": episode.api_key, "row": row["verifiers"]})
        episode.client.log("verifiers/turns", float(reply.get("turns") or 0))
        if "error" in reply:
            kind = VerifiersWorkerError if reply.get("infra") else VerifiersEpisodeError
            raise kind(f"verifiers environment {self.spec.env_id}: {reply['error']}")
        for name, value in dict(reply.get("metrics") or {}).items():
            episode.client.log(f"verifiers/{name}", float(value))
        if reply.get("reward") is None:  # its group's rubric gives the reward (`group_rewards`)
            return episode.client.trajectory(0.0, {KEY: episode.api_key})
        return float(reply["reward"])

    async def group_rewards(self, row: object, trajectories: Sequence[Trajectory]) -> Sequence[float] | None:
        if not self.requires_group:
            return None
        if self.worker is None:
            raise VerifiersWorkerError("no verifiers worker to score the group")
        reply = await self.worker.call({"op": "score_group", "keys": [str(t.metadata[KEY]) for t in trajectories]})
        if "error" in reply:
            raise VerifiersWorkerError(f"verifiers environment {self.spec.env_id} could not score a group: "
                                       f"{reply['error']}")
        return [float(reward) for reward in reply["rewards"]]

    async def teardown(self) -> None:
        if self.worker is not None:
            await self.worker.stop()
            self.worker = None
