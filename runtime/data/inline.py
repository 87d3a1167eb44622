"""A :class:`~clamor.runtime.stage.StageRunner` in one process, for fast tests of datasets.

It runs a stage's tasks one after the other in this process, but keeps what
matters of a real cluster: the program is pickled once per stage with
:mod:`clamor.runtime.net.shipping` and unpickled for every task (so unpicklable
closures fail the same way), partitions are stored pickled (a task never sees
another's objects), tasks are spread over ``workers`` simulated worker ids
(task ``i`` on worker ``i % workers``, or ``TaskSpec.worker``) so holders and
tree aggregation are exercised, and accumulator updates merge once per task at
the barrier, in index order, only if the whole stage succeeded.

Like a cluster it numbers stages with epochs (``last_epoch``; a stage given
``StageSpec.epoch`` reports that one) but has no arena versions to replay and
no read sets (``last_read_sets`` holds empty lists). :meth:`InlineRunner.lose`
forgets a simulated worker's partitions, as if it had died.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from clamor.runtime.data import accumulators
from clamor.runtime.data.dataset import DatasetSources
from clamor.runtime.data.lineage import LineageStore
from clamor.runtime.errors import MissingPartitionError
from clamor.runtime.net import shipping
from clamor.runtime.stage import (
    DRIVER,
    PartitionKey,
    StageSpec,
    TaskContext,
    run_program,
)


class InlineRunner(DatasetSources):
    """Runs stages in this process. ``stages``: every stage run so far, in order."""

    def __init__(self, workers: int = 2) -> None:
        if workers < 1:
            raise ValueError(f"an inline runner needs at least one worker, got {workers}")
        self._workers = list(range(workers))
        self._store: dict[PartitionKey, tuple[int, bytes]] = {}
        self.stages: list[StageSpec] = []
        self._epoch = 0
        #: The lineage of the partitions its stages keep.
        self.lineage = LineageStore()
        #: The epoch of the last successful stage (one more per stage, or the replayed one).
        self.last_epoch = 0
        #: Per task of the last successful stage: its ``(page, version)`` read set (empty here).
        self.last_read_sets: list[list[tuple[int, int]]] = []

    @property
    def tasks_recomputed(self) -> int:
        """Tasks run again by lineage recovery (as ``Cluster.stats()["tasks_recomputed"]``)."""
        return self.lineage.counters.tasks_recomputed

    @property
    def workers(self) -> list[int]:
        return list(self._workers)

    def execute(self, stage: StageSpec) -> list[Any]:
        """Run every task (all of them, as a cluster would), then raise the first error in
        index order, or merge the accumulator updates and return the replies."""
        self.stages.append(stage)
        self._epoch += 1
        payload = shipping.pack_program(stage.program)
        missing = [k for t in stage.tasks for k in t.inputs if k not in self._store]
        if missing:
            raise MissingPartitionError(list(dict.fromkeys(missing)))
        for task in stage.tasks:
            if task.worker is not None and task.worker not in self._workers:
                raise ValueError(f"no worker {task.worker} (workers: {self._workers})")
        replies, updates, errors = [], [], []
        for position, task in enumerate(stage.tasks):
            worker = task.worker if task.worker is not None else position % len(self._workers)
            ctx = TaskContext(task.index, task.inputs, self.fetch, self._storer(worker), task.payload)
            program = shipping.loads(payload)
            try:
                value = run_program(program, ctx)
                if task.output is not None:
                    ctx.put(task.output, value)
                reply = shipping.loads(shipping.dumps(value)) if task.reply else None
            except Exception as exc:  # noqa: BLE001 - re-raised below, after every task ran
                errors.append(exc)
                continue
            replies.append((task.index, reply))
            updates.append((task.index, shipping.loads(shipping.dumps(ctx.accumulator_updates))))
        if errors:
            raise errors[0]
        accumulators.merge(u for _, u in sorted(updates, key=lambda p: p[0]))
        self.last_epoch = self._epoch if stage.epoch is None else stage.epoch
        self.last_read_sets = [[] for _ in stage.tasks]
        return [r for _, r in sorted(replies, key=lambda p: p[0])]

    def _storer(self, worker: int):
        def store(key: PartitionKey, value: Any) -> int:
            data = shipping.dumps(value)
            self._store[key] = (worker, data)
            return len(data)

        return store

    def fetch(self, key: PartitionKey) -> Any:
        """A copy of a partition (``MissingPartitionError`` if nobody holds it)."""
        if key not in self._store:
            raise MissingPartitionError([key])
        return shipping.loads(self._store[key][1])

    def put(self, key: PartitionKey, value: Any) -> None:
        self._store[key] = (DRIVER, shipping.dumps(value))

    def drop(self, keys: Iterable[PartitionKey]) -> None:
        for key in keys:
            self._store.pop(key, None)

    def holder(self, key: PartitionKey) -> int | None:
        entry = self._store.get(key)
        return None if entry is None else entry[0]

    def held(self) -> set[PartitionKey]:
        """The partitions held now (tests check that actions leave nothing behind)."""
        return set(self._store)

    def lose(self, worker: int) -> None:
        """Forget every partition ``worker`` holds, as if it had died (for recovery tests)."""
        for key in [k for k, (w, _) in self._store.items() if w == worker]:
            del self._store[key]
