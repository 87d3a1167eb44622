"""Partitions kept in a process (worker or driver) and how they travel.

A :class:`PartitionStore` holds the partitions a process keeps: task outputs
and shuffle buckets on workers, ``parallelize`` data in the driver. They travel
between processes as the pickled value (:func:`clamor.runtime.net.shipping.dumps`)
cut into :data:`CHUNK_BYTES` chunks (``GetPartition`` / ``FetchPartition``
streams), so no gRPC message grows with the partition.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
from clamor.runtime.errors import ClamorError
from clamor.runtime.net import shipping
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.paging.pager import worker_pager
from clamor.runtime.stage import PartitionKey

#: Size of one chunk of a partition on the wire.
CHUNK_BYTES = 1 << 20


def approx_nbytes(value: Any) -> int:
    """A cheap size estimate of a partition (exact for arrays and bytes)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    size = sys.getsizeof(value)
    if isinstance(value, list | tuple) and value:
        size += len(value) * sys.getsizeof(value[0])
    return int(size)


def detach(value: Any) -> Any:
    """``value``, with an array viewing this worker's arena copied out.

    A kept partition is a snapshot: a view of the arena would change when the
    driver later updates those pages and the worker re-fetches them.
    """
    pager = worker_pager()
    if pager is not None and isinstance(value, np.ndarray) and pager.contains(value):
        return np.array(value, copy=True)
    return value


class PartitionStore:
    """Thread-safe ``key -> value`` map of the partitions this process keeps."""

    def __init__(self) -> None:
        self._values: dict[PartitionKey, Any] = {}
        self._sizes: dict[PartitionKey, int] = {}
        self._bytes = 0  # the sum of ``_sizes``
        self._lock = threading.Lock()

    def put(self, key: PartitionKey, value: Any, spillable: bool = True) -> int:
        """Keep ``value`` under ``key``; return its (estimated) size in bytes.

        ``spillable``: whether a store with a budget may move it out of memory
        (:class:`~clamor.runtime.storage.spill.SpillingStore`); this one keeps everything."""
        value = detach(value)
        size = approx_nbytes(value)
        with self._lock:
            self._bytes += size - self._sizes.get(key, 0)
            self._values[key] = value
            self._sizes[key] = size
        return size

    def get(self, key: PartitionKey) -> Any:
        with self._lock:
            try:
                return self._values[key]
            except KeyError:
                raise ClamorError(f"partition {key!r} is not held here") from None

    def lookup(self, key: PartitionKey) -> Any:
        """The value of ``key``; ``KeyError`` if it is not held here (a bulk server's lookup)."""
        if key not in self:
            raise KeyError(key)
        return self.get(key)

    def pop(self, key: PartitionKey) -> Any:
        with self._lock:
            return self._take(key)[0]

    def drop(self, keys: Iterable[PartitionKey]) -> None:
        with self._lock:
            for key in keys:
                self._take(key)

    def _take(self, key: PartitionKey) -> tuple[Any, int]:
        """Remove ``key`` from memory: its value and size (``None, 0`` if absent). Lock held."""
        size = self._sizes.pop(key, 0)
        self._bytes -= size
        return self._values.pop(key, None), size

    def __contains__(self, key: PartitionKey) -> bool:
        with self._lock:
            return key in self._values

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def stats(self) -> dict[str, Any]:
        """How many partitions are kept here and their bytes."""
        with self._lock:
            return {"partitions_in_memory": len(self._values), "partition_bytes": self._bytes}

    def drain_moves(self) -> list[pb.PartitionMove]:
        """Partitions moved out since the last call: none here (no budget)."""
        return []

    def chunks(self, key: PartitionKey) -> Iterator[pb.Chunk]:
        """The pickled value of ``key`` as a stream of chunks (``ClamorError`` if absent)."""
        return chunk(shipping.dumps(self.get(key)))


def chunk(data: bytes) -> Iterator[pb.Chunk]:
    """``data`` as :data:`CHUNK_BYTES` chunks; the first one carries the total size."""
    view = memoryview(data)
    yield pb.Chunk(data=bytes(view[:CHUNK_BYTES]), total=len(data))
    for start in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
        yield pb.Chunk(data=bytes(view[start : start + CHUNK_BYTES]))


def join_chunks(stream: Iterable[pb.Chunk]) -> Any:
    """Reassemble and unpickle a value streamed by :func:`chunk`."""
    parts: list[bytes] = []
    total = None
    for piece in stream:
        if total is None:
            total = piece.total
        parts.append(piece.data)
    data = b"".join(parts)
    if total is None or len(data) != total:
        raise ClamorError(f"partition stream ended early: {len(data)} of {total} bytes")
    return shipping.loads(data)
