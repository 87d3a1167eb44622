"""The lineage graph of a dataset, which the widgets draw (:class:`LineageGraph`).

Built from a runner's :class:`~clamor.runtime.data.lineage.LineageStore` and the plan:
:func:`build_graph` for one dataset (``Dataset.lineage()``), :func:`live_graph` for
everything a runner keeps and its last actions (the dashboard's view).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clamor.runtime.data.lineage import (
    LineageStore,
    LineageView,
    Record,
    holder_alive,
)
from clamor.runtime.stage import PartitionKey

logger = logging.getLogger("clamor.lineage")

#: Partition states in a :class:`LineageGraph`.
HELD, LOST, RECOMPUTED, NOT_COMPUTED = "held", "lost", "recomputed", "not computed"
#: Not kept, of a dataset whose action runs now (:func:`live_graph`).
COMPUTING = "computing"
#: An action's dataset of more partitions than this is not drawn in the live graph.
ACTION_NODES = 1000


@dataclasses.dataclass(frozen=True)
class LineageNode:
    """One partition of a dataset in a :class:`LineageGraph`.

    ``ops``: the fused steps that compute it from its nearest persisted ancestors,
    shuffles or sources; ``epoch`` / ``read_set``: of the task that computed it
    (persisted partitions only); ``state``: ``"held"``, ``"lost"``, ``"recomputed"``
    or ``"not computed"`` (also every partition of a dataset that is not persisted).
    """

    key: PartitionKey
    dataset: int
    name: str
    index: int
    ops: tuple[str, ...]
    persisted: bool
    state: str
    holder: int | None = None
    epoch: int | None = None
    read_set: Sequence[tuple[int, int]] = ()

    @property
    def id(self) -> str:
        """A short string id, ``"<dataset>:<index>"``."""
        return f"{self.dataset}:{self.index}"

    @property
    def read_set_size(self) -> int:
        return len(self.read_set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "key": list(self.key), "dataset": self.dataset, "name": self.name,
            "index": self.index, "ops": list(self.ops), "persisted": self.persisted,
            "state": self.state, "holder": self.holder, "epoch": self.epoch,
            "read_set_size": self.read_set_size,
        }  # fmt: skip


@dataclasses.dataclass
class LineageGraph:
    """Partitions of a dataset and of its ancestors up to the sources (``nodes``, in
    dependency order) and ``edges`` ``(parent key, child key)``."""

    nodes: list[LineageNode]
    edges: list[tuple[PartitionKey, PartitionKey]]

    def __post_init__(self) -> None:
        self._by_key = {n.key: n for n in self.nodes}

    def node(self, key: PartitionKey) -> LineageNode:
        return self._by_key[key]

    def parents(self, key: PartitionKey) -> list[PartitionKey]:
        """The keys of the partitions ``key`` is computed from, in edge order."""
        return [p for p, c in self.edges if c == key]

    def states(self) -> dict[str, int]:
        """How many partitions are in each state."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.state] = counts.get(n.state, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): ``nodes`` (dicts) and ``edges`` (pairs of node ids)."""
        ids = {n.key: n.id for n in self.nodes}
        return {
            "nodes": [n.to_dict() for n in self.nodes],
            "edges": [[ids[p], ids[c]] for p, c in self.edges],
        }

    def to_networkx(self) -> Any:
        """A ``networkx.DiGraph`` on node ids (``ImportError`` if networkx is missing)."""
        import networkx as nx

        graph = nx.DiGraph()
        for n in self.nodes:
            graph.add_node(n.id, **n.to_dict())
        graph.add_edges_from((self._by_key[p].id, self._by_key[c].id) for p, c in self.edges)
        return graph


# --- building the graph of a dataset -----------------------------------------------------------
# Plan nodes (runtime/data/plan.py) are read by duck typing: ``id``, ``n``, ``name``,
# ``parents()``, and ``sides`` for shuffles.


def _key(node_id: int, i: int) -> tuple:
    return ("ds", node_id, i)


def fused_ops(node: Any, persisted: Mapping[int, Any], top: bool = True) -> tuple[str, ...]:
    """The steps fused into the task computing a partition of ``node``: back to its
    sources and shuffles (included) or persisted ancestors (excluded)."""
    if not top and node.id in persisted:
        return ()
    parents = node.parents()
    if not parents or hasattr(node, "sides"):
        return (node.name,)
    return tuple(op for p in parents for op in fused_ops(p, persisted, False)) + (node.name,)


def ancestry(root: Any) -> list[Any]:
    """``root`` and its ancestors, each once, parents before children."""
    order: list[Any] = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif node.id not in seen:
            seen.add(node.id)
            stack.append((node, True))
            stack.extend((p, False) for p in reversed(node.parents()))
    return order


def build_graph(root: Any, runner: LineageView) -> LineageGraph:
    """The :class:`LineageGraph` of plan node ``root`` (the partitions of its persisted
    nodes are ``("ds", id, i)``)."""
    store = runner.lineage
    persisted = store.persisted
    nodes: list[LineageNode] = []
    edges: list[tuple[PartitionKey, PartitionKey]] = []
    live = set(runner.workers)
    for node in ancestry(root):
        kept = node.id in persisted
        ops = fused_ops(node, persisted)
        for i in range(node.n):
            key = _key(node.id, i)
            rec = store.get(key) if kept else None
            if rec is None:
                nodes.append(LineageNode(key, node.id, node.name, i, ops, kept, NOT_COMPUTED))
            else:
                nodes.append(_kept_node(rec, node.id, node.name, i, runner, live))
        edges += _edges(node, store)
    return LineageGraph(nodes, edges)


def live_graph(runner: LineageView) -> LineageGraph:
    """The graph of every live dataset partition ``runner`` made (all persisted datasets:
    what the dashboard draws), and of the datasets of its last actions: while one runs
    its partitions not kept are ``"computing"``; once it ended, an action on a dataset
    that keeps nothing stays drawn, ``"not computed"``. Edges link a partition to the dataset partitions its task read,
    through at most one shuffle (its buckets' producers)."""
    live = set(runner.workers)
    recs = [r for r in runner.lineage.records() if r.dataset is not None]
    keys = {r.key for r in recs}
    nodes, edges = [], []
    for rec in sorted(recs, key=lambda r: (r.dataset, r.index)):
        name = rec.ops[-1] if rec.ops else "partition"
        nodes.append(_kept_node(rec, rec.dataset, name, rec.index, runner, live))
        parents: list[PartitionKey] = []
        for key in rec.run.inputs:
            if key in keys:
                parents.append(key)
            elif (run := rec.run.parents.get(key)) is not None:
                parents += [k for k in run.inputs if k in keys]
        edges += [(p, rec.key) for p in dict.fromkeys(parents)]
    for graph, running in list(runner.lineage.actions):
        nodes, edges = _with_action(nodes, edges, graph, runner, running)
    return LineageGraph(nodes, edges)


def _with_action(nodes: list[LineageNode], edges: list, graph: Callable[[LineageView], LineageGraph],
                 runner: LineageView, running: bool) -> tuple[list[LineageNode], list]:  # fmt: skip
    """``nodes`` and ``edges`` with those of an action's dataset graph added (its
    partitions not kept are computing while it runs); as they were if it is too large
    or ended on a persisted dataset (its records show it)."""
    try:
        action = graph(runner)
    except Exception:  # e.g. a dataset of a closed runner: not drawn
        logger.debug("the lineage of an action is unavailable", exc_info=True)
        return nodes, edges
    if len(action.nodes) > ACTION_NODES or (not running and action.nodes and action.nodes[-1].persisted):
        return nodes, edges  # too large, or ended on a persisted dataset: its records show it
    known = {n.key for n in nodes}
    added = [dataclasses.replace(n, state=COMPUTING) if running and n.state == NOT_COMPUTED else n
             for n in action.nodes if n.key not in known]  # fmt: skip
    return nodes + added, list(dict.fromkeys(edges + action.edges))


def _kept_node(rec: Record, dataset: int, name: str, index: int, runner: LineageView,
               live: set[int]) -> LineageNode:  # fmt: skip
    """The node of a persisted partition with a record: held, lost or recomputed."""
    holder = holder_alive(runner, rec.key, live)
    state = LOST if holder is None else RECOMPUTED if rec.recomputed else HELD
    return LineageNode(rec.key, dataset, name, index, rec.ops, True, state, holder,
                       rec.run.epoch, rec.run.read_set)  # fmt: skip


def _edges(node: Any, store: LineageStore) -> list[tuple[PartitionKey, PartitionKey]]:
    """``(parent partition, partition)`` pairs of ``node``. A shuffle's output partition
    comes from every partition of every side, or, once computed and persisted, from
    those that left it a bucket."""
    parents = list(dict.fromkeys(node.parents()))
    if not hasattr(node, "sides"):
        return [(_key(p.id, i), _key(node.id, i)) for i in range(node.n) for p in parents]
    edges = []
    for j in range(node.n):
        rec = store.get(_key(node.id, j))
        if rec is not None:
            buckets = [k for k in rec.run.inputs if _is_bucket(k, node.id, j)]
            pairs = list(dict.fromkeys((node.sides[k[3]].id, k[4]) for k in buckets))
        else:
            pairs = [(side.id, i) for side in parents for i in range(side.n)]
        edges += [(_key(nid, i), _key(node.id, j)) for nid, i in pairs]
    return edges


def _is_bucket(key: PartitionKey, node_id: int, j: int) -> bool:
    """Whether ``key`` is a bucket ``("shuffle", job, node_id, side, i, j)`` (runtime/data/plan.py)."""
    return isinstance(key, tuple) and len(key) == 6 and key[0] == "shuffle" and key[2] == node_id and key[5] == j
