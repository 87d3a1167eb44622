"""A worker's partition store with a memory budget (R3S).

Partitions beyond the worker's partition budget leave its memory, the least
recently used first, as ``Cluster(spill=...)`` says:

- ``"peer"``: to the peer with the most free memory (the driver names the
  candidates, the peer takes it only if it fits its own budget), else to disk:
  R3S's pool of cluster memory, where a peer's memory is cheaper than a disk;
- ``"disk"``: to a file in the worker's spill directory.

(There is no "drop and recompute" policy: a dropped persisted partition would be
recomputed from lineage by a recovery stage whose outputs push the stage's other
inputs out of memory in turn; bench/workloads/spill.py measures recomputing instead by not
persisting what does not fit.)

Tasks never notice: ``get`` reads a spilled partition back from its file or
from the peer, and ``chunks`` serves it to whoever asks. Every move is queued
for the driver (:meth:`SpillingStore.drain_moves`, sent with the next
results on the task stream), so its registry, and with it task placement and lineage,
knows where each partition lives. A partition spilled to a peer belongs to
that peer from then on; the stub left here forwards reads and drops that
arrive before the driver knows.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from clamor.runtime.errors import ClamorError
from clamor.runtime.net import shipping
from clamor.runtime.net.messages import encode_key
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.stage import PartitionKey
from clamor.runtime.storage.partitions import (
    PartitionStore,
    chunk,
    join_chunks,
)

logger = logging.getLogger("clamor.spill")

#: ``(worker id, gRPC address)`` of the peers with room, most free memory first.
PeerFinder = Callable[[int], list[tuple[int, str]]]


#: The driver's spill folder in the system temp directory: ``clamor-spill-<driver pid>-<id>``.
SPILL_PREFIX = "clamor-spill-"


def spill_folder(driver_pid: int, tag: str) -> str:
    """Where a cluster's workers on this host spill (made private by the first to spill)."""
    return os.path.join(tempfile.gettempdir(), f"{SPILL_PREFIX}{driver_pid}-{tag}")


def sweep_stale_spill_folders(tmp: str | None = None) -> list[str]:
    """Remove the spill folders of drivers that are gone (SIGKILLed: nobody closed their
    clusters); the ones it removed. A folder whose pid lives on is left alone, even if a
    new process took the pid: a stale folder may stay, a live one is never removed."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    for name in os.listdir(tmp):
        pid = name[len(SPILL_PREFIX):].split("-", 1)[0]
        if name.startswith(SPILL_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            path = os.path.join(tmp, name)
            if os.path.isdir(path) and not os.path.islink(path) and os.stat(path).st_uid == os.getuid():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def _private_folder(path: str) -> None:
    """``path`` and its parent made if missing, readable by this user alone (0700)."""
    for folder in (os.path.dirname(path), path):
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass


def _write_through(path: str, data: bytes) -> None:
    """Write a spilled partition to the disk itself: a spill that stayed in the OS page
    cache would take the very memory it was meant to free. The file is this user's alone
    (0600): it holds the notebook's data."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "wb") as f:
        f.write(data)
        f.flush()
        os.fdatasync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def _read_through(path: str) -> bytes:
    """Read a spilled partition back, leaving no copy in the OS page cache."""
    with open(path, "rb") as f:
        data = f.read()
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return data


@dataclasses.dataclass
class _Spilled:
    """Where a partition that left this worker's memory went."""

    nbytes: int
    path: str | None = None  # on this worker's disk
    peer: tuple[int, str] | None = None  # (worker, address) it was moved to


class SpillingStore(PartitionStore):
    """A :class:`PartitionStore` that keeps at most ``budget`` bytes in memory.

    ``spill``: ``"peer"`` or ``"disk"``; ``spill_dir``: where files go
    (a subdirectory per worker is made); ``find_peers(nbytes)``: the candidates for
    ``"peer"``; ``peer_stub(address)``: a Worker stub for a peer. ``budget`` 0: no limit.
    """

    def __init__(
        self,
        worker_id: int,
        budget: int,
        spill: str,
        spill_dir: str,
        find_peers: PeerFinder,
        peer_stub: Callable[[str], pb_grpc.WorkerStub],
    ) -> None:
        super().__init__()
        self.worker_id = worker_id
        self.budget = budget
        self.spill = spill
        self._dir = os.path.join(spill_dir or tempfile.gettempdir(), f"worker-{worker_id}-{os.getpid()}")
        self._find_peers = find_peers
        self._peer_stub = peer_stub
        self._spilled: dict[PartitionKey, _Spilled] = {}
        self._recency: OrderedDict[PartitionKey, None] = OrderedDict()  # memory, LRU first
        self._pinned: set[PartitionKey] = set()  # never spilled (e.g. replies in transit)
        self._in_flight: dict[PartitionKey, Any] = {}  # being spilled: still readable
        self._dropped_in_flight: set[PartitionKey] = set()  # dropped while being spilled
        self._moves: list[pb.PartitionMove] = []
        self._files = itertools.count()
        self.counters = dict.fromkeys(("spilled_to_peers", "spilled_to_disk", "guests_taken", "guests_refused",
                                       "read_from_disk", "read_from_peers"), 0)  # fmt: skip

    # --- keeping ---

    def put(self, key: PartitionKey, value: Any, spillable: bool = True) -> int:
        """Keep ``value``; then spill the least recently used partitions beyond the budget."""
        self._forget_spilled([key])
        size = super().put(key, value)
        with self._lock:
            self._recency[key] = None
            self._recency.move_to_end(key)
            if not spillable:
                self._pinned.add(key)
        if spillable:
            self._make_room()
        return size

    def accept(self, key: PartitionKey, data: bytes, nbytes: int) -> bool:
        """A peer's spilled partition: keep it if it fits the budget now (``False`` if not)."""
        with self._lock:
            fits = not self.budget or self._bytes + nbytes <= self.budget
        if not fits:
            self.counters["guests_refused"] += 1
            return False
        self.put(key, shipping.loads(data))
        self.counters["guests_taken"] += 1
        return True

    def _make_room(self) -> None:
        """Spill the least recently used partitions while memory is over the budget."""
        if not self.budget:
            return
        while True:
            with self._lock:
                victim = next((k for k in self._recency if k not in self._pinned), None)
                if self._bytes <= self.budget or victim is None:
                    return
                value, size = self._take(victim)
                del self._recency[victim]
                self._in_flight[victim] = value
            try:
                self._spill(victim, value, size)
            finally:
                with self._lock:
                    self._in_flight.pop(victim, None)
                    dropped = victim in self._dropped_in_flight
                    self._dropped_in_flight.discard(victim)
                if dropped:  # its copy on a peer or on disk is nobody's now
                    self._discard_copies([victim])

    def _spill(self, key: PartitionKey, value: Any, size: int) -> None:
        data = shipping.dumps(value)
        if self.spill == "peer":
            for peer in self._find_peers(size):
                if self._send_to_peer(peer, key, data, size):
                    with self._lock:
                        self._spilled[key] = _Spilled(size, peer=peer)
                    self.counters["spilled_to_peers"] += 1
                    self._moved(key, peer[0], "memory", size)
                    return
        _private_folder(self._dir)
        path = os.path.join(self._dir, f"{next(self._files)}.pickle")
        _write_through(path, data)
        with self._lock:
            self._spilled[key] = _Spilled(size, path=path)
        self.counters["spilled_to_disk"] += 1
        self._moved(key, self.worker_id, "disk", size)

    def _send_to_peer(self, peer: tuple[int, str], key: PartitionKey, data: bytes, size: int) -> bool:
        def stream() -> Iterator[pb.Chunk]:
            for i, piece in enumerate(chunk(data)):
                if i == 0:
                    piece.key.CopyFrom(encode_key(key))
                    piece.nbytes = size
                yield piece

        try:
            self._peer_stub(peer[1]).PutPartition(stream(), timeout=600)
            return True
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                logger.warning("spilling %r to worker %d failed: %s", key, peer[0], exc.details())
            return False

    def _moved(self, key: PartitionKey, holder: int, tier: str, nbytes: int) -> None:
        with self._lock:
            self._moves.append(pb.PartitionMove(key=encode_key(key), holder=holder, tier=tier, nbytes=nbytes))

    def drain_moves(self) -> list[pb.PartitionMove]:
        """The moves since the last call, oldest first (sent with the next results)."""
        with self._lock:
            moves, self._moves = self._moves, []
        return moves

    # --- reading ---

    def get(self, key: PartitionKey) -> Any:
        with self._lock:
            if key in self._values:
                self._recency.move_to_end(key)
                return self._values[key]
            if key in self._in_flight:
                return self._in_flight[key]
            spilled = self._spilled.get(key)
        if spilled is None:
            raise ClamorError(f"partition {key!r} is not held here")
        if spilled.path is not None:
            self.counters["read_from_disk"] += 1
            return shipping.loads(_read_through(spilled.path))
        self.counters["read_from_peers"] += 1
        return join_chunks(self._from_peer(key, spilled.peer))

    def chunks(self, key: PartitionKey) -> Iterator[pb.Chunk]:
        with self._lock:
            if key in self._in_flight:
                return chunk(shipping.dumps(self._in_flight[key]))
            spilled = self._spilled.get(key) if key not in self._values else None
        if spilled is None:
            return super().chunks(key)
        if spilled.path is not None:
            return chunk(_read_through(spilled.path))
        return self._from_peer(key, spilled.peer)

    def _from_peer(self, key: PartitionKey, peer: tuple[int, str] | None) -> Iterator[pb.Chunk]:
        assert peer is not None
        try:
            return iter(list(self._peer_stub(peer[1]).GetPartition(
                pb.PartitionRequest(key=encode_key(key)), timeout=600)))  # fmt: skip
        except grpc.RpcError as exc:
            raise ClamorError(
                f"partition {key!r} was spilled to worker {peer[0]}, which cannot give it "
                f"back: {exc.code().name}: {exc.details()}"
            ) from None

    def __contains__(self, key: PartitionKey) -> bool:
        with self._lock:
            return key in self._values or key in self._spilled

    def __len__(self) -> int:
        with self._lock:
            return len(self._values) + len(self._spilled)

    # --- freeing ---

    def pop(self, key: PartitionKey) -> Any:
        value = super().pop(key)
        self._forget_spilled([key])
        return value

    def drop(self, keys: Iterable[PartitionKey]) -> None:
        keys = list(keys)
        super().drop(keys)
        self._forget_spilled(keys)

    def _forget_spilled(self, keys: list[PartitionKey]) -> None:
        """Forget these keys' memory bookkeeping and spilled copies."""
        with self._lock:
            for key in keys:
                self._recency.pop(key, None)
                self._pinned.discard(key)
                if key in self._in_flight:
                    self._dropped_in_flight.add(key)
        self._discard_copies(keys)

    def _discard_copies(self, keys: list[PartitionKey]) -> None:
        """Remove the spilled copies of these keys: their files, or drop them at the peer."""
        at_peers: dict[str, list[bytes]] = {}
        with self._lock:
            for key in keys:
                spilled = self._spilled.pop(key, None)
                if spilled is None:
                    continue
                if spilled.path is not None:
                    try:
                        os.unlink(spilled.path)
                    except OSError:
                        pass
                elif spilled.peer is not None:
                    at_peers.setdefault(spilled.peer[1], []).append(encode_key(key))
        for address, encoded in at_peers.items():
            try:
                self._peer_stub(address).DropPartitions(pb.DropRequest(keys=encoded), timeout=10)
            except grpc.RpcError:
                pass  # a lost peer took them along

    def close(self) -> None:
        """Remove this worker's spill files (the driver removes the directory of a killed one
        on its own host; a remote worker's go here)."""
        shutil.rmtree(self._dir, ignore_errors=True)

    # --- stats ---

    def stats(self) -> dict[str, Any]:
        """Budget, bytes in memory, and where the partitions that left memory went."""
        with self._lock:
            on_disk = [s for s in self._spilled.values() if s.path is not None]
            at_peers = [s for s in self._spilled.values() if s.peer is not None]
            stats = {
                "partition_budget": self.budget,
                "partitions_in_memory": len(self._values),
                "partition_bytes": self._bytes,
                "partitions_on_disk": len(on_disk),
                "partition_disk_bytes": sum(s.nbytes for s in on_disk),
                "partitions_moved_to_peers": len(at_peers),
                "spill": self.spill,
            }
        stats.update(self.counters)
        return stats
