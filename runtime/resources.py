"""What a cluster opened, closed in reverse order of opening (:class:`Resources`).

Each part the cluster starts (the pager, the executor's threads, servers, the workers)
is registered as it is opened, with the call that ends it. Closing runs those calls in
reverse order, each one whatever the others did (a failure is logged): what was opened
last, and may use what came before it, ends first. The same list undoes a constructor
that fails halfway, and ends an unclosed cluster when it is collected or at exit.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger("clamor.cluster")


class Resources:
    """A list of ``(name, close)``, closed once, last opened first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._opened: list[tuple[str, Callable[[], object]]] = []

    def opened(self, name: str, close: Callable[[], object]) -> None:
        """``close()`` ends what was just opened (``name`` says what, in logs)."""
        with self._lock:
            self._opened.append((name, close))

    def names(self) -> list[str]:
        """What is open, in the order it will be closed."""
        with self._lock:
            return [name for name, _ in reversed(self._opened)]

    def close(self) -> None:
        """Close everything, last opened first; later calls do nothing."""
        with self._lock:
            steps, self._opened = self._opened, []
        for name, close in reversed(steps):
            try:
                close()
            except Exception:
                logger.exception("closing the cluster: %s failed", name)
