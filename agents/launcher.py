"""The trainer side of an out-of-process harness: start its zygote once, run each episode with a hard time limit.

Owns: the zygote's life (`start`/`stop`) for any argv and environment (a harness in another
interpreter included), asking it for one episode process per spec (an `EpisodeRequest` around the
harness's spec record), waiting for that process without blocking the event loop (a pidfd), and the
hard kill: at the time limit, or when the episode is cancelled, the episode process and every process
below it are killed (`kill_tree`), so nothing outlives its episode. Reads the episode's result file into
the harness's result record, checked on receipt; a process that ends without one is an infrastructure
failure (`HarnessCrashedError`, with the tail of its log), and so is a record that does not match its
type, either way (`HarnessMessageError`). The zygote is `fullasync_agents.zygote.serve`. Does not own:
what an episode does, or its reward.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from fullasync.rollout.processes import alive, kill_tree
from fullasync_agents.messages import EpisodeRequest, ForkReply, Message, MessageError
from fullasync_agents.zygote import READY

ZYGOTE_START_TIMEOUT_S = 180.0  # importing litellm on a loaded 2-core machine can take a while
FORK_TIMEOUT_S = 30.0
OutcomeT = TypeVar("OutcomeT", bound=Message)


class HarnessCrashedError(RuntimeError):
    """The harness process ended without a result: an infrastructure failure, never a reward of 0."""


class HarnessMessageError(HarnessCrashedError):
    """A record crossing the zygote boundary did not match its type: the harness refused the episode's spec, or
    its result is malformed. An infrastructure failure (a version mismatch, a bug), never a reward of 0."""


class HarnessTimeoutError(TimeoutError):
    """The harness ran past its hard time limit and was killed with everything it started."""


async def wait_for_exit(pid: int, timeout_s: float) -> None:
    """Return when `pid` has ended (it need not be our child); TimeoutError after `timeout_s`."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:  # ended already
        return
    loop = asyncio.get_running_loop()
    ended: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not ended.done():
            ended.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await asyncio.wait_for(ended, timeout_s)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


class ZygoteLauncher:
    """`await start()`, then `await run(spec, OutcomeType, timeout_s)` per episode (concurrently), `await stop()`.

    `argv` starts the zygote (e.g. `[python, "-m", "fullasync_agents.terminus.runner"]`), `env` is its
    whole environment; `harness` names it in errors and `missing_hint` says how to install it.
    """

    def __init__(self, workdir: Path, argv: Sequence[str], env: Mapping[str, str], harness: str,
                 missing_hint: str = "") -> None:
        self.workdir = Path(workdir)
        self.argv = list(argv)
        self.env = dict(env)
        self.harness = harness
        self.missing_hint = missing_hint
        self._zygote: asyncio.subprocess.Process | None = None
        self._fork_lock = asyncio.Lock()
        self._episodes = 0

    @property
    def zygote_pid(self) -> int | None:
        return self._zygote.pid if self._zygote is not None else None

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "zygote.log", "wb")
        self._zygote = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
            start_new_session=True, cwd=self.workdir, env=self.env)
        log.close()
        assert self._zygote.stdout is not None  # piped
        try:
            line = await asyncio.wait_for(self._zygote.stdout.readline(), ZYGOTE_START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line.decode().strip() != READY:
            await self.stop()
            tail = (self.workdir / "zygote.log").read_text(errors="replace")[-2000:]
            raise HarnessCrashedError(f"{self.harness}'s process did not start ({self.missing_hint}):\n{tail}")

    async def stop(self) -> None:
        """Kill the zygote and anything it still holds (episode processes, orphans it adopted)."""
        if self._zygote is None:
            return
        if self._zygote.returncode is None:
            kill_tree(self._zygote.pid)
        await self._zygote.wait()
        self._zygote = None

    def _pipes(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        """The running zygote's stdin and stdout."""
        if self._zygote is None or self._zygote.returncode is not None:
            raise HarnessCrashedError(f"the {self.harness} launcher is not running: call setup() first "
                                      "(the rollouter does), and see zygote.log if it died")
        stdin, stdout = self._zygote.stdin, self._zygote.stdout
        assert stdin is not None and stdout is not None  # started with both piped
        return stdin, stdout

    async def _fork(self, request: EpisodeRequest) -> int:
        stdin, stdout = self._pipes()
        async with self._fork_lock:
            stdin.write((json.dumps(request.to_json()) + "\n").encode())
            await stdin.drain()
            line = await asyncio.wait_for(stdout.readline(), FORK_TIMEOUT_S)
        if not line:
            raise HarnessCrashedError(f"the {self.harness} launcher died; see {self.workdir / 'zygote.log'}")
        try:
            reply = ForkReply.from_json(json.loads(line))
        except (MessageError, ValueError) as error:
            raise HarnessMessageError(f"the {self.harness} launcher answered {line[:200]!r}: {error}") from None
        if reply.error:
            raise HarnessMessageError(f"{self.harness}'s process refused the episode: {reply.error}")
        return reply.pid

    def episode_dir(self) -> Path:
        """A fresh directory for the next episode's files (removed when its `run` ends)."""
        self._episodes += 1
        files = self.workdir / f"episode-{self._episodes}"
        files.mkdir()
        return files

    async def run(self, spec: Message, outcome_type: type[OutcomeT], timeout_s: float,
                  files: Path | None = None) -> OutcomeT:
        """Run one episode of `spec` to its `outcome_type` result; at `timeout_s` (or on cancellation) kill it and
        all it started."""
        files = files if files is not None else self.episode_dir()
        request = EpisodeRequest(spec.to_json(), result_path=str(files / "result.json"),
                                 log_path=str(files / "harness.log"))
        try:
            pid = await self._fork(request)
            ended = False
            try:
                await wait_for_exit(pid, timeout_s)
                ended = True
            except TimeoutError as error:
                raise HarnessTimeoutError(f"{self.harness} ran past {timeout_s:.0f} s and was killed with every "
                                          f"process it started; its log ends:\n{_log_tail(files)}") from error
            finally:
                if not ended and alive(pid):  # timed out or cancelled (the rollouter's episode timeout)
                    kill_tree(pid)
            return self._result(files, outcome_type)
        finally:
            shutil.rmtree(files, ignore_errors=True)

    def _result(self, files: Path, outcome_type: type[OutcomeT]) -> OutcomeT:
        result = files / "result.json"
        if not result.exists():
            raise HarnessCrashedError(f"{self.harness}'s episode process ended without a result:\n{_log_tail(files)}")
        try:
            return outcome_type.from_json(json.loads(result.read_text()))
        except ValueError as error:  # a MessageError, or a file that is not JSON
            raise HarnessMessageError(f"{self.harness}'s episode result is not a valid {outcome_type.__name__}: "
                                      f"{error}") from None


def _log_tail(files: Path, chars: int = 3000) -> str:
    log = files / "harness.log"
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"
