"""Parked chunks: an update between stages pays for its writes, not for a refault per page.

What a user relies on: the driver's arena array that it updates between stages (a
parameter server's weights) keeps its page tables across the stages: at a stage start its
64 MiB chunks are parked (their tables moved aside whole), and the first touch after the
stage moves them back, so the next update writes at memory speed. A parked chunk keeps
every version promise: a driver write during a running stage is not seen by that stage
and is by the next; a page never written reads as zeros; a driver read between stages
does not stop ``keep_versions`` from pinning the last epoch, and a write after the pin
keeps the old bytes.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

import numpy as np
import pytest
from clamor.runtime.paging import arena
from clamor.testing.zero_copy import read_twice, start_and_wait_until_mapped

import clamor

pytestmark = pytest.mark.slow

PAGE = 64 << 10
OS_PAGE = 4096
CHUNK = 64 << 20  # write_tracking.h: CL_WT_CHUNK_BYTES


@pytest.fixture
def cluster():
    with clamor.Cluster(workers=1, page_size=PAGE) as c:  # transport "auto": zero copy here
        yield c


def present(addresses: list[int]) -> list[bool]:
    """Whether this process's page tables map each virtual address (/proc/self/pagemap)."""
    out = []
    with open("/proc/self/pagemap", "rb") as f:
        for a in addresses:
            f.seek(a // OS_PAGE * 8)
            out.append(bool(struct.unpack("<Q", f.read(8))[0] >> 63))
    return out


def driver(cluster) -> dict:
    return cluster.stats()["driver"]


def test_an_update_between_stages_finds_its_page_tables_where_it_left_them(cluster):
    w = clamor.empty(CHUNK // 8, np.float64)  # a chunk's worth: the update stays in one or two
    w[:] = 0.0
    touched = np.random.default_rng(3).choice(len(w), 500, replace=False)
    cluster.run(lambda a: 0, w)
    w[touched] += 1.0  # the chunks go over to async tracking
    before = driver(cluster)
    cluster.run(lambda a: float(a[touched].sum()), w)  # the stage start parks them

    after = driver(cluster)
    assert after["parks"] > before["parks"]
    assert not any(present([w.ctypes.data + int(i) * 8 for i in touched]))  # the tables are aside
    w[touched[0]] += 1.0  # the first touch unparks its chunk whole
    now = driver(cluster)
    assert now["unparks"] > after["unparks"], {k: (after[k], now[k]) for k in now if now[k] != after[k]}
    chunk = (arena.arena_offset(w) + touched * 8) // CHUNK  # chunks count from the arena's start
    same_chunk = [int(i) for i in touched[chunk == chunk[0]]]
    assert all(present([w.ctypes.data + i * 8 for i in same_chunk]))  # not refaulted: moved back
    w[touched] += 1.0
    assert cluster.run(lambda a, i: a[i].tolist(), w, touched) == w[touched].tolist()
    assert driver(cluster)["cow_copies"] == before["cow_copies"]  # no old bytes were needed


def one_chunk() -> np.ndarray:
    """A float64 array that is exactly one write-tracking chunk of the arena."""
    x = clamor.empty(2 * CHUNK // 8, np.float64)
    k = (-arena.arena_offset(x)) % CHUNK // 8
    return x[k : k + CHUNK // 8]


def never_written(x: np.ndarray) -> int:
    """An element of ``x`` whose OS page is made a hole in the arena's memfd (as if never
    written), not the first OS page of its arena page: reading it while its chunk is
    parked is a MISSING fault on a page that does not exist yet."""
    i = len(x) // 2 + OS_PAGE // 8 + 7  # x starts on a chunk: this is an arena page's second OS page
    off = (arena.arena_offset(x) + i * 8) // OS_PAGE * OS_PAGE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    punch_hole = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    if libc.fallocate(arena.get_arena().fd, punch_hole, off, OS_PAGE) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
    assert os.lseek(arena.get_arena().fd, off, os.SEEK_HOLE) == off
    return i


def test_chunks_start_on_a_page_table_boundary():
    """The arena starts on a 2 MiB boundary, so each 64 MiB chunk does: parking moves its
    page tables a table at a time, not one entry per OS page (the slot is aligned too)."""
    assert arena.get_arena().base % (2 << 20) == 0


def chunks(n: int) -> np.ndarray:
    """A float64 array of exactly ``n`` adjacent write-tracking chunks of the arena."""
    x = clamor.empty((n + 1) * CHUNK // 8, np.float64)
    k = (-arena.arena_offset(x)) % CHUNK // 8
    return x[k : k + n * CHUNK // 8]


def test_adjacent_chunks_written_between_stages_are_parked_in_one_go_and_unparked_one_by_one(cluster):
    x = chunks(4)
    x[:] = 1.0
    per_chunk = CHUNK // 8
    cluster.run(lambda a: 0, x)
    x[::per_chunk] = 2.0  # one write in each: all four go over to async tracking
    before = driver(cluster)
    assert cluster.run(lambda a, n: a[::n].tolist(), x, per_chunk) == [2.0] * 4  # its start parks them
    after = driver(cluster)
    assert (after["parks"] - before["parks"], after["park_runs"] - before["park_runs"]) == (4, 1)
    assert not any(present([x[i * per_chunk :].ctypes.data for i in range(4)]))

    x[2 * per_chunk + 9] = 3.0  # unparks the third chunk alone
    assert present([x[i * per_chunk :].ctypes.data for i in range(4)]) == [False, False, True, False]
    x[per_chunk + 9] = 3.0  # and the second: two mremaps back, perhaps two mappings now
    assert cluster.run(lambda a, n: a[n + 9] + a[2 * n + 9], x, per_chunk) == 6.0
    again = driver(cluster)
    assert again["parks"] - after["parks"] == 2  # in one go or, over two mappings, one by one
    assert cluster.run(lambda a: float(a.sum()), x) == float(x.sum()) == len(x) + 4 + 4
    assert driver(cluster)["cow_copies"] == before["cow_copies"]


def test_a_write_to_a_parked_chunk_during_a_stage_is_not_seen_by_it(cluster):
    x = one_chunk()
    x[5] = 1.0
    hole = never_written(x)
    cluster.run(lambda a: 0, x)
    x[5] = 1.0  # async now: the next stage start parks the chunk
    before = driver(cluster)
    result: list = []
    stage = threading.Thread(target=lambda: result.append(cluster.run(read_twice, x, worker=0)))
    start_and_wait_until_mapped(cluster, x, stage)
    assert driver(cluster)["parks"] == before["parks"] + 1
    assert x[hole] == 0.0  # a page never written, read while the chunk is parked
    x[5] = 2.0  # the stage reads epoch E: the old bytes are kept and the worker unmaps
    stage.join(30)
    assert result == [(1.0, 1.0)]
    after = driver(cluster)
    assert after["parked_faults"] == before["parked_faults"] + 2  # mapped one by one, not unparked
    assert after["unparks"] == before["unparks"]
    assert after["cow_copies"] == before["cow_copies"] + 1
    assert cluster.run(lambda a, i: (float(a[5]), float(a[i])), x, hole, worker=0) == (2.0, 0.0)


def test_a_read_between_stages_leaves_the_last_epoch_pinnable(cluster):
    x = one_chunk()
    x[:] = 5.0
    cluster.run(lambda a: 0, x)
    x[7] = 5.0  # async
    cluster.run(lambda a: 0, x)  # parked; nothing pinned this epoch when it ended
    epoch = cluster.last_epoch
    assert float(x[100]) == 5.0  # a read unparks the chunk, but writes nothing
    copies = driver(cluster)["cow_copies"]
    with cluster.keep_versions(epoch):
        x[7] = -1.0  # must keep the old bytes now: the chunk traps again
        assert cluster.run(lambda a: float(a[7]), x, epoch=epoch) == 5.0
        assert cluster.run(lambda a: float(a[7]), x) == -1.0
    assert driver(cluster)["cow_copies"] == copies + 1


def test_the_arena_reads_and_writes_normally_after_the_cluster_closes():
    """Closing the cluster with chunks parked leaves the arena a plain shared mapping."""
    x = clamor.empty(CHUNK // 8, np.float64)
    x[:] = 3.0
    with clamor.Cluster(workers=1, page_size=PAGE) as c:
        c.run(lambda a: 0, x)
        x[::4096] = 4.0
        c.run(lambda a: 0, x)  # parked
        assert c.stats()["driver"]["parks"] > 0
    assert float(x[0]) == 4.0 and float(x[1]) == 3.0
    x[1] = 6.0
    assert float(x.sum()) == 3.0 * len(x) + (4.0 - 3.0) * len(x[::4096]) + 3.0
