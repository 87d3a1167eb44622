"""The ``Observer`` gRPC service: read-only views of a cluster for other processes.

The jupyter-server extension (extension/) runs in the notebook server, not in
the kernel that owns the cluster; it asks the kernel's scheduler server for
snapshots through this service. Calls need the cluster token like every other
call (and TLS when the cluster uses it); the kernel hands the token only to
files private to its user (runtime/observe/cluster_registry.py). Replies are typed
messages (runtime/observe/observed_messages.py): the server unpickles nothing a
kernel sends it.
"""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import grpc
from clamor.runtime.credentials import Credentials
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.transport import connect
from clamor.runtime.observe.observed_messages import (
    snapshot_message,
    snapshot_of,
    stats_message,
    stats_of,
)
from clamor.runtime.observe.snapshots import ClusterSnapshot


class Observed(Protocol):
    """What the service reads of a cluster (the cluster imports this module, not the reverse)."""

    @property
    def closed(self) -> bool: ...

    def snapshot(self) -> ClusterSnapshot: ...

    def stats(self) -> dict: ...


#: What :func:`query` can ask for.
KINDS = ("snapshot", "stats")


class ObserverServicer(pb_grpc.ObserverServicer):
    """Answers ``Query``; holds its cluster weakly."""

    def __init__(self, cluster: Observed) -> None:
        self._cluster = weakref.ref(cluster)

    def Query(self, request, context):
        cluster = self._cluster()
        if cluster is None or cluster.closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the cluster is closed")
        if request.kind == "snapshot":
            return pb.QueryReply(snapshot=snapshot_message(cluster.snapshot()))
        if request.kind == "stats":
            return pb.QueryReply(stats=stats_message(cluster.stats()))
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"unknown query kind {request.kind!r} (expected one of {', '.join(KINDS)})",
        )


class ObserverClient:
    """One channel to a cluster's ``Observer`` service, reused across queries (a live
    dashboard polls several times a second; a new channel each time would redo the TCP
    and, with TLS, the handshake on the kernel's side). Thread-safe, like the channel."""

    def __init__(self, address: str, credentials: Credentials) -> None:
        self._channel = connect(address, credentials.token, tls=credentials.tls)
        self._stub = pb_grpc.ObserverStub(self._channel)

    def query(self, kind: str, timeout: float = 10.0) -> Any:
        """Ask for a ``kind`` (see :data:`KINDS`): a :class:`ClusterSnapshot` or the
        ``Cluster.stats()`` dict, read from typed messages (nothing is unpickled);
        raises ``grpc.RpcError``, or ``ValueError`` for a reply of another kind."""
        reply = self._stub.Query(pb.QueryRequest(kind=kind), timeout=timeout)
        body = reply.WhichOneof("body")
        if body != kind:
            raise ValueError(f"asked for a {kind!r}, the cluster answered {body!r}")
        return snapshot_of(reply.snapshot) if body == "snapshot" else stats_of(reply.stats)

    def close(self) -> None:
        self._channel.close()


def query(address: str, credentials: Credentials, kind: str, timeout: float = 10.0) -> Any:
    """One query on a fresh channel (see :meth:`ObserverClient.query`)."""
    client = ObserverClient(address, credentials)
    try:
        return client.query(kind, timeout)
    finally:
        client.close()
