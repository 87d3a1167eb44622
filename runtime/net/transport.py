"""gRPC plumbing of the control plane: servers, channels, tokens, wire helpers; and the
token handshake of its plain-TCP channels (the task streams, the bulk partition server).

Every call carries a one-time proof of the cluster token (runtime/net/call_proofs.py:
never the token) and the protocol version as metadata; a server interceptor checks
both on every service (``UNAUTHENTICATED`` for a missing, wrong or replayed proof,
``FAILED_PRECONDITION`` for another protocol version).
Messages are bounded by :data:`MAX_MESSAGE_BYTES` in both directions. With
``tls`` (a :class:`~clamor.runtime.credentials.TLSMaterial`), servers and
channels use mutual TLS with the cluster's own CA, and channels check the
server's certificate against :data:`TLS_SERVER_NAME`.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
import resource
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent import futures
from typing import Any

import grpc
from clamor.runtime.credentials import TLS_SERVER_NAME, TLSMaterial
from clamor.runtime.net.acceptor import PREAUTH_DEADLINE, RateLimitedLog
from clamor.runtime.net.call_proofs import PROOF_METADATA_KEY, ProofChecker, prove

logger = logging.getLogger("clamor.transport")
_refusals = RateLimitedLog(logger)

#: Version of the control-plane protocol (runtime/net/proto/clamor.proto, package clamor.v1).
#: 2: attempts and results travel on the Scheduler.Session task stream (Worker.Launch,
#: Worker.Cancel and Scheduler.TaskFinished are gone).
#: 3: the task stream is a TCP connection of its own (Scheduler.Session is gone), and a
#: task's read set travels packed (TaskReport.read_pages / read_versions).
#: 4: an Assignment may run several tasks (``count``: a fused attempt of tiny tasks).
#: 5: a task's read set travels as runs of pages at one version (TaskReport.read_runs).
#: 6: calls carry a one-time proof of the token, not the token (x-clamor-proof);
#: Worker.Interrupt stops a cancelled stage's running task.
#: 7: the control plane is typed: partition keys (PartitionKey), a worker's configuration
#: (WorkerConfig), info (WorkerInfo) and stats (WorkerStats), and the Observer's snapshots
#: and stats (QueryReply) travel as messages, not pickles.
#: 8: page invalidations travel on the task stream too (DriverMessage.invalidate), their
#: pages packed as little-endian uint64s (InvalidateRequest.pages).
#: 9: a resident read set travels without versions (TaskReport.resident): the driver
#: reads them from its page table. The bulk channel's replies echo the request's key.
#: 10: the page protocol has ROWS (clamor.gather): a driver of 9 would refuse it.
PROTOCOL_VERSION = "10"
PROTOCOL_METADATA_KEY = "x-clamor-protocol"

#: Largest gRPC message sent or received, either way.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024

_CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Keepalive: a call to a host whose link was cut (no RST ever comes) fails with
    # UNAVAILABLE ~10 s later instead of at its deadline (up to 600 s): ping every 5 s
    # while calls are active, give up after 5 s; servers accept pings that often.
    # (grpcio 1.85 waits for the ack ping_timeout_ms, 60 s by default: see _CONTROL_OPTIONS.)
    ("grpc.keepalive_time_ms", 5000),
    ("grpc.keepalive_timeout_ms", 5000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 4000),
    ("grpc.http2.max_ping_strikes", 0),
]

#: The driver's control plane (its Scheduler server, the workers' channels to it) also
#: bounds the wait for a ping's ack: grpcio 1.85 ends a connection whose peer stopped
#: answering only after ping_timeout_ms (60 s by default), whatever keepalive_timeout_ms
#: says; with it, a worker's task stream ends ~10 s after a link is cut, on both ends.
#: Not between workers: a fetch from a peer whose link was cut must keep failing later
#: than the driver notices the loss, so that the scheduler sees the input missing and
#: recomputes it rather than failing the stage.
_CONTROL_OPTIONS = [("grpc.http2.ping_timeout_ms", 5000)]


# --- addresses and tokens -----------------------------------------------------


def format_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def split_address(address: str) -> tuple[str, int]:
    """Inverse of :func:`format_address`."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


# --- the token handshake of the plain-TCP channels ------------------------------------

#: Bytes of a handshake nonce, and of its answer (HMAC-SHA256).
NONCE = 32
MAC = hashlib.sha256().digest_size


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Exactly ``n`` bytes from ``sock`` (``ConnectionError`` if it closes first)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("the peer closed the connection")
        got += k
    return buf


def _mac(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, nonce, hashlib.sha256).digest()


def prove_token_server(sock: socket.socket, token: bytes) -> bool:
    """The server's half of the handshake: both sides prove they know the cluster token
    before anything else is read (the server sends a nonce, the client answers its HMAC
    and a nonce of its own, which the server answers likewise). False: a wrong answer."""
    nonce = os.urandom(NONCE)
    sock.sendall(nonce)
    answer = bytes(recv_exact(sock, MAC + NONCE))
    if not hmac.compare_digest(answer[:MAC], _mac(token, nonce)):
        return False
    sock.sendall(_mac(token, answer[MAC:]))
    return True


def prove_token_client(sock: socket.socket, token: bytes) -> None:
    """The client's half of :func:`prove_token_server`; ``ConnectionError`` if the server
    does not know the token."""
    theirs, mine = bytes(recv_exact(sock, NONCE)), os.urandom(NONCE)
    sock.sendall(_mac(token, theirs) + mine)
    if not hmac.compare_digest(bytes(recv_exact(sock, MAC)), _mac(token, mine)):
        raise ConnectionError("the server does not know the cluster token")


# --- servers --------------------------------------------------------------------


class _AuthInterceptor(grpc.ServerInterceptor):
    """Refuses calls without a good proof of the cluster token (runtime/net/call_proofs.py)
    or with another protocol version."""

    def __init__(self, token: str) -> None:
        self._proofs = ProofChecker(token.encode())

    def intercept_service(self, continuation, details):
        metadata = dict(details.invocation_metadata or ())
        version = metadata.get(PROTOCOL_METADATA_KEY)
        if (why := self._proofs.check(details.method, metadata.get(PROOF_METADATA_KEY))) is not None:
            _refusals.warning("refused a gRPC call of %s: %s", details.method, why)
            refusal = (grpc.StatusCode.UNAUTHENTICATED, why)
        elif version != PROTOCOL_VERSION:
            theirs = "no protocol version" if version is None else f"protocol version {version}"
            refusal = (
                grpc.StatusCode.FAILED_PRECONDITION,
                (
                    f"protocol version mismatch: the client sent {theirs}, "
                    f"this server speaks protocol version {PROTOCOL_VERSION}"
                ),
            )
        else:
            return continuation(details)
        return _refusing_handler(continuation(details), details.method, *refusal)


def _refusing_handler(handler, method: str, code: grpc.StatusCode, message: str):
    if handler is None:
        return None

    def refuse(request_or_iterator, context):
        logger.warning("refused %s from %s: %s", method, context.peer(), message)
        context.abort(code, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


#: Name prefix of the threads that run a server's handlers.
_HANDLER_THREADS = "clamor-grpc"


class Server:
    """A started gRPC server and the thread pool its handlers run on.

    grpc's own ``stop`` leaves the pool's threads behind (it does not own the pool);
    :meth:`stop` ends both, so a closed cluster keeps no handler thread.
    """

    def __init__(self, server: grpc.Server, pool: futures.ThreadPoolExecutor) -> None:
        self._server = server
        self._pool = pool

    def stop(self, grace: float | None = None, timeout: float = 5.0, *, join: bool = True) -> None:
        """Refuse new calls, give calls in flight ``grace`` seconds (None: cancel them),
        then (``join``) wait for the handlers still running to return. From one of those
        handlers (a cluster collected on a handler thread) it does not wait: a thread
        cannot join itself; the pool's threads end once their handlers return."""
        self._server.stop(grace).wait(timeout)
        in_handler = threading.current_thread().name.startswith(_HANDLER_THREADS)
        self._pool.shutdown(wait=join and not in_handler, cancel_futures=True)


def _flood_options() -> list[tuple[str, int]]:
    """A gRPC server's bounds against a flood of idle connections (the acceptors of the
    plain-TCP ports have their own: runtime/net/acceptor.py): a connection that has not
    finished its HTTP/2 handshake within :data:`PREAUTH_DEADLINE` s is dropped, and at
    most half of this process's file descriptors (at least 64) hold connections."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = 1 << 20 if soft == resource.RLIM_INFINITY else max(64, soft // 2)
    return [("grpc.server_handshake_timeout_ms", int(PREAUTH_DEADLINE * 1000)),
            ("grpc.max_allowed_incoming_connections", cap)]  # fmt: skip


def create_server(
    token: str,
    services: Iterable[tuple[Callable[[Any, grpc.Server], None], Any]],
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_workers: int = 8,
    tls: TLSMaterial | None = None,
    control: bool = False,
) -> tuple[Server, str]:
    """Start a gRPC server on ``host:port`` (0: any free port) that checks the token.

    ``services`` are ``(add_XServicer_to_server, servicer)`` pairs. With ``tls``,
    the server accepts only TLS clients presenting a certificate of the cluster's
    CA. ``control``: the driver's (:data:`_CONTROL_OPTIONS`). Returns the started
    server and its ``host:port`` address.
    """
    pool = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix=_HANDLER_THREADS)
    options = _CHANNEL_OPTIONS + (_CONTROL_OPTIONS if control else []) + _flood_options()
    server = grpc.server(pool, interceptors=[_AuthInterceptor(token)], options=options)
    for add, servicer in services:
        add(servicer, server)
    where = format_address(host, port)
    if tls is None:
        bound = server.add_insecure_port(where)
    else:
        credentials = grpc.ssl_server_credentials(
            [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True
        )
        bound = server.add_secure_port(where, credentials)
    if not bound:
        pool.shutdown(wait=False)
        raise OSError(f"cannot listen on {format_address(host, port)}")
    server.start()
    return Server(server, pool), format_address(host, bound)


# --- channels -------------------------------------------------------------------

_Details = collections.namedtuple(
    "_Details", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
)


class _CallDetails(_Details, grpc.ClientCallDetails):
    pass


class _MetadataInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """Adds a proof of the token (never the token) and the protocol version to every call."""

    def __init__(self, token: bytes, protocol: str) -> None:
        self._token = token
        self._protocol = protocol

    def _with_metadata(self, d):
        method = d.method if isinstance(d.method, str) else d.method.decode()
        mine = [(PROOF_METADATA_KEY, prove(self._token, method)), (PROTOCOL_METADATA_KEY, self._protocol)]
        return _CallDetails(
            d.method,
            d.timeout,
            list(d.metadata or ()) + mine,
            d.credentials,
            getattr(d, "wait_for_ready", None),
            getattr(d, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_metadata(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_metadata(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_metadata(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_metadata(details), request_iterator)


def connect(
    address: str,
    token: str,
    *,
    tls: TLSMaterial | None = None,
    protocol: str = PROTOCOL_VERSION,
    control: bool = False,
) -> grpc.Channel:
    """A channel to ``address`` whose every call proves ``token`` and carries ``protocol``.

    With ``tls``: a mutual-TLS channel that trusts only the cluster's CA. ``control``:
    a worker's channel to the driver (:data:`_CONTROL_OPTIONS`).
    """
    options = _CHANNEL_OPTIONS + (_CONTROL_OPTIONS if control else [])
    if tls is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
        )
        options = options + [("grpc.ssl_target_name_override", TLS_SERVER_NAME)]
        channel = grpc.secure_channel(address, credentials, options=options)
    return grpc.intercept_channel(channel, _MetadataInterceptor(token.encode(), protocol))
