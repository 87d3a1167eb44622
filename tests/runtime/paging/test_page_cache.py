"""A worker's page cache stays within its memory budget (``worker_memory``, docs/user-guide.md).

Half of ``worker_memory`` is the worker's cache of arena pages. Beyond it the
native pager evicts pages with CLOCK (second chance) and tells the driver, so
the directory never redirects a peer to a worker that dropped the page. An
evicted page is fetched again on its next touch, with the same bytes.
"""

from __future__ import annotations

import resource

import numpy as np
import pytest
from clamor.runtime.paging.pager import MIN_CACHE_PAGES, cache_limit_pages
from clamor.testing.waiting import wait_for

import clamor

MiB = 1 << 20
#: Besides the page cache, what a scan may add to a worker's peak RSS: the
#: task's unpickled arguments, numpy's reduction buffers, allocator slack.
RSS_OVERHEAD = 24 * MiB


def filled(nbytes: int) -> tuple[np.ndarray, float]:
    """An arena float64 array of ``nbytes`` with small integer values, and their exact sum."""
    x = clamor.array(nbytes // 8, np.float64)
    x[:] = np.arange(len(x)) % 1021
    return x, float(x.sum())


def peak_rss() -> int:
    """This process's peak RSS in bytes; it counts mapped arena (memfd) pages too."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def scan(a: np.ndarray) -> tuple[float, int]:
    """Sum every element in order; return the sum and the peak RSS afterwards."""
    return float(a.sum()), peak_rss()


def read_pages(a: np.ndarray, per_page: int, seed: int) -> float:
    """Touch one element of every page of ``a``, in a random order (no read-ahead runs)."""
    order = np.random.default_rng(seed).permutation(len(a) // per_page)
    return float(sum(a[p * per_page] for p in order))


def test_budget_is_converted_to_whole_pages():
    ps = 256 << 10
    assert cache_limit_pages(0, ps) == 0  # unlimited
    assert cache_limit_pages(32 * MiB, ps) == 128
    assert cache_limit_pages(32 * MiB + ps - 1, ps) == 128  # rounded down: stays within the budget
    assert cache_limit_pages(1, ps) == MIN_CACHE_PAGES
    with pytest.raises(ValueError):
        cache_limit_pages(-1, ps)


def test_scan_larger_than_the_page_cache_stays_within_the_budget():
    with clamor.Cluster(workers=1, transport="tcp", worker_memory="64MiB") as cluster:
        budget = cluster.budgets.of(0).page_cache
        assert budget == 48 * MiB  # a copying worker's cache: 3/4 of its budget
        x, expected = filled(128 * MiB)  # over twice the page cache
        baseline = cluster.run(peak_rss, worker=0)

        total, peak = cluster.run(scan, x, worker=0)

        assert total == expected
        assert peak - baseline <= budget + RSS_OVERHEAD, (
            f"peak RSS grew by {(peak - baseline) / MiB:.1f} MiB scanning 128 MiB with a "
            f"{budget / MiB:.0f} MiB page cache"
        )  # measured: 32.1 MiB with a 32 MiB cache (128.2 MiB without a limit)
        stats = cluster.worker_stats()[0]
        assert stats["cache_limit_pages"] == budget // cluster.page_size
        assert stats["evictions"] > 0
        assert stats["cached_pages"] <= stats["cache_limit_pages"]


def test_evicted_pages_are_fetched_again_with_the_same_bytes():
    with clamor.Cluster(workers=1, transport="tcp", worker_memory="8MiB", readahead=False) as cluster:
        limit = cluster.budgets.of(0).page_cache // cluster.page_size
        assert cluster.worker_stats()[0]["cache_limit_pages"] == limit
        n_pages = 4 * limit
        x, expected = filled(n_pages * cluster.page_size)
        assert cluster.run(scan, x, worker=0)[0] == expected
        before = cluster.worker_stats()[0]

        assert cluster.run(scan, x, worker=0)[0] == expected  # the same bytes, refetched

        after = cluster.worker_stats()[0]
        # A sequential scan cycles through a cache four times too small: at least
        # every page that did not fit misses again (a MISSING fault, not a minor one).
        assert after["faults"] - before["faults"] >= n_pages - limit
        assert after["evictions"] - before["evictions"] >= n_pages - limit
        assert after["cached_pages"] <= limit
        assert after["peer_fallbacks"] == 0


def test_the_driver_never_redirects_to_a_worker_that_evicted_the_page():
    budgets = {0: "16MiB", 1: "1GiB"}  # worker 0: an 8 MiB page cache
    with clamor.Cluster(workers=2, transport="tcp", replication=True, worker_memory=budgets) as cluster:
        ps = cluster.page_size
        x, expected = filled(64 * MiB)
        n_pages = len(x) * 8 // ps
        assert cluster.run(scan, x, worker=0)[0] == expected  # evicts most of x
        w0 = cluster.worker_stats()[0]
        assert w0["evictions"] >= n_pages - w0["cache_limit_pages"]
        still_held = w0["cached_pages"]
        assert 0 < still_held <= w0["cache_limit_pages"]

        assert cluster.run(read_pages, x, ps // 8, 7, worker=1) == float(x[:: ps // 8].sum())

        w1 = cluster.worker_stats()[1]
        # worker 0 counts a page served once it is sent, maybe after worker 1 has it
        wait_for(lambda: cluster.worker_stats()[0]["pages_served"] - w0["pages_served"] >= w1["from_peers"])
        served = cluster.worker_stats()[0]["pages_served"] - w0["pages_served"]
        assert w1["peer_fallbacks"] == 0  # no redirect to a page worker 0 had dropped
        assert w1["from_peers"] == served <= still_held  # peers served only what worker 0 held
        assert served > 0  # and the directory still knew what it held
        assert cluster.stats()["driver"]["evictions_told"] >= w0["evictions"]

        holders = cluster.page_stats(x)["holders"]
        assert (holders >= 1).all()  # worker 1 holds every page now
        assert (holders == 2).sum() <= still_held  # worker 0 only for the pages it kept
        assert (holders == 1).sum() >= n_pages - still_held
