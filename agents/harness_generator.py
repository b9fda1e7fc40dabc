"""`HarnessGenerator`: what every out-of-process harness adapter's `CustomGenerator` shares.

Owns: the adapter's working directory and its `ZygoteLauncher` (`start_harness` in `setup`, both gone
in `teardown`), the checks before an episode (set up, and a gateway base URL to point the harness at),
running one episode's spec record to its result record under the hard time limit, `exit_statuses` —
how episodes ended, where a launcher failure (crash, hard kill, a record that does not match its type)
counts under its exception's name — and, for an adapter whose episodes run in containers (`sandboxes`, here or
on the Ray nodes), their preflight, a coming row's containers prepared ahead with a warm pool, and their close.
Does not own: the spec, what the harness runs, or the reward (each adapter: `fullasync_agents.mini_swe`,
`fullasync_agents.terminus`).
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fullasync.errors import InfraError
from fullasync.rollout.generator import CustomGenerator, EpisodeContext
from fullasync_agents.launcher import ZygoteLauncher
from fullasync_agents.messages import Message
from fullasync_agents.sandboxes import Sandboxes

OutcomeT = TypeVar("OutcomeT", bound=Message)


class HarnessError(RuntimeError):
    """The harness failed for a reason that is not the policy's; each adapter raises its own subclass."""


class HarnessGenerator(CustomGenerator):
    """Subclasses call `start_harness` in `setup`, `launcher_for(episode)` then `run_harness` in `generate`."""

    uses_gateway = True
    harness_error: type[HarnessError] = HarnessError  # the adapter's own HarnessError

    def __init__(self) -> None:
        self.exit_statuses: Counter[str] = Counter()  # how episodes ended (scored ones and failures)
        self._workdir: Path | None = None
        self._launcher: ZygoteLauncher | None = None
        self.sandboxes: Sandboxes | None = None  # the episodes' containers, when they run in containers
        self._coming: set[asyncio.Task[None]] = set()  # rows' images and warm containers being prepared

    def new_workdir(self, prefix: str) -> Path:
        """A fresh temporary directory for the zygote and the episodes' files (removed in `teardown`)."""
        self._workdir = Path(tempfile.mkdtemp(prefix=prefix))
        return self._workdir

    async def start_harness(self, argv: Sequence[str], env: Mapping[str, str], harness: str,
                            missing_hint: str = "") -> None:
        """Start the zygote in `new_workdir`'s directory (the harness imported once)."""
        if self._workdir is None:
            raise RuntimeError("call new_workdir() before start_harness()")
        self._launcher = ZygoteLauncher(self._workdir, argv, env, harness=harness, missing_hint=missing_hint)
        await self._launcher.start()

    def container_task(self, row: dict[str, Any]) -> dict[str, Any] | None:
        """The row as a container task (its image, `workdir`, ...) when its episodes run in `sandboxes`; else None."""
        return None

    async def preflight_containers(self) -> None:
        """Say in one line what would stop the episodes' containers (the CLI, free disk, the base image)."""
        if self.sandboxes is not None and (problem := await self.sandboxes.preflight()):
            raise InfraError(problem)

    def coming(self, row: object, episodes: int) -> None:
        """With a warm pool: the row's image built (and cut at its base commit) and its containers started now."""
        if self.sandboxes is None or not self.sandboxes.warm or not isinstance(row, dict):
            return
        task = self.container_task(row)
        if task is not None:
            prepared = asyncio.get_running_loop().create_task(self._prepare(row, task, episodes))
            self._coming.add(prepared)
            prepared.add_done_callback(self._coming.discard)

    async def _prepare(self, row: dict[str, Any], task: dict[str, Any], episodes: int) -> None:
        assert self.sandboxes is not None  # coming() checked
        try:
            await self.sandboxes.ahead(task, episodes)
        except (InfraError, ValueError) as error:  # its episodes meet it again, and count it
            logging.getLogger(__name__).warning("row %s: preparing its containers failed: %s", row.get("id"), error)

    async def teardown(self) -> None:
        for prepared in list(self._coming):
            prepared.cancel()
        await asyncio.gather(*self._coming, return_exceptions=True)
        if self.sandboxes is not None:
            await self.sandboxes.close()
        if self._launcher is not None:
            await self._launcher.stop()
            self._launcher = None
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None

    @staticmethod
    def log(episode: EpisodeContext, name: str, value: float) -> None:
        """One observation of the adapter's metric `name` for the run's step metrics (`RolloutClient.log`);
        nothing when the episode has no in-process client (an adapter driven without a run)."""
        if episode.client is not None:
            episode.client.log(name, value)

    def launcher_for(self, episode: EpisodeContext, adapter: str) -> ZygoteLauncher:
        """The running launcher; the adapter's HarnessError if `setup()` has not run or there is no gateway URL."""
        self.gateway(episode)
        return self._running_launcher(adapter)

    def gateway(self, episode: EpisodeContext) -> tuple[str, str]:
        """The episode's gateway base URL and key, to point the harness at; HarnessError if it has none."""
        if episode.base_url is None or episode.api_key is None:
            raise self.harness_error("the episode has no gateway base URL: keep uses_gateway = True")
        return episode.base_url, episode.api_key

    def _running_launcher(self, adapter: str) -> ZygoteLauncher:
        if self._launcher is None:
            raise self.harness_error(f"{adapter}.setup() has not run: train through AsyncAgentTrainer / the "
                                     "rollouter, or await generator.setup() first")
        return self._launcher

    async def run_harness(self, spec: Message, outcome_type: type[OutcomeT], timeout_s: float,
                          files: Path | None = None) -> OutcomeT:
        """One episode's result record; a launcher failure is counted in `exit_statuses` and raised."""
        launcher = self._running_launcher(type(self).__name__)
        try:
            return await launcher.run(spec, outcome_type, timeout_s, files)
        except Exception as error:
            self.exit_statuses[type(error).__name__] += 1
            raise
