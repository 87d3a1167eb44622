"""Running benchmark children: machine load, waiting for quiet, stopping and sweeping.

Each benchmark runs every measured system in a child process whose environment
carries a marker (inherited by the system's own workers and daemons), so the
parent can tell its processes from everybody else's, measure the machine's
other load, and kill whatever a child leaves behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

#: Other processes using more than this many cores perturb the numbers.
BUSY_CORES = 0.1
#: In the environment of every child that :func:`run_child` starts, inherited by the
#: measured system's workers and daemons.
CHILD_MARKER = "CLAMOR_BENCH_CHILD"
STOP_GRACE = 30.0  # seconds a stopped child gets to shut its system down
SWEEP_GRACE = 20.0  # seconds the child's processes get to exit after it did
#: ``bench/run.py``: every workload runs through it (``run.py NAME ARGS``).
RUN = Path(__file__).resolve().parents[1] / "run.py"
ROOT = RUN.parents[1]

__all__ = [
    "BUSY_CORES", "CHILD_MARKER", "ROOT", "RUN", "ChildRun", "Rows", "busy_seconds",
    "child_main", "machine_load", "marked_processes", "merge", "progress", "run_all", "run_child",
    "run_marked", "sweep", "wait_child", "wait_until_idle", "workload_command",
]


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


# --- one measured system per child process (the result rows of results.py) ---------------


class Rows(list):
    """A child's rows, written to its output file each time one is added, so a system
    that hangs later keeps what it measured."""

    def __init__(self, out: Path) -> None:
        super().__init__()
        self.out = out

    def append(self, r: dict) -> None:
        self.extend([r])

    def extend(self, rows: Sequence[dict]) -> None:  # type: ignore[override]
        super().extend(rows)
        self.out.write_text(json.dumps(list(self), indent=1) + "\n")


def child_main(system: str, out: Path, cases: Sequence[str],
               measure: Callable[[str, Rows], None], label: str | None = None) -> None:  # fmt: skip
    """In the child: ``measure(system, rows)``; any failure becomes ``unavailable`` rows
    (named ``label``, default ``system``) for the cases it had not finished."""
    from harness.results import unavailable

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)  # the parent stops us: shut down in finally
    rows = Rows(out)
    try:
        measure(system, rows)
    except BaseException as exc:  # noqa: BLE001 - the parent must get rows
        why = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        progress(f"  {system}: {why}\n{traceback.format_exc()}")
        done = {r["case"] for r in rows}
        for case in cases:
            if case not in done:
                rows.append(unavailable(label or system, case, why))


def workload_command(script: Path | str) -> list[str]:
    """The command that runs the workload ``bench/workloads/<stem>.py`` (through run.py,
    which puts ``bench/`` on the path)."""
    return [sys.executable, str(RUN), Path(script).stem]


@dataclasses.dataclass
class ChildRun:
    """How one child went: what it wrote, what went wrong, what it left behind."""

    output: Any  # the JSON it wrote to its output file; None if it wrote none
    failure: str | None  # a time-out (it was stopped), or None
    returncode: int
    wall_s: float  # start to exit
    leftovers: list[str]  # its processes still there after the grace period (killed)
    waited_s: float  # the grace period used


def run_marked(command: Callable[[Path], Sequence[str]], timeout: float,
               env: dict[str, str] | None = None) -> ChildRun:  # fmt: skip
    """Run ``command(out)`` in its own session, marked with :data:`CHILD_MARKER` (which
    its workers and daemons inherit), until it exits or overruns ``timeout``; then sweep
    its processes. ``out`` is a fresh file the child may write its JSON result to.
    Ctrl-C stops the child, sweeps, and raises ``KeyboardInterrupt``."""
    marker = uuid.uuid4().hex
    env = dict(os.environ, **(env or {}), **{CHILD_MARKER: marker}, RAY_USAGE_STATS_ENABLED="0",
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="clamor-bench-") as tmp:
        out = Path(tmp) / "out.json"
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(command(out)), env=env, stdout=sys.stderr, cwd=ROOT,
                                start_new_session=True)  # fmt: skip
        failure = wait_child(proc, timeout, STOP_GRACE)
        wall = time.perf_counter() - t0
        leftovers, waited = sweep(CHILD_MARKER, marker, SWEEP_GRACE)
        if failure == "interrupted":
            raise KeyboardInterrupt
        output = json.loads(out.read_text()) if out.exists() else None
    if leftovers:
        progress(f"  killed {len(leftovers)} process(es) left behind: {leftovers}")
    return ChildRun(output, failure, proc.returncode, wall, leftovers, waited)


def run_child(script: Path, system: str, argv: Sequence[str], cases: Sequence[str],
              timeout: float, label: str | None = None) -> list[dict]:  # fmt: skip
    """Run ``script --child system --child-out F argv`` through :func:`run_marked`; its
    rows, with the processes it left behind noted. Cases it did not report become
    ``unavailable`` rows named ``label`` (default ``system``)."""
    from harness.results import unavailable

    run = run_marked(lambda out: [*workload_command(script), "--child", system,
                                  "--child-out", str(out), *argv], timeout)  # fmt: skip
    rows = run.output or []
    why = run.failure or f"the child exited with status {run.returncode} before this case"
    done = {r["case"] for r in rows}
    rows += [unavailable(label or system, c, why) for c in cases if c not in done]
    for r in rows:
        r["child_elapsed_s"] = run.wall_s
        r["left_behind"] = run.leftovers
        if run.leftovers:
            r["note"] = "; ".join(x for x in (r["note"], f"left {len(run.leftovers)} process(es) behind (killed)") if x)
        progress(f"  {r['system']} {r['case']}: "
                 + (f"median {statistics.median(r['seconds']):.3f} s" if r["seconds"] else r["note"]))
    return rows


def run_all(script: Path, systems: Sequence[str], argv: Sequence[str], cases: Sequence[str],
            timeout: float, wait_idle: float = 0.0,
            label: Callable[[str], str] | None = None, passes: int = 1) -> list[dict]:  # fmt: skip
    """Every system through :func:`run_child`, one after the other, ``passes`` times
    (A B C A B C ...: a drift of the machine reaches every system alike); all their
    rows, each pass's repetitions of a (system, case) merged into one row (:func:`merge`)."""
    passes_rows: list[list[dict]] = []
    for number in range(passes):
        rows: list[dict] = []
        for system in systems:
            if wait_idle:
                wait_until_idle(wait_idle)
            progress(f"{system}:" + (f" pass {number + 1} of {passes}" if passes > 1 else ""))
            rows += run_child(script, system, argv, cases, timeout, label(system) if label else None)
        passes_rows.append(rows)
    return merge(passes_rows)


def merge(passes: Sequence[Sequence[dict]]) -> list[dict]:
    """One row per (system, case) from the rows of every pass: the repetitions'
    seconds and every ``*_runs`` list concatenated in pass order, the largest peak,
    the notes of every pass, ``passes`` the number merged; the other fields the first
    pass's."""
    merged: dict[tuple[str, str], dict] = {}
    for rows in passes:
        for r in rows:
            key = (r["system"], r["case"])
            if key not in merged:
                merged[key] = {**r, "passes": 1}
                continue
            m = merged[key]
            m["passes"] += 1
            for field, value in r.items():
                if field == "seconds" or field.endswith("_runs"):
                    m[field] = [*(m.get(field) or []), *(value or [])]
                elif field.startswith("peak_") and value is not None:
                    m[field] = max(value, m.get(field) or 0)
                elif field == "note" and value and value not in m["note"].split("; "):
                    m["note"] = "; ".join(x for x in (m["note"], value) if x)
    return list(merged.values())
