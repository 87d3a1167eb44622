"""Mutual TLS on both planes of a cluster: gRPC (control) and the page protocol.

A ``Cluster(tls=True)`` pages over TCP through TLS (driver and peers), and
every server of it, the driver's and each worker's, gRPC and page protocol,
refuses plaintext clients, clients with another cluster's certificates and,
inside TLS, a wrong token; it keeps serving the right bytes afterwards.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import threading
import time

import grpc
import numpy as np
import pytest
from clamor.runtime.credentials import TLS_SERVER_NAME, TLSMaterial
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.transport import connect
from clamor.runtime.paging import arena
from clamor.runtime.paging import page_client as pc
from clamor.runtime.paging.pager import DriverPager, PagingError
from clamor.testing.waiting import wait_for

import clamor

PAGE = 64 << 10


# Runs before the module's cluster exists (one driver pager per process).
def test_the_driver_pager_checks_its_tls_material():
    good, other = TLSMaterial.generate(), TLSMaterial.generate()
    with pytest.raises(TypeError, match="TLSMaterial"):
        DriverPager(token=b"t", tls=good.to_json())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="PEM"):
        DriverPager(token=b"t", tls=TLSMaterial(good.ca, b"not a pem", good.key))
    with pytest.raises(PagingError, match="does not match"):
        DriverPager(token=b"t", tls=TLSMaterial(good.ca, good.cert, other.key))
    broken = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    with pytest.raises(PagingError, match="TLS CA certificate"):
        DriverPager(token=b"t", tls=TLSMaterial(broken, good.cert, good.key))
    pager = DriverPager(token=b"t", tls=good)  # and nothing was left running by the failures
    pager.close()


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(2, tls=True, transport="tcp", page_size=PAGE) as c:
        yield c


def part_sum(a: np.ndarray, i: int, n: int) -> float:
    step = len(a) // n
    return float(a[i * step : (i + 1) * step].sum())


def read_pages_shuffled(a: np.ndarray, per_page: int, seed: int) -> float:
    """Touch every page once in random order (no sequential run, so no read-ahead)."""
    order = np.random.default_rng(seed).permutation(len(a) // per_page)
    return float(sum(a[p * per_page + 1] for p in order))


def test_a_tls_cluster_pages_over_tcp_with_exact_results(cluster):
    assert all(cluster.worker_info(w)["tls"] and not cluster.worker_info(w)["shm"] for w in cluster.workers)
    x = clamor.array((12 << 20) // 8, np.float64)
    x[:] = np.arange(len(x)) * 0.5
    before = cluster.stats()["bytes_served_by_driver"]
    for round_ in range(2):  # the second round reads pages changed by the driver
        x[:: PAGE // 8] += round_
        n = 8
        results = cluster.run_stage([(i % 2, part_sum, (x, i, n)) for i in range(n)])
        assert results == [part_sum(x, i, n) for i in range(n)]
    served = cluster.stats()["bytes_served_by_driver"] - before
    assert served >= x.nbytes  # every page went over TLS at least once
    stats = cluster.worker_stats()
    assert sum(w["from_driver"] for w in stats) > 0 and sum(w["from_shm"] for w in stats) == 0
    assert sum(w["readahead_pages"] for w in stats) > 0  # batched GETs went through TLS too


def test_peers_serve_each_other_through_tls(cluster):
    n_pages = 64
    y = clamor.array(n_pages * PAGE // 8, np.float64)
    y[1 :: PAGE // 8] = np.arange(n_pages)
    expected = float(np.arange(n_pages).sum())
    w0, w1 = cluster.workers[:2]
    assert cluster.run(read_pages_shuffled, y, PAGE // 8, 0, worker=w0) == expected
    before = cluster.stats()["bytes_served_by_peers"]
    peers_before = cluster.worker_stats()[w1]["from_peers"]
    # Worker 1 asks the driver, which redirects it to worker 0, which holds every page.
    assert cluster.run(read_pages_shuffled, y, PAGE // 8, 1, worker=w1) == expected
    assert cluster.stats()["bytes_served_by_peers"] - before > 0
    assert cluster.worker_stats()[w1]["from_peers"] > peers_before


# ------------------------------------------------------------ page protocol --


def driver_port(cluster) -> int:
    return cluster.paging.port


def driver_failures(cluster) -> int:
    return cluster.stats()["driver"]["auth_failures"]


def noise_is_refused(port: int) -> None:
    """A plaintext client speaking first (a page-protocol GET) gets no byte of the protocol."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(pc.pack(pc.GET, 0, 1, 1))
        received = b""
        try:
            while chunk := sock.recv(4096):
                received += chunk
        except ConnectionResetError:
            pass
    assert pc.MAGIC.to_bytes(4, "little") not in received


def foreign_clients_are_refused(port: int, tls: TLSMaterial, token: bytes) -> int:
    """Clients with another CA's certificate, or none; returns how many were refused."""
    other = TLSMaterial.generate()
    with pytest.raises(ssl.SSLCertVerificationError):  # it does not trust our server either
        pc.PageClient("127.0.0.1", port, token, tls=other)
    with pytest.raises((ssl.SSLError, pc.PageProtocolError, ConnectionError)):
        pc.PageClient("127.0.0.1", port, token, tls=TLSMaterial(tls.ca, other.cert, other.key))
    no_cert = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    no_cert.load_verify_locations(cadata=tls.ca.decode())
    with pytest.raises((ssl.SSLError, pc.PageProtocolError, ConnectionError)):
        pc.PageClient("127.0.0.1", port, token, tls=no_cert)
    return 3


def page_aligned(pages: int) -> np.ndarray:
    """An arena array of exactly ``pages`` whole pages (the arena aligns to its own,
    possibly smaller, page size)."""
    raw = clamor.array((pages + 1) * PAGE // 8, np.float64)
    skip = (-arena.arena_offset(raw)) % PAGE // 8
    return raw[skip : skip + pages * PAGE // 8]


def test_the_driver_page_server_refuses_all_but_tls_with_the_token(cluster):
    tls, token = cluster._credentials.tls, cluster._token.encode()
    x = page_aligned(4)
    x[:] = np.arange(len(x)) + 0.5
    cluster.run(lambda a: float(a[0]), x)  # a stage: x's current version is sealed
    epoch = cluster.stats()["epoch"]
    first = arena.arena_offset(x) // PAGE
    failures = driver_failures(cluster)

    noise_is_refused(driver_port(cluster))
    refused = 1 + foreign_clients_are_refused(driver_port(cluster), tls, token)
    with pytest.raises(PermissionError, match="error 5"):  # ERR_AUTH, inside TLS
        pc.PageClient("127.0.0.1", driver_port(cluster), b"not the token", tls=tls)
    refused += 1
    wait_for(lambda: driver_failures(cluster) == failures + refused)

    with pc.PageClient("127.0.0.1", driver_port(cluster), token, tls=tls) as c:
        replies = c.get(first, epoch, count=4)
        assert b"".join(r.data for r in replies) == x.tobytes()
        assert c.get(10**15, epoch)[0].error == pc.ERR_PAGE_RANGE  # errors travel inside TLS too
        (again,) = c.get(first, epoch)
        assert again.data == x[: PAGE // 8].tobytes()
    assert driver_failures(cluster) == failures + refused


def test_worker_page_servers_refuse_all_but_tls_with_the_token(cluster):
    tls, token = cluster._credentials.tls, cluster._token.encode()
    z = page_aligned(2)
    z[:] = -np.arange(len(z), dtype=np.float64)
    w = cluster.workers[0]
    assert cluster.run(lambda a: float(a.sum()), z, worker=w) == float(z.sum())  # w now holds z
    epoch = cluster.stats()["epoch"]
    port = cluster.worker_info(w)["page_port"]
    failures = cluster.worker_stats()[w]["auth_failures"]

    noise_is_refused(port)
    refused = 1 + foreign_clients_are_refused(port, tls, token)
    with pytest.raises(PermissionError):
        pc.PageClient("127.0.0.1", port, b"not the token", tls=tls)
    refused += 1
    wait_for(lambda: cluster.worker_stats()[w]["auth_failures"] == failures + refused)

    with pc.PageClient("127.0.0.1", port, token, tls=tls) as c:
        replies = c.get(arena.arena_offset(z) // PAGE, epoch, count=2)
        assert [r.type for r in replies] == [pc.PAGE, pc.PAGE]
        assert b"".join(r.data for r in replies) == z.tobytes()


def test_a_client_that_hangs_up_gets_a_close_notify_not_an_alert(cluster):
    """Regression (found by the fuzzer): an EOF without close_notify made the server
    answer with a decode_error alert; it now ends the session cleanly."""
    with pc.connect("127.0.0.1", driver_port(cluster), tls=cluster._credentials.tls) as sock:
        header = sock.recv(pc.HEADER.size)
        assert pc.HEADER.unpack(header)[2] == pc.HELLO
        assert len(sock.recv(pc.NONCE)) == pc.NONCE
        socket.socket.shutdown(sock, socket.SHUT_WR)  # TCP EOF, the TLS session left open
        assert sock.recv(100) == pc.pack(pc.ERROR, aux=pc.ERR_AUTH)  # no AUTH came
        assert sock.recv(100) == b""  # then a close_notify (an alert would raise ssl.SSLError)


@pytest.mark.slow
def test_a_plaintext_page_client_is_refused(cluster):
    """A plaintext client waits for HELLO, the TLS server for a ClientHello: the server
    gives up after its handshake timeout (5 s), counts it, and goes on serving."""
    failures = driver_failures(cluster)
    with pytest.raises((pc.PageProtocolError, ConnectionError)):
        pc.PageClient("127.0.0.1", driver_port(cluster), cluster._token.encode(), timeout=30)
    wait_for(lambda: driver_failures(cluster) == failures + 1)
    assert cluster.run(lambda: 42) == 42


# --------------------------------------------------------------------- gRPC --


def grpc_targets(cluster):
    """(address, call) for the driver's scheduler server and each worker's server."""
    def observer(channel):
        return pb_grpc.ObserverStub(channel).Query(pb.QueryRequest(kind="stats"), timeout=10)

    def worker(channel):
        return pb_grpc.WorkerStub(channel).Stats(pb.StatsRequest(), timeout=10)

    workers = [(w["address"], worker) for w in cluster.worker_stats() if w["alive"]]
    return [(cluster.address, observer)] + workers


def rpc_code(address: str, call, token: str, tls: TLSMaterial | None) -> grpc.StatusCode | None:
    with connect(address, token, tls=tls) as channel:
        try:
            call(channel)
        except grpc.RpcError as exc:
            return exc.code()
    return None


def test_grpc_needs_the_cluster_tls_and_the_token(cluster):
    creds = cluster._credentials
    other = TLSMaterial.generate()
    for address, call in grpc_targets(cluster):
        assert rpc_code(address, call, creds.token, None) == grpc.StatusCode.UNAVAILABLE  # plaintext
        assert rpc_code(address, call, creds.token, other) == grpc.StatusCode.UNAVAILABLE
        assert rpc_code(address, call, creds.token, TLSMaterial(creds.tls.ca, other.cert, other.key)) in (
            grpc.StatusCode.UNAVAILABLE,
            grpc.StatusCode.UNKNOWN,  # TLS 1.3: the server's refusal can arrive after the handshake
        )
        assert rpc_code(address, call, "not-the-token", creds.tls) == grpc.StatusCode.UNAUTHENTICATED
        assert rpc_code(address, call, creds.token, creds.tls) is None
    assert TLS_SERVER_NAME == "clamor-cluster"


# Last: it kills a worker of the module's cluster.
def test_a_peer_frozen_mid_handshake_falls_back_to_the_driver(cluster):
    n_pages = 16
    v = clamor.array(n_pages * PAGE // 8, np.float64)
    v[1 :: PAGE // 8] = np.arange(n_pages) + 0.25
    expected = float((np.arange(n_pages) + 0.25).sum())
    victim, survivor = cluster.workers[-1], cluster.workers[0]
    assert cluster.run(read_pages_shuffled, v, PAGE // 8, 0, worker=victim) == expected
    before = cluster.worker_stats()[survivor]["peer_fallbacks"]
    pid = cluster.worker_pid(victim)
    os.kill(pid, signal.SIGSTOP)  # its kernel accepts connections; no TLS handshake completes
    result: list[float] = []
    reader = threading.Thread(target=lambda: result.append(cluster.run(read_pages_shuffled, v, PAGE // 8, 1, worker=survivor)))
    reader.start()
    time.sleep(1.0)  # the survivor is now waiting for the frozen peer's ServerHello
    os.kill(pid, signal.SIGKILL)
    reader.join(timeout=60)
    assert result == [expected]
    assert cluster.worker_stats()[survivor]["peer_fallbacks"] > before
