"""Helpers for tests of same-host zero copy: a stage that keeps a page mapped while the
driver writes it."""

from __future__ import annotations

import threading
import time

import numpy as np
from clamor.testing.waiting import wait_for


def start_and_wait_until_mapped(cluster, x: np.ndarray, stage: threading.Thread) -> None:
    """Start ``stage``; return once a worker has mapped x's first page again (counted
    before it is mapped, after the worker marked it as one it maps: from then on the
    driver waits for it to unmap the page before a write lands)."""
    maps = cluster.page_stats(x)["requests"][0]
    stage.start()
    wait_for(lambda: cluster.page_stats(x)["requests"][0] > maps, what="a worker maps the page")


def read_twice(a: np.ndarray) -> tuple[float, float]:
    """A task: ``a[5]``, then again 1.5 s later (a driver write lands in between)."""
    first = float(a[5])  # the page is mapped from now on
    time.sleep(1.5)
    return first, float(a[5])
