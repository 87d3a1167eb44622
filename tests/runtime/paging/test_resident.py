"""Resident read sets: the repeat pass costs what shared memory costs.

Workers keep their arena mappings across tasks and stages for as long as the mapped
versions are current, on every transport: a stage run again over unchanged pages
faults nothing. A driver write between stages unmaps just the written page, and the
next stage reads the new bytes; a replay at an older epoch starts from an empty range.
A task's read set is every page its worker has resident: a superset of the pages it
read, checked here against a trace of what each task touched (``read_sets="exact"``
keeps the per-task read sets of before: test_exact_read_sets.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from clamor.runtime.paging import arena
from clamor.runtime.paging.read_sets import ReadSet, ReadSetCache, encode

import clamor

pytestmark = pytest.mark.slow

PAGE = 64 << 10
PER = PAGE // 8
PAGES = 96  # 6 MiB: three fault-around blocks of 2 MiB
COUNTERS = ("faults", "soft_faults", "pages_mapped", "pages_fetched", "unmap_all")


@pytest.fixture(scope="module", params=["shm", "shm-copy", "tcp"])
def cluster(request):
    with clamor.Cluster(workers=2, page_size=PAGE, transport=request.param) as c:
        yield c


@pytest.fixture
def table(cluster) -> np.ndarray:
    x = clamor.array(PAGES * PER, np.int64)
    x[:] = 7 * np.arange(len(x)) + 3
    return x  # back to the arena when the test drops it


def lookups(a: np.ndarray, seed: int, n: int) -> tuple[int, list[int]]:
    """Random lookups over all of ``a``: their sum and the indices read (the trace)."""
    idx = np.random.default_rng(seed).integers(0, len(a), n)
    return int(a[idx].sum()), idx.tolist()


def counters(cluster) -> list[dict[str, int]]:
    return [{k: w[k] for k in COUNTERS} for w in sorted(cluster.worker_stats(), key=lambda w: w["id"])]


def pages_of(a: np.ndarray, indices: list[int]) -> set[int]:
    return set(((arena.arena_offset(a) + np.asarray(indices) * 8) // PAGE).tolist())


def run_lookups(cluster, table, seeds=(1, 2, 3, 4), n=20_000):
    stage = [(w, lookups, (table, seed, n)) for w, seed in zip((0, 1, 0, 1), seeds)]
    return cluster.run_stage(stage), cluster.last_read_sets


def test_a_repeated_stage_faults_no_page_after_the_first(cluster, table):
    first, _ = run_lookups(cluster, table)
    before = counters(cluster)
    for _ in range(3):
        again, _ = run_lookups(cluster, table)
        assert again == first
    assert counters(cluster) == before  # no fault, fetch, mapping or unmapping since


def test_a_read_set_covers_every_page_its_task_read(cluster, table):
    results, read_sets = run_lookups(cluster, table, seeds=(5, 6, 7, 8))
    for (total, trace), read_set in zip(results, read_sets):
        assert total == int((7 * np.asarray(trace) + 3).sum())
        read = {p for p, _ in read_set}
        assert pages_of(table, trace) <= read
        assert all(v >= 1 for _, v in read_set)


def test_a_write_between_stages_is_read_by_the_next_stage_and_unmaps_one_page(cluster, table):
    cluster.run_stage([(0, lookups, (table, 9, 20_000))])
    before = counters(cluster)[0]
    k = 40 * PER + 11
    table[k] = -1
    page = next(iter(pages_of(table, [k])))
    value, read_set = cluster.run(lambda a, i: int(a[i]), table, k, worker=0), cluster.last_read_sets[0]
    assert value == -1
    assert (page, cluster.last_epoch) in list(read_set)  # the new version, from this stage
    after = counters(cluster)[0]
    moved = (after["pages_mapped"] - before["pages_mapped"]) + (after["pages_fetched"] - before["pages_fetched"])
    assert moved == 1  # only the written page came again
    assert after["unmap_all"] == before["unmap_all"]


def test_a_resident_read_set_travels_as_maximal_runs_split_where_a_version_changes(cluster, table):
    cluster.run_stage([(0, lookups, (table, 11, 20_000))])  # every table page resident on worker 0
    k = 50 * PER
    table[k] = -5  # its page gets the next stage's version; its neighbours keep theirs
    assert cluster.run(lambda a, i: int(a[i]), table, k, worker=0) == -5
    read_set = cluster.last_read_sets[0]
    page = next(iter(pages_of(table, [k])))
    versions = dict(zip(read_set.pages().tolist(), read_set.versions().tolist()))
    assert versions[page] == cluster.last_epoch
    assert versions[page - 1] < cluster.last_epoch and versions[page + 1] < cluster.last_epoch
    assert read_set.runs == len(encode(read_set.pages(), read_set.versions())) // 16  # none split needlessly


def test_a_replay_at_an_older_epoch_reads_old_bytes_then_the_current_stage_new_ones(cluster, table):
    k = 70 * PER + 5
    assert cluster.run(lambda a, i: int(a[i]), table, k, worker=1) == 7 * k + 3
    old = cluster.last_epoch
    with cluster.keep_versions(old):
        table[k] = 123
        assert cluster.run(lambda a, i: int(a[i]), table, k, worker=1) == 123
        page, written_at = next(iter(pages_of(table, [k]))), cluster.last_epoch
        assert cluster.run(lambda a, i: int(a[i]), table, k, worker=1, epoch=old) == 7 * k + 3
        replayed = dict(cluster.last_read_sets[0])  # the versions the page had at the old epoch
        assert 1 <= replayed[page] <= old < written_at
        assert cluster.run(lambda a, i: int(a[i]), table, k, worker=1) == 123
        assert (page, written_at) in list(cluster.last_read_sets[0])
        total, trace = cluster.run(lookups, table, 10, 5_000, worker=1)  # every page again, current
    expected = 7 * np.asarray(trace) + 3
    expected[np.asarray(trace) == k] = 123
    assert total == int(expected.sum())


def test_a_bad_read_set_mode_is_refused():
    with pytest.raises(ValueError, match="read_sets must be one of"):
        clamor.Cluster(workers=1, read_sets="everything")


def test_read_sets_travel_as_runs_and_compare_as_pairs():
    pages = np.array([3, 4, 5, 9, 10], np.uint64)
    versions = np.array([1, 1, 2, 2, 2], np.uint32)
    runs = encode(pages, versions)
    assert len(runs) == 3 * 16  # (3..4 @1), (5 @2), (9..10 @2)
    read_set = ReadSet(runs)
    assert read_set == [(3, 1), (4, 1), (5, 2), (9, 2), (10, 2)]
    assert len(read_set) == 5 and read_set.runs == 3
    assert read_set == ReadSet.of([(10, 2), (3, 1), (9, 2), (5, 2), (4, 1)])
    assert read_set.pages().tolist() == pages.tolist()
    assert read_set.versions().tolist() == versions.tolist()
    assert ReadSet(encode(np.arange(16384, dtype=np.uint64), np.ones(16384, np.uint32))).runs == 1
    assert not read_set.conflicts(ReadSet.of([(4, 1), (10, 2), (11, 7)]))  # pages in both agree
    assert read_set.conflicts(ReadSet.of([(5, 3)]))  # page 5: version 2, then 3


def test_a_resident_read_set_keeps_its_pages_as_runs_and_one_version_a_page_beside_them():
    """As the driver fills in a resident set's versions: the same pairs, runs and equality
    as the form whose runs carry their versions, without a run per page."""
    pages_only = encode(np.array([3, 4, 5, 9, 10], np.uint64), np.zeros(5, np.uint32))
    assert len(pages_only) == 2 * 16  # (3..5), (9..10)
    dense = ReadSet(pages_only, np.array([1, 1, 2, 2, 2], np.uint32))
    assert dense == [(3, 1), (4, 1), (5, 2), (9, 2), (10, 2)]
    assert dense == ReadSet.of(list(dense)) and hash(dense) == hash(ReadSet.of(list(dense)))
    assert dense.runs == 3 and dense.packed() == ReadSet.of(list(dense)).packed()
    assert dense.page_runs() == pages_only
    assert dense.conflicts(ReadSet.of([(5, 3)])) and not dense.conflicts(ReadSet.of([(9, 2)]))
    alternating = ReadSet(encode(np.arange(1000, dtype=np.uint64), np.zeros(1000, np.uint32)),
                          np.arange(1000, dtype=np.uint32) % 2)  # fmt: skip
    assert alternating.runs == 1000 and repr(alternating) == "ReadSet(1000 pages in 1000 run(s), versions 0..1)"
    with pytest.raises(ValueError, match="3 versions for a read set of 5 pages"):
        ReadSet(pages_only, np.zeros(3, np.uint32))


def test_on_the_drivers_host_every_written_page_is_invalidated(cluster, request):
    """A worker's copy from the driver's memfd ("shm-copy") reaches the driver's
    directory by a notice that can arrive after the next stage has started (the copy
    would then outlive the write). So on the driver's host, where workers map pages in
    place or copy them from the memfd, the driver invalidates every written page, not
    only the pages it knows are held; over TCP every copy is the driver's answer, so
    the directory knows it at once."""
    a = clamor.asarray(np.zeros(PAGES * PER))
    cluster.run(abs, 1)  # a stage: a's pages sealed at a version; no worker read one
    before = cluster.paging.stats()["invalidations"]
    a[5 * PER] = 1.0  # a page no holder is known of
    assert cluster.run(lambda x: float(x[5 * PER]), a) == 1.0
    listed = cluster.paging.stats()["invalidations"] - before
    assert listed == (0 if request.node.callspec.params["cluster"] == "tcp" else 1)


class PageTable:
    """A driver's page versions by epoch, for ReadSetCache: ``seal(epoch, pages)`` gives
    ``pages`` that version; ``versions_at`` answers as the driver does (and counts pages)."""

    def __init__(self) -> None:
        self.history: list[dict[int, int]] = [{}]  # per epoch: page -> version sealed then
        self.asked = 0

    def seal(self, pages) -> int:
        self.history.append({int(p): len(self.history) for p in pages})
        return len(self.history) - 1

    def version(self, page: int, epoch: int) -> int:
        return max((e for e in range(1, epoch + 1) if page in self.history[e]), default=0)

    def versions_at(self, runs: bytes, epoch: int) -> np.ndarray:
        pages = ReadSet(runs).pages().tolist()
        self.asked += len(pages)
        return np.array([self.version(p, epoch) for p in pages], np.uint32)


def test_a_resident_sets_versions_at_a_new_epoch_come_from_the_seals_since_without_reading_the_page_table():
    table, cache = PageTable(), ReadSetCache()
    resident = ReadSet(encode(np.r_[np.arange(0, 16), np.arange(32, 48)].astype(np.uint64), np.zeros(32, np.uint32)))
    rng = np.random.default_rng(4)
    epochs = []
    for _ in range(12):
        written = np.unique(rng.integers(0, 64, 5)).astype(np.uint64)
        epochs.append(table.seal(written))
        cache.sealed(epochs[-1], written)
    cache.sealed(table.seal([]), np.empty(0, np.uint64))
    epochs.append(len(table.history) - 1)
    for epoch in (3, 4, 9, 13, 2, 13):  # forward, then a replay at an older epoch, then forward
        before = table.asked
        got = cache.at(resident, epoch, table.versions_at)
        assert got == [(p, table.version(p, epoch)) for p in resident.pages().tolist()], epoch
        if epoch in (4, 9, 13):  # forward from a known epoch: the seals say it all
            assert table.asked == before
    assert cache.at(resident, 13, table.versions_at) is got  # nothing sealed since: the same set
    cache.sealed(table.seal([40]), None)  # a stage start whose sealed pages are not known
    before = table.asked
    assert cache.at(resident, 14, table.versions_at) == [(p, table.version(p, 14)) for p in resident.pages().tolist()]
    assert table.asked - before == len(resident)  # read again whole
