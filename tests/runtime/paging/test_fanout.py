"""Replication at a burst: many workers read the same pages at the same moment.

Eight workers over TCP sum the same slice of the arena, all starting together, before
any of them holds a page. The driver lists each worker it sends a page to, or redirects
for one, as a holder at once (a holder-to-be), and that worker's page server waits for
its own copy, so the requests fan out over a tree of peers and the driver sends each
page about once instead of once per worker; read-ahead batches are redirected page by
page too. A holder killed in the middle leaves the others to fall back to the driver,
with the right bytes. Counts and bytes are checked, never timings.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import clamor

pytestmark = pytest.mark.slow

WORKERS = 8
PAGES = 64  # of 256 KiB: a 16 MiB slice


def sum_at(a: np.ndarray, start: float) -> float:
    """Wait until ``start`` (so that every worker begins together), then sum ``a``."""
    time.sleep(max(0.0, start - time.time()))
    return float(a.sum())


def counters(cluster: clamor.Cluster) -> dict[int, dict]:
    return {w["id"]: w for w in cluster.stats()["workers"]}


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(workers=WORKERS, transport="tcp", speculation=False) as c:
        c.run_stage([(w, os.getpid, ()) for w in c.workers])  # every worker up and warm
        yield c


def hot_slice(cluster: clamor.Cluster, salt: float) -> tuple[np.ndarray, float]:
    a = clamor.array(PAGES * cluster.page_size // 8, np.float64)
    a[:] = np.arange(len(a)) * 0.5 + salt
    return a, float(a.sum())


def test_a_burst_is_served_by_the_peers_not_the_driver(cluster):
    ps = cluster.page_size
    a, expected = hot_slice(cluster, 1.0)
    before, w0 = cluster.stats(), counters(cluster)
    start = time.time() + 1.0
    assert cluster.run_stage([(w, sum_at, (a, start)) for w in cluster.workers]) == [expected] * WORKERS
    after, w1 = cluster.stats(), counters(cluster)
    driver = after["bytes_served_by_driver"] - before["bytes_served_by_driver"]
    peers = after["bytes_served_by_peers"] - before["bytes_served_by_peers"]
    assert driver + peers >= WORKERS * PAGES * ps  # every worker got the whole slice
    # Without the fan-out the driver sends nearly every copy (read-ahead batches were never
    # redirected, and a peer still receiving a page answered NOT_HELD): ~8 slices.
    assert driver <= 2 * PAGES * ps + 16 * ps, (driver / ps, peers / ps)
    delta = {k: sum(w1[w][k] - w0[w][k] for w in w1) for k in ("peer_fallbacks", "from_peers", "redirects")}
    assert delta["from_peers"] >= (WORKERS - 2) * PAGES
    assert delta["peer_fallbacks"] <= PAGES // 4, delta  # nobody keeps falling back to the driver
    holders = cluster.page_stats(a)["holders"]
    assert (holders == WORKERS).all()  # and every copy is known to the directory


def test_a_holder_killed_mid_burst_leaves_the_rest_to_the_driver(cluster):
    """The victim holds the whole slice, so the burst's first redirects name it; it stops
    answering (SIGSTOP) while the others are at it, then dies (SIGKILL)."""
    a, expected = hot_slice(cluster, 2.0)
    victim, *others = cluster.workers
    assert cluster.run(sum_at, a, 0.0, worker=victim) == expected
    w0 = counters(cluster)
    pid = cluster.worker_pid(victim)
    result: list = []
    start = time.time() + 0.5
    burst = threading.Thread(target=lambda: result.append(
        cluster.run_stage([(w, sum_at, (a, start)) for w in others])))  # fmt: skip
    os.kill(pid, signal.SIGSTOP)
    burst.start()
    time.sleep(1.5)  # the others are inside redirected exchanges with the frozen victim
    os.kill(pid, signal.SIGKILL)
    burst.join(timeout=120)
    assert result == [[expected] * len(others)]
    w1 = counters(cluster)
    assert sum(w1[w]["peer_fallbacks"] - w0[w]["peer_fallbacks"] for w in others) > 0
    assert sum(w1[w]["from_peers"] - w0[w]["from_peers"] for w in others) > 0  # the others still share
