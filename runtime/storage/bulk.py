"""Partitions worker to worker over plain TCP, faster than gRPC streams.

Python gRPC streams move partitions slowly (chunking, copies, per-message costs), so a
partition read from a peer (a shuffle bucket, or one spilled to the peer with the most free
memory, R3S) then costs more than reading it from a local disk. Here a value is
pickled with its array buffers out of band (``shipping.dumps_out_of_band``) and
each buffer goes out with one ``sendall`` and lands with ``recv_into``: no
chunking, no copies beyond the kernel's.

Protocol (little-endian; one request at a time per connection):

- both sides prove they know the token before any pickle is read: the server sends
  a 32-byte nonce, the client answers ``HMAC-SHA256(token, nonce)`` and a nonce of its
  own, which the server answers likewise; a wrong answer closes the connection;
- request: ``u32`` length, then the partition key, a serialized ``PartitionKey`` message
  (:func:`~clamor.runtime.net.messages.key_bytes`, at most 64 KiB);
- reply: ``u8`` status (0 value, 1 not held here, 2 error), ``u32`` number of
  buffers, ``u64`` pickle length, ``u32`` key length, the request's key again,
  ``u64`` per buffer length; then the pickle and the buffers (or, for 1 and 2, a
  UTF-8 message as the "pickle"). The echoed key lets the client refuse a reply
  that answers another request rather than hand a task someone else's value.

A cluster with TLS keeps partitions on gRPC (over TLS); this channel is plaintext,
authenticated by the token like the page protocol.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import socket
import struct
import threading
from collections.abc import Callable, Iterable
from typing import Any

import grpc
from clamor.runtime.errors import ClamorError
from clamor.runtime.net import shipping
from clamor.runtime.net.acceptor import Acceptor, RateLimitedLog
from clamor.runtime.net.messages import key_bytes, key_from_bytes
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.transport import (
    prove_token_client,
    prove_token_server,
    recv_exact,
    split_address,
)
from clamor.runtime.stage import PartitionKey
from clamor.runtime.storage.partitions import join_chunks

logger = logging.getLogger("clamor.bulk")
_refusals = RateLimitedLog(logger)

MAX_KEY_BYTES = 64 << 10
MAX_BUFFERS = 4096
OK, NOT_HELD, ERROR = 0, 1, 2
_HEADER = struct.Struct("<BIQI")
_U32 = struct.Struct("<I")
TIMEOUT = 600.0


class BulkError(ClamorError):
    """A partition could not be fetched over the bulk channel."""


class BulkServer:
    """Serves ``lookup(key)`` (a partition's value; ``KeyError`` if not held) to peers."""

    def __init__(self, token: bytes, host: str, lookup: Callable[[PartitionKey], Any]) -> None:
        self._token = token
        self._lookup = lookup
        self._sock = socket.create_server((host, 0))
        self.port = self._sock.getsockname()[1]
        self.served = self.refused = 0
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._acceptor = Acceptor(self._sock, self._serve, "clamor-bulk", "clamor-bulk-conn", _refusals)

    def _serve(self, conn: socket.socket, authenticated: Callable[[], None]) -> None:
        with self._lock:
            if self._closed:
                conn.close()
                return
            self._conns[conn] = threading.current_thread()
        try:
            self._converse(conn, authenticated)
        finally:
            with self._lock:
                self._conns.pop(conn, None)
            conn.close()

    def _converse(self, conn: socket.socket, authenticated: Callable[[], None]) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not prove_token_server(conn, self._token):  # within the acceptor's deadline
                self.refused += 1
                _refusals.warning("bulk server: refused a client without the cluster token")
                return
            authenticated()
            conn.settimeout(TIMEOUT)
            while True:
                (n,) = _U32.unpack(recv_exact(conn, _U32.size))
                if n > MAX_KEY_BYTES:
                    return  # not our protocol: hang up
                self._answer(conn, bytes(recv_exact(conn, n)))
        except (ConnectionError, OSError, struct.error):
            return

    def _answer(self, conn: socket.socket, raw_key: bytes) -> None:
        try:
            key = key_from_bytes(raw_key)
            data, buffers = shipping.dumps_out_of_band(self._lookup(key))
        except KeyError:
            return _send(conn, raw_key, NOT_HELD, b"not held here", [])
        except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable key: the client gets it
            return _send(conn, raw_key, ERROR, f"{type(exc).__name__}: {exc}".encode(), [])
        _send(conn, raw_key, OK, data, [b.raw() for b in buffers])
        self.served += 1

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting, end every connection and join the server's threads. Idempotent.

        ``shutdown`` wakes the threads blocked in ``accept``/``recv`` (a bare ``close``
        of the fd would leave them blocked for ever on Linux)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns = dict(self._conns)
        for sock in (self._sock, *conns):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._acceptor.thread.join(timeout)
        for thread in conns.values():
            if thread is not threading.current_thread():
                thread.join(timeout)
        self._sock.close()


def _send(conn: socket.socket, raw_key: bytes, status: int, data: bytes, buffers: list[memoryview]) -> None:
    sizes = struct.pack(f"<{len(buffers)}Q", *(b.nbytes for b in buffers))
    conn.sendall(_HEADER.pack(status, len(buffers), len(data), len(raw_key)) + raw_key + sizes + data)
    for b in buffers:
        conn.sendall(b)


def fetch_partition(
    bulk: BulkClient | None,
    address: str,
    key: PartitionKey,
    stream: Callable[[], Iterable[pb.Chunk]],
    where: str,
) -> Any:
    """Partition ``key``: from the bulk server at ``address``, else (no bulk channel, or it
    failed, e.g. a stale location) from the gRPC chunk ``stream()`` of ``where`` (which
    says what went wrong, as a ``ClamorError``)."""
    if address and bulk is not None:
        try:
            return bulk.get(address, key)
        except BulkError as exc:
            logger.info("%s; trying gRPC", exc)
    try:
        return join_chunks(stream())
    except grpc.RpcError as exc:
        raise ClamorError(
            f"cannot fetch partition {key!r} from {where}: {exc.code().name}: {exc.details()}"
        ) from None


class BulkClient:
    """Fetches partitions from peers' :class:`BulkServer` s (one connection per peer, kept)."""

    def __init__(self, token: bytes) -> None:
        self._token = token
        self._conns: dict[str, tuple[socket.socket, threading.Lock]] = {}
        self._lock = threading.Lock()

    def get(self, address: str, key: PartitionKey) -> Any:
        """The value of ``key`` held at ``address`` (``BulkError`` if it cannot be had)."""
        try:
            sock, lock = self._connection(address)
        except (ConnectionError, OSError) as exc:
            raise BulkError(f"cannot fetch partition {key!r} from {address}: {exc}") from None
        with lock:
            try:
                status, data, buffers = self._exchange(sock, key)
            except (ConnectionError, OSError, struct.error) as exc:
                self._forget(address, sock)
                raise BulkError(f"cannot fetch partition {key!r} from {address}: {exc}") from None
            except BaseException:
                # Stopped mid-exchange (a task interrupted while it waits): the rest of the
                # reply is still coming, and the next request on this connection would read
                # it as its own, another partition's value. Only a new connection is safe.
                self._forget(address, sock)
                raise
        if status != OK:
            raise BulkError(f"partition {key!r} at {address}: {data.decode(errors='replace')}")
        return pickle.loads(data, buffers=buffers)

    @staticmethod
    def _exchange(sock: socket.socket, key: PartitionKey) -> tuple[int, bytearray, list[bytearray]]:
        """One request and its whole reply: status, pickle (or message) and buffers."""
        raw = key_bytes(key)
        sock.sendall(_U32.pack(len(raw)) + raw)
        status, nbuf, size, nkey = _HEADER.unpack(recv_exact(sock, _HEADER.size))
        if nbuf > MAX_BUFFERS or nkey != len(raw) or recv_exact(sock, nkey) != raw:
            raise ConnectionError("a reply to another request: not the bulk protocol, or out of step")
        sizes = struct.unpack(f"<{nbuf}Q", recv_exact(sock, 8 * nbuf)) if nbuf else ()
        data = recv_exact(sock, size)
        return status, data, [recv_exact(sock, n) for n in sizes]

    def _connection(self, address: str) -> tuple[socket.socket, threading.Lock]:
        with self._lock:
            entry = self._conns.get(address)
        if entry is not None:
            return entry
        host, port = split_address(address)
        sock = socket.create_connection((host, port), timeout=TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            prove_token_client(sock, self._token)
        except ConnectionError as exc:
            sock.close()
            raise ConnectionError(f"no handshake: {exc} (a different cluster token?)") from None
        except BaseException:
            sock.close()
            raise
        entry = (sock, threading.Lock())
        with self._lock:
            self._conns[address] = entry
        return entry

    def _forget(self, address: str, sock: socket.socket | None = None) -> None:
        """Close the connection to ``address`` (only if it is ``sock``, when given: another
        thread may have opened a new one meanwhile)."""
        with self._lock:
            entry = self._conns.get(address)
            if entry is None or (sock is not None and entry[0] is not sock):
                entry = None
            else:
                del self._conns[address]
        if entry is not None:
            entry[0].close()
        elif sock is not None:
            sock.close()

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for sock, _ in conns:
            sock.close()
