"""Datasets: lazy, partitioned collections whose partitions stay on the workers.

The paper's ``DataCollection``, Spark-like::

    ds = cluster.parallelize(points, partitions=8)          # or range, read_text, read_npy
    near = ds.map_partitions(lambda q: tree.query(q)[1]).persist()
    near.count()                                             # an action: stages run

Transformations only build a plan (runtime/data/plan.py); narrow ones fuse into one
task per partition; join, lookup and repartition shuffle through the workers.
Actions (collect, take, reduce, sum, count) run stages through the runner the
dataset came from (a :class:`~clamor.runtime.stage.StageRunner`: a ``Cluster``,
or an ``InlineRunner`` in tests). Aggregations are tree-structured across the
workers; the driver only receives the final value.
"""

from __future__ import annotations

import builtins
import html
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from clamor.runtime.data import ops, plan, sources
from clamor.runtime.data.accumulators import Accumulator
from clamor.runtime.data.lineage import LineageRunner
from clamor.runtime.data.lineage_graph import LineageGraph
from clamor.runtime.data.ops import Aggregate
from clamor.runtime.data.plan import Node, persist_key, run_action


def _release(runner_ref: weakref.ref, node_id: int, n: int) -> None:
    """Forget a persisted node and drop its partitions (on unpersist or collection)."""
    runner = runner_ref()
    if runner is not None:  # else its lineage went with it
        keys = [persist_key(node_id, i) for i in builtins.range(n)]
        runner.lineage.unpersist(node_id, keys)
        try:
            runner.drop(keys)
        except Exception:  # noqa: BLE001 - e.g. the cluster is closed already
            plan.logger.debug("could not drop persisted dataset %d", node_id, exc_info=True)


class Dataset:
    """A lazy, partitioned collection. Transformations return new datasets; actions run stages.

    Partition values: ``map``, ``filter``, ``flat_map``, ``zip`` and ``join`` make lists;
    ``map_partitions(f)`` keeps what ``f`` returns (arrays stay arrays); ``parallelize``
    of an array gives array slices, ``range`` gives ``range`` objects.
    """

    def __init__(self, runner: LineageRunner, node: Node) -> None:
        self._runner = runner
        self._node = node
        self._finalizer: weakref.finalize | None = None

    @property
    def num_partitions(self) -> int:
        return self._node.n

    @property
    def id(self) -> int:
        """The plan node's id (persisted partitions are ``("ds", id, i)``)."""
        return self._node.id

    def __repr__(self) -> str:
        state = " persisted" if self.is_persisted else ""
        return f"<Dataset {self.id}: {plan.describe(self._node)}, {self.num_partitions} partitions{state}>"

    def _repr_html_(self) -> str:
        """Its plan, partitions and, persisted, where they are kept (nothing is computed)."""
        kept = ""
        if self.is_persisted:
            held = [w for w in self.locations() if w is not None]
            kept = f"<br>persisted: {len(held)} of {self.num_partitions} kept on {len(set(held))} worker(s)"
        plan_text = html.escape(plan.describe(self._node))
        return (f"<div><b>Clamor dataset {self.id}</b>: {self.num_partitions:,} partitions"
                f"<br>plan: <code>{plan_text}</code>{kept}</div>")  # fmt: skip

    def _derive(self, node: Node) -> Dataset:
        return Dataset(self._runner, node)

    def _narrow(self, name: str, fn: Callable[[Any], Any]) -> Dataset:
        return self._derive(plan.Narrow(n=self._node.n, name=name, parent=self._node, fn=fn))

    def _same_runner(self, other: Dataset, what: str) -> None:
        if not isinstance(other, Dataset):
            raise TypeError(f"{what} needs a Dataset, got {type(other).__name__}")
        if other._runner is not self._runner:
            raise ValueError(f"{what}: both datasets must belong to the same cluster")

    # --- narrow transformations (fused into one task per partition) ---

    def map(self, f: Callable[[Any], Any]) -> Dataset:
        """``f(x)`` for every element ``x`` (a list per partition)."""
        return self._narrow("map", ops.EachFn(f))

    def filter(self, f: Callable[[Any], Any]) -> Dataset:
        """The elements for which ``f(x)`` is true."""
        return self._narrow("filter", ops.KeepFn(f))

    def flat_map(self, f: Callable[[Any], Iterable]) -> Dataset:
        """The elements of ``f(x)`` for every element ``x``, flattened."""
        return self._narrow("flat_map", ops.FlatFn(f))

    def map_partitions(self, f: Callable[[Any], Any]) -> Dataset:
        """``f(partition)`` per partition; its result is the new partition as it is (an
        array stays an array; an iterator becomes a list)."""
        return self._narrow("map_partitions", ops.WholeFn(f))

    def zip(self, other: Dataset) -> Dataset:
        """Pairs ``(x, y)`` of the elements at the same position of two datasets with the
        same number of partitions and the same number of elements in each partition."""
        self._same_runner(other, "zip")
        if other.num_partitions != self.num_partitions:
            raise ValueError(
                f"zip needs the same number of partitions: {self.num_partitions} and "
                f"{other.num_partitions}"
            )
        return self._derive(plan.Zip(n=self._node.n, name="zip", left=self._node, right=other._node))

    # --- shuffles ---

    def join(self, other: Dataset, partitions: int | None = None) -> Dataset:
        """Inner join of pair datasets: ``(k, v)`` and ``(k, w)`` give ``(k, (v, w))`` for every
        match. Hash-partitioned by key into ``partitions`` (default: the larger count)."""
        self._same_runner(other, "join")
        n = partitions or max(self.num_partitions, other.num_partitions)
        split = ops.HashSplit(by_first=True)
        return self._shuffle("join", (self, other), (split, split), ops.join_buckets, n)

    def lookup(self, keys: Dataset | Iterable[Any], partitions: int | None = None) -> Dataset:
        """For each element ``k`` of ``keys`` (a dataset or any iterable), ``(k, [v, ...])``:
        the values of the pairs ``(k, v)`` of this dataset, in its order (``[]`` if none).

        A key repeated in ``keys`` appears as many times. The result is hash-partitioned by
        key (``partitions``, default: this dataset's count), so it is not in the order of
        ``keys``: use ``dict(ds.lookup(keys).collect())`` for a mapping.
        """
        n = partitions or self.num_partitions
        if not isinstance(keys, Dataset):
            keys = list(keys)
            keys = self._derive(sources.parallelize(self._runner, keys, min(n, max(1, len(keys)))))
        self._same_runner(keys, "lookup")
        splits = (ops.HashSplit(by_first=False), ops.HashSplit(by_first=True))
        return self._shuffle("lookup", (keys, self), splits, ops.lookup_buckets, n)

    def repartition(self, partitions: int) -> Dataset:
        """The same elements in ``partitions`` partitions: every input partition is cut into
        ``partitions`` contiguous slices, and output partition ``j`` joins the ``j``-th slices
        in input order (arrays stay arrays). Each output gets a share of every input, so
        sizes even out; the global order changes (unless ``partitions`` is 1)."""
        n = sources._check_partitions(partitions)
        return self._shuffle("repartition", (self,), (ops.ContiguousSplit(),), ops.concat_buckets, n)

    def _shuffle(
        self, name: str, sides: tuple[Dataset, ...], splits: tuple, combine: Callable, n: int
    ) -> Dataset:
        sources._check_partitions(n)
        node = plan.Shuffle(
            n=n, name=name, sides=tuple(d._node for d in sides), splits=splits, combine=combine
        )
        return self._derive(node)

    # --- persistence ---

    def persist(self) -> Dataset:
        """Keep this dataset's partitions on the workers once an action computes them;
        later actions read them instead of recomputing. Returns ``self``. They are
        dropped by :meth:`unpersist` or when this object is garbage-collected."""
        if self._finalizer is None or not self._finalizer.alive:
            self._runner.lineage.persisted.setdefault(self.id, set())
            self._finalizer = weakref.finalize(
                self, _release, weakref.ref(self._runner), self.id, self.num_partitions
            )
            self._finalizer.atexit = False
        return self

    def unpersist(self) -> Dataset:
        """Drop the kept partitions; later actions recompute them. Returns ``self``."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        return self

    @property
    def is_persisted(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive

    def locations(self) -> list[int | None]:
        """Per partition, the worker holding it if this dataset is persisted and computed
        (:data:`~clamor.runtime.stage.DRIVER` for the driver), else ``None``."""
        held = self._runner.lineage.persisted.get(self.id, set()) if self.is_persisted else set()
        return [
            self._runner.holder(persist_key(self.id, i)) if i in held else None
            for i in builtins.range(self.num_partitions)
        ]

    def lineage(self) -> LineageGraph:
        """The lineage graph of this dataset's partitions and of its ancestors' (one node
        per partition, up to the sources): for persisted partitions, the fused ops, the
        arena epoch and ``(page, version)`` read set of the task that computed them,
        their holder and state (``"held"``, ``"lost"``, ``"recomputed"``)."""
        return plan.graph_of(self._node, self._runner)

    # --- actions ---

    # Every action takes ``timeout``: seconds before its stages are cancelled and their
    # running tasks stopped (ActionTimeoutError; default: the cluster's ``action_timeout``).

    def _act(self, action: str, body: Callable[[plan.Job], Any], timeout: float | None) -> Any:
        return run_action(self._runner, action, body, timeout, self._node)

    def collect(self, timeout: float | None = None) -> Any:
        """All elements in the driver: one array if every partition is an array (concatenated
        along axis 0), else a list."""
        return self._act("collect", lambda job: ops.concat(job.collect(self._node)), timeout)

    def take(self, n: int, timeout: float | None = None) -> Any:
        """The first ``n`` elements (fewer if there are not as many), like :meth:`collect`'s
        result cut to ``n``. Runs one partition, then four times as many per round, and
        stops as soon as it has ``n``: it does not compute the whole dataset."""
        if n < 0:
            raise ValueError(f"take needs n >= 0, got {n}")
        return self._act("take", lambda job: job.take(self._node, n), timeout)

    def reduce(self, f: Callable[[Any, Any], Any], timeout: float | None = None) -> Any:
        """``f`` folded over all elements; ``f`` must be associative and commutative (partials
        combine across workers in a tree). ``ValueError`` for an empty dataset."""
        return self._aggregate("reduce", Aggregate("reduce", f), timeout)

    def sum(self, timeout: float | None = None) -> Any:
        """The sum of all elements (array partitions are summed by numpy along axis 0); 0 if empty."""
        return self._aggregate("sum", Aggregate("sum"), timeout)

    def count(self, timeout: float | None = None) -> int:
        """The number of elements."""
        return self._aggregate("count", Aggregate("count"), timeout)

    def _aggregate(self, action: str, aggregate: Aggregate, timeout: float | None) -> Any:
        return self._act(action, lambda job: job.aggregate(self._node, aggregate), timeout)


class DatasetSources:
    """Where datasets and accumulators come from: a mixin for a
    :class:`~clamor.runtime.stage.StageRunner` (``Cluster``, ``InlineRunner``)."""

    def parallelize(self, data: Any, partitions: int | None = None) -> Dataset:
        """``data`` (an array, a ``range`` or any iterable) cut into contiguous partitions.

        An array's partitions are its slices along axis 0: those of an arena array travel
        as references and workers page them in. Default partitions: two per worker (at
        most one per element). Data of more than 1 MiB (pickled, arena arrays excluded)
        is kept by the driver and each task fetches its own partition.
        """
        return Dataset(self, sources.parallelize(self, data, partitions))

    def range(self, start: int, stop: int | None = None, step: int = 1, *, partitions: int | None = None) -> Dataset:
        """The integers of ``range(start, stop, step)``; each partition is a ``range``."""
        whole = builtins.range(start) if stop is None else builtins.range(start, stop, step)
        return Dataset(self, sources.range_source(self, whole, partitions))

    def read_text(self, url: str | list[str], partitions: int | None = None, encoding: str = "utf-8") -> Dataset:
        """The lines of text files, without line endings. ``url``: a path or fsspec URL of a
        file, a directory or a glob (or a list of them). Each task reads its byte range of
        the files itself. Default partitions: two per worker, or one per 64 MiB."""
        return Dataset(self, sources.text_source(self, url, partitions, encoding))

    def read_npy(self, url: str, partitions: int | None = None) -> Dataset:
        """The rows of a ``.npy`` file (path or fsspec URL) as array partitions, each task
        reading its rows itself. Default partitions: two per worker, or one per 64 MiB."""
        return Dataset(self, sources.npy_source(self, url, partitions))

    def accumulator(self, shape_or_array: Any, op: str | Callable = "sum", dtype: Any = None) -> Accumulator:
        """A new :class:`~clamor.runtime.data.accumulators.Accumulator`: tasks call
        ``acc.add(index, values)``; the driver reads ``acc.value`` after the stage."""
        return Accumulator(shape_or_array, op, dtype)
