"""A flood of idle, unauthenticated connections cannot stop a worker's servers.

Every listening port of a worker gets 1,100 connections that never say anything while
the worker may hold 1,024 file descriptors. Its acceptors close what is beyond their
bound of unauthenticated connections, drop the idle ones after the pre-authentication
deadline, and survive running out of descriptors (gRPC's own server drops a connection
whose HTTP/2 handshake does not come within that deadline, and holds at most half the
descriptors); the cluster goes on serving the partitions that worker holds and running
stages on it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import resource
import socket
import time

import numpy as np
import psutil
import pytest
from clamor.runtime.net.acceptor import PREAUTH_DEADLINE

import clamor

pytestmark = pytest.mark.slow

FLOOD = 1_100


def _connections(process: psutil.Process, **kind: str) -> list:
    """``net_connections`` (psutil 6), ``connections`` before it."""
    return (getattr(process, "net_connections", None) or process.connections)(**kind)


def flood(port: int) -> list[socket.socket]:
    """As many idle connections to ``port`` as it takes (refused or closed ones included)."""
    out = []
    for _ in range(FLOOD):
        s = socket.socket()
        s.settimeout(2.0)
        with contextlib.suppress(OSError):
            s.connect(("127.0.0.1", port))
        out.append(s)
    return out


def test_idle_connections_to_every_port_of_a_worker_leave_it_serving():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8 * FLOOD)), hard))
    with clamor.Cluster(workers=2, speculation=False) as cluster:
        parts = cluster.range(8, partitions=8).map_partitions(lambda r: [np.full(1000, r[0])]).persist()
        assert parts.count() == 8
        held = [k for k, p in cluster.partitions().items() if p["holder"] == 0]
        assert held, "worker 0 holds none of the partitions"
        pid = next(w["pid"] for w in cluster.worker_stats() if w["id"] == 0)
        worker = psutil.Process(pid)
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (1024, 1024))
        ports = sorted({c.laddr.port for c in _connections(worker, kind="tcp") if c.status == psutil.CONN_LISTEN})
        idle: list[socket.socket] = []
        try:
            for port in ports:
                idle += flood(port)
            time.sleep(PREAUTH_DEADLINE + 1)  # the ones it took were given up on by now
            pool = concurrent.futures.ThreadPoolExecutor(1)  # a dead acceptor: a failure, not a hang
            try:
                for key in held:  # served from worker 0
                    assert len(pool.submit(cluster.fetch, key).result(timeout=60)[0]) == 1000
                assert pool.submit(cluster.run, lambda: 7, worker=0).result(timeout=60) == 7
            finally:
                pool.shutdown(wait=False, cancel_futures=True)
            assert worker.is_running() and 0 in cluster.workers
            assert worker.num_fds() < 512  # every server let go of the idle ones (gRPC too)
        finally:
            for s in idle:
                s.close()
