"""Exact read sets (``read_sets="exact"``): every task starts with the arena range
unmapped, so its read set is just the pages it touched, at a fault per page per task
(resident read sets, the default, are in test_resident.py). ``clamor.gather`` reads its
rows through the arena here, so its read set is exact too."""

from __future__ import annotations

import numpy as np
import pytest
from clamor.runtime.paging import arena

import clamor

pytestmark = pytest.mark.slow

PAGE = 64 << 10
PER = PAGE // 8


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_exact_read_sets_are_just_the_pages_touched(transport):
    x = clamor.array(96 * PER, np.int64)
    x[:] = np.arange(len(x))
    touch = [3 * PER, 50 * PER + 1, 90 * PER + 2]
    pages = {(arena.arena_offset(x) + i * 8) // PAGE for i in touch}
    with clamor.Cluster(workers=1, page_size=PAGE, transport=transport, read_sets="exact") as cluster:
        for _ in range(2):  # every task starts unmapped: the same read set each time
            assert cluster.run(lambda a, ix: int(a[ix].sum()), x, touch) == sum(touch)
            assert {p for p, _ in cluster.last_read_sets[0]} == pages
        assert cluster.worker_stats()[0]["unmap_all"] >= 2


def test_a_gather_reads_its_rows_page_by_page_and_records_each():
    x = clamor.array(96 * PER, np.float64)
    x[:] = np.arange(len(x))
    ids = np.array([3, 50 * PER + 1, 96 * PER - 1])
    with clamor.Cluster(workers=1, page_size=PAGE, transport="tcp", read_sets="exact") as cluster:
        assert cluster.run(lambda a, i: clamor.gather(a, i), x, ids).tolist() == ids.astype(float).tolist()
        assert cluster.worker_stats()[0]["rows_gathered"] == 0  # not asked of the driver as rows
        assert {p for p, _ in cluster.last_read_sets[0]} == {(arena.arena_offset(x) + i * 8) // PAGE for i in ids}
