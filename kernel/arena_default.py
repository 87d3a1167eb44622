"""Notebook arrays in the arena by default.

In the Clamor kernel every cell runs inside :func:`cell_allocations`: numpy
allocations of at least one arena page made by the cell's own thread go to the
shared arena, so a large array (or the arrays inside an sklearn ``KDTree``)
defined in an ordinary cell is demand-paged by ``%%clamor`` cells instead of
being copied to the workers. Smaller allocations stay in ordinary memory.

The arena's NEP 49 handler lives in numpy's per-context variable, so nothing
else is affected: not the runtime's threads (gRPC, the executor), not other
asyncio tasks of the kernel, and not threads a cell starts.

Turn it off with ``%clamor config arena_default=false`` (the session's
``config["arena_default"]``); it applies from the next cell. Explicit
``clamor.shared()`` blocks and ``clamor.asarray`` work either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from clamor.kernel import session
from clamor.runtime.paging import arena

__all__ = ["CONFIG_KEY", "cell_allocations", "enabled", "threshold"]

#: The session configuration key that switches it (default on).
CONFIG_KEY = "arena_default"

_FALSE = {"0", "false", "no", "off", ""}


def _truthy(value: Any) -> bool:
    """``config`` values may arrive as strings from ``%clamor config key=value``."""
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE
    return bool(value)


def threshold(config: Mapping[str, Any] | None = None) -> int:
    """Bytes from which a cell's numpy allocation goes to the arena; 0 when off.

    One arena page: the size from which arrays ship to tasks by reference.
    ``config``: a mapping; by default the kernel session's ``config``.
    """
    if config is None:
        config = session.config
    if not _truthy(config.get(CONFIG_KEY, True)):
        return 0
    return arena.page_size()


def enabled(config: Mapping[str, Any] | None = None) -> bool:
    """Whether cells put large numpy arrays in the arena (see :func:`threshold`)."""
    return threshold(config) > 0


@contextlib.contextmanager
def cell_allocations(min_bytes: int | None = None) -> Iterator[int]:
    """Route this context's numpy allocations of at least ``min_bytes`` to the arena.

    ``min_bytes``: ``None`` reads :func:`threshold`; 0 turns it off. Yields the
    threshold in force (0: off). Nests with ``clamor.shared()``, which sends every
    allocation of its block, small ones included, to the arena.
    """
    if min_bytes is None:
        min_bytes = threshold()
    if min_bytes <= 0:
        yield 0
        return
    with arena.shared(min_bytes=min_bytes):
        yield min_bytes
