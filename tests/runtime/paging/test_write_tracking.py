"""Driver writes between stages: cheap when nothing needs the bytes they replace.

What a user relies on: a parameter-server update of an arena array between two stages
costs about the write itself (no trap, no copy per page on Linux 6.7+, async
write-protect); the next stage still sees exactly the pages written as new versions, so
workers that cached the old bytes drop exactly those, whichever thread wrote them and
whenever; an epoch that lineage or ``keep_versions`` pins keeps its old bytes (one copy
per written page), and asking for an epoch whose bytes are gone is a clear error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from clamor.runtime.errors import ClamorError
from clamor.runtime.paging import arena

import clamor

pytestmark = pytest.mark.slow

PAGE = 4 << 10
CHUNK = 64 << 20  # write_tracking.h: CL_WT_CHUNK_BYTES


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    """Three chunks' worth of float64, so that writes cross chunk boundaries."""
    t = clamor.empty(3 * CHUNK // 8, np.float64)
    t[:] = 1.0
    return t


@pytest.fixture(scope="module")
def cluster(table):
    # tcp: the worker caches pages, so a missed write would show as a stale page
    with clamor.Cluster(workers=1, page_size=PAGE, transport="tcp") as c:
        yield c


def pages_of(x: np.ndarray, elements: np.ndarray) -> np.ndarray:
    return np.unique((arena.arena_offset(x) + elements * x.itemsize) // PAGE)


def versions(cluster, x: np.ndarray) -> np.ndarray:
    first = arena.arena_offset(x) // PAGE
    return cluster.paging.page_stats(first, x.nbytes // PAGE)["version"].astype(np.int64)


def page_sums(x: np.ndarray) -> np.ndarray:
    return x.reshape(-1, PAGE // 8).sum(axis=1)


def test_async_tracking_finds_exactly_the_written_pages(cluster, table):
    assert cluster.stats()["write_tracking"] == "async"  # Linux 6.7+: what CI and users run
    cluster.run(lambda t: float(t.sum()), table)  # the worker caches every page
    before = versions(cluster, table)
    drv = cluster.paging.stats()["driver"]

    rng = np.random.default_rng(7)
    written = rng.choice(len(table), 3000, replace=False)
    table[written] += 1.0  # scattered writes over all three chunks
    cluster.run(lambda t: 0, table)  # the next stage seals them

    changed = np.flatnonzero(versions(cluster, table) != before)
    first = arena.arena_offset(table) // PAGE
    assert set(changed + first) == set(pages_of(table, written))
    after = cluster.paging.stats()["driver"]
    assert after["cow_copies"] == drv["cow_copies"]  # nothing copied
    chunks = set(pages_of(table, written) // (CHUNK // PAGE))
    assert after["async_switches"] - drv["async_switches"] == len(chunks)  # one per chunk written
    assert after["pages_written"] - drv["pages_written"] == len(changed)
    # the worker dropped exactly those pages and reads the new bytes
    np.testing.assert_array_equal(cluster.run(page_sums, table), page_sums(table))


def test_writes_racing_the_switch_from_other_threads_are_never_lost(cluster, table):
    """Threads write big slices (numpy drops the GIL) while the driver moves chunks to
    async tracking and back; every stage's worker sees every write before it."""
    rng = np.random.default_rng(11)
    for round_ in range(6):
        cluster.run(lambda t: float(t.sum()), table)  # cache all pages on the worker

        def writer(seed: int) -> None:
            r = np.random.default_rng(seed)
            for _ in range(40):
                lo = int(r.integers(0, len(table) - 70_000))
                table[lo : lo + int(r.integers(1, 70_000))] = float(r.integers(2, 1000))

        threads = [threading.Thread(target=writer, args=(int(rng.integers(1 << 30)),)) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        np.testing.assert_array_equal(cluster.run(page_sums, table), page_sums(table), err_msg=f"round {round_}")


def test_a_pinned_epoch_keeps_its_bytes_and_a_released_one_says_it_is_gone(cluster, table):
    table[:] = 5.0
    cluster.run(lambda t: 0, table)
    old = cluster.last_epoch
    with cluster.keep_versions(old):  # pinned before the write: copied, as a replay needs
        table[10] = -1.0
        assert cluster.run(lambda t: float(t[10]), table) == -1.0
        assert cluster.run(lambda t: float(t[10]), table, epoch=old) == 5.0

    cluster.run(lambda t: 0, table)
    gone = cluster.last_epoch
    table[20] = -2.0  # nothing pinned `gone` when its stage ended: no copy was kept
    with pytest.raises(ClamorError, match="written arena pages since"):
        with cluster.keep_versions(gone):
            pass
    with pytest.raises(ClamorError, match="freed"):
        cluster.run(lambda t: float(t[20]), table, epoch=gone)
    assert cluster.run(lambda t: float(t[20]), table) == -2.0  # the cluster goes on

    cluster.run(lambda t: 0, table)
    unwritten = cluster.last_epoch
    with cluster.keep_versions(unwritten):  # no write since: its bytes are all there
        table[30] = -3.0
        assert cluster.run(lambda t: float(t[30]), table, epoch=unwritten) == 5.0


def test_without_async_write_protect_writes_are_trapped_but_not_copied(tmp_path):
    """Where the kernel lacks async write-protect (forced here with CLAMOR_WRITE_TRACKING=trap),
    the first write to each page still traps, but no old bytes are copied."""
    script = tmp_path / "trap.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, clamor
        x = clamor.empty(1 << 20, np.float64); x[:] = 1.0
        with clamor.Cluster(workers=1, page_size=4096, transport="tcp") as c:
            c.run(lambda a: float(a.sum()), x)
            x[::512] = 2.0  # one element in each of 2048 pages
            assert c.run(lambda a: float(a.sum()), x) == float(x.sum())
            s = c.stats(); d = c.paging.stats()["driver"]
            assert s["write_tracking"] == "trap", s["write_tracking"]
            assert d["cow_copies"] == 0 and d["uncopied_writes"] == 2048, d
            assert d["async_switches"] == 0
        print("ok")
    """))
    env = dict(os.environ, CLAMOR_WRITE_TRACKING="trap")
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
