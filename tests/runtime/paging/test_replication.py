"""Dynamic replication: the driver redirects requests for held pages to peers.

Four workers over TCP read the same hot pages; the driver's directory sends
most requests to workers that already hold them. A redirect to a peer that
dies mid-exchange falls back to the driver with the right bytes.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from clamor.runtime.paging import page_client as pc

import clamor

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[4 << 10, 256 << 10, 4 << 20], ids=["4KiB", "256KiB", "4MiB"])
def cluster(request):
    with clamor.Cluster(workers=4, page_size=request.param, transport="tcp") as c:
        yield c


def read_pages(a, per_page, seed):
    """Touch every page of `a` once, in a per-worker random order."""
    order = np.random.default_rng(seed).permutation(len(a) // per_page)
    return float(sum(a[p * per_page + 1] for p in order))


def test_hot_pages_are_served_mostly_by_peers(cluster):
    ps = cluster.page_size
    n_pages = max(8, (8 << 20) // ps)  # a few MiB of hot data
    hot = clamor.array(n_pages * ps // 8, np.float64)
    hot[1 :: ps // 8] = np.arange(n_pages)
    expected = float(np.arange(n_pages).sum())
    before = cluster.stats()

    results = cluster.run_stage([(w, read_pages, (hot, ps // 8, w)) for w in range(4)])
    assert results == [expected] * 4
    # every fetched byte is accounted for once; a serving peer counts a page once it is
    # sent, which may be just after its reader's task ended: wait for the count to settle
    deadline = time.monotonic() + 10
    while True:
        after = cluster.stats()
        peer = after["bytes_served_by_peers"] - before["bytes_served_by_peers"]
        driver = after["bytes_served_by_driver"] - before["bytes_served_by_driver"]
        if peer + driver >= 4 * n_pages * ps or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert peer + driver == 4 * n_pages * ps
    assert peer >= 0.5 * (peer + driver)
    holders = cluster.page_stats()["holders"]
    first = clamor.runtime.paging.arena.arena_offset(hot) // ps
    assert (holders[first + 1 : first + n_pages] >= 2).all()


def test_a_peer_that_dies_mid_transfer_falls_back_to_the_driver(cluster):
    ps = cluster.page_size
    n_pages = 16
    x = clamor.array(n_pages * ps // 8, np.float64)
    x[1 :: ps // 8] = np.arange(n_pages) + 0.25
    expected = float((np.arange(n_pages) + 0.25).sum())
    victim = cluster.workers[-1]
    assert cluster.run(read_pages, x, ps // 8, 0, worker=victim) == expected
    survivor = cluster.workers[0]
    before = cluster.worker_stats()[survivor]["peer_fallbacks"]

    pid = cluster.worker_pid(victim)
    os.kill(pid, signal.SIGSTOP)  # the victim stops answering, with the driver unaware
    result: list[float] = []
    reader = threading.Thread(target=lambda: result.append(cluster.run(read_pages, x, ps // 8, 1, worker=survivor)))
    reader.start()
    deadline = time.monotonic() + 60
    while (cluster.page_stats(x)["holders"] < 2).all():  # the driver's own counts: no worker called
        assert time.monotonic() < deadline, "the survivor never asked for a page"
        time.sleep(0.05)
    time.sleep(0.2)  # it was sent to the frozen victim, and waits there
    os.kill(pid, signal.SIGKILL)
    reader.join(timeout=60)
    assert result == [expected]
    assert cluster.worker_stats()[survivor]["peer_fallbacks"] > before


def test_worker_page_servers_refuse_a_wrong_token(cluster):
    info = cluster.worker_info(cluster.workers[0])
    with pytest.raises(PermissionError):
        pc.PageClient(info["host"], info["page_port"], b"wrong token")
