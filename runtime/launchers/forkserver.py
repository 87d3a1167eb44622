"""The driver's side of the worker template (runtime/worker/template.py): local workers
forked from one process that has imported everything, instead of a Python start-up each.

:class:`ForkServer` starts the template on first use and asks it for workers;
:class:`ForkedWorker` stands for one of them with the part of ``subprocess.Popen`` that
the local launcher uses (``pid``, ``poll``, ``wait``, ``kill``). The template's children
are not the driver's, so their exits come over the template's socket, read by one
daemon thread. If the template dies, its children die with it (``PR_SET_PDEATHSIG``);
the next request starts a new template.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence

logger = logging.getLogger("clamor.launcher")

#: Seconds to wait for the template to fork a requested worker.
FORK_TIMEOUT = 30.0


class ForkedWorker:
    """A worker forked by the template: what the local launcher needs of a process."""

    def __init__(self) -> None:
        self._pid: int | None = None
        self._error: str | None = None
        self.returncode: int | None = None
        self._forked = threading.Event()
        self._exited = threading.Event()

    @property
    def pid(self) -> int:
        """Its pid (waits for the template to have forked it)."""
        if not self._forked.wait(FORK_TIMEOUT) or self._pid is None:
            raise OSError(self._error or "the worker template did not fork the worker in time")
        return self._pid

    def poll(self) -> int | None:
        """Its exit status once it exited (``-signal`` if killed), else ``None``."""
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for it to exit; ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(f"worker pid {self._pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        """SIGKILL it (if it is still running)."""
        if self.returncode is None and self._pid is not None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _set_pid(self, pid: int | None, error: str | None = None) -> None:
        self._pid, self._error = pid, error
        self._forked.set()
        if pid is None:
            self._ended(1)

    def _ended(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = status
        self._exited.set()


class _Template:
    """One template process, its socket and the workers it forked or is forking."""

    def __init__(self, env: dict[str, str] | None) -> None:
        ours, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "clamor.runtime.worker.template", str(theirs.fileno()), str(os.getpid()),
             str(int(threading.current_thread() is threading.main_thread()))],
            pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=True,
        )  # fmt: skip
        theirs.close()
        self.sock: socket.socket | None = ours
        self.reader: threading.Thread | None = None  # ForkServer._read, while it runs
        self.waiting: dict[int, ForkedWorker] = {}  # request id -> not forked yet
        self.running: dict[int, ForkedWorker] = {}  # pid -> forked, not exited


class ForkServer:
    """The template process of this driver, started on first use (and again if it died).
    ``env``: its (and its workers') environment."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.env = env
        self._lock = threading.Lock()
        self._template: _Template | None = None
        self._ids = 0

    def spawn(
        self, requests: Sequence[tuple[list[str], str | None]], keep: Callable[[list[ForkedWorker]], None]
    ) -> None:
        """Fork a worker per ``(argv, log path or None)`` (``clamor-worker`` arguments);
        ``keep(workers)`` is called before the template is asked, so that a worker which
        registers at once is known already."""
        with self._lock:
            template = self._started()
            workers, batch = [], []
            for argv, log in requests:
                self._ids += 1
                worker = ForkedWorker()
                template.waiting[self._ids] = worker
                workers.append(worker)
                batch.append({"id": self._ids, "argv": argv, "log": log})
            keep(workers)
            try:
                assert template.sock is not None
                template.sock.sendall(json.dumps({"spawn": batch}).encode() + b"\n")
            except OSError as exc:
                for item in batch:
                    template.waiting.pop(item["id"])._set_pid(None, f"the worker template is gone: {exc}")

    def prepare(self) -> None:
        """Start the template if none runs (it imports while the caller goes on)."""
        with self._lock:
            self._started()

    def _started(self) -> _Template:
        """A running template (a new one if there is none, or it died)."""
        template = self._template
        if template is None or template.sock is None or template.proc.poll() is not None:
            template = self._template = _Template(self.env)
            template.reader = threading.Thread(target=self._read, args=(template,), name="clamor-template", daemon=True)
            template.reader.start()
        return template

    def _read(self, template: _Template) -> None:
        """The template's answers, until it closes: forks and exits of its workers."""
        sock, pending = template.sock, b""
        assert sock is not None
        try:
            while data := sock.recv(1 << 16):
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._handle(template, json.loads(line))
        except OSError:
            pass
        finally:
            with self._lock:
                template.sock = None
                orphans = list(template.waiting.values()) + list(template.running.values())
                template.waiting.clear()
                template.running.clear()
            for worker in orphans:  # they die with the template (PR_SET_PDEATHSIG)
                if worker._pid is None:
                    worker._set_pid(None, "the worker template exited")
                else:
                    worker._ended(-signal.SIGKILL)
            sock.close()
            template.proc.wait()

    def _handle(self, template: _Template, message: dict) -> None:
        with self._lock:
            if "forked" in message:
                worker = template.waiting.pop(message["forked"])
                template.running[message["pid"]] = worker
                worker._set_pid(message["pid"])
            elif "failed" in message:
                template.waiting.pop(message["failed"])._set_pid(None, message["error"])
            elif "exited" in message:
                worker = template.running.pop(message["exited"], None)
                if worker is not None:
                    worker._ended(message["status"])

    def close(self) -> None:
        """Stop the template (its workers, if any are left, die with it)."""
        with self._lock:
            template, self._template = self._template, None
            sock = template.sock if template is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # the template and the reader see the end
            except OSError:
                pass
        if template is not None:
            try:
                template.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                template.proc.kill()
                template.proc.wait()
            if template.reader is not None and template.reader is not threading.current_thread():
                template.reader.join(5)  # it ends with the socket: a closed launcher leaves no thread
