"""The local launcher: workers as subprocesses of the driver (the default).

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

import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable
from typing import IO

import psutil
from clamor.runtime.launchers.base import Launcher, worker_command
from clamor.runtime.launchers.forkserver import ForkedWorker, ForkServer


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie. Asked before every stage: on Linux one
    read of ``/proc/PID/stat`` (cheaper than psutil's process object), elsewhere psutil."""
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


def _remove_token_file(files: dict[str, str]) -> None:
    path = files.pop("token", None)
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _reap(procs: dict[int, subprocess.Popen | ForkedWorker], logs: list[IO], files: dict[str, str], forks: ForkServer | None) -> None:
    """SIGKILL and wait for every worker still running; stop the template; remove the token file."""
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
    if forks is not None:
        forks.close()
    for f in logs:
        f.close()
    _remove_token_file(files)


class LocalLauncher(Launcher):
    """Worker processes of one cluster on this machine, keyed by worker id.

    ``env``: the workers' environment (default: the driver's). Worker logs go to
    ``worker-<id>.log`` in the cluster's ``log_dir`` (default: the driver's output).
    ``fork``: fork the workers from one template process that has imported everything
    (runtime/worker/template.py), instead of a Python start-up each (default: on Linux,
    unless a subclass changes :meth:`command`: its workers start as that command says).
    """

    name = "local"

    def __init__(self, env: dict[str, str] | None = None, fork: bool | None = None) -> None:
        super().__init__()
        self.env = env
        if fork is None:
            fork = sys.platform.startswith("linux") and type(self).command is LocalLauncher.command
        self.fork = fork
        self._procs: dict[int, subprocess.Popen | ForkedWorker] = {}
        self._logs: list[IO] = []
        self._files: dict[str, str] = {}  # "token": path of the current token file
        self._forks = ForkServer(env) if self.fork else None
        self._finalizer = weakref.finalize(self, _reap, self._procs, self._logs, self._files, self._forks)

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

    def prepare(self) -> None:
        """Start the template now (its imports overlap the cluster's own set-up)."""
        if self._forks is not None:
            self._forks.prepare()

    def start(self, worker_ids: Iterable[int]) -> None:
        """Start a process per id: forked from the template in one request, or one by one."""
        ids = list(worker_ids)
        if self._forks is None:
            super().start(ids)
            return
        self._check_new(ids)
        requests = [(self._arguments(i)[3:], self._log_path(i)) for i in ids]  # without python -m
        self._forks.spawn(requests, lambda workers: self._procs.update(zip(ids, workers)))

    def spawn(self, worker_id: int) -> None:
        """Start the process that will register as ``worker_id``."""
        if self._forks is not None:
            self.start([worker_id])
            return
        self._check_new([worker_id])
        out = None
        if (path := self._log_path(worker_id)) is not None:
            out = open(path, "ab")  # noqa: SIM115 - closed with the launcher
            self._logs.append(out)
        command = self._arguments(worker_id)
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

    def _check_new(self, worker_ids: list[int]) -> None:
        if not self._finalizer.alive:
            raise RuntimeError("launcher is closed")
        if started := [i for i in worker_ids if i in self._procs]:
            raise ValueError(f"worker {started[0]} was already started")

    def _arguments(self, worker_id: int) -> list[str]:
        """The worker's command line, with the driver's pid and its launch key."""
        command = self.command() + ["--parent-pid", str(os.getpid())]
        return command + ["--launch-key", self.new_launch_key(worker_id)]

    def _log_path(self, worker_id: int) -> str | None:
        return None if self.log_dir is None else os.path.join(self.log_dir, f"worker-{worker_id}.log")

    @property
    def worker_ids(self) -> list[int]:
        return sorted(self._procs)

    def claim(self, launch_key: str, pid: int) -> int | None:
        """The reserved id, if the registering process is one this launcher started."""
        worker_id = super().claim(launch_key, pid)
        proc = self._procs.get(worker_id) if worker_id is not None else None
        try:
            return worker_id if proc is not None and proc.pid == pid else None
        except OSError:  # the template never forked it
            return None

    def pid(self, worker_id: int) -> int:
        return self._procs[worker_id].pid

    def observes(self, worker_id: int) -> bool:
        return worker_id in self._procs

    def describe(self, worker_id: int) -> str:
        proc = self._procs.get(worker_id)
        return super().describe(worker_id) if proc is None else f"pid {proc.pid}"

    def alive(self, worker_id: int) -> bool:
        """Whether the worker's process still runs. A forked worker's exit is reported by
        its template, which reaps it, so its ``poll`` is enough (asked before every stage:
        no system call per worker). ``Popen.poll`` alone says "running" while another
        thread is inside ``wait()`` (e.g. ``kill_worker``), so for a worker started on its
        own, a process that has died (a zombie) or was reaped is checked for as well."""
        proc = self._procs[worker_id]
        if proc.poll() is not None:
            return False
        return isinstance(proc, ForkedWorker) or _running(proc.pid)

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
