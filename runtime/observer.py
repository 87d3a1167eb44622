"""The ``Observer`` gRPC service: read-only views of a cluster for other processes.

The jupyter-server extension (extension/) runs in the notebook server, not in
the kernel that owns the cluster; it asks the kernel's scheduler server for
snapshots through this service. Calls need the cluster token like every other
call (and TLS when the cluster uses it); the kernel hands the token only to
files private to its user (kernel/cluster_registry.py).
"""

from __future__ import annotations

import pickle
import weakref
from typing import TYPE_CHECKING, Any

import grpc
from clamor.runtime.credentials import Credentials
from clamor.runtime.proto import clamor_pb2 as pb
from clamor.runtime.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.transport import connect

if TYPE_CHECKING:
    from clamor.runtime.cluster import Cluster

#: What :func:`query` can ask for.
KINDS = ("snapshot", "stats")


class ObserverServicer(pb_grpc.ObserverServicer):
    """Answers ``Query``; holds its cluster weakly."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = weakref.ref(cluster)

    def Query(self, request, context):
        cluster = self._cluster()
        if cluster is None or cluster.closed:
            context.abort(grpc.StatusCode.UNAVAILABLE, "the cluster is closed")
        if request.kind == "snapshot":
            body: Any = cluster.snapshot()
        elif request.kind == "stats":
            body = cluster.stats()
        else:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"unknown query kind {request.kind!r} (expected one of {', '.join(KINDS)})",
            )
        return pb.QueryReply(body=pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL))


def query(address: str, credentials: Credentials, kind: str, timeout: float = 10.0) -> Any:
    """Ask the cluster at ``address`` for a ``kind`` (see :data:`KINDS`); raises ``grpc.RpcError``.

    The reply is unpickled: only query clusters whose token you hold (your own kernels).
    """
    with connect(address, credentials.token, tls=credentials.tls) as channel:
        reply = pb_grpc.ObserverStub(channel).Query(pb.QueryRequest(kind=kind), timeout=timeout)
    return pickle.loads(reply.body)
