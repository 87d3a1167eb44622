"""A pure-Python client of the page protocol (runtime/paging/native/protocol.h).

The workers' fault handler speaks the protocol natively; this client exists
for tests, benchmarks and debugging: it authenticates like a worker, asks for
pages and reports the raw replies, so a test can send exactly the malformed
or unauthorised request it wants. With ``tls`` (the cluster's
:class:`~clamor.runtime.credentials.TLSMaterial`) it speaks mutual TLS first,
like the workers do on a TLS cluster.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
import struct
import tempfile
from dataclasses import dataclass
from typing import Self

from clamor.runtime.credentials import TLS_SERVER_NAME, TLSMaterial

MAGIC = 0x504D4C43
VERSION = 1
HEADER = struct.Struct("<IHHQIIIIQ")  # magic, version, type, page, epoch, aux, flags, aux2, length
HELLO, AUTH, AUTH_OK, GET, PAGE, REDIRECT, ERROR, HAVE, ROWS = range(1, 10)
ERR_BAD_REQUEST, ERR_PAGE_RANGE, ERR_NO_VERSION, ERR_NOT_HELD, ERR_AUTH = range(1, 6)
NO_REDIRECT = 1
ANY_CLIENT = 0xFFFFFFFF
NONCE = 32
MAX_BATCH = 1024  # pages in one GET (CL_MAX_BATCH)
MAX_ROWS, MAX_ROWS_BYTES = 1 << 20, 64 << 20  # rows in one ROWS request, their bytes (CL_MAX_ROWS*)


class PageProtocolError(ConnectionError):
    """The server closed the connection or broke the protocol."""


@dataclass
class Reply:
    """One reply header, with the page bytes for PAGE replies."""

    type: int
    page: int
    epoch: int
    aux: int
    flags: int
    aux2: int
    data: bytes = b""

    @property
    def error(self) -> int | None:
        return self.aux if self.type == ERROR else None


def pack(type_: int, page: int = 0, epoch: int = 0, aux: int = 0, flags: int = 0, aux2: int = 0,
         length: int = 0, *, magic: int = MAGIC, version: int = VERSION) -> bytes:
    """A header as the wire carries it (fields can be set to bad values on purpose)."""
    return HEADER.pack(magic, version, type_, page, epoch, aux, flags, aux2, length)


def tls_context(tls: TLSMaterial, server: bool = False) -> ssl.SSLContext:
    """A client (``server``: server) context presenting the cluster certificate and trusting
    only the cluster CA; a server requires its clients' certificates and sends no session
    tickets (no resumption is used, and a task stream's connection is read and written by
    two threads at once: the fewer records beyond the data, the better)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    if server:
        context.verify_mode = ssl.CERT_REQUIRED
        context.num_tickets = 0
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=tls.ca.decode())
    # ssl loads a certificate chain only from files: a private directory, gone at once.
    with tempfile.TemporaryDirectory(prefix="clamor-tls-") as tmp:
        cert, key = f"{tmp}/cert.pem", f"{tmp}/key.pem"
        for path, pem in ((cert, tls.cert), (key, tls.key)):
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(pem)
        context.load_cert_chain(cert, key)
    return context


def connect(host: str, port: int, *, tls: TLSMaterial | ssl.SSLContext | None = None,
            timeout: float = 10.0) -> socket.socket:
    """A TCP (or, with ``tls``, TLS) connection to a page server, before the token handshake."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is None:
        return sock
    context = tls if isinstance(tls, ssl.SSLContext) else tls_context(tls)
    try:
        return context.wrap_socket(sock, server_hostname=TLS_SERVER_NAME)
    except BaseException:
        sock.close()
        raise


class PageClient:
    """One authenticated connection to a page server (``tls``: material or a ready context)."""

    def __init__(self, host: str, port: int, token: bytes, client_id: int = ANY_CLIENT, timeout: float = 10.0,
                 *, tls: TLSMaterial | ssl.SSLContext | None = None):
        self.sock = connect(host, port, tls=tls, timeout=timeout)
        try:
            self._authenticate(token, client_id)
        except BaseException:
            self.sock.close()
            raise

    def _authenticate(self, token: bytes, client_id: int) -> None:
        hello = self._recv_header()
        if hello.type != HELLO or len(hello.data) != NONCE:
            raise PageProtocolError(f"expected HELLO, got type {hello.type}")
        server_nonce = hello.data
        client_nonce = os.urandom(NONCE)
        mac = hmac.new(token, b"C" + server_nonce + client_nonce, hashlib.sha256).digest()
        self.sock.sendall(pack(AUTH, aux=client_id, length=2 * NONCE) + client_nonce + mac)
        reply = self._recv_header()
        if reply.type != AUTH_OK:
            raise PermissionError(f"page server refused the token (reply type {reply.type}, error {reply.aux})")
        proof = reply.data
        expected = hmac.new(token, b"S" + client_nonce + server_nonce, hashlib.sha256).digest()
        if not hmac.compare_digest(proof, expected):
            raise PermissionError("page server failed to prove it knows the token")

    def _recv_exact(self, n: int) -> bytes:
        chunks, got = [], 0
        while got < n:
            try:
                chunk = self.sock.recv(n - got)
            except ssl.SSLEOFError:  # closed without a TLS close_notify
                chunk = b""
            if not chunk:
                raise PageProtocolError("connection closed by the page server")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def _recv_header(self) -> Reply:
        magic, version, type_, page, epoch, aux, flags, aux2, length = HEADER.unpack(self._recv_exact(HEADER.size))
        if magic != MAGIC or version != VERSION:
            raise PageProtocolError(f"bad reply header (magic {magic:#x}, version {version})")
        reply = Reply(type_, page, epoch, aux, flags, aux2)
        reply.data = self._recv_exact(length) if length else b""
        return reply

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> Reply:
        return self._recv_header()

    def get(self, page: int, epoch: int, count: int = 1, flags: int = NO_REDIRECT) -> list[Reply]:
        """GET pages [page, page + count) as of `epoch`; one reply per page, or one error."""
        self.sock.sendall(pack(GET, page, epoch, count, flags))
        replies = []
        for _ in range(count):
            reply = self.recv()
            replies.append(reply)
            if reply.type == ERROR:
                break
        return replies

    def rows(self, offsets: list[int], row_bytes: int, epoch: int) -> Reply:
        """ROWS: the ``row_bytes`` at each arena offset as of `epoch`, in one reply (its
        ``data``), or an error."""
        payload = struct.pack(f"<{len(offsets)}Q", *offsets)
        self.sock.sendall(pack(ROWS, 0, epoch, len(offsets), aux2=row_bytes, length=len(payload)) + payload)
        return self.recv()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
