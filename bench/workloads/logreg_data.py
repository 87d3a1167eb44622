"""The data of the ``logreg`` workload, made the same way in the parent (the reference
losses) and in every program's child: Criteo-like hashed examples (:func:`make_examples`),
each iteration's partitions (:func:`batches`), and the ids and weights a ship program
sends with each partition's task (:func:`shipments`, :func:`shipped_bytes`).

Only drivers call these (the parent, each child), never a worker: the task functions,
which the peers pickle by value, stay in ``logreg.py`` (the child's ``__main__``).
"""

from __future__ import annotations

import numpy as np

FIELDS, NUMERIC = 39, 13


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x`` (uint64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def make_examples(n: int, dim: int, seed: int, zipf: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` examples: feature ids (n x 39 int64 in [0, dim)), values (float64), labels.

    Field f's value is a Zipf(``zipf``) rank (numeric fields: a log2 bucket of a Zipf
    count, with value log1p(count)/10); the id is a hash of (f, value) mod ``dim``. Labels
    are Bernoulli draws from a hidden model whose weight for an id is also a hash.
    """
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(zipf, size=(n, FIELDS)).astype(np.uint64)
    val = np.ones((n, FIELDS))
    counts = ranks[:, :NUMERIC].astype(np.float64)
    val[:, :NUMERIC] = np.log1p(counts) / 10.0
    ranks[:, :NUMERIC] = np.floor(np.log2(counts)).astype(np.uint64)
    with np.errstate(over="ignore"):
        keys = _mix(ranks * np.uint64(64) + np.arange(FIELDS, dtype=np.uint64))
        idx = (keys % np.uint64(dim)).astype(np.int64)
        truth = ((_mix(keys) >> np.uint64(40)).astype(np.float64) / 2**24 - 0.5) * 2.0
    z = (truth * val).sum(axis=1)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.float64)
    return idx, val, y


def batches(p: dict) -> list[list[tuple[int, int]]]:
    """Per iteration, its P partitions' row ranges (iteration t: rows [t*B, (t+1)*B))."""
    b, parts = p["batch"], p["partitions"]
    out = []
    for t in range(p["iterations"]):
        edges = np.linspace(t * b, (t + 1) * b, parts + 1).astype(int)
        out.append([(int(edges[j]), int(edges[j + 1])) for j in range(parts)])
    return out


def shipments(idx: np.ndarray, w: np.ndarray, parts: list[tuple[int, int]]) -> list[tuple]:
    """The arguments after ``data`` of each task of a ship program: ``(ids, w[ids], lo,
    hi)``, the ids its rows touch (what Clamor's tasks prefetch)."""
    out = []
    for lo, hi in parts:
        ids = np.unique(idx[lo:hi])
        out.append((ids, w[ids], lo, hi))
    return out


def shipped_bytes(idx: np.ndarray, parts: list[tuple[int, int]]) -> int:
    """What shipping ``ids`` and ``w[ids]`` to each task of an iteration sends (16 B an id)."""
    return sum(16 * len(np.unique(idx[lo:hi])) for lo, hi in parts)

