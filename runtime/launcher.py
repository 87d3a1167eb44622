"""Start ``clamor-worker`` processes on this machine (the ``local`` launcher).

No orphans: workers die with :meth:`LocalLauncher.close`, with the interpreter
(``weakref.finalize``, which also runs at exit), and with a SIGKILL of the driver
(``PR_SET_PDEATHSIG`` on Linux, plus the worker's own watchdog on ``--parent-pid``).

The worker sets ``PR_SET_PDEATHSIG`` itself, first thing after exec, then checks
that its parent is still the driver (closing the race). That is equivalent to a
``preexec_fn`` without its hazard: a ``preexec_fn`` runs Python in a child forked
from a process full of gRPC threads, which can deadlock before exec.
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
from clamor.runtime.transport import write_temp_token_file


def _remove_token_file(files: dict[str, str]) -> None:
    path = files.pop("token", None)
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _reap(procs: dict[int, subprocess.Popen], logs: list[IO], files: dict[str, str]) -> None:
    """SIGKILL and wait for every worker still running; remove the token file."""
    for proc in procs.values():
        if proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass
    for proc in procs.values():
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for f in logs:
        f.close()
    _remove_token_file(files)


class LocalLauncher:
    """Worker subprocesses of one cluster, keyed by the worker id the cluster chose.

    ``log_dir``: write each worker's stdout/stderr to ``worker-<id>.log`` there
    (default: inherit the driver's). ``env``: the workers' environment (default: the
    driver's).
    """

    def __init__(
        self,
        connect: str,
        token: str,
        *,
        host: str = "127.0.0.1",
        log_dir: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.connect = connect
        self.host = host
        self.log_dir = log_dir
        self.env = env
        self._procs: dict[int, subprocess.Popen] = {}
        self._logs: list[IO] = []
        self._token = token
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
        """The worker command line (without ``--parent-pid``)."""
        if "token" not in self._files:
            self._files["token"] = write_temp_token_file(self._token)
        return [
            sys.executable,
            "-m",
            "clamor.runtime.worker",
            "--connect",
            self.connect,
            "--token-file",
            self._files["token"],
            "--host",
            self.host,
        ]

    def spawn(self, worker_id: int) -> int:
        """Start the process that will register as ``worker_id``; return its pid."""
        if not self._finalizer.alive:
            raise RuntimeError("launcher is closed")
        if worker_id in self._procs:
            raise ValueError(f"worker {worker_id} was already started")
        out = None
        if self.log_dir is not None:
            out = open(os.path.join(self.log_dir, f"worker-{worker_id}.log"), "ab")  # noqa: SIM115
            self._logs.append(out)
        command = self.command() + ["--parent-pid", str(os.getpid())]
        # PR_SET_PDEATHSIG fires when the *thread* that started the child exits: ask for it
        # from the main thread only; the worker's --parent-pid watchdog covers the rest.
        if threading.current_thread() is threading.main_thread():
            command.append("--kill-with-parent")
        self._procs[worker_id] = proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT if out is not None else None,
            env=self.env,
            start_new_session=True,  # notebook interrupts (SIGINT to the group) spare the workers
        )
        return proc.pid

    def start(self, worker_ids: Iterable[int]) -> list[int]:
        """:meth:`spawn` each id; return the pids."""
        return [self.spawn(i) for i in worker_ids]

    @property
    def worker_ids(self) -> list[int]:
        return sorted(self._procs)

    def worker_id_for_pid(self, pid: int) -> int | None:
        """The worker id of the process ``pid``, if this launcher started it."""
        for worker_id, proc in self._procs.items():
            if proc.pid == pid:
                return worker_id
        return None

    def pid(self, worker_id: int) -> int:
        return self._procs[worker_id].pid

    def alive(self, worker_id: int) -> bool:
        """Whether the worker's process still runs. ``Popen.poll`` alone says "running"
        while another thread is inside ``wait()`` (e.g. ``kill_worker``), so a process
        that has died (a zombie) or was reaped is checked for as well."""
        proc = self._procs[worker_id]
        if proc.poll() is not None:
            return False
        try:
            return psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def exitcode(self, worker_id: int) -> int | None:
        """``None`` while running; the exit status, or ``-signal`` if killed by a signal."""
        return self._procs[worker_id].poll()

    def wait(self, worker_id: int, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the worker to exit; its exit code or ``None``."""
        try:
            return self._procs[worker_id].wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self, worker_id: int, timeout: float = 10.0) -> int | None:
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
        for proc in self._procs.values():
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self._finalizer()
