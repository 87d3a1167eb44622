"""A worker's SpillingStore on its own (runtime/storage/spill.py), no processes: the least
recently used partitions leave memory beyond the budget, to a peer with room, else to
disk; reads and drops reach them wherever they went, and every move is reported."""

from __future__ import annotations

import os

import grpc
import numpy as np
from clamor.runtime.net.messages import decode_key
from clamor.runtime.storage.partitions import join_chunks
from clamor.runtime.storage.spill import SpillingStore

MiB = 1 << 20


def part(i: int) -> np.ndarray:
    return np.full(MiB // 8, float(i))


class Refused(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self):
        return "no room"


class PeerStub:
    """A Worker stub that calls a SpillingStore in this process (the peer)."""

    def __init__(self, store: SpillingStore) -> None:
        self.store = store

    def PutPartition(self, chunks, timeout=None):
        chunks = list(chunks)
        data = b"".join(c.data for c in chunks)
        if not self.store.accept(decode_key(chunks[0].key), data, chunks[0].nbytes):
            raise Refused()

    def GetPartition(self, request, timeout=None):
        return self.store.chunks(decode_key(request.key))

    def DropPartitions(self, request, timeout=None):
        self.store.drop(decode_key(k) for k in request.keys)


def store(worker: int, budget: int, tmp_path, peer: SpillingStore | None = None, spill="peer"):
    find = (lambda n: [(peer.worker_id, "peer:1")]) if peer is not None else (lambda n: [])
    return SpillingStore(worker, budget, spill, str(tmp_path), find, lambda address: PeerStub(peer))


def moves(s: SpillingStore) -> list[tuple]:
    return [(decode_key(m.key), m.holder, m.tier) for m in s.drain_moves()]


def test_the_least_recently_used_partition_goes_to_disk_and_reads_back(tmp_path):
    s = store(0, 2 * MiB, tmp_path)
    s.put("a", part(1))
    s.put("b", part(2))
    assert s.get("a")[0] == 1.0  # "a" is now the most recently used
    s.put("c", part(3))
    assert moves(s) == [("b", 0, "disk")]
    assert s.stats()["partition_bytes"] == 2 * MiB and s.stats()["partitions_on_disk"] == 1
    assert np.array_equal(s.get("b"), part(2)) and "b" in s and len(s) == 3
    assert np.array_equal(join_chunks(s.chunks("b")), part(2))  # as a peer would get it
    s.drop(["b"])
    assert os.listdir(s._dir) == [] and "b" not in s


def test_a_peer_with_room_takes_the_partition_and_one_without_sends_it_to_disk(tmp_path):
    peer = store(1, 2 * MiB, tmp_path / "peer")
    s = store(0, MiB, tmp_path, peer=peer)
    s.put("a", part(1))
    s.put("b", part(2))  # "a" to the peer
    s.put("c", part(3))  # "b" to the peer
    peer.put("own", part(9))  # the peer is over its budget now: its LRU guest goes to its disk
    s.put("d", part(4))  # "c": the peer refuses (full), so to disk here
    assert moves(s) == [("a", 1, "memory"), ("b", 1, "memory"), ("c", 0, "disk")]
    assert moves(peer) == [("a", 1, "disk")]
    assert [s.get(k)[0] for k in "abcd"] == [1.0, 2.0, 3.0, 4.0]  # wherever they went
    assert s.counters["spilled_to_peers"] == 2 and peer.counters["guests_refused"] == 1
    s.drop(["b"])  # dropped at the peer too
    assert "b" not in peer


def test_replies_in_transit_are_never_spilled(tmp_path):
    s = store(0, MiB, tmp_path)
    s.put("reply", part(1), spillable=False)
    s.put("a", part(2))
    assert moves(s) == [("a", 0, "disk")]  # over the budget, but the reply stays
    assert s.get("reply")[0] == 1.0


def test_a_partition_dropped_while_it_is_being_spilled_leaves_no_copy(tmp_path):
    peer = store(1, 4 * MiB, tmp_path / "peer")
    s = store(0, MiB, tmp_path, peer=peer)
    s.put("a", part(1))
    original = PeerStub.PutPartition

    def drop_meanwhile(self, chunks, timeout=None):
        s.drop(["a"])  # the driver drops "a" while it travels
        return original(self, chunks, timeout)

    PeerStub.PutPartition = drop_meanwhile
    try:
        s.put("b", part(2))
    finally:
        PeerStub.PutPartition = original
    assert "a" not in s and "a" not in peer


def test_no_budget_keeps_everything_in_memory(tmp_path):
    s = store(0, 0, tmp_path)
    for i in range(5):
        s.put(i, part(i))
    assert s.drain_moves() == [] and s.stats()["partitions_in_memory"] == 5


def test_spill_to_disk_never_asks_for_peers(tmp_path):
    asked = []
    s = SpillingStore(0, MiB, "disk", str(tmp_path), lambda n: asked.append(n) or [], lambda a: None)
    s.put("a", part(1))
    s.put("b", part(2))
    assert asked == [] and moves(s) == [("a", 0, "disk")]
    assert s.drain_moves() == []  # each move is reported once
