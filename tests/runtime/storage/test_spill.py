"""Persisted partitions beyond a worker's budget (R3S; the `spill` option of docs/user-guide.md), on a real cluster.

Each worker's ``worker_memory`` is split between cached arena pages and the partitions
it keeps (on the driver's host, where pages are mapped in place, the cache gets 1/8). Beyond that, partitions spill: to the peer with the most free
memory while one has room, then to the worker's own disk (``spill="peer"``, the
default), or only to disk (``spill="disk"``). Tasks read them back without noticing; ``cluster.partitions()`` and
the worker stats say where each one lives.
"""

from __future__ import annotations

import glob
import os
import stat
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from clamor.runtime.paging.memory import ZERO_COPY_CACHE_SHARE

import clamor

MiB = 1 << 20


def room_for(mib: int) -> int:
    """A budget whose partition share holds ``mib`` MiB (and not a byte less); these
    clusters are local, so the page cache's share is the zero-copy one."""
    return int(mib * MiB / (1 - ZERO_COPY_CACHE_SHARE)) + 8


#: Budgets giving worker 0 room for 4 partitions of 1 MiB and worker 1 for 12.
BUDGETS = {0: room_for(4), 1: room_for(12)}
#: The tests count on each block's 8 tasks running four per worker, as first placed: no
#: straggler handling (on a loaded machine a task taken back from a "slow" worker, or a
#: speculative copy still running, would tilt the next placement).
STEADY = {"speculation": False, "speculation_factor": 1e6}


def one_mib(r) -> np.ndarray:
    """Partition ``r`` (a range of one number) as 1 MiB of that number."""
    return np.full(MiB // 8, float(r[0]), dtype=np.float64)


def totals(ds) -> list[float]:
    return ds.map_partitions(lambda x: [float(x.sum())]).collect()


def expected(first: int, n: int = 8) -> list[float]:
    return [float(i * (MiB // 8)) for i in range(first, first + n)]


def persist_block(cluster, first: int):
    """Eight 1 MiB partitions (values first..first+7), computed four per worker and kept."""
    ds = cluster.range(first, first + 8, partitions=8).map_partitions(one_mib).persist()
    assert totals(ds) == expected(first)
    return ds


def where(cluster, ds) -> list[tuple[int, str]]:
    parts = cluster.partitions()
    return [(parts[("ds", ds.id, i)]["holder"], parts[("ds", ds.id, i)]["tier"]) for i in range(8)]


def spill_files() -> list[str]:
    """The files this process's clusters' workers spilled to disk."""
    return glob.glob(os.path.join(tempfile.gettempdir(), f"clamor-spill-{os.getpid()}-*", "*", "*"))


def stats(cluster) -> dict[int, dict]:
    return {w["id"]: w for w in cluster.worker_stats()}


def test_partitions_over_a_budget_spill_to_the_peer_while_it_has_room_then_to_disk():
    with clamor.Cluster(workers=2, worker_memory=BUDGETS, **STEADY) as cluster:
        a = persist_block(cluster, 0)
        assert {tier for _, tier in where(cluster, a)} == {"memory"}
        assert 4 * MiB <= stats(cluster)[0]["partition_budget"] < 4 * MiB + 64

        b = persist_block(cluster, 8)  # worker 0 now keeps 8 MiB: 4 go to worker 1's memory
        s = stats(cluster)
        assert s[0]["spilled_to_peers"] == 4 and s[0]["spilled_to_disk"] == 0
        assert s[1]["guests_taken"] == 4 and s[1]["partitions_on_disk"] == 0
        assert s[0]["partition_bytes"] <= 4 * MiB and s[1]["partition_bytes"] <= 12 * MiB
        assert all(tier == "memory" for _, tier in where(cluster, a) + where(cluster, b))
        assert [h for h, _ in where(cluster, a)] == [1] * 8  # a's half from worker 0 moved there
        assert cluster.stats()["spilled_to_peers"] == 4  # summed over the workers

        c = persist_block(cluster, 16)  # both full now: what no peer has room for goes to disk
        s = stats(cluster)
        assert s[0]["spilled_to_disk"] + s[1]["spilled_to_disk"] >= 4
        assert s[0]["partition_bytes"] <= 4 * MiB and s[1]["partition_bytes"] <= 12 * MiB
        placed = where(cluster, a) + where(cluster, b) + where(cluster, c)
        assert sum(tier == "disk" for _, tier in placed) >= 4
        assert sum(w["partitions_on_disk"] for w in s.values()) == sum(t == "disk" for _, t in placed)

        # read back transparently, from memory, a peer's memory and disk alike
        assert totals(a) == expected(0) and totals(b) == expected(8) and totals(c) == expected(16)
        assert sum(w["read_from_disk"] for w in stats(cluster).values()) >= 1
        assert float(c.map_partitions(lambda x: [x.sum()]).sum()) == sum(expected(16))


def test_a_spilled_partition_whose_holder_is_killed_is_recomputed_through_lineage():
    # not replaced (restarts=0): a replacement forked at once would share the recomputation
    with clamor.Cluster(workers=2, worker_memory=BUDGETS, restarts=0, **STEADY) as cluster:
        a = persist_block(cluster, 0)
        persist_block(cluster, 8)  # a's partitions on worker 0 spill to worker 1
        # a spill rides the worker's next results message: the last one may come just after
        deadline = time.monotonic() + 10
        while [h for h, _ in where(cluster, a)] != [1] * 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [h for h, _ in where(cluster, a)] == [1] * 8
        before = cluster.lineage.recovery_counters()["tasks_recomputed"]

        cluster.kill_worker(1)  # the holder of every partition of a, spilled ones included

        assert totals(a) == expected(0)
        assert cluster.lineage.recovery_counters()["tasks_recomputed"] - before >= 8
        assert {h for h, _ in where(cluster, a)} == {0}  # recomputed on the survivor, over its
        assert stats(cluster)[0]["partition_bytes"] <= 4 * MiB  # budget: the rest on its disk


def test_spill_to_disk_only_keeps_peers_out_of_it_and_gives_the_same_results():
    with clamor.Cluster(workers=2, worker_memory=BUDGETS, **STEADY, spill="disk") as cluster:
        a = persist_block(cluster, 0)
        b = persist_block(cluster, 8)
        s = stats(cluster)
        assert s[1]["guests_taken"] == 0
        assert s[0]["spilled_to_disk"] == 4 and s[0]["partitions_on_disk"] == 4
        assert sum(tier == "disk" for _, tier in where(cluster, a) + where(cluster, b)) == 4
        assert totals(a) == expected(0) and totals(b) == expected(8)
        assert len(spill_files()) == 4
    assert spill_files() == []  # closing the cluster removes what its workers spilled


SPILL_AND_DIE = """
import os, sys, time
import numpy as np
import clamor
cluster = clamor.Cluster(workers=1, worker_memory=int(sys.argv[1]), spill="disk",
                         speculation=False)
ds = cluster.range(0, 8, partitions=8).map_partitions(
    lambda r: np.full((1 << 20) // 8, float(r[0]))).persist()
ds.count()
print(cluster.worker_stats()[0]["spilled_to_disk"], flush=True)
time.sleep(600)  # SIGKILLed here: nobody closes the cluster
"""


def test_spill_files_are_private_and_a_killed_drivers_are_swept_by_the_next_cluster(tmp_path):
    script = tmp_path / "spill_and_die.py"
    script.write_text(SPILL_AND_DIE)
    driver = subprocess.Popen([sys.executable, str(script), str(room_for(4))], stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert int(driver.stdout.readline()) >= 4  # 8 partitions of 1 MiB, room for 4
        folders = glob.glob(os.path.join(tempfile.gettempdir(), f"clamor-spill-{driver.pid}-*"))
        files = glob.glob(os.path.join(folders[0], "*", "*"))
        assert len(folders) == 1 and len(files) >= 4
        for path in [folders[0], *{os.path.dirname(f) for f in files}]:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
        assert {stat.S_IMODE(os.stat(f).st_mode) for f in files} == {0o600}
    finally:
        driver.kill()  # its workers follow it (parent-death signal); their files stay
        driver.wait()
    assert os.path.isdir(folders[0])
    with clamor.Cluster(workers=1):
        assert not os.path.exists(folders[0])  # a gone driver's folder: swept at the start


def test_bad_budgets_and_spill_policies_are_refused_before_any_worker_starts():
    with pytest.raises(ValueError, match="spill must be one of"):
        clamor.Cluster(workers=1, spill="tape")
    with pytest.raises(ValueError, match="is not a size"):
        clamor.Cluster(workers=1, worker_memory="lots")
    with pytest.raises(ValueError, match="must be positive"):
        clamor.Cluster(workers=1, worker_memory=0)
    with pytest.raises(ValueError, match="worker ids"):
        clamor.Cluster(workers=1, worker_memory={"w0": "1GiB"})


def test_the_default_budget_is_a_fair_share_of_this_hosts_memory():
    import psutil
    from clamor.runtime.paging import memory

    with clamor.Cluster(workers=2) as cluster:
        s = stats(cluster)
        share = int(psutil.virtual_memory().total * memory.HOST_SHARE) // 2
        assert s[0]["memory_budget"] == s[1]["memory_budget"] == share
        assert s[0]["partition_budget"] + s[0]["page_cache_budget"] == share


def test_a_worker_that_maps_pages_in_place_gives_its_budget_to_partitions():
    """On the driver's host N workers share one copy of the arena (zero copy): the page
    cache only holds old versions, so 7/8 of the budget is for partitions. A worker that
    copies what it reads (another host, or transport="tcp" here) caches 3/4."""
    with clamor.Cluster(workers=1, worker_memory="64MiB") as cluster:
        s = stats(cluster)[0]
        assert (s["page_cache_budget"], s["partition_budget"]) == (8 * MiB, 56 * MiB)
        assert s["cache_limit_pages"] == 8 * MiB // cluster.page_size
    with clamor.Cluster(workers=1, worker_memory="64MiB", transport="tcp") as cluster:
        s = stats(cluster)[0]
        assert (s["page_cache_budget"], s["partition_budget"]) == (48 * MiB, 16 * MiB)


def test_tasks_over_an_arena_array_go_where_its_pages_are_cached():
    """Placement by pages: a partition of an arena array runs on the worker caching its
    pages (by the driver's directory), whatever the worker-by-room order would say."""
    with clamor.Cluster(workers=2, transport="tcp", **STEADY) as cluster:
        x = clamor.array(8 * MiB // 8, np.float64)
        x[:] = np.arange(len(x)) % 7
        ds = cluster.parallelize(x, partitions=8)
        half = len(x) // 2
        # each worker caches the half that placement by room alone would give the other
        cluster.run_stage([(1, np.sum, (x[:half],)), (0, np.sum, (x[half:],))])
        before = {i: w["pages_fetched"] for i, w in stats(cluster).items()}

        sums = ds.map_partitions(lambda p: [float(p.sum())]).collect()

        assert sums == [float(p.sum()) for p in np.array_split(x, 8)]
        fetched = {i: w["pages_fetched"] - before[i] for i, w in stats(cluster).items()}
        assert fetched == {0: 0, 1: 0}  # every task found its pages where it ran


def test_spill_targets_are_the_other_workers_with_room_most_free_memory_first():
    from clamor.runtime.paging.memory import Budgets

    budgets = Budgets({0: 8 * MiB, 1: 24 * MiB, 2: 24 * MiB}, local_workers=3)
    budgets.zero_copy.update({0, 1, 2})  # on the driver's host: partitions 7, 21, 21 MiB
    held = {0: 7 * MiB, 1: 14 * MiB, 2: 20 * MiB}
    assert budgets.free(held, exclude=0, at_least=MiB) == [(1, 7 * MiB), (2, MiB)]
    assert budgets.free(held, exclude=1, at_least=2 * MiB) == []  # worker 0 is full, 2 nearly
