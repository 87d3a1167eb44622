"""The bulk channel (runtime/storage/bulk.py): partitions worker to worker over plain TCP.

Values travel with their array buffers out of band (no chunking, no copies beyond
the kernel's); every connection proves it knows the cluster token first; a bad
request or a wrong token costs that connection only, never the server.
"""

from __future__ import annotations

import socket
import struct
import threading

import numpy as np
import pytest
from clamor.runtime.net.messages import key_bytes
from clamor.runtime.storage.bulk import BulkClient, BulkError, BulkServer
from clamor.runtime.worker.interrupts import Interrupter, TaskInterrupted
from clamor.testing.waiting import wait_for

import clamor

TOKEN = b"t" * 32
MiB = 1 << 20


@pytest.fixture
def server():
    values = {("ds", 1, 0): np.arange(4 * MiB // 8, dtype=np.float64), ("small",): {"a": [1, 2]}}

    def lookup(key):
        if key == ("boom",):
            raise RuntimeError("the store broke")
        return values[key]

    s = BulkServer(TOKEN, "127.0.0.1", lookup)
    yield s, f"127.0.0.1:{s.port}"
    s.close()


def test_values_arrive_whole_with_their_arrays_out_of_band(server):
    s, address = server
    client = BulkClient(TOKEN)
    x = client.get(address, ("ds", 1, 0))
    assert x.dtype == np.float64 and np.array_equal(x, np.arange(4 * MiB // 8))
    assert client.get(address, ("small",)) == {"a": [1, 2]}
    assert client.get(address, ("ds", 1, 0)).sum() == x.sum()  # the connection is reused
    wait_for(lambda: s.served == 3, what="the server counts a reply once it is sent")
    client.close()


def test_a_missing_key_or_a_failing_store_is_a_clear_error_and_the_connection_lives_on(server):
    _, address = server
    client = BulkClient(TOKEN)
    with pytest.raises(BulkError, match=r"\('nope',\).*not held here"):
        client.get(address, ("nope",))
    with pytest.raises(BulkError, match="RuntimeError: the store broke"):
        client.get(address, ("boom",))
    assert client.get(address, ("small",)) == {"a": [1, 2]}
    client.close()


def test_a_wrong_token_is_refused_and_others_are_still_served(server):
    s, address = server
    with pytest.raises(BulkError, match="cannot fetch partition.*no handshake.*cluster token"):
        BulkClient(b"w" * 32).get(address, ("small",))
    assert s.refused == 1
    assert BulkClient(TOKEN).get(address, ("small",)) == {"a": [1, 2]}


def test_a_server_that_cannot_prove_the_token_is_never_sent_a_request():
    listener = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def impostor() -> None:  # takes any answer, cannot answer the client's nonce
        conn, _ = listener.accept()
        with conn:
            conn.sendall(b"n" * 32)
            got.append(conn.recv(64))
            conn.sendall(b"x" * 32)
            conn.settimeout(2)
            try:
                got.append(conn.recv(100))  # a request would come here
            except OSError:
                pass

    thread = threading.Thread(target=impostor)
    thread.start()
    with pytest.raises(BulkError, match="does not know the cluster token"):
        BulkClient(TOKEN).get(f"127.0.0.1:{listener.getsockname()[1]}", ("small",))
    thread.join()
    listener.close()
    assert len(got[0]) == 64 and got[1:] in ([], [b""])  # the answer and a nonce, no request


def test_a_corrupt_request_costs_only_its_connection(server):
    s, address = server
    with socket.create_connection(("127.0.0.1", s.port)) as raw:
        raw.recv(32)
        raw.sendall(b"\xff" * 64)  # a wrong MAC (and a nonce)
        assert raw.recv(1) == b""  # hung up
    client = BulkClient(TOKEN)
    sock, _ = client._connection(address)
    sock.sendall(struct.pack("<I", 1 << 30))  # a key length no request has
    assert sock.recv(1) == b""
    client._forget(address)
    assert client.get(address, ("small",)) == {"a": [1, 2]}



def test_a_fetch_interrupted_mid_reply_costs_its_connection_not_the_next_fetchs_value():
    """A task stopped (``TaskInterrupted``) while it waits for a partition leaves the rest of
    that reply unread: the connection is dropped, so the next fetch cannot read it as its own."""
    entered, release = threading.Event(), threading.Event()

    def lookup(key):
        if key == ("slow",):
            entered.set()
            release.wait(10)
            return list(range(1000))  # what the stale reply would hand the next fetch
        return {"key": key}

    s = BulkServer(TOKEN, "127.0.0.1", lookup)
    address = f"127.0.0.1:{s.port}"
    client, interrupter = BulkClient(TOKEN), Interrupter()
    outcome: list[object] = []

    def task() -> None:
        try:
            with interrupter.user_code(7):
                outcome.append(client.get(address, ("slow",)))
        except TaskInterrupted as exc:
            outcome.append(exc)

    thread = threading.Thread(target=task)
    thread.start()
    assert entered.wait(10)
    assert interrupter.interrupt([7])  # delivered once the reply's first bytes arrive
    release.set()
    thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], TaskInterrupted)
    assert client.get(address, ("small",)) == {"key": ("small",)}
    client.close()
    s.close()



def test_a_reply_to_another_request_is_refused_not_returned(server):
    _, address = server
    client = BulkClient(TOKEN)
    sock, _ = client._connection(address)
    raw = key_bytes(("ds", 1, 0))
    sock.sendall(struct.pack("<I", len(raw)) + raw)  # a request whose reply nobody reads
    with pytest.raises(BulkError, match=r"\('small',\).*reply to another request"):
        client.get(address, ("small",))  # it would read the array as its own value
    assert client.get(address, ("small",)) == {"a": [1, 2]}  # on a new connection
    client.close()


@pytest.mark.parametrize("tls", [False, True])
def test_a_shuffle_between_workers_goes_over_the_bulk_channel_unless_the_cluster_uses_tls(tls):
    with clamor.Cluster(workers=2, tls=tls) as cluster:
        pairs = cluster.range(4000, partitions=8).map(lambda i: (i % 7, i))
        joined = pairs.join(cluster.parallelize([(k, -k) for k in range(7)], 2))
        assert sorted(joined.map(lambda kv: kv[0]).collect()) == sorted(i % 7 for i in range(4000))
        served = sum(w["partitions_served_bulk"] for w in cluster.worker_stats())
        assert served == 0 if tls else served > 0  # TLS clusters keep to gRPC (over TLS)


def test_workers_fetch_the_drivers_partitions_over_its_bulk_channel():
    rows = [("row", i, f"{i:0100d}") for i in range(20_000)]  # ~2.4 MB pickled: kept by the driver
    # exact counts: no straggler handling, which on a loaded machine runs a task twice
    with clamor.Cluster(workers=2, speculation=False, speculation_factor=1e6) as cluster:
        ds = cluster.parallelize(rows, partitions=4)
        assert ds.map(lambda r: r[1]).sum() == sum(range(20_000))
        stats = cluster.stats()
        assert stats["driver_partitions_served_bulk"] == 4
        assert sum(w["partitions_fetched_from_driver"] for w in stats["workers"]) == 4
