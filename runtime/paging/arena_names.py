"""Names for arena pages: which notebook variable owns which pages (the views' hover).

The arena knows allocations, not names; a namespace (the notebook's, which the
kernel and the views hand in) holds the arrays. :func:`variable_spans` maps each top-level arena array (and
the arrays inside objects one level down, such as an sklearn ``KDTree``'s
``get_arrays()``) to its page span; the views' publisher calls it per snapshot.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
from clamor.runtime.paging import arena

#: Scanning stops after this many arrays (a namespace full of arrays stays cheap).
MAX_ARRAYS = 512


def _arrays(name: str, value: Any) -> Iterator[tuple[str, np.ndarray]]:
    if isinstance(value, np.ndarray):
        yield name, value
        return
    get_arrays = getattr(value, "get_arrays", None)  # sklearn KDTree / BallTree
    if callable(get_arrays) and type(value).__module__.startswith("sklearn."):
        fields = ("data", "idx_array", "node_data", "node_bounds")
        for field, array in zip(fields, get_arrays(), strict=False):
            if isinstance(array, np.ndarray):
                yield f"{name}.{field}", array
        return
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        for attr, array in list(attributes.items())[:64]:
            if isinstance(array, np.ndarray) and not attr.startswith("_"):
                yield f"{name}.{attr}", array


def variable_spans(namespace: Mapping[str, Any], page_size: int) -> dict[str, tuple[int, int]]:
    """``{name: (first page, end page)}`` of the arena arrays in ``namespace``; an array
    whose pages another name already covers (a view of it) is left out."""
    spans: dict[str, tuple[int, int]] = {}
    seen = 0
    for name, value in list(namespace.items()):
        if name.startswith("_") or isinstance(value, type):
            continue
        try:
            for label, array in _arrays(name, value):
                seen += 1
                if seen > MAX_ARRAYS:
                    return spans
                if array.nbytes and arena.in_arena(array):
                    span = arena.page_span(array, page_size)
                    if not any(a <= span[0] and span[1] <= b for a, b in spans.values()):
                        spans[label] = span
        except Exception:  # noqa: BLE001, S112 - an odd object must not break the views
            continue
    return dict(sorted(spans.items(), key=lambda item: item[1]))


def namer(namespace: Mapping[str, Any], page_size: int) -> Callable[[], dict[str, tuple[int, int]]]:
    """A zero-argument callable for ``Publisher.variables``."""
    return lambda: variable_spans(namespace, page_size)


class _Named(Protocol):
    variables: Callable[[], dict[str, tuple[int, int]]] | None


class NamedCluster(Protocol):
    """What :func:`name_after_notebook` reads of a cluster (``Cluster`` is one)."""

    @property
    def publisher(self) -> _Named: ...

    @property
    def page_size(self) -> int: ...


def name_after_notebook(cluster: NamedCluster) -> None:
    """In IPython, have ``cluster``'s snapshots name arena pages after the user's variables
    (unless something named them already); elsewhere nothing."""
    if cluster.publisher.variables is not None:
        return
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        cluster.publisher.variables = namer(shell.user_ns, cluster.page_size)
