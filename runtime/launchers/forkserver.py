"""The driver's side of the worker template (runtime/worker/template.py): local workers
forked from one process that has imported everything, instead of a Python start-up each.

:class:`ForkServer` starts the template on first use and asks it for workers;
:class:`ForkedWorker` stands for one of them with the part of ``subprocess.Popen`` that
the local launcher uses (``pid``, ``poll``, ``wait``, ``kill``). The template's children
are not the driver's, so their exits come over the template's socket, read by one
daemon thread. If the template dies, its children die with it (``PR_SET_PDEATHSIG``);
the next request starts a new template. The same server drives a template on another
host (``start``: the ssh launcher runs ``template --stdio`` there and talks to it over
ssh's stdin and stdout; a kill then goes through the template).
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
from typing import IO, Protocol

logger = logging.getLogger("clamor.launcher")

#: Seconds to wait for the template to fork a requested worker.
FORK_TIMEOUT = 30.0


class ForkedWorker:
    """A worker forked by the template: what the local launcher needs of a process."""

    def __init__(self, kill: Callable[[int], None]) -> None:
        self._kill = kill  # SIGKILLs a pid of the template's: here, or through the template
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
            self._kill(self._pid)

    @property
    def forked(self) -> bool:
        """Whether the template has forked it (its pid is known; no waiting)."""
        return self._pid is not None

    @property
    def error(self) -> str | None:
        """Why it was never forked (the template failed or is gone), else ``None``."""
        return self._error

    def _set_pid(self, pid: int | None, error: str | None = None, status: int = 1) -> None:
        self._pid, self._error = pid, error
        self._forked.set()
        if pid is None:
            self._ended(status)

    def _ended(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = status
        self._exited.set()


def _kill_here(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Channel(Protocol):
    """The driver's end of a template's channel: JSON lines each way."""

    def send(self, data: bytes) -> None: ...

    def recv(self) -> bytes:
        """What came (``b""`` once the template's end closed)."""
        ...

    def shut(self) -> None:
        """End it both ways: the template and the reader see the end."""
        ...

    def close(self) -> None: ...


class _SocketChannel:
    """A local template's socket pair."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> bytes:
        return self.sock.recv(1 << 16)

    def shut(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


class PipeChannel:
    """A template's stdin and stdout (through ssh, on another host)."""

    def __init__(self, to_template: IO[bytes], from_template: IO[bytes]) -> None:
        self._to, self._from = to_template, from_template

    def send(self, data: bytes) -> None:
        self._to.write(data)
        self._to.flush()

    def recv(self) -> bytes:
        return os.read(self._from.fileno(), 1 << 16)

    def shut(self) -> None:
        try:
            self._to.close()  # the template sees the end of its stdin and exits
        except OSError:
            pass

    def close(self) -> None:
        for f in (self._to, self._from):
            try:
                f.close()
            except OSError:
                pass


def _tell(channel: Channel | None, message: dict) -> None:
    """Send the template a JSON line; one that is gone or ending is not told (its reader
    sees the end and fails what it had not forked, with its exit status and why)."""
    if channel is None:
        return
    try:
        channel.send(json.dumps(message).encode() + b"\n")
    except OSError:
        pass


def _start_here(env: dict[str, str] | None) -> tuple[subprocess.Popen, Channel]:
    """A template process on this host, its end of a socket pair its channel."""
    ours, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "clamor.runtime.worker.template", str(theirs.fileno()), str(os.getpid()),
         str(int(threading.current_thread() is threading.main_thread()))],
        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    theirs.close()
    return proc, _SocketChannel(ours)


class _Template:
    """One template process, its channel and the workers it forked or is forking."""

    def __init__(self, proc: subprocess.Popen, channel: Channel) -> None:
        self.proc = proc
        self.channel: Channel | None = channel
        self.reader: threading.Thread | None = None  # ForkServer._read, while it runs
        self.waiting: dict[int, ForkedWorker] = {}  # request id -> not forked yet
        self.running: dict[int, ForkedWorker] = {}  # pid -> forked, not exited


class ForkServer:
    """A template process, started on first use (and again if it died). ``env``: its (and
    its workers') environment, for one on this host. ``start``: start one elsewhere
    instead (its process and channel); ``greeting``: the first message it gets (the
    credentials, there); ``ended``: what to say of workers never forked when it ended,
    from its process (its exit status is theirs)."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        *,
        start: Callable[[], tuple[subprocess.Popen, Channel]] | None = None,
        greeting: dict | None = None,
        ended: Callable[[subprocess.Popen], str] | None = None,
    ) -> None:
        self.env = env
        self._start = start or (lambda: _start_here(env))
        self._greeting = greeting
        self._ended = ended or (lambda proc: f"the worker template exited (status {proc.returncode})")
        self._remote = start is not None
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
                worker = ForkedWorker(self._kill_through(template) if self._remote else _kill_here)
                template.waiting[self._ids] = worker
                workers.append(worker)
                batch.append({"id": self._ids, "argv": argv, "log": log})
            keep(workers)
            _tell(template.channel, {"spawn": batch})

    def _kill_through(self, template: _Template) -> Callable[[int], None]:
        def kill(pid: int) -> None:
            with self._lock:
                channel = template.channel
            _tell(channel, {"kill": pid})  # if it is gone, its children died with it

        return kill

    def prepare(self) -> None:
        """Start the template if none runs (it imports while the caller goes on)."""
        with self._lock:
            self._started()

    def _started(self) -> _Template:
        """A running template (a new one if there is none, or it died)."""
        template = self._template
        if template is None or template.channel is None or template.proc.poll() is not None:
            template = self._template = _Template(*self._start())
            if self._greeting is not None:
                _tell(template.channel, self._greeting)
            template.reader = threading.Thread(target=self._read, args=(template,), name="clamor-template", daemon=True)
            template.reader.start()
        return template

    def _read(self, template: _Template) -> None:
        """The template's answers, until it closes: forks and exits of its workers."""
        channel, pending = template.channel, b""
        assert channel is not None
        try:
            while data := channel.recv():
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._handle(template, json.loads(line))
        except OSError:
            pass
        finally:
            with self._lock:
                template.channel = None
                orphans = list(template.waiting.values()) + list(template.running.values())
                template.waiting.clear()
                template.running.clear()
            status = template.proc.wait()
            why = self._ended(template.proc)
            for worker in orphans:  # they die with the template (PR_SET_PDEATHSIG)
                if worker._pid is None:
                    worker._set_pid(None, why, status if status else 1)
                else:
                    worker._ended(-signal.SIGKILL)
            channel.close()

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
            channel = template.channel if template is not None else None
        if channel is not None:
            channel.shut()  # the template and the reader see the end
        if template is not None:
            try:
                template.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                template.proc.kill()
                template.proc.wait()
            if template.reader is not None and template.reader is not threading.current_thread():
                template.reader.join(5)  # it ends with the socket: a closed launcher leaves no thread
