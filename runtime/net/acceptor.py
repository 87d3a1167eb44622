"""Accepting connections on a listening socket so that a flood cannot stop a server.

Used by the task-stream server and the bulk partition server. An unauthenticated
client gets a few seconds to prove the cluster token (:data:`PREAUTH_DEADLINE`), and at
most :data:`PENDING_LIMIT` of them are served at once per port: a connection beyond
that is closed at once, so idle connections cannot hold the process's file descriptors
and threads. An ``accept`` that fails for want of descriptors or memory (``EMFILE``,
``ENFILE``, ``ENOBUFS``, ``ENOMEM``) backs off and goes on instead of ending the loop.
Refusals are logged at a bounded rate, with a count of those not logged.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable

#: Seconds a client has to prove the cluster token after it connects.
PREAUTH_DEADLINE = 5.0
#: Unauthenticated connections one listening socket serves at once.
PENDING_LIMIT = 64
#: ``accept`` errors that a flood (or a busy host) causes and that pass.
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class RateLimitedLog:
    """At most ``burst`` lines every ``period`` seconds; the next line says how many were
    left out meanwhile."""

    def __init__(self, logger: logging.Logger, burst: int = 10, period: float = 10.0) -> None:
        self._logger, self._burst, self._period = logger, burst, period
        self._window, self._lines, self._left_out = 0.0, 0, 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args: object) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._window >= self._period:
                self._window, self._lines = now, 0
            if self._lines >= self._burst:
                self._left_out += 1
                return
            self._lines += 1
            left_out, self._left_out = self._left_out, 0
        if left_out:
            message += f" ({left_out} more not logged)"
        self._logger.warning(message, *args)


class Acceptor:
    """Runs ``serve(conn, authenticated)`` on a thread of its own (``conn_name``) for each connection
    accepted on ``listener``, once fewer than ``limit`` are still unauthenticated.
    ``serve`` calls ``authenticated()`` once the client proved the token (or on its way
    out); until then the connection counts against the limit."""

    def __init__(
        self, listener: socket.socket, serve: Callable[[socket.socket, Callable[[], None]], None],
        name: str, conn_name: str, log: RateLimitedLog, limit: int = PENDING_LIMIT,
    ) -> None:  # fmt: skip
        self._listener, self._serve, self._log = listener, serve, log
        self._name, self._conn_name = name, conn_name
        self._pending = threading.Semaphore(limit)
        self.turned_away = 0
        self.thread = threading.Thread(target=self._accept, name=name, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        backoff = 0.01
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError as exc:
                if exc.errno not in _TRANSIENT:
                    return  # shut down by its server's close()
                self._log.warning("%s: cannot accept a connection (%s); retrying", self._name, exc.strerror)
                time.sleep(backoff)
                backoff = min(2 * backoff, 1.0)
                continue
            backoff = 0.01
            if not self._pending.acquire(blocking=False):
                self.turned_away += 1
                self._log.warning("%s: too many connections still unauthenticated; closed a new one", self._name)
                with contextlib.suppress(OSError):
                    conn.close()
                continue
            conn.settimeout(PREAUTH_DEADLINE)
            threading.Thread(target=self._run, args=(conn,), name=self._conn_name, daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        released = False

        def authenticated() -> None:
            nonlocal released
            if not released:
                released = True
                self._pending.release()

        try:
            self._serve(conn, authenticated)
        finally:
            authenticated()
