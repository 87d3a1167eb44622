"""Lineage of partitions (runtime/data/lineage.py; docs/user-guide.md, "Failures"): what is
recorded, the graph widgets draw, the version floor, and recovery of lost partitions on the in-process runner.

``InlineRunner.lose(worker)`` forgets a simulated worker's partitions; a runner
subclass injects losses between or during stages. Real processes and SIGKILL are
in tests/runtime/data/test_recovery.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from clamor.runtime.data import lineage
from clamor.runtime.data.inline import InlineRunner
from clamor.runtime.errors import WorkerLostError
from clamor.runtime.stage import StageSpec

import clamor


@pytest.fixture
def runner() -> InlineRunner:
    return InlineRunner(workers=2)


def recompute_stages(runner: InlineRunner) -> list[StageSpec]:
    return [s for s in runner.stages if s.name.startswith("recompute")]


def epoch_of(runner: InlineRunner, name: str) -> int:
    """The epoch of the first stage called ``name`` (the inline runner counts one per stage)."""
    return next(k for k, s in enumerate(runner.stages, 1) if s.name == name)


def states(ds) -> list[str]:
    """The state of each of ``ds``'s own partitions in its lineage graph."""
    graph = ds.lineage()
    return [graph.node(("ds", ds.id, i)).state for i in range(ds.num_partitions)]


class LoseAfter(InlineRunner):
    """Loses worker 1's partitions once, right after the first stage whose name contains
    ``after``; or during it (``during=True``: that stage fails with ``WorkerLostError``,
    merging nothing, as a cluster's stage does)."""

    def __init__(self, after: str, during: bool = False) -> None:
        super().__init__(workers=2)
        self.after, self.during, self.fired = after, during, False

    def execute(self, stage: StageSpec) -> list:
        fire = not self.fired and self.after in stage.name
        self.fired |= fire
        if fire and self.during:
            self.stages.append(stage)
            self.lose(1)
            raise WorkerLostError(1, "lost in a test")
        results = super().execute(stage)
        if fire:
            self.lose(1)
        return results


# --- the graph ------------------------------------------------------------------------------


def test_one_node_per_partition_of_the_dataset_and_of_its_ancestors(runner):
    base = runner.parallelize(list(range(40)), partitions=4)
    pairs = base.map(lambda x: (x % 5, x)).persist()
    table = runner.range(5, partitions=2).map(lambda k: (k, -k))
    joined = pairs.filter(lambda kv: kv[1] > 3).join(table, partitions=3)
    graph = joined.lineage()

    filtered = joined._node.sides[0]
    expected = {(d, i) for d, n in [(base.id, 4), (pairs.id, 4), (filtered.id, 4), (joined.id, 3)] for i in range(n)}
    expected |= {(table.id, 0), (table.id, 1), (table._node.parent.id, 0), (table._node.parent.id, 1)}
    assert {(n.dataset, n.index) for n in graph.nodes} == expected
    assert len(graph.nodes) == len(expected)
    # narrow steps: partition i from partition i; the join's partitions from every partition of both sides
    assert graph.parents(("ds", pairs.id, 2)) == [("ds", base.id, 2)]
    assert set(graph.parents(("ds", joined.id, 1))) == {("ds", filtered.id, i) for i in range(4)} | {
        ("ds", table.id, i) for i in range(2)
    }
    assert graph.node(("ds", filtered.id, 0)).ops == ("filter",)  # it reads pairs: persisted
    assert graph.node(("ds", pairs.id, 0)).ops == ("parallelize", "map")
    assert graph.states() == {"not computed": len(expected)}  # nothing has run yet


def test_a_persisted_partition_records_its_ops_epoch_and_task(runner):
    ds = (
        runner.parallelize(list(range(8)), partitions=4)
        .map_partitions(lambda p: [x * 10 for x in p])
        .filter(lambda x: x != 30)
        .persist()
    )
    assert ds.count() == 7
    partials = runner.stages[0]
    assert partials.name == "count: filter (partials)"
    epoch = epoch_of(runner, partials.name)
    graph = ds.lineage()
    for i in range(4):
        node = graph.node(("ds", ds.id, i))
        assert node.ops == ("parallelize", "map_partitions", "filter")
        assert (node.state, node.epoch, node.holder) == ("held", epoch, runner.holder(("ds", ds.id, i)))
        record = ds._runner.lineage.get(("ds", ds.id, i))
        assert (record.run.index, record.run.stage, record.run.inputs) == (i, partials.name, ())
    later = ds.map(lambda x: x + 1).persist()
    assert later.sum() == sum(x * 10 + 1 for x in range(8) if x != 3)
    node = later.lineage().node(("ds", later.id, 2))
    assert node.ops == ("map",) and node.epoch > epoch
    assert ds._runner.lineage.get(("ds", later.id, 2)).run.inputs == (("ds", ds.id, 2),)  # read, not recomputed


def test_a_persisted_join_comes_from_the_partitions_that_left_it_buckets(runner):
    left = runner.parallelize([(k, k) for k in (0, 0, 1)], partitions=3)  # keys 0 and 1 only
    right = runner.parallelize([(0, "a"), (1, "b")], partitions=1)
    joined = left.join(right, partitions=2).persist()
    assert sorted(joined.collect()) == [(0, (0, "a")), (0, (0, "a")), (1, (1, "b"))]
    graph = joined.lineage()
    # bucket 0 of every map partition is always kept; bucket 1 only where key 1 is
    assert set(graph.parents(("ds", joined.id, 1))) == {
        ("ds", left.id, 0), ("ds", left.id, 2), ("ds", right.id, 0),
    }  # fmt: skip
    assert graph.node(("ds", joined.id, 1)).ops == ("join",)


def test_lineage_graph_is_plain_data_for_widgets(runner):
    ds = runner.range(6, partitions=3).map(lambda x: x).persist()
    ds.count()
    data = json.loads(json.dumps(ds.lineage().to_dict()))
    assert [n["id"] for n in data["nodes"]] == [f"{ds._node.parent.id}:{i}" for i in range(3)] + [
        f"{ds.id}:{i}" for i in range(3)
    ]
    assert data["edges"][0] == [f"{ds._node.parent.id}:0", f"{ds.id}:0"]
    assert {n["state"] for n in data["nodes"]} == {"held", "not computed"}
    import networkx as nx
    graph = ds.lineage().to_networkx()
    assert isinstance(graph, nx.DiGraph) and graph.number_of_nodes() == 6 and graph.number_of_edges() == 3


# --- recovery ---------------------------------------------------------------------------------


def test_lost_partitions_are_lost_then_recomputed_at_the_epoch_they_were_computed(runner):
    ds = runner.range(8, partitions=4).map(lambda x: x * 2).persist()
    ds.count()
    first = epoch_of(runner, "count: map (partials)")
    runner.range(3).count()  # later stages: the epoch moves on
    assert runner.last_epoch > first
    on_worker_1 = [i for i, w in enumerate(ds.locations()) if w == 1]
    runner.lose(1)
    assert [states(ds)[i] for i in on_worker_1] == ["lost"] * len(on_worker_1)
    assert ds.collect() == [2 * x for x in range(8)]
    (stage,) = recompute_stages(runner)
    assert stage.epoch == first and len(stage.tasks) == len(on_worker_1)
    assert [s == "recomputed" for s in states(ds)] == [i in on_worker_1 for i in range(4)]
    assert runner.lineage.counters.tasks_recomputed == len(on_worker_1) == runner.tasks_recomputed


def test_partitions_computed_at_different_epochs_are_recomputed_in_one_stage_per_epoch(runner):
    ds = runner.range(40, partitions=4).map(lambda x: x).persist()
    assert ds.take(3) == [0, 1, 2]  # partition 0 only
    assert ds.sum() == sum(range(40))  # partitions 1-3, later
    take_epoch, sum_epoch = epoch_of(runner, "take: map"), epoch_of(runner, "sum: map (partials)")
    runner.lose(0)
    runner.lose(1)
    assert states(ds) == ["lost"] * 4
    assert ds.collect() == list(range(40))
    assert [(s.epoch, len(s.tasks)) for s in recompute_stages(runner)] == [(take_epoch, 1), (sum_epoch, 3)]


def test_buckets_lost_between_the_map_and_the_reduce_stage_are_recomputed_alone():
    runner = LoseAfter("shuffle for join")
    calls = runner.accumulator((), dtype=np.int64)

    def counted(x):
        calls.add((), 1)
        return (x % 3, x)

    left = runner.range(30, partitions=6).map(counted)
    joined = left.join(runner.parallelize([(0, "z"), (1, "o"), (2, "t")], 1))
    assert sorted(joined.collect()) == sorted((x % 3, (x, "zot"[x % 3])) for x in range(30))
    (stage,) = recompute_stages(runner)
    map_stage = next(s for s in runner.stages if "shuffle for join" in s.name)
    assert len(stage.tasks) == sum(1 for k in range(len(map_stage.tasks)) if k % 2 == 1)  # worker 1's
    assert int(calls.value) == 30  # the recomputed map tasks' updates are not counted again
    assert not {k for k in runner.held() if k[0] != "par"}  # recomputed buckets dropped too


def test_a_stage_that_loses_a_worker_runs_again_and_counts_accumulators_once():
    runner = LoseAfter("(partials)", during=True)
    calls = runner.accumulator((), dtype=np.int64)
    ds = runner.range(20, partitions=4).map(lambda x: calls.add((), 1) or x)
    assert ds.sum() == sum(range(20))
    names = [s.name for s in runner.stages]
    assert names.count("sum: map (partials)") == 2  # failed once (nothing merged), then again
    assert int(calls.value) == 20


def test_a_persisted_partition_after_a_shuffle_is_rebuilt_from_the_buckets_lineage(runner):
    calls = runner.accumulator((), dtype=np.int64)
    pairs = runner.range(12, partitions=3).map(lambda x: calls.add((), 1) or (x % 4, x))
    regrouped = pairs.join(runner.parallelize([(k, k) for k in range(4)], 2), partitions=4).persist()
    expected = sorted(regrouped.collect())
    assert not {k for k in runner.held() if k[0] == "shuffle"}  # the buckets are gone
    runner.lose(0)
    runner.lose(1)
    assert sorted(regrouped.collect()) == expected
    epochs = [s.epoch for s in recompute_stages(runner)]
    assert len(epochs) == 2 and epochs[0] < epochs[1]  # the map tasks first, then the join
    assert int(calls.value) == 12
    assert {k[0] for k in runner.held()} <= {"ds", "par"}


def test_recomputation_runs_the_program_as_it_was_pickled(runner):
    table = [100, 200]  # a heap object the notebook changes later
    ds = runner.range(4, partitions=2).map(lambda x: table[x % 2] + x).persist()
    assert ds.collect() == [100, 201, 102, 203]
    table[0] = -1
    runner.lose(0)
    runner.lose(1)
    assert ds.collect() == [100, 201, 102, 203]  # a persisted dataset is a snapshot
    assert runner.range(2, partitions=1).map(lambda x: table[x]).collect() == [-1, 200]


def test_partitions_without_lineage_fail_with_a_clear_error(runner):
    big = runner.parallelize(np.arange(300_000), partitions=2)  # kept by the driver
    runner.drop([("par", big.id, 1)])
    with pytest.raises(lineage.UnrecoverableError, match=r"\('par', \d+, 1\)"):
        big.sum()


# --- the version floor ----------------------------------------------------------------------


def test_oldest_needed_epoch_follows_live_lineage(runner):
    assert runner.lineage.oldest_needed_epoch() is None
    a = runner.range(8, partitions=2).map(lambda x: x).persist()
    a.count()
    first = epoch_of(runner, "count: map (partials)")
    b = runner.range(8, partitions=2).map(lambda x: -x).persist()
    b.count()
    second = [k for k, s in enumerate(runner.stages, 1) if s.name == "count: map (partials)"][1]
    assert runner.lineage.oldest_needed_epoch() == first
    assert InlineRunner().lineage.oldest_needed_epoch() is None  # epochs are counted per runner
    c = a.map(lambda x: x + 1).persist()
    c.count()
    a.unpersist()
    assert runner.lineage.oldest_needed_epoch() == first  # c can only be rebuilt from a's lineage
    c.unpersist()
    assert runner.lineage.oldest_needed_epoch() == second  # b's
    del b
    assert runner.lineage.oldest_needed_epoch() is None  # garbage collection releases it too


def test_truncated_lineage_is_recomputed_at_the_checkpoint_epoch(runner):
    ds = runner.range(8, partitions=2).map(lambda x: x).persist()
    ds.count()
    for _ in range(3):
        runner.range(2).count()
    checkpoint = runner.last_epoch
    runner.lineage.truncate(checkpoint)
    assert runner.lineage.oldest_needed_epoch() == checkpoint
    runner.lose(0)
    assert ds.collect() == list(range(8))
    assert [s.epoch for s in recompute_stages(runner)] == [checkpoint]


def test_an_arena_dataset_records_epochs_and_read_sets_on_a_cluster():
    with clamor.Cluster(workers=2) as cluster:
        x = clamor.array((1 << 16,), np.float64)  # 512 KiB: two 256 KiB pages
        x[:] = 1.0
        page = cluster.page_size
        first = clamor.runtime.paging.arena.page_span(x, page)[0]
        rows = cluster.range(2, partitions=2).map_partitions(lambda r: [x[r.start * (len(x) // 2)]]).persist()
        assert rows.collect() == [1.0, 1.0]
        epoch = cluster.last_epoch
        graph = rows.lineage()
        for i in range(2):
            node = graph.node(("ds", rows.id, i))
            assert node.epoch == epoch and node.state == "held"
            assert first + i in {p for p, _ in node.read_set}  # the page the task touched (and its worker's other resident pages)
