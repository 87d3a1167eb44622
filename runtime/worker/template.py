"""The template of a host's local workers: one process that has imported everything a
worker needs and forks a worker per request (a fork server).

A fresh Python start-up per worker (the interpreter, numpy, grpc, cffi and the native
module) costs far more CPU than the worker's own set-up, and a host starting hundreds of
workers at once spends seconds on it. The driver's local launcher starts this template
once (``python -m clamor.runtime.worker.template FD ...``, ``FD`` its end of a socket pair),
and asks it for workers (runtime/launchers/forkserver.py). The template never creates a
thread, a gRPC channel or the arena: a forked child starts from a clean, single-threaded
copy and runs ``clamor-worker``'s own ``main``.

The protocol is JSON lines on the socket. The driver sends
``{"spawn": [{"id": N, "argv": [...], "log": PATH or null}, ...]}``; the template forks
each in turn and answers ``{"forked": N, "pid": P}`` (or ``{"failed": N, "error": ...}``),
and ``{"exited": P, "status": S}`` when a child ends (``-signal`` if it was killed);
``{"kill": P}`` SIGKILLs child ``P``. When the driver's end closes (the driver closed its
launcher, or died), the template kills the children left and exits. It dies with the
driver (``PR_SET_PDEATHSIG``, or its own check of its parent every second); its children
die with it (``PR_SET_PDEATHSIG``).

On another host (``python -m clamor.runtime.worker.template --stdio``, started by the ssh
launcher) the channel is the template's stdin and stdout, and the workers' output goes
to its stderr. The driver's first message there is ``{"credentials": TEXT}``: the
template keeps them in memory and hands each child its own copy through a pipe (it adds
``--token-file /dev/fd/N`` to the child's arguments), so no file holds them.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import sys
from typing import Any, NoReturn

PR_SET_PDEATHSIG = 1


def preload() -> None:
    """Import what a worker imports (so its children do not); create nothing."""
    import concurrent.futures.thread  # noqa: F401 - the gRPC server's pool
    import queue  # noqa: F401

    import cloudpickle  # noqa: F401
    import grpc._channel
    import grpc._server
    import grpc.experimental  # noqa: F401
    import numpy.random  # noqa: F401
    from clamor.runtime.paging import pager  # noqa: F401 - loads the native module
    from clamor.runtime.storage import bulk, spill  # noqa: F401
    from clamor.runtime.worker import process  # noqa: F401 - grpc, the proto, the task runner


PR_SET_NAME = 15


def _name(name: bytes) -> None:
    """The process's name as ``ps`` and ``top`` show it (its command line stays the template's)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits (Linux); exit now if it has already."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(70)


def _child(channel: tuple[int, int], template: int, argv: list[str], log: str | None,
           credentials: bytes | None) -> None:  # fmt: skip
    """In a forked child: become a fresh worker process and run ``clamor-worker``."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh process
        for fd in set(channel):
            os.close(fd)
        if channel == (0, 1):  # stdio: stdin from nowhere, stdout where stderr goes
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            os.dup2(2, 1)
        os.setsid()  # notebook interrupts (SIGINT to the driver's group) spare it
        _die_with_parent(template)
        _name(b"clamor-worker")
        if credentials is not None:
            r, w = os.pipe()
            os.write(w, credentials)  # a few KiB: the pipe holds them
            os.close(w)
            argv = [*argv, "--token-file", f"/dev/fd/{r}"]
        if log is not None:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        import numpy

        numpy.random.seed()  # its own entropy, as a fresh process has (random reseeds itself)
        from clamor.runtime.worker import process

        sys.argv = ["clamor-worker", *argv]
        code = process.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - a child must never return into the template's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    os._exit(code or 0)


class Template:
    """The template's loop: requests from the driver, exits of its children."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.credentials: bytes | None = None  # stdio mode: the driver's first message
        self.children: set[int] = set()
        self.pending = b""
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the pipe

    def send(self, message: dict[str, Any]) -> None:
        data = memoryview(json.dumps(message).encode() + b"\n")
        while data:
            data = data[os.write(self.wfd, data):]

    def spawn(self, request: dict[str, Any]) -> None:
        try:
            pid = os.fork()
        except OSError as exc:
            self.send({"failed": request["id"], "error": f"fork: {exc}"})
            return
        if pid == 0:
            _child((self.rfd, self.wfd), os.getppid(), request["argv"], request.get("log"), self.credentials)
        self.children.add(pid)
        self.send({"forked": request["id"], "pid": pid})

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.children.discard(pid)
            self.send({"exited": pid, "status": os.waitstatus_to_exitcode(status)})

    def read(self) -> bool:
        """Serve what the driver sent; False once it closed its end."""
        data = os.read(self.rfd, 1 << 16)
        if not data:
            return False
        self.pending += data
        *lines, self.pending = self.pending.split(b"\n")
        for line in lines:
            message = json.loads(line)
            if "credentials" in message:
                self.credentials = message["credentials"].encode()
            if message.get("kill") in self.children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(message["kill"], signal.SIGKILL)
            for request in message.get("spawn", []):
                self.spawn(request)
        return True

    def run(self, parent: int | None) -> None:
        """Serve until the driver closes its end or is gone (``parent``: checked every
        second, since its ``PR_SET_PDEATHSIG`` is asked for only from its main thread;
        ``None``: on another host, where the end of stdin says it)."""
        selector = selectors.DefaultSelector()
        selector.register(self.rfd, selectors.EVENT_READ, "driver")
        selector.register(self.wake_r, selectors.EVENT_READ, "signal")
        try:
            while parent is None or os.getppid() == parent:
                for key, _ in selector.select(timeout=1.0):
                    if key.data == "signal":
                        with contextlib.suppress(BlockingIOError):
                            os.read(self.wake_r, 4096)
                        self.reap()
                    elif not self.read():
                        return
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            for pid in self.children:  # the driver is gone or closed: no orphans
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def main(argv: list[str] | None = None) -> NoReturn:
    """``python -m clamor.runtime.worker.template FD DRIVER_PID KILL_WITH_DRIVER``: serve
    on socket ``FD``; ``KILL_WITH_DRIVER`` 1: ask for ``PR_SET_PDEATHSIG`` (it fires when the
    *thread* that started us exits, so the driver asks for it from its main thread only).
    ``... --stdio``: serve on stdin and stdout (on another host, through ssh)."""
    args = argv if argv is not None else sys.argv[1:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when workers go
    if args == ["--stdio"]:
        _name(b"clamor-template")
        preload()
        Template(0, 1).run(None)
    else:
        fd, parent, kill_with_parent = (int(a) for a in args)
        if kill_with_parent:
            _die_with_parent(parent)
        _name(b"clamor-template")
        preload()
        Template(fd, fd).run(parent)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no interpreter shutdown (tens of ms with grpc and numpy loaded): the driver's close waits for it


if __name__ == "__main__":
    sys.exit(main())
