"""Close clusters while everything that reads them polls: run by test_close_races.py.

A separate process, so that a crash (a reader touching the pager's freed tables)
fails the test instead of killing the test run. Each round starts a cluster with
``%clamor start``, subscribes a live dashboard (the publisher's thread), and polls
it from three more threads: the dashboard's ``refresh`` (a snapshot on demand),
the server extension's :class:`ClusterSource` (the ``Observer`` gRPC service, as
the Lab panel and the dashboards do) and ``%clamor status``. A stage runs, then
``%clamor stop`` closes the cluster while all of them keep polling.

Every error a poller gets must be one that says the cluster is closed or gone;
anything else is printed and the exit status is 1. Prints ``ok``, the rounds run and
the counts.

Usage: ``python close_races.py ROUNDS REGISTRY_DIR [SECONDS]``: ``ROUNDS`` rounds, but no
round is started once ``SECONDS`` have passed (a round is a cluster's start and close,
many times slower on a loaded machine than on an idle one).
"""

from __future__ import annotations

import asyncio
import collections
import io
import random
import sys
import threading
import time
from collections.abc import Callable

KERNEL = "close-races"


def main(rounds: int, registry: str, seconds: float = float("inf")) -> int:
    import numpy as np
    from clamor.extension.clusters import (
        ClusterSource,
        ClusterUnavailable,
        NoSuchCluster,
    )
    from clamor.kernel import session
    from clamor.runtime.errors import ClamorError
    from clamor.runtime.observe import cluster_registry
    from IPython.core.interactiveshell import InteractiveShell

    import clamor
    from clamor import widgets

    expected = (ClamorError, ClusterUnavailable, NoSuchCluster)
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "clamor")
    source = ClusterSource(lambda: [registry], lambda: [KERNEL], timeout=5.0, max_age=0.0)
    seen: collections.Counter[str] = collections.Counter()
    unexpected: list[str] = []

    def poller(name: str, call: Callable[[], object], stop: threading.Event) -> threading.Thread:
        def run() -> None:
            while not stop.is_set():
                try:
                    call()
                    seen[f"{name} answered"] += 1
                    time.sleep(0.001)
                except expected as exc:
                    seen[f"{name}: {type(exc).__name__}"] += 1
                    time.sleep(0.001)
                except Exception as exc:  # noqa: BLE001 - what the test is looking for
                    unexpected.append(f"{name}: {type(exc).__name__}: {exc}")

        thread = threading.Thread(target=run, name=f"poll-{name}", daemon=True)
        thread.start()
        return thread

    def status() -> None:
        shell.run_line_magic("clamor", "status")

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="server-ioloop", daemon=True).start()

    def observe() -> None:
        asyncio.run_coroutine_threadsafe(source.query(KERNEL, "snapshot"), loop).result(10)

    def slow_names() -> dict:
        """The kernel names arena variables by scanning its namespace: say it takes a while."""
        time.sleep(random.uniform(0.0, 0.3))
        return {}

    report, sys.stdout = sys.stdout, io.StringIO()  # what the magics print, from any thread
    data = np.arange(1 << 18, dtype=np.float64)
    # 256k pages of 4 KiB (untouched: no memory): the pager's per-page loops take a while
    clamor.empty(1 << 27, np.float64)
    deadline = time.monotonic() + seconds
    done = 0
    while done < rounds and time.monotonic() < deadline:
        done += 1
        cluster = session.use(clamor.Cluster(workers=1, page_size=4096))
        cluster_registry.publish(cluster, kernel=KERNEL, directory=registry)
        view = widgets.dashboard(cluster)
        cluster.publisher.interval = 0.005  # a snapshot being built whenever the close comes
        cluster.publisher.variables = slow_names  # and some of them still building after it
        stop = threading.Event()
        threads = [poller("refresh", view.refresh, stop), poller("observer", observe, stop),
                   poller("status", status, stop)]  # fmt: skip
        shared = cluster.parallelize(data, partitions=2)
        shared.map(lambda x: x * 2).sum()
        time.sleep(random.uniform(0.0, 0.2))
        shell.run_line_magic("clamor", "stop")
        time.sleep(random.uniform(0.0, 0.1))  # they poll the closed cluster too
        stop.set()
        for thread in threads:
            thread.join(10)
        view.close()
        sys.stdout.seek(0)
        sys.stdout.truncate()
    sys.stdout = report
    source.close()
    loop.call_soon_threadsafe(loop.stop)
    for line in unexpected[:20]:
        print("UNEXPECTED", line)
    verdict = "ok" if not unexpected else f"{len(unexpected)} unexpected errors,"
    print(verdict, done, "rounds", dict(sorted(seen.items())))
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], *map(float, sys.argv[3:4])))
