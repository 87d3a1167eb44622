"""Running benchmark children: machine load, waiting for quiet, stopping and sweeping.

Each benchmark runs every measured system in a child process whose environment
carries a marker (inherited by the system's own workers and daemons), so the
parent can tell its processes from everybody else's, measure the machine's
other load, and kill whatever a child leaves behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

#: Other processes using more than this many cores perturb the numbers.
BUSY_CORES = 0.1


def progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (all but idle and iowait)."""
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def machine_load() -> float:
    """Cores busy on the whole machine over the next second."""
    a, t0 = busy_seconds(), time.monotonic()
    time.sleep(1.0)
    return (busy_seconds() - a) / (time.monotonic() - t0)


def wait_until_idle(limit: float, load: Callable[[], float] = machine_load) -> float:
    """Wait up to ``limit`` s until ``load()`` (cores busy over about a second) drops
    below :data:`BUSY_CORES`; the last load measured."""
    deadline = time.monotonic() + limit
    while True:
        cores = load()
        if cores < BUSY_CORES or time.monotonic() >= deadline:
            progress(f"other load: {cores:.2f} cores")
            return cores
        progress(f"waiting for the machine to go idle (other load {cores:.2f} cores)")
        time.sleep(4.0)


def marked_processes(variable: str, marker: str, include_self: bool = False) -> list:
    """Processes whose environment carries ``variable=marker`` (this one only if asked)."""
    found = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == os.getpid():
            if include_self:
                found.append(p)
            continue
        try:
            if p.environ().get(variable) == marker:
                found.append(p)
        except (psutil.Error, OSError):
            pass
    return found


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sweep(variable: str, marker: str, grace: float) -> tuple[list[str], float]:
    """Wait up to ``grace`` s for a child's processes to exit, then kill the rest.

    Some systems' helpers exit a little after their shutdown call has returned; only
    those still there after the grace period count as left behind. Returns their
    descriptions and the seconds waited.
    """
    t0 = time.monotonic()
    left = marked_processes(variable, marker)
    while left and time.monotonic() - t0 < grace:
        time.sleep(0.25)
        left = [p for p in left if _alive(p)]
    waited = time.monotonic() - t0
    described = []
    for p in left:
        try:
            described.append(f"pid {p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            described.append(f"pid {p.pid}")
    for p in left:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, stuck = psutil.wait_procs(left, timeout=5)
    for p in stuck:
        try:
            p.kill()
        except psutil.Error:
            pass
    return described, waited


def wait_child(proc: subprocess.Popen, timeout: float, stop_grace: float) -> str | None:
    """Wait for a child started with ``start_new_session=True``; stop it if it overruns
    ``timeout`` or on Ctrl-C. Returns what went wrong (``"interrupted"`` for Ctrl-C: the
    caller cleans up, then raises ``KeyboardInterrupt``) or ``None``.

    Stopping is SIGTERM to the child alone, so it shuts its system down in its
    ``finally`` blocks; after ``stop_grace`` s its whole session is SIGKILLed.
    """
    failure = None
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        failure = f"timed out after {timeout:.0f} s (killed)"
    except KeyboardInterrupt:
        failure = "interrupted"
    finally:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=stop_grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
    return failure
