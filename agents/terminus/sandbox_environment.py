"""`LocalNamespaceEnvironment`: a harbor environment without Docker — Linux namespaces and a chroot per trial.

Runs inside the harbor interpreter (Python >= 3.12, `harbor` importable); harbor's `Trial` builds it from
`EnvironmentConfig(import_path="fullasync_agents.terminus.sandbox_environment:LocalNamespaceEnvironment")`.

Owns: one trial's sandbox. `start` builds a root directory (`<state>/rootfs`) and starts a *holder*
process with `unshare --user --map-root-user --mount --pid --fork --kill-child [--net]`: inside those new
namespaces it bind-mounts the host's system directories (`/usr`, `/etc`, ... — `host_dirs`) read-only,
harbor's mounts (`/logs/agent`, `/logs/verifier`, `/logs/artifacts` from the trial directory), a fresh
`/proc`, a minimal `/dev` with its own pseudo-terminals, then chroots and waits. Everything else under
`/` (`/app`, `/tests`, `/solution`, `/tmp`, `/root`) is the trial's own writable rootfs. Each `exec`
enters those namespaces with `nsenter` and runs `bash -c` as root *of the user namespace* (the caller's
own uid outside; the host's files stay read-only), so a tmux server started by one exec (Terminus-2's)
is found by the next through `/tmp` (`TMUX_TMPDIR`) and there is one tmux server per trial. `stop`
kills the holder: the kernel then kills every process of the trial's pid namespace, daemons included.
Files the task ships in `environment/app/` are copied to the workdir (`/app`); a task's Dockerfile is
not built (the host's tools stand in for the image: bash, coreutils, python3, tmux). Network: with the
task's `network_mode = "no-network"` the sandbox gets an empty network namespace (loopback down);
otherwise it shares the host's. No CPU or memory limits are applied.

Does not own: the agent, the verifier or the trial's lifecycle (harbor's), nor killing the harness
process tree at the episode timeout (the launcher's; the holder is a descendant, so it goes too).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import tempfile
from pathlib import Path, PurePosixPath

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode

from fullasync.rollout.processes import descendants, kill_tree  # stdlib-only: fine in the harbor interpreter

HOST_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc")  # read-only in the sandbox
HOST_TOOLS = ("unshare", "nsenter", "chroot", "mount", "findmnt", "bash", "tmux")
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY = "sandbox-ready"
APP_FILES = "app"  # environment/app/ holds the files the task starts with (copied to the workdir)
DEFAULT_WORKDIR = "/app"
START_TIMEOUT_S = 60.0

# Runs in the new namespaces as root of the user namespace. $1 = rootfs, then (host source, rootfs target) pairs
# to bind; $SANDBOX_READ_ONLY = the host directories to bind read-only (every mount below them too).
HOLDER_SCRIPT = r"""
set -eu
root=$1; shift
for name in $SANDBOX_READ_ONLY; do
  mount --rbind "/$name" "$root/$name"
  findmnt -R -n -r -o TARGET "$root/$name" | while read -r target; do mount -o remount,bind,ro "$target"; done
done
while [ $# -ge 2 ]; do mount --bind "$1" "$root$2"; shift 2; done
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755 tmpfs "$root/dev"
for device in null zero full random urandom tty; do
  touch "$root/dev/$device"; mount --bind "/dev/$device" "$root/dev/$device"
done
mkdir -p "$root/dev/pts" "$root/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
exec chroot "$root" /bin/sh -c 'echo sandbox-ready; trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done'
"""


class SandboxStartError(RuntimeError):
    """The namespace sandbox could not be set up: an infrastructure failure, never the agent's doing."""


def missing_host_tools() -> list[str]:
    """The host tools the sandbox needs that are not on PATH (util-linux, bash, tmux)."""
    return [tool for tool in HOST_TOOLS if shutil.which(tool) is None]


class LocalNamespaceEnvironment(BaseEnvironment):
    """A harbor environment in per-trial Linux namespaces on this machine (no container daemon)."""

    def __init__(self, *args, host_dirs: list[str] | tuple[str, ...] = HOST_DIRS, sandbox_parent: str = "",
                 start_timeout_s: float = START_TIMEOUT_S, **kwargs) -> None:
        self._host_dirs = tuple(host_dirs)
        self._sandbox_parent = sandbox_parent or None
        self._start_timeout_s = start_timeout_s
        self._state: Path | None = None
        self._unshare: asyncio.subprocess.Process | None = None
        self._holder_pid: int | None = None
        super().__init__(*args, **kwargs)

    @staticmethod
    def type() -> str:
        return "local-namespace"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(disable_internet=True, mounted=True)

    def _validate_definition(self) -> None:
        if not self.environment_dir.is_dir():
            raise FileNotFoundError(f"task environment directory {self.environment_dir} does not exist")
        missing = missing_host_tools()
        if missing:
            raise SandboxStartError(f"the local namespace sandbox needs {', '.join(missing)} on PATH "
                                    "(apt-get install util-linux tmux)")

    @property
    def workdir(self) -> str:
        return self.task_env_config.workdir or DEFAULT_WORKDIR

    @property
    def rootfs(self) -> Path:
        if self._state is None:
            raise SandboxStartError(f"{self.session_id}: the sandbox is not started")
        return self._state / "rootfs"

    # -- life cycle ------------------------------------------------------------------------------------

    async def start(self, force_build: bool) -> None:
        self._state = Path(tempfile.mkdtemp(prefix="fullasync-sandbox-", dir=self._sandbox_parent))
        read_only, binds = self._build_rootfs()
        unshare = ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--fork", "--kill-child",
                   "--propagation", "private"]
        if self.network_policy.network_mode == NetworkMode.NO_NETWORK:
            unshare.append("--net")
        log = open(self._state / "holder.log", "wb")
        self._unshare = await asyncio.create_subprocess_exec(
            *unshare, "--", "/bin/sh", "-c", HOLDER_SCRIPT, "sandbox", str(self.rootfs), *binds,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log,
            env={**os.environ, "SANDBOX_READ_ONLY": " ".join(read_only)})
        log.close()
        assert self._unshare.stdout is not None  # stdout=PIPE
        try:
            line = await asyncio.wait_for(self._unshare.stdout.readline(), self._start_timeout_s)
        except TimeoutError:
            line = b""
        holder = descendants(self._unshare.pid)[:1]  # unshare --fork has one child: the holder
        if line.decode().strip() != READY or not holder:
            detail = (self._state / "holder.log").read_text(errors="replace")[-2000:]
            await self.stop(delete=True)
            raise SandboxStartError(f"{self.session_id}: the namespace sandbox did not start "
                                    f"(unprivileged user namespaces must be allowed):\n{detail}")
        self._holder_pid = int(holder[0])
        source = self.environment_dir / APP_FILES
        if source.is_dir():
            await self.upload_dir(source, self.workdir)

    def _build_rootfs(self) -> tuple[list[str], list[str]]:
        """Mount points and the trial's own directories: (host dirs to bind read-only, harbor's bind pairs)."""
        rootfs = self.rootfs
        for name in ("proc", "dev", "tmp", "root", "run", "app", "tests", "solution", "logs"):
            (rootfs / name).mkdir(parents=True, exist_ok=True)
        (rootfs / "tmp").chmod(0o1777)
        (rootfs / self.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        read_only = []
        for name in self._host_dirs:
            host = Path("/") / name
            if host.is_symlink():
                (rootfs / name).symlink_to(os.readlink(host))
            elif host.is_dir():
                (rootfs / name).mkdir(exist_ok=True)
                read_only.append(name)
        binds = []
        for mount in self._mounts:
            if mount.get("type") != "bind":
                raise SandboxStartError(f"{self.session_id}: only bind mounts are supported, not {mount}")
            (rootfs / mount["target"].lstrip("/")).mkdir(parents=True, exist_ok=True)
            binds += [mount["source"], mount["target"]]
        return read_only, binds

    async def stop(self, delete: bool) -> None:
        """Kill the holder (and with it every process of the trial); remove the sandbox's files if `delete`."""
        if self._unshare is not None:
            if self._unshare.returncode is None:
                self._unshare.send_signal(signal.SIGKILL)  # --kill-child: the holder, then its pid namespace
            await self._unshare.wait()
            self._unshare = None
            self._holder_pid = None
        if delete and self._state is not None:
            shutil.rmtree(self._state, ignore_errors=True)
            self._state = None

    # -- commands ----------------------------------------------------------------------------------------

    def _exec_environment(self, env: dict[str, str] | None) -> dict[str, str]:
        """A clean environment for the sandbox's shell (nothing of the harness's leaks in), then harbor's."""
        base = {"PATH": SANDBOX_PATH, "HOME": "/root", "USER": "root", "LANG": "C.UTF-8", "TERM": "xterm-256color",
                "TMUX_TMPDIR": "/tmp"}
        return {**base, **(self._merge_env(env) or {})}

    async def exec(self, command: str, cwd: str | None = None, env: dict[str, str] | None = None,
                   timeout_sec: int | None = None, user: str | int | None = None) -> ExecResult:
        """`bash -c command` in the sandbox as its root (`user` is not switched: every exec is the same user)."""
        if self._holder_pid is None or self._state is None:
            raise SandboxStartError(f"{self.session_id}: exec before start() (or after stop())")
        nsenter = ["nsenter", "--target", str(self._holder_pid), "--user", "--mount", "--pid", "--root"]
        if self.network_policy.network_mode == NetworkMode.NO_NETWORK:
            nsenter.append("--net")
        script = f"cd {shlex.quote(cwd or self.workdir)} && {command}"
        with tempfile.TemporaryFile(dir=self._state) as out, tempfile.TemporaryFile(dir=self._state) as err:
            process = await asyncio.create_subprocess_exec(
                *nsenter, "--", "/bin/bash", "-c", script, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=err,
                env=self._exec_environment(env), start_new_session=True)
            try:
                await asyncio.wait_for(process.wait(), timeout_sec if timeout_sec else None)
            except TimeoutError as error:
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from error
            finally:
                if process.returncode is None:  # timed out or cancelled (harbor's phase timeouts cancel us)
                    kill_tree(process.pid)
                    await process.wait()
            out.seek(0)
            err.seek(0)
            stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
        return ExecResult(stdout=stdout or None, stderr=stderr or None, return_code=process.returncode)

    # -- files (the sandbox's paths are host paths under rootfs, or harbor's bind-mount sources) ------------

    def _host_path(self, path: str, writing: bool) -> Path:
        target = PurePosixPath(path)
        if not target.is_absolute():
            target = PurePosixPath(self.workdir) / target
        for mount in sorted(self._mounts, key=lambda m: len(m["target"]), reverse=True):
            if target.is_relative_to(mount["target"]):
                base = Path(mount["source"])
                return _inside(base, base / target.relative_to(mount["target"]), path)
        top = target.parts[1] if len(target.parts) > 1 else ""
        if top in self._host_dirs:
            if writing:
                raise PermissionError(f"{path} is read-only in the local namespace sandbox")
            return _inside(Path("/"), Path(target), path)
        return _inside(self.rootfs, self.rootfs / target.relative_to("/"), path)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        target = self._host_path(target_path, writing=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source_path, target)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        shutil.copytree(source_dir, self._host_path(target_dir, writing=True), symlinks=True, dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self._host_path(source_path, writing=False), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        shutil.copytree(self._host_path(source_dir, writing=False), target_dir, symlinks=True, dirs_exist_ok=True)


def _inside(base: Path, candidate: Path, path: str) -> Path:
    """`candidate`, unless a symlink the agent planted makes it resolve outside `base` (then PermissionError)."""
    if not candidate.resolve().is_relative_to(base.resolve()):
        raise PermissionError(f"{path} resolves outside the sandbox")
    return candidate

