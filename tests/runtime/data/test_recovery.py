"""Recovery of lost work on a real cluster (docs/user-guide.md, "Failures"): worker processes SIGKILLed
(``cluster.kill_worker``) between or during stages; every result stays exact.

Lost persisted partitions and shuffle buckets are recomputed from lineage, reading
the arena at the epoch they were first computed at (the driver's version log), so a
persisted dataset stays the snapshot it was. Accumulators count every task once.
A killed worker is gone for good: each test starts its own cluster (one paging
cluster per process at a time, so each is closed before the next).
"""

from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest
from clamor.demo import geodata
from clamor.runtime.errors import NoWorkersError, WorkerLostError
from sklearn.neighbors import KDTree

import clamor


def recomputed(cluster) -> int:
    return cluster.lineage.recovery_counters()["tasks_recomputed"]


# --- Listing 3: a snapshot survives a kill after the driver's in-place update -----------------


def test_listing_3_prefs_stay_the_pre_update_answers_after_a_kill():
    with clamor.Cluster(workers=3) as cluster:
        points = geodata.scaled_points(200_000, seed=5)
        with clamor.shared():
            tree = KDTree(clamor.asarray(points), leaf_size=40)
        rng = np.random.default_rng(6)
        queries_np = points[rng.integers(0, len(points), 4000)] + rng.normal(scale=0.01, size=(4000, 2))
        queries = cluster.parallelize(queries_np, partitions=8)

        def nearest(q):
            dist, ind = tree.query(q, k=1)
            return np.column_stack([dist[:, 0], ind[:, 0]])

        before_ref = nearest(queries_np)
        prefs = queries.map_partitions(nearest).persist()
        assert prefs.count() == len(queries_np)
        computed_at = prefs.lineage().node(("ds", prefs.id, 0)).epoch

        data = tree.get_arrays()[0]  # the driver moves the first 500 queries' answers away
        data[np.unique(before_ref[:500, 1].astype(np.intp))] += 0.5
        after_ref = nearest(queries_np)
        assert (after_ref[:500, 1] != before_ref[:500, 1]).sum() >= 400  # partition 0 changes
        prefs2 = queries.map_partitions(nearest).persist()
        assert np.array_equal(prefs2.collect(), after_ref)

        victim = prefs.locations()[0]  # holds partition 0, whose answers the update changed
        lost = [i for i, w in enumerate(prefs.locations()) if w == victim]
        fetched = cluster.stats()["pages_fetched"]
        assert cluster.stats()["pages_mapped"] > 0  # one host: the tree is read in place
        cluster.kill_worker(victim)
        graph = prefs.lineage()
        assert [graph.node(("ds", prefs.id, i)).state for i in lost] == ["lost"] * len(lost)

        assert np.array_equal(prefs.collect(), before_ref)  # recomputed from the old versions
        assert cluster.stats()["pages_fetched"] > fetched  # copied from the version log
        assert np.array_equal(prefs2.collect(), after_ref)  # and the newer snapshot from its own
        graph = prefs.lineage()
        for i in range(8):
            node = graph.node(("ds", prefs.id, i))
            assert node.state == ("recomputed" if i in lost else "held")
            assert node.epoch == computed_at and node.holder in cluster.workers
        counters = cluster.lineage.recovery_counters()
        assert counters["read_set_mismatches"] == 0  # the same page versions as the first time
        assert counters["tasks_recomputed"] >= len(lost)


# --- a kill at a random moment of a four-stage job --------------------------------------------

N, KEYS, PARTS = 6000, 97, 12


def four_stage_job(cluster, calls) -> tuple[int, int]:
    """parallelize -> map (persisted) -> join (a shuffle) -> sum (partials, combine)."""

    def slow(part, delay=0.05):  # long enough for a kill to land inside a stage
        time.sleep(delay)
        return part

    def counted(part):
        calls.add((), len(part))
        return slow(part)

    pairs = cluster.parallelize(np.arange(N), partitions=PARTS).map_partitions(counted)
    pairs = pairs.map(lambda x: (int(x) % KEYS, int(x))).persist()
    squares = cluster.range(KEYS, partitions=3).map(lambda k: (k, k * k))
    products = pairs.join(squares, partitions=PARTS).map_partitions(slow)
    return products.map(lambda kv: kv[1][0] * kv[1][1]).sum(), pairs.count()


EXPECTED = sum(x * (x % KEYS) ** 2 for x in range(N))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_a_worker_killed_at_a_random_moment_of_a_four_stage_job(seed):
    rng = random.Random(seed)
    with clamor.Cluster(workers=3) as cluster:
        calls = cluster.accumulator((), dtype=np.int64)
        victim = rng.randrange(3)
        timer = threading.Timer(rng.uniform(0.02, 0.6), cluster.kill_worker, (victim,))
        timer.start()
        try:
            total, count = four_stage_job(cluster, calls)
        finally:
            timer.join()
        assert victim not in cluster.workers  # the kill did happen
        assert (total, count) == (EXPECTED, N)
        assert int(calls.value) == N  # every element counted once, whatever was rerun
        assert (total, count) == four_stage_job(cluster, calls)  # and the cluster goes on


def test_two_of_four_workers_killed_in_one_stage():
    with clamor.Cluster(workers=4) as cluster:
        calls = cluster.accumulator((), dtype=np.int64)
        pairs = cluster.range(4000, partitions=16).map(lambda x: (x % 10, x)).persist()
        assert pairs.count() == 4000

        def slow_sum(part):
            calls.add((), 1)
            time.sleep(0.1)
            return [sum(v for _, v in part)]

        stage = pairs.map_partitions(slow_sum)
        victims = sorted(set(pairs.locations()))[:2]
        timer = threading.Timer(0.15, lambda: [cluster.kill_worker(v) for v in victims])
        timer.start()
        try:
            assert stage.sum() == sum(range(4000))
        finally:
            timer.join()
        assert not set(victims) & set(cluster.workers)
        assert int(calls.value) == 16  # each of the 16 tasks counted once
        assert recomputed(cluster) >= 1  # pairs' partitions on the victims were rebuilt
        assert sorted(pairs.collect()) == sorted((x % 10, x) for x in range(4000))


def test_all_workers_killed_gives_a_clear_error_not_a_hang():
    with clamor.Cluster(workers=2, restarts=0) as cluster:  # nobody replaces them
        ds = cluster.range(40, partitions=8).map_partitions(lambda p: time.sleep(0.2) or list(p))
        outcome: list[BaseException | object] = []

        def act() -> None:
            try:
                outcome.append(ds.sum())
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome.append(exc)

        thread = threading.Thread(target=act)
        thread.start()
        time.sleep(0.3)
        for worker in (0, 1):
            cluster.kill_worker(worker)
        thread.join(timeout=30)
        assert not thread.is_alive(), "the action hung after every worker was lost"
        (error,) = outcome
        assert isinstance(error, WorkerLostError), error  # as docs/user-guide.md says
        assert "worker" in str(error) and ("lost" in str(error) or "no live" in str(error))


def test_an_action_with_no_worker_left_nor_starting_fails_at_once_and_scale_brings_them_back():
    """Every worker lost and the restart budget spent: the next action does not wait for
    a worker that will never come; its error says why, and what brings workers back."""
    with clamor.Cluster(workers=1, restarts=0) as cluster:
        cluster.kill_worker(0)
        start = time.monotonic()
        with pytest.raises(NoWorkersError) as failed:
            cluster.run(lambda: "never", timeout=30)  # not an ActionTimeoutError after 30 s
        assert time.monotonic() - start < 10
        assert "worker 0 was lost (pid" in str(failed.value)
        assert "not replaced: 0 were replaced in the last 60 s (restarts=0)" in str(failed.value)
        assert "cluster.scale(n) starts new ones" in str(failed.value)
        with pytest.raises(NoWorkersError):
            cluster.range(4, partitions=2).collect(timeout=30)
        assert cluster.scale(1) == [1]
        assert cluster.run(lambda: "back") == "back"


def test_all_workers_killed_mid_action_are_replaced_and_the_action_completes():
    with clamor.Cluster(workers=2) as cluster:
        ds = cluster.range(40, partitions=8).map_partitions(lambda p: time.sleep(0.2) or list(p))
        threading.Timer(0.3, lambda: [cluster.kill_worker(w) for w in (0, 1)]).start()
        assert ds.sum() == sum(range(40))
        assert len(cluster.wait_for_workers(timeout=60)) == 2 and not {0, 1} & set(cluster.workers)
        assert cluster.counters()["workers_replaced"] == 2
