"""Closing a cluster is safe while anything reads it, and leaves nothing behind.

Everything that wraps a native handle or runs a thread has a close order
(runtime/cluster.py ``_shutdown``): the publisher's thread, the executor's
threads, the gRPC handlers and the bulk server end before the driver pager frees
its tables, and the pager's own API waits for calls in flight on other threads.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import clamor
from clamor import widgets

HERE = Path(__file__).parent


def _census() -> dict[str, set]:
    """This process's OS threads (Python's and native ones), open fds (with their targets)
    and child processes."""
    gc.collect()
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.add(f"{fd} -> {os.readlink(f'/proc/self/fd/{fd}')}")
        except OSError:
            pass  # the listing's own fd, closed by now
    return {
        "threads": {int(t) for t in os.listdir("/proc/self/task")},
        "fds": fds,
        "children": {p.pid for p in psutil.Process().children(recursive=True)},
    }


#: gRPC's own thread pool (its EventEngine, shared by every channel and server of the
#: process) adds threads when its work backs up, as it does on a loaded machine, and
#: reclaims an extra thread after it has idled this long (kIdleThreadLimit in grpc core's
#: work_stealing_thread_pool.cc, grpcio 1.60-1.85); its pollers' epoll and eventfd fds go
#: with them. They are not the cluster's, but they are counted here until they end; on
#: a loaded machine some outlive the wait (other gRPC users in the process keep the pool
#: busy), and those are then told apart by name (:func:`_not_grpcs`).
GRPC_IDLE_THREAD_LIMIT = 20.0
#: What gRPC names its threads (/proc/.../comm): its EventEngine's pool, the pool's
#: lifeguard and the global timer (a whole engine sometimes outlives the wait). The
#: cluster's native threads are unnamed ("python"); its Python threads are checked by
#: name too.
GRPC_THREADS = ("event_engine", "lifeguard", "grpc_global_tim")
#: A gRPC pool thread's poller: an epoll and its wake-up eventfd.
POLLER_FDS = ("anon_inode:[eventpoll]", "anon_inode:[eventfd]")
#: How long what a closed cluster leaves may take to wind down before it counts as left.
WIND_DOWN = GRPC_IDLE_THREAD_LIMIT + 10.0


def _not_grpcs(left: dict[str, set]) -> dict[str, set]:
    """``left`` without gRPC's pool threads that outlived the wait, and without as many
    poller fd pairs as there are such threads."""
    names = {}
    for tid in left.get("threads", ()):
        with contextlib.suppress(OSError), open(f"/proc/self/task/{tid}/comm") as f:
            names[tid] = f.read().strip()
    grpc_threads = {tid for tid, name in names.items() if name in GRPC_THREADS}
    pollers = sorted(fd for fd in left.get("fds", ()) if fd.split(" -> ")[1] in POLLER_FDS)
    spare = set(pollers[: 2 * len(grpc_threads)]) if len(pollers) <= 2 * len(grpc_threads) else set()
    out = {"threads": {f"{t} ({names.get(t, '?')})" for t in left.get("threads", set()) - grpc_threads},
           "fds": left.get("fds", set()) - spare,
           "children": left.get("children", set())}  # fmt: skip
    return {k: v for k, v in out.items() if v}


def _left_since(before: dict[str, set], seconds: float = WIND_DOWN) -> dict[str, set]:
    """What exists now and did not ``before``, once what is still winding down has ended
    (returns as soon as nothing is left: ``seconds`` is only how long to wait for that)."""
    deadline = time.monotonic() + seconds
    while True:
        now = _census()
        left = {k: now[k] - before[k] for k in now if now[k] - before[k]}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


@pytest.mark.slow
def test_eight_open_close_cycles_with_a_dashboard_leave_no_thread_fd_or_process():
    x = clamor.array(1 << 20, np.float64)  # 8 MiB: pages served to both workers
    x[:] = 1.0

    def cycle() -> None:
        with clamor.Cluster(workers=2) as cluster:
            view = widgets.dashboard(cluster)  # the publisher's thread, subscribed
            cluster.publisher.interval = 0.01
            assert cluster.run_stage([(w, lambda a: float(a[::512].sum()), (x,)) for w in (0, 1)]) == [2048.0] * 2
            time.sleep(0.05)
        view.close()

    cycle()  # libraries' own lazily started threads (grpc's) come with the first cluster
    _left_since(_census())
    before = _census()
    python_threads = {t.ident for t in threading.enumerate()}
    for _ in range(8):  # a leak of one cycle shows; more cycles catch one that is rare
        cycle()
    left = _left_since(before)
    assert [t.name for t in threading.enumerate() if t.ident not in python_threads] == []
    assert _not_grpcs(left) == {}, left


#: close_races.py's run must end within pytest's 300 s (pyproject's timeout).
RACES_TIMEOUT = 280
#: The longest one round may take once started, from the product's own bounds: the
#: workers' start (Cluster's default ``timeout``), the close (``Shutdown`` 2 s, the
#: workers' own exit 5 s, the server's stop 5 s: Cluster.close) and the three pollers'
#: joins (10 s each in close_races.py).
LAST_ROUND = inspect.signature(clamor.Cluster).parameters["timeout"].default + 2 + 5 + 5 + 3 * 10
#: No round starts after this many seconds (30 s more for the interpreter and imports):
#: 15 rounds take ~27 s on an idle 2-core VM; 30 took ~55 s and 50 ~100 s, too much of
#: the suite's 10 minutes for the 2 cores it runs on (more than 280 s on a loaded one).
RACES_BUDGET = RACES_TIMEOUT - LAST_ROUND - 30


@pytest.mark.slow
def test_closing_clusters_while_the_publisher_views_extension_and_status_poll(tmp_path):
    """Up to 15 rounds in a subprocess (close_races.py), as many as fit in the time budget:
    a crash fails the test, not the run."""
    assert RACES_BUDGET > 60
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    command = [sys.executable, str(HERE / "close_races.py"), "15", str(tmp_path), str(RACES_BUDGET)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=RACES_TIMEOUT, env=env,
                          check=False)  # fmt: skip
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, f"exit status {proc.returncode}:\n{tail}"
    verdict, rounds, *_ = proc.stdout.splitlines()[-1].split()
    assert verdict == "ok", tail
    assert int(rounds) >= 3, f"only {rounds} rounds in {RACES_BUDGET:g} s:\n{tail}"
    assert not list(tmp_path.iterdir()), "a registry entry was left behind"
