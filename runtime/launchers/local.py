"""Launchers start ``clamor-worker`` processes for a cluster.

A worker is always the same command, ``clamor-worker --connect ADDR --token-file F``;
launchers differ in where it runs: :class:`LocalLauncher` (subprocesses here,
the default), ``ssh`` (runtime/launchers/ssh.py) and ``dask`` (runtime/launchers/dask.py).
The cluster reserves a worker id, asks the launcher to :meth:`~Launcher.spawn` it,
and the launcher passes a ``--launch-key`` that the worker echoes when it registers,
so the cluster knows which reservation a registering worker fills.

No orphans from the local launcher: workers die with :meth:`LocalLauncher.close`,
with the interpreter (``weakref.finalize``, which also runs at exit), and with a
SIGKILL of the driver (``PR_SET_PDEATHSIG`` on Linux, plus the worker's own
watchdog on ``--parent-pid``). The worker sets ``PR_SET_PDEATHSIG`` itself, first
thing after exec, then checks that its parent is still the driver (closing the
race). That is equivalent to a ``preexec_fn`` without its hazard: a ``preexec_fn``
runs Python in a child forked from a process full of gRPC threads, which can
deadlock before exec. Remote workers exit on their own when the driver has been
unreachable for a few seconds (the worker's heartbeat watchdog).
"""

from __future__ import annotations

import abc
import os
import secrets
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from typing import IO

import psutil
from clamor.runtime.credentials import Credentials


def worker_command(
    connect: str, token_file: str, *, python: str | None = None, host: str | None = None
) -> list[str]:
    """The ``clamor-worker`` command line (run as ``python -m``, so no PATH is needed)."""
    command = [
        python or sys.executable,
        "-m",
        "clamor.runtime.worker.process",
        "--connect",
        connect,
        "--token-file",
        token_file,
    ]
    return command + (["--host", host] if host else [])


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie. Asked before every stage: on Linux one
    read of ``/proc/PID/stat`` (~15 µs; psutil takes ~100), elsewhere psutil."""
    if sys.platform.startswith("linux"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                return f.read().rpartition(b")")[2].split()[0] not in (b"Z", b"X")
        except FileNotFoundError:
            return False
        except (OSError, IndexError):
            pass  # an unusual /proc: ask psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Launcher(abc.ABC):
    """Starts and stops the worker processes of one cluster.

    The cluster calls :meth:`bind` once (its scheduler address and secrets), then
    :meth:`spawn` per reserved worker id, :meth:`claim` when a worker registers,
    and :meth:`close` at the end. Launchers that see their processes (``local``)
    say so with :meth:`observes`; for the others the cluster relies on heartbeats.
    """

    #: Short name shown in stats and error messages.
    name = "launcher"

    def __init__(self) -> None:
        self.connect = ""
        self.credentials: Credentials | None = None
        self.host = "127.0.0.1"
        self.log_dir: str | None = None
        self._keys: dict[str, int] = {}  # launch key -> worker id

    def bind(
        self, connect: str, credentials: Credentials, *, host: str, log_dir: str | None
    ) -> None:
        """Called once by the cluster before the first :meth:`spawn`."""
        self.connect, self.credentials, self.host, self.log_dir = connect, credentials, host, log_dir

    def new_launch_key(self, worker_id: int) -> str:
        """A fresh key for ``worker_id``'s process (passed as ``--launch-key``)."""
        key = f"{worker_id}-{secrets.token_hex(8)}"
        self._keys[key] = worker_id
        return key

    def claim(self, launch_key: str, pid: int) -> int | None:
        """The worker id reserved for a registering process (``None``: not ours)."""
        return self._keys.pop(launch_key, None) if launch_key else None

    @abc.abstractmethod
    def spawn(self, worker_id: int) -> None:
        """Start the process that will register as ``worker_id``."""

    def start(self, worker_ids: Iterable[int]) -> None:
        """:meth:`spawn` each id."""
        for i in worker_ids:
            self.spawn(i)

    def observes(self, worker_id: int) -> bool:
        """Whether :meth:`alive` and :meth:`exitcode` see the worker's process itself."""
        return False

    def alive(self, worker_id: int) -> bool:
        """Whether the worker's process may still run (``True`` when not observable)."""
        return self.exitcode(worker_id) is None

    def exitcode(self, worker_id: int) -> int | None:
        """``None`` while running (or unknown); the exit status, ``-signal`` if killed."""
        return None

    def wait(self, worker_id: int, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the worker to exit; its exit code or ``None``."""
        return self.exitcode(worker_id)

    def describe(self, worker_id: int) -> str:
        """Where the worker runs, for messages (e.g. ``pid 123`` or ``ssh node1``)."""
        return f"{self.name} worker {worker_id}"

    def kill(self, worker_id: int, pid: int | None = None, timeout: float = 10.0) -> int | None:
        """SIGKILL the worker's process (``pid``, as it registered); its exit code if known."""
        raise NotImplementedError(f"the {self.name} launcher cannot kill workers")

    def release_token_file(self) -> None:
        """Remove any token file written for start-up (workers read it only then)."""

    @abc.abstractmethod
    def close(self, timeout: float = 5.0) -> None:
        """Give workers ``timeout`` seconds to exit on their own, then stop the rest."""


def _remove_token_file(files: dict[str, str]) -> None:
    path = files.pop("token", None)
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _reap(procs: dict[int, subprocess.Popen], logs: list[IO], files: dict[str, str]) -> None:
    """SIGKILL and wait for every worker still running; remove the token file."""
    for proc in list(procs.values()):  # a replacement may start meanwhile
        if proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass
    for proc in list(procs.values()):
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for f in logs:
        f.close()
    _remove_token_file(files)


class LocalLauncher(Launcher):
    """Worker subprocesses of one cluster on this machine, keyed by worker id.

    ``env``: the workers' environment (default: the driver's). Worker logs go to
    ``worker-<id>.log`` in the cluster's ``log_dir`` (default: the driver's output).
    """

    name = "local"

    def __init__(self, env: dict[str, str] | None = None) -> None:
        super().__init__()
        self.env = env
        self._procs: dict[int, subprocess.Popen] = {}
        self._logs: list[IO] = []
        self._files: dict[str, str] = {}  # "token": path of the current token file
        self._finalizer = weakref.finalize(self, _reap, self._procs, self._logs, self._files)

    @property
    def token_file(self) -> str | None:
        """The 0600 token file workers read at start-up (``None`` once released)."""
        return self._files.get("token")

    def release_token_file(self) -> None:
        """Remove the token file (workers read it only at start-up); :meth:`spawn` makes a new one."""
        _remove_token_file(self._files)

    def command(self) -> list[str]:
        """The worker command line (without ``--parent-pid`` and ``--launch-key``)."""
        if "token" not in self._files:
            assert self.credentials is not None, "bind() first"
            self._files["token"] = self.credentials.write_temp()
        return worker_command(self.connect, self._files["token"], host=self.host)

    def spawn(self, worker_id: int) -> None:
        """Start the process that will register as ``worker_id``."""
        if not self._finalizer.alive:
            raise RuntimeError("launcher is closed")
        if worker_id in self._procs:
            raise ValueError(f"worker {worker_id} was already started")
        out = None
        if self.log_dir is not None:
            out = open(os.path.join(self.log_dir, f"worker-{worker_id}.log"), "ab")  # noqa: SIM115
            self._logs.append(out)
        command = self.command() + ["--parent-pid", str(os.getpid())]
        command += ["--launch-key", self.new_launch_key(worker_id)]
        # PR_SET_PDEATHSIG fires when the *thread* that started the child exits: ask for it
        # from the main thread only; the worker's --parent-pid watchdog covers the rest.
        if threading.current_thread() is threading.main_thread():
            command.append("--kill-with-parent")
        self._procs[worker_id] = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            env=self.env,
            start_new_session=True,  # notebook interrupts (SIGINT to the group) spare the workers
        )

    @property
    def worker_ids(self) -> list[int]:
        return sorted(self._procs)

    def claim(self, launch_key: str, pid: int) -> int | None:
        """The reserved id, if the registering process is one this launcher started."""
        worker_id = super().claim(launch_key, pid)
        if worker_id is None or self._procs[worker_id].pid != pid:
            return None
        return worker_id

    def pid(self, worker_id: int) -> int:
        return self._procs[worker_id].pid

    def observes(self, worker_id: int) -> bool:
        return worker_id in self._procs

    def describe(self, worker_id: int) -> str:
        proc = self._procs.get(worker_id)
        return super().describe(worker_id) if proc is None else f"pid {proc.pid}"

    def alive(self, worker_id: int) -> bool:
        """Whether the worker's process still runs. ``Popen.poll`` alone says "running"
        while another thread is inside ``wait()`` (e.g. ``kill_worker``), so a process
        that has died (a zombie) or was reaped is checked for as well."""
        proc = self._procs[worker_id]
        if proc.poll() is not None:
            return False
        return _running(proc.pid)

    def exitcode(self, worker_id: int) -> int | None:
        """``None`` while running (or not started here); the exit status, ``-signal`` if killed."""
        proc = self._procs.get(worker_id)
        return None if proc is None else proc.poll()

    def wait(self, worker_id: int, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the worker to exit; its exit code or ``None``
        (at once for a worker not started here)."""
        proc = self._procs.get(worker_id)
        try:
            return None if proc is None else proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, worker_id: int, pid: int | None = None, timeout: float = 10.0) -> int | None:
        """SIGKILL the worker and wait for it to exit; its exit code."""
        proc = self._procs[worker_id]
        if proc.poll() is None:
            proc.kill()
        return self.wait(worker_id, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Give workers ``timeout`` seconds to exit on their own, then SIGKILL the rest."""
        if not self._finalizer.alive:
            return
        deadline = time.monotonic() + timeout
        for proc in list(self._procs.values()):  # a replacement may start meanwhile
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self._finalizer()
