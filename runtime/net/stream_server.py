"""The driver's end of the task streams: the listeners, and one thread that reads them all.

Workers connect to :class:`TaskStreamServer` (runtime/net/task_stream.py has the wire
and each worker's :class:`~clamor.runtime.net.task_stream.DriverLink`). A thread per
new connection runs the handshake and attaches the link; then a plain connection is
read by the server's one :class:`StreamPoller` thread (epoll), a TLS one by a thread of
its own (a TLS record cannot be read without blocking from a socket other threads write).

Why one poller: a thread per worker woke up for each results message and took the GIL
from the others, so the driver's CPU per task grew with the number of workers. The
poller reads whatever every ready stream holds in one wake-up, and runs the results' scheduler
events (``on_results``) on its own thread, together, inside ``gather()``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable

import grpc
from clamor.runtime.credentials import TLSMaterial
from clamor.runtime.net.acceptor import Acceptor, RateLimitedLog
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.task_stream import (
    CLOSED,
    HANDSHAKE_TIMEOUT,
    HEADER,
    MESSAGE,
    PING_INTERVAL,
    Connection,
    DriverLink,
    LinkTimeout,
    OnEnd,
    OnResults,
    end_frame,
    ending,
    keep_alive,
)
from clamor.runtime.net.transport import prove_token_server, recv_exact
from clamor.runtime.paging.page_client import tls_context
from google.protobuf.message import DecodeError

logger = logging.getLogger("clamor.task_stream")
_refusals = RateLimitedLog(logger)

#: ``gather()``: a context in which the results' events are gathered, run on the way out.
Gather = Callable[[], contextlib.AbstractContextManager]


class StreamPoller:
    """One thread reading the plain task streams: each ready one's frames go to its link;
    every :data:`PING_INTERVAL` / 2 s it pings the links due and ends those silent for
    :data:`~clamor.runtime.net.task_stream.LINK_TIMEOUT` s whose worker nobody vouches for
    (its process runs: a task holds its GIL)."""

    def __init__(self, on_results: OnResults, on_end: OnEnd, gather: Gather = contextlib.nullcontext) -> None:
        self._on_results, self._on_end, self._gather = on_results, on_end, gather
        self._epoll = select.epoll()
        self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake, select.EPOLLIN)
        self._streams: dict[int, tuple[DriverLink, Connection]] = {}  # fd -> stream
        self._closed = False
        self.thread = threading.Thread(target=self._run, name="clamor-stream-in", daemon=True)
        self.thread.start()

    def add(self, link: DriverLink, conn: Connection) -> None:
        """Read ``conn`` (attached to ``link``) from now on."""
        fd = conn.sock.fileno()
        link.unregister = lambda: self._forget(fd)
        self._streams[fd] = (link, conn)
        self._epoll.register(fd, select.EPOLLIN)

    def close(self) -> None:
        """Stop reading (the links are closed by their owner) and end the thread."""
        self._closed = True
        os.eventfd_write(self._wake, 1)
        self.thread.join(5.0)
        self._epoll.close()
        os.close(self._wake)

    def _forget(self, fd: int) -> None:
        if self._streams.pop(fd, None) is not None:
            with contextlib.suppress(OSError, ValueError):  # closed meanwhile
                self._epoll.unregister(fd)

    def _run(self) -> None:
        housekeeping = time.monotonic()
        while not self._closed:
            try:
                ready = self._epoll.poll(PING_INTERVAL / 2)
            except (OSError, ValueError):
                return  # closed
            with self._gather():
                for fd, _ in ready:
                    stream = self._streams.get(fd)
                    if stream is not None:
                        self._read(*stream)
            if time.monotonic() - housekeeping >= PING_INTERVAL / 2:
                housekeeping = time.monotonic()
                for link, conn in list(self._streams.values()):
                    link.ping_if_due()
                    try:
                        conn.check_heard()
                    except LinkTimeout as exc:
                        self._end(link, conn, ending(link.worker, exc))

    def _read(self, link: DriverLink, conn: Connection) -> None:
        try:
            frames = conn.read_ready()
            if frames is None:
                return self._end(link, conn, CLOSED)
            for kind, body in frames:
                if (ended := link.handle_frame(kind, body, self._on_results)) is not None:
                    return self._end(link, conn, ended)
        except Exception as exc:  # noqa: BLE001 - see ending()
            self._end(link, conn, ending(link.worker, exc))

    def _end(self, link: DriverLink, conn: Connection, ended: tuple[str, grpc.StatusCode]) -> None:
        """The stream ended: stop reading it, and end the link on a thread of its own
        (telling the worker may wait a second for a write under way; the loss is handled
        there too)."""
        self._forget(conn.sock.fileno())
        threading.Thread(target=link.end_stream, args=(conn, self._on_end, *ended),
                         name=f"clamor-stream-end-{link.worker}", daemon=True).start()  # fmt: skip


class TaskStreamServer:
    """The driver's listeners, on ``port`` (TCP) and on the abstract Unix socket
    ``unix_name`` (this network namespace only; ``""``: none): a thread per connection
    runs the handshake and attaches the worker's :class:`DriverLink` (``link_of(worker)``),
    whose results then go to ``on_results`` (inside ``gather()`` for those the poller
    reads: see :class:`StreamPoller`).

    Refused, with the reason in an ``END`` frame: a first message that does not decode
    (``INVALID_ARGUMENT``), a worker the driver does not have ready
    (``FAILED_PRECONDITION``), a second stream for one worker (``ALREADY_EXISTS``). A
    client without the token is hung up on.
    """

    def __init__(self, token: bytes, host: str, tls: TLSMaterial | None,
                 link_of: Callable[[int], DriverLink | None], on_results: OnResults,
                 on_end: OnEnd, gather: Gather = contextlib.nullcontext,
                 vouch: Callable[[int], bool] | None = None) -> None:  # fmt: skip
        self._token = token
        self._vouch = vouch
        self._tls = tls_context(tls, server=True) if tls is not None else None
        self._link_of, self._on_results, self._on_end = link_of, on_results, on_end
        self._poller = StreamPoller(on_results, on_end, gather)
        self._socks = [socket.create_server((host, 0))]
        self.port: int = self._socks[0].getsockname()[1]
        self.unix_name = f"clamor-stream-{secrets.token_hex(8)}"
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            unix.bind("\0" + self.unix_name)
            unix.listen()
            self._socks.append(unix)
        except OSError as exc:  # not Linux: TCP only
            logger.info("no Unix task-stream socket (%s): local workers use TCP", exc)
            unix.close()
            self.unix_name = ""
        self.refused = 0
        self._acceptors = [Acceptor(s, self._serve, "clamor-stream-accept", "clamor-stream", _refusals) for s in self._socks]

    def _serve(self, sock: socket.socket, authenticated: Callable[[], None]) -> None:
        try:
            conn, link = self._open(sock, authenticated)
        except (OSError, ValueError) as exc:
            self.refused += 1
            _refusals.warning("refused a task stream: %s", exc)
            with contextlib.suppress(OSError):
                sock.close()
            return
        if link is not None and self._tls is not None:
            link.read_until_end(conn, self._on_results, self._on_end)

    def _open(self, sock: socket.socket, authenticated: Callable[[], None]) -> tuple[Connection, DriverLink | None]:
        """Handshake (within the acceptor's deadline) and first message; the link
        attached (a plain one handed to the poller), or ``None`` (refused, told why)."""
        if sock.family != socket.AF_UNIX:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)
        if self._tls is not None:
            sock = self._tls.wrap_socket(sock, server_side=True)
        if not prove_token_server(sock, self._token):
            raise ConnectionError("a client without the cluster token")
        authenticated()
        sock.settimeout(HANDSHAKE_TIMEOUT)
        size, kind = HEADER.unpack(recv_exact(sock, HEADER.size))
        body = bytes(recv_exact(sock, min(size, 1 << 16)))
        sock.settimeout(None)
        conn = Connection(sock)
        try:
            if kind != MESSAGE or size > len(body):
                raise DecodeError("not a message")
            first = pb.WorkerMessage.FromString(body)
        except DecodeError as exc:
            refusal = (grpc.StatusCode.INVALID_ARGUMENT, f"the first task-stream message does not decode ({exc})")
        else:
            link = self._link_of(first.worker_id)
            own = threading.current_thread() if self._tls is not None else None
            if link is None:
                refusal = (grpc.StatusCode.FAILED_PRECONDITION, f"worker {first.worker_id} is not ready here, or was lost")
            elif not link.attach(conn, own):
                refusal = (grpc.StatusCode.ALREADY_EXISTS, f"worker {first.worker_id} has a task stream already")
            else:
                if self._vouch is not None:
                    conn.vouch = functools.partial(self._vouch, first.worker_id)
                if own is None:
                    self._poller.add(link, conn)
                return conn, link
        self.refused += 1
        with contextlib.suppress(OSError):
            conn.send(end_frame(*refusal))
        conn.close()
        return conn, None

    def close(self) -> None:
        """Stop accepting and reading (the links' :meth:`DriverLink.close` ends the streams)."""
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for acceptor in self._acceptors:
            acceptor.thread.join(5.0)
        self._poller.close()
