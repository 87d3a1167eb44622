"""The task stream: one long-lived connection per worker, beside the gRPC control plane.

A worker opens it once ``Ready`` returned and keeps it for its lifetime. Down it go the
driver's launches, cancels and partition drops; up come the results of the worker's
attempts. A worker in the driver's network namespace (its host) connects to the
driver's abstract Unix socket, others over TCP (a Unix send costs the sender less CPU
than a loopback TCP one, and a 2-task stage makes four). It is a plain stream (TLS when
the cluster has TLS), not a gRPC stream: a gRPC message costs Python far more to send and
receive than a framed socket, enough to keep a 2-task stage over a millisecond
(docs/architecture.md, "The task stream", has the measurements). The rest of the control plane stays on gRPC.

Wire: the token handshake of :func:`~clamor.runtime.net.transport.prove_token_server`,
then frames of a ``u32`` length and a ``u8`` kind (little-endian) and the body:

- ``MESSAGE``: a serialized :class:`pb.DriverMessage` (down) or :class:`pb.WorkerMessage`
  (up). The worker's first one names it (``worker_id`` only); every later one carries
  results, which the worker batches while it has attempts queued.
- ``PING`` / ``PONG``: the driver pings every :data:`PING_INTERVAL` s; the worker answers.
- ``END``: ``"CODE why"`` (a ``grpc.StatusCode`` name, UTF-8): why the sender ends it.

Order: the driver's items reach the worker in the order issued (a cancel never
overtakes its launch): a small one is written at once on the caller's thread, as far as
the socket takes it without waiting; its rest, a large one (a stage's program) and
whatever follows them while they are written go through the link's writer thread, so
that the thread running the scheduler's events never waits on a worker.

Failure: the stream's end, either way and for any reason, means the worker is lost.
A killed process resets the connection; a stopped one, or a cut link, stops answering
(nothing heard for :data:`LINK_TIMEOUT` s ends the stream, on both ends); a message
that does not decode, or a second stream for the same worker, is refused with the
reason. The driver then counts the worker lost (``on_end``: its attempts rerun
elsewhere) and the worker exits, saying why (:func:`run_worker_stream`).
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator

import grpc
from clamor.runtime.credentials import TLS_SERVER_NAME, TLSMaterial
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.transport import (
    MAX_MESSAGE_BYTES,
    prove_token_client,
    split_address,
)
from clamor.runtime.paging.page_client import tls_context
from google.protobuf.message import DecodeError

logger = logging.getLogger("clamor.task_stream")

#: A worker's results message gathers reports up to about this size.
MAX_BATCH_BYTES = 4 << 20
#: The driver pings each worker this often; nothing heard for LINK_TIMEOUT s ends a stream.
PING_INTERVAL = 2.5
LINK_TIMEOUT = 10.0
#: Items up to this size are written on the issuing thread (when nothing waits before them).
INLINE_BYTES = 64 << 10
#: Seconds a new connection has for its handshake and first message.
HANDSHAKE_TIMEOUT = 10.0

MESSAGE, PING, PONG, END = range(4)
HEADER = struct.Struct("<IB")

#: ``on_results(worker, reports, moved)``: a WorkerMessage's content.
OnResults = Callable[[int, Iterable[pb.TaskReport], Iterable[pb.PartitionMove]], None]
#: ``on_end(worker, why)``: the stream ended without the driver closing it.
OnEnd = Callable[[int, str], None]


class LinkTimeout(ConnectionError):
    """Nothing was heard from the other end for :data:`LINK_TIMEOUT` s."""


def keep_alive(sock: socket.socket) -> None:
    """Have the kernel watch a TCP connection (a Unix one needs no watching): keepalive
    probes while it is idle, and an error once what was sent stays unacknowledged for
    :data:`LINK_TIMEOUT` s. The kernel answers the probes whatever the process does, so
    a worker busy under the GIL keeps its link; a cut link or a dead host ends it."""
    if sock.family == socket.AF_UNIX:
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", PING_INTERVAL), ("TCP_KEEPINTVL", PING_INTERVAL),
                          ("TCP_KEEPCNT", LINK_TIMEOUT // PING_INTERVAL),
                          ("TCP_USER_TIMEOUT", LINK_TIMEOUT * 1000)):  # fmt: skip
        if hasattr(socket, option):  # Linux has them all
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), max(1, int(value)))


def frame(kind: int, body: bytes = b"") -> bytes:
    """One frame as the wire carries it."""
    return HEADER.pack(len(body), kind) + body


def invalidation_frame(request: pb.InvalidateRequest) -> bytes:
    """``request`` as the frame of a DriverMessage, built once for every stream it goes on."""
    return frame(MESSAGE, pb.DriverMessage(invalidate=request).SerializeToString())


def end_frame(code: grpc.StatusCode, why: str) -> bytes:
    return frame(END, f"{code.name} {why}".encode())


def parse_end(body: bytes) -> tuple[grpc.StatusCode, str]:
    """An ``END`` frame's code and reason (an unknown code reads as ``UNKNOWN``)."""
    name, _, why = body.decode(errors="replace").partition(" ")
    return getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN), why


class Connection:
    """A connected task-stream socket: whole frames out (:meth:`send`, thread-safe) and in
    (:meth:`frames` on a thread of its own, or :meth:`read_ready` from a poller)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        #: Whether the other end is known to live though it is silent (its process runs,
        #: busy holding its GIL): then silence does not end the stream (see check_heard).
        self.vouch: Callable[[], bool] | None = None
        self._lock = threading.Lock()
        self._poll = select.poll()  # not select(): a driver of many workers has fds past 1024
        self._poll.register(sock, select.POLLIN)
        self._buf = bytearray()  # what came in after the last whole frame
        self.last_heard = time.monotonic()

    def send(self, data: bytes, wait: bool = True) -> bool:
        """Write frames (``OSError`` if the connection is gone); ``wait=False``: not
        while another thread writes (then False, nothing sent)."""
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            self.sock.sendall(data)
        finally:
            self._lock.release()
        return True

    def send_some(self, data: bytes) -> int:
        """Write what the socket takes now, without waiting for the other end: how many
        bytes of ``data`` went (``OSError`` if the connection is gone). A TLS socket
        takes it all (a TLS record cannot be written in part)."""
        with self._lock:
            if isinstance(self.sock, ssl.SSLSocket):
                self.sock.sendall(data)
                return len(data)
            view, sent = memoryview(data), 0
            while sent < len(view):
                try:
                    sent += self.sock.send(view[sent:], socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
            return sent

    def frames(self, tick: Callable[[], None] = lambda: None) -> Iterator[tuple[int, bytes]]:
        """``(kind, body)`` as they arrive, until the other end closes the connection (or
        ``OSError``: a reset, :class:`LinkTimeout`). ``tick`` runs at least every
        :data:`PING_INTERVAL` s."""
        while True:
            tick()
            pending = isinstance(self.sock, ssl.SSLSocket) and self.sock.pending()
            if not pending and not self._poll.poll(PING_INTERVAL * 1000):
                self.check_heard()
                continue
            data = self.sock.recv(1 << 20)
            if not data:
                return
            yield from self._parse(data)

    def read_ready(self) -> list[tuple[int, bytes]] | None:
        """The frames that what the socket holds now completes, read without blocking
        (a plain socket: TLS records need :meth:`frames`); ``None`` once the other end
        closed the connection."""
        try:
            data = self.sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return []
        return self._parse(data) if data else None

    def check_heard(self) -> None:
        """:class:`LinkTimeout` if nothing came for :data:`LINK_TIMEOUT` s, unless
        :attr:`vouch` says the other end lives: a task holding the GIL for minutes (a long
        C call) leaves its worker silent, not dead. A cut TCP link is found out by the
        kernel meanwhile (:func:`keep_alive`), a dead process by its connection's reset."""
        silent = time.monotonic() - self.last_heard
        if silent > LINK_TIMEOUT and (self.vouch is None or not self.vouch()):
            raise LinkTimeout(f"nothing heard for {silent:.0f} s")

    def _parse(self, data: bytes) -> list[tuple[int, bytes]]:
        """``data`` appended; the whole frames now in, taken out of the buffer."""
        self.last_heard = time.monotonic()
        buf, at, out = self._buf, 0, []
        buf += data
        while len(buf) - at >= HEADER.size:
            size, kind = HEADER.unpack_from(buf, at)
            if size > MAX_MESSAGE_BYTES:
                raise ConnectionError(f"a frame of {size} bytes: not the task-stream protocol")
            if len(buf) - at - HEADER.size < size:
                break
            out.append((kind, bytes(buf[at + HEADER.size : at + HEADER.size + size])))
            at += HEADER.size + size
        del buf[:at]
        return out

    def close(self) -> None:
        """Shut the socket down (wakes a thread blocked on it) and close it."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


#: Seconds a link's writer thread waits for more to write before it ends.
WRITER_IDLE = 2.0


class DriverLink:
    """The driver's end of one worker's task stream.

    :meth:`launch`, :meth:`cancel` and :meth:`drop` send a message each, in issue order,
    and never wait on the worker: items issued before the worker connects, a large one,
    and those behind it, are written by the link's writer thread. That thread runs only
    while there is such a backlog (it ends after :data:`WRITER_IDLE` s without one), so
    a thousand idle workers cost the driver no thread each. :meth:`close` ends it.
    """

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self._cond = threading.Condition()
        self._conn: Connection | None = None  # attached, until the stream ends
        self._backlog: list[bytes] = []  # frames for the writer thread, in order
        self._writing = False  # a thread is writing: later items join the backlog
        self._closed = False
        self._last_ping = time.monotonic()
        #: The threads that read the worker's results (``None``: the server's poller reads
        #: it) and write the backlog, once it connected.
        self.reader: threading.Thread | None = None
        #: Set by the poller reading it: stop watching the socket (called as the link closes).
        self.unregister: Callable[[], None] = lambda: None
        #: The writer thread while one runs (:meth:`_writer`), else the last one or ``None``.
        self.writer: threading.Thread | None = None
        self._writer_running = False
        #: Counters (read from any thread): messages each way, attempts sent, reports received.
        self.sent_messages = self.sent_attempts = self.received_messages = self.received_reports = 0
        #: How the worker connected: ``"unix"`` (same host), ``"tcp"``; ``""`` not yet.
        self.transport = ""

    # --- the executor's side ---

    def launch(self, request: pb.LaunchRequest) -> None:
        self._send(pb.DriverMessage(launches=[request]), len(request.attempts))

    def cancel(self, attempts: Iterable[int]) -> None:
        self._send(pb.DriverMessage(cancel=list(attempts)))

    def drop(self, keys: Iterable[pb.PartitionKey]) -> None:
        """Free partitions on the worker."""
        self._send(pb.DriverMessage(drop=list(keys)))

    def invalidate(self, message: bytes) -> None:
        """Send an :func:`invalidation_frame`: the worker drops or advances its pages
        before it runs any attempt sent after this (one write, not a call)."""
        self._put(message, 0)

    def shut_down(self) -> bool:
        """Tell the worker to exit (the cluster is closing); False if the stream is not
        connected (then nothing was sent: the caller asks another way)."""
        if not self.connected:
            return False
        self._send(pb.DriverMessage(shutdown=True))
        return True

    def close(self, why: str = "", code: grpc.StatusCode = grpc.StatusCode.OK) -> None:
        """End the stream (what is still waiting to be written is not sent); the worker
        gets ``code`` and ``why``. ``on_end`` is not called: the driver knows."""
        self._finish(why, code)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connected(self) -> bool:
        """The worker's stream is attached and has not ended."""
        return self._conn is not None and not self._closed

    def _send(self, message: pb.DriverMessage, attempts: int = 0) -> None:
        self._put(frame(MESSAGE, message.SerializeToString()), attempts)

    def _put(self, data: bytes, attempts: int | None = None) -> None:
        """Frames to write after those issued before (``attempts``: a message launching
        that many, counted; ``None``: a ping): here, as far as the socket takes them now;
        the rest, a large item and what is issued meanwhile by the writer thread. So the
        thread running the scheduler's events never waits on a worker (one that is itself
        blocked sending its results to a driver not reading them)."""
        with self._cond:
            if self._closed:
                return
            if attempts is not None:
                self.sent_messages += 1
                self.sent_attempts += attempts
            conn = self._conn
            if conn is None or self._writing or self._backlog or len(data) > INLINE_BYTES:
                self._backlog.append(data)
                self._wake_writer()
                return
            self._writing = True
        try:
            sent = conn.send_some(data)
        except OSError:
            conn.close()  # the reader reports it
            sent = len(data)
        with self._cond:
            self._writing = False
            if sent < len(data):
                self._backlog.insert(0, data[sent:])
            if self._backlog:
                self._wake_writer()

    def _wake_writer(self) -> None:
        """(Under ``_cond``.) Have the backlog written: wake the writer thread, or start one
        once the worker is connected."""
        self._cond.notify_all()
        if self._conn is not None and not self._writer_running and not self._closed:
            self._writer_running = True
            self.writer = threading.Thread(target=self._writer, args=(self._conn,),
                                           name=f"clamor-stream-out-{self.worker}", daemon=True)  # fmt: skip
            self.writer.start()

    def _write(self, conn: Connection, data: bytes) -> None:
        """Write ``data`` (this thread set ``_writing``), waiting for the socket; a broken
        connection is shut down, which the reader reports."""
        try:
            conn.send(data)
        except OSError:
            conn.close()
        with self._cond:
            self._writing = False
            if self._backlog:
                self._cond.notify_all()

    def _writer(self, conn: Connection) -> None:
        """The writer thread: the backlog, in order, until the link is closed or it has had
        nothing to write for :data:`WRITER_IDLE` s (the next backlog starts another)."""
        while True:
            with self._cond:
                idle_since = time.monotonic()
                while not self._closed and (self._writing or not self._backlog):
                    if not self._writing and time.monotonic() - idle_since >= WRITER_IDLE:
                        self._writer_running = False
                        return
                    self._cond.wait(WRITER_IDLE)
                if self._closed:
                    self._writer_running = False
                    return
                data, self._backlog = b"".join(self._backlog), []
                self._writing = True
            self._write(conn, data)

    def _finish(self, why: str, code: grpc.StatusCode) -> bool:
        """Close once, telling the worker why (after the write under way, if it ends within
        a second); False if it was closed already (then nothing changes)."""
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            self._cond.notify_all()
            idle = self._cond.wait_for(lambda: not self._writing, timeout=1.0)
            self._writing = True  # the end goes last; nothing is written after it
            conn = self._conn
        if conn is not None:
            if idle:
                with contextlib.suppress(OSError):
                    conn.send(end_frame(code, why), wait=False)
            self.unregister()
            conn.close()
        return True

    # --- the reader's side: its own thread (read_until_end), or a poller (the rest) ---

    def attach(self, conn: Connection, reader: threading.Thread | None = None) -> bool:
        """The worker connected (its results read by ``reader``, or by a poller): start
        writing. False if it had connected already or the link is closed."""
        with self._cond:
            if self._conn is not None or self._closed:
                return False
            self._conn = conn
            self.transport = "unix" if conn.sock.family == socket.AF_UNIX else "tcp"
            self.reader = reader
            if self._backlog:  # issued before it connected
                self._wake_writer()
        return True

    def ping_if_due(self) -> None:
        """Ping the worker if :data:`PING_INTERVAL` s passed since the last ping."""
        now = time.monotonic()
        if now - self._last_ping >= PING_INTERVAL and self._conn is not None:
            self._last_ping = now
            self._put(frame(PING))

    def handle_frame(self, kind: int, body: bytes, on_results: OnResults) -> tuple[str, grpc.StatusCode] | None:
        """Handle one frame from the worker: results to ``on_results``; why the stream
        ends, if it does (an ``END``, a message that does not decode)."""
        if kind == END:
            return "its task stream ended: the worker said {1} ({0.name})".format(*parse_end(body)), grpc.StatusCode.OK
        if kind != MESSAGE:
            return None
        try:
            message = pb.WorkerMessage.FromString(body)
        except DecodeError as exc:
            why = f"worker {self.worker} sent a task-stream message that does not decode ({exc})"
            return why, grpc.StatusCode.INVALID_ARGUMENT
        self.received_messages += 1
        self.received_reports += len(message.reports)
        if message.reports or message.moved:
            on_results(self.worker, message.reports, message.moved)
        return None

    def read_until_end(self, conn: Connection, on_results: OnResults, on_end: OnEnd) -> None:
        """Results to ``on_results`` until the stream ends (this thread reads it); then,
        unless the driver closed it, ``on_end`` with why."""
        ended = None
        try:
            for kind, body in conn.frames(self.ping_if_due):
                if (ended := self.handle_frame(kind, body, on_results)) is not None:
                    break
        except Exception as exc:  # noqa: BLE001 - see ending()
            ended = ending(self.worker, exc)
        self.end_stream(conn, on_end, *(ended or CLOSED))

    def end_stream(self, conn: Connection, on_end: OnEnd, why: str, code: grpc.StatusCode) -> None:
        """The stream ended (read side): unless the driver closed it, tell the worker and
        ``on_end``."""
        if self._finish(why, code):
            on_end(self.worker, why)
        conn.close()


#: Why a stream ended that the worker closed without a word.
CLOSED = ("its task stream ended (connection closed)", grpc.StatusCode.OK)


def ending(worker: int, exc: Exception) -> tuple[str, grpc.StatusCode]:
    """Why a worker's stream ended, from what reading it (and handling its results) raised."""
    if isinstance(exc, LinkTimeout):
        return f"its task stream ended ({exc}: stopped, or its link was cut)", grpc.StatusCode.OK
    if isinstance(exc, OSError | ValueError):  # ValueError: the driver closed the socket meanwhile
        return f"its task stream ended (connection lost: {exc})", grpc.StatusCode.OK
    why = f"the driver could not take worker {worker}'s results: {type(exc).__name__}: {exc}"
    return why, grpc.StatusCode.INTERNAL


# --- the worker's end ---------------------------------------------------------------


def _connect(address: str, unix_name: str) -> socket.socket:
    """A socket connected to the driver: its Unix socket ``unix_name`` where this process
    shares its network namespace, else TCP to ``address``."""
    if unix_name:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT)
            sock.connect("\0" + unix_name)
            return sock
        except OSError:  # another host or network namespace
            sock.close()
    sock = socket.create_connection(split_address(address), timeout=HANDSHAKE_TIMEOUT)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    keep_alive(sock)
    return sock


def open_stream(address: str, token: bytes, tls: TLSMaterial | None, first: bytes,
                unix_name: str = "") -> Connection:  # fmt: skip
    """Connect to the driver's :class:`TaskStreamServer` (its Unix socket ``unix_name`` if
    reachable, else ``address``), prove the token and send ``first`` (a serialized
    WorkerMessage naming the worker)."""
    sock = _connect(address, unix_name)
    try:
        if tls is not None:
            sock = tls_context(tls).wrap_socket(sock, server_hostname=TLS_SERVER_NAME)
        prove_token_client(sock, token)
        sock.settimeout(None)
        conn = Connection(sock)
        conn.send(frame(MESSAGE, first))
        return conn
    except BaseException:
        sock.close()
        raise


def run_worker_stream(
    address: str,
    token: bytes,
    tls: TLSMaterial | None,
    worker_id: int,
    apply: Callable[[pb.DriverMessage], None],
    report_to: Callable[[Callable[[pb.WorkerMessage], None]], None],
    unix_name: str = "",
    vouch: Callable[[], bool] | None = None,
) -> tuple[grpc.StatusCode, str]:
    """Open this worker's task stream and serve it until it ends: each DriverMessage goes
    to ``apply`` (on this thread, in order); ``report_to`` gets the function that sends
    a WorkerMessage up (from any thread). ``vouch``: whether the driver lives though
    silent (:attr:`Connection.vouch`). Returns how the stream ended: ``OK`` when the
    driver closed it (the cluster closes), else the code and what happened."""
    try:
        conn = open_stream(address, token, tls, pb.WorkerMessage(worker_id=worker_id).SerializeToString(),
                           unix_name)
    except (OSError, ValueError) as exc:
        return grpc.StatusCode.UNAVAILABLE, f"the task stream could not be opened at {address}: {exc}"
    conn.vouch = vouch
    report_to(lambda message: conn.send(frame(MESSAGE, message.SerializeToString())))
    try:
        for kind, body in conn.frames():
            if kind == MESSAGE:
                apply(pb.DriverMessage.FromString(body))
            elif kind == PING:
                conn.send(frame(PONG))
            elif kind == END:
                code, why = parse_end(body)
                return code, f"the driver ended the task stream: {code.name}: {why}"
    except OSError as exc:  # a reset, a cut link (LinkTimeout)
        return grpc.StatusCode.UNAVAILABLE, f"the task stream ended: {exc}"
    except Exception as exc:  # noqa: BLE001 - a message this worker cannot apply
        with contextlib.suppress(OSError):
            conn.send(end_frame(grpc.StatusCode.INTERNAL, f"a message could not be applied: {exc}"))
        return grpc.StatusCode.INTERNAL, (
            f"a task-stream message could not be applied: {type(exc).__name__}: {exc}"
        )
    else:
        return grpc.StatusCode.UNAVAILABLE, "the task stream ended: the driver closed the connection"
    finally:
        conn.close()
