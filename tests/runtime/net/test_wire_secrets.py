"""What an observer of the wire sees: never the cluster token, and nothing to replay.

gRPC calls carry a one-time proof of the token (runtime/net/call_proofs.py); the task
streams, the bulk channel and the page protocol prove it by challenge and response. A
capture of a whole cluster's loopback traffic (an ``AF_PACKET`` socket, as tcpdump
uses: root only) holds neither the token nor its hex form, and a captured call sent
again is refused.
"""

from __future__ import annotations

import socket
import threading

import grpc
import numpy as np
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.net import call_proofs
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.transport import PROTOCOL_METADATA_KEY, PROTOCOL_VERSION

import clamor

ETH_P_ALL = 0x0003


def _capture_socket() -> socket.socket:
    try:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(ETH_P_ALL))
    except PermissionError:
        pytest.skip("capturing packets needs CAP_NET_RAW")
    sock.bind(("lo", 0))
    sock.settimeout(0.2)
    return sock


class Capture:
    """Every frame seen on the loopback interface while it runs."""

    def __init__(self) -> None:
        self.sock = _capture_socket()
        self.frames: list[bytes] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.frames.append(self.sock.recv(1 << 17))
            except TimeoutError:
                continue

    def stop(self) -> bytes:
        self._stop.set()
        self.thread.join(5)
        self.sock.close()
        return b"".join(self.frames)


def test_a_capture_of_a_clusters_loopback_traffic_holds_no_token():
    capture = Capture()
    try:
        with Cluster(2, transport="tcp", timeout=60) as cluster:  # pages over TCP too
            token = cluster._token
            with clamor.shared():
                table = clamor.asarray(np.arange(200_000, dtype=np.float64))
            assert cluster.range(4, partitions=4).map(lambda i: float(table[i * 1000])).collect() == [
                0.0, 1000.0, 2000.0, 3000.0]  # fmt: skip
            kept = cluster.range(4, partitions=2).map(lambda i: i).persist()
            assert kept.collect() == [0, 1, 2, 3]
            assert cluster.stats()["tasks_run"] > 0
    finally:
        seen = capture.stop()
    assert len(seen) > 10_000  # the cluster's traffic was captured
    assert b"x-clamor-proof" in seen  # gRPC calls among it, in clear (no TLS)
    assert token.encode() not in seen
    assert token.encode().hex().encode() not in seen


def test_a_captured_proof_is_refused_when_sent_again():
    checker = call_proofs.ProofChecker(b"the token")
    proof = call_proofs.prove(b"the token", "/clamor.v1.Worker/Stats")
    assert checker.check("/clamor.v1.Worker/Stats", proof) is None
    assert checker.check("/clamor.v1.Worker/Stats", proof) == "a replayed proof of the cluster token"
    other = call_proofs.prove(b"the token", "/clamor.v1.Worker/Stats")
    assert "invalid proof" in checker.check("/clamor.v1.Worker/Shutdown", other)  # bound to its method
    stale = call_proofs.prove(b"the token", "/clamor.v1.Worker/Stats", now=1_000.0)
    assert "off this host's clock" in checker.check("/clamor.v1.Worker/Stats", stale)
    assert "invalid proof" in checker.check("/m", call_proofs.prove(b"another token", "/m"))
    assert "missing proof" in checker.check("/m", None)
    assert "malformed" in checker.check("/m", "not:a proof")


def test_a_worker_refuses_a_replayed_call():
    with Cluster(1, timeout=60) as cluster:
        address = cluster.registry.get(0).address
        proof = call_proofs.prove(cluster._token.encode(), "/clamor.v1.Worker/Stats")
        metadata = [(call_proofs.PROOF_METADATA_KEY, proof), (PROTOCOL_METADATA_KEY, PROTOCOL_VERSION)]
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.WorkerStub(channel)
            assert stub.Stats(pb.StatsRequest(), metadata=metadata, timeout=10).stats  # the first time
            with pytest.raises(grpc.RpcError) as refused:
                stub.Stats(pb.StatsRequest(), metadata=metadata, timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "replayed" in refused.value.details()
        assert cluster.run(lambda: 5) == 5
