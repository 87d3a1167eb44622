"""The executor's ways to its workers: per worker, its task stream's link (launches,
cancels, drops, in order, never blocking the caller) and its stub for the unary calls
(``Invalidate``, partitions, interrupts), with the addresses its peers fetch from.

One owner for them, so that adding, losing, shutting down and closing a worker's links
happen in one place, and calls to many workers at once go through
:func:`~clamor.runtime.net.calls.call_each`.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc
import numpy as np
from clamor.runtime.errors import ClamorError
from clamor.runtime.net.calls import call_each
from clamor.runtime.net.messages import encode_key, invalidation
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.task_stream import DriverLink, invalidation_frame
from clamor.runtime.stage import PartitionKey
from clamor.runtime.storage.bulk import BulkClient, fetch_partition

#: What a link's counters are called in :meth:`Endpoints.stream_counters`.
STREAM_COUNTERS = ("sent_messages", "sent_attempts", "received_messages", "received_reports", "transport")


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A worker as the driver reaches it."""

    stub: pb_grpc.WorkerStub
    address: str
    bulk_address: str
    link: DriverLink


class Endpoints:
    """The workers the executor was told about, by id (lost ones kept, their links closed).
    ``unreachable(worker, why)``: a call to a worker failed."""

    def __init__(self, unreachable: Callable[[int, str], None], bulk: BulkClient | None) -> None:
        self._unreachable = unreachable
        self._bulk = bulk
        self._by_id: dict[int, Endpoint] = {}

    def add(self, worker: int, stub: pb_grpc.WorkerStub, address: str, bulk_address: str = "") -> None:
        self._by_id[worker] = Endpoint(stub, address, bulk_address, DriverLink(worker))

    def get(self, worker: int) -> Endpoint | None:
        return self._by_id.get(worker)

    def link(self, worker: int) -> DriverLink | None:
        """Its link (closed ones included), or ``None`` for a worker never added."""
        endpoint = self._by_id.get(worker)
        return endpoint.link if endpoint is not None else None

    def open_link(self, worker: int) -> DriverLink | None:
        """Its link for its stream to attach (``None``: not added, or lost)."""
        link = self.link(worker)
        return None if link is None or link.closed else link

    def lost(self, worker: int, why: str) -> None:
        """End a lost worker's task stream, telling it why."""
        if (link := self.link(worker)) is not None:
            link.close(why, grpc.StatusCode.ABORTED)

    def linked(self) -> int:
        """How many workers have an open task stream (cheap: no process is looked at)."""
        return sum(not e.link.closed for e in list(self._by_id.values()))

    def stream_counters(self) -> dict[int, dict[str, int | str]]:
        """Per worker, its task stream's ``sent_messages`` (with ``sent_attempts`` launched in
        them), ``received_messages`` (with ``received_reports``) and ``transport``
        (``"unix"``: same host, ``"tcp"``)."""
        return {w: {n: getattr(e.link, n) for n in STREAM_COUNTERS} for w, e in list(self._by_id.items())}

    def shut_down(self, workers: Iterable[int]) -> list[int]:
        """Tell each worker on its task stream to exit (the cluster is closing): one write
        each, no reply awaited. The workers whose stream is not connected (told nothing)."""
        return [w for w in workers if (link := self.link(w)) is None or not link.shut_down()]

    def invalidate(self, epoch: int, pages: Sequence[int] | np.ndarray, workers: list[int],
                   barrier: bool = False) -> None:  # fmt: skip
        """Invalidate ``pages`` on every worker of ``workers``.

        On a worker's task stream (its link), ahead of the attempts sent after it: nothing
        is waited for, and the message is built once for all of them. ``barrier``, and for a
        worker without a link: an ``Invalidate`` call each, returning once every worker ran
        it between two attempts (so no attempt sent before still runs); one that fails is
        reported unreachable."""
        request = invalidation(epoch, pages)
        if not barrier:
            links = {w: link for w in workers if (link := self.open_link(w)) is not None}
            message = invalidation_frame(request) if links else b""
            for link in links.values():
                link.invalidate(message)
            workers = [w for w in workers if w not in links]
        workers = [w for w in workers if w in self._by_id]
        replies = call_each(lambda w: self._by_id[w].stub.Invalidate(request, timeout=60), workers)
        for worker, reply in zip(workers, replies):
            if isinstance(reply, grpc.RpcError):
                self._unreachable(worker, f"invalidation failed: {reply.code().name}: {reply.details()}")

    def fetch(self, key: PartitionKey, holder: int) -> Any:
        """Partition ``key`` from worker ``holder``: from its bulk server, else in chunks
        over gRPC."""
        endpoint = self._by_id.get(holder)
        if endpoint is None:
            raise ClamorError(f"partition {key!r}: no worker {holder}")
        request = pb.PartitionRequest(key=encode_key(key))
        stream = lambda: endpoint.stub.GetPartition(request, timeout=600)
        return fetch_partition(self._bulk, endpoint.bulk_address, key, stream, f"worker {holder}")

    def close(self) -> None:
        """End every task stream (its reader and writer threads return) and the bulk client."""
        for endpoint in list(self._by_id.values()):
            endpoint.link.close()
        if self._bulk is not None:
            self._bulk.close()

    def threads(self) -> list[threading.Thread]:
        """The task streams' reader and writer threads, to join after :meth:`close`."""
        links = [e.link for e in list(self._by_id.values())]
        return [t for link in links for t in (link.reader, link.writer) if t is not None]
