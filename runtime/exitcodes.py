"""Exit statuses of ``clamor-worker``, how to describe a worker's end, and whether a
process still runs (the driver asks it of its workers, a worker of its driver)."""

import signal

import psutil

EXIT_OK = 0
#: The driver could not be reached (at registration, by heartbeats, or its process is gone).
EXIT_DRIVER_UNREACHABLE = 70
#: The driver refused the worker (bad token, protocol mismatch, or it no longer knows it).
EXIT_DRIVER_REFUSED = 71
#: The worker could not set itself up (e.g. its paging factory failed).
EXIT_SETUP_FAILED = 72
#: The fault handler could not get a page (the driver refused it, or the page cache is full).
#: Declared in C too (api.h, CLAMOR_EXIT_PAGE_ERROR); a test checks they agree.
EXIT_PAGE_ERROR = 73
#: Dropping or advancing the pages the driver wrote failed: the worker's pages may be stale.
EXIT_INVALIDATION_FAILED = 74

_NAMES = {
    EXIT_OK: "clean shutdown",
    EXIT_DRIVER_UNREACHABLE: "driver unreachable",
    EXIT_DRIVER_REFUSED: "refused by the driver",
    EXIT_SETUP_FAILED: "worker set-up failed",
    EXIT_PAGE_ERROR: "a page could not be fetched",
    EXIT_INVALIDATION_FAILED: "the driver's written pages could not be invalidated",
}


def describe_exit(code: int | None) -> str:
    """Say how a process ended, from a ``Popen.returncode``-style code (negative = signal)."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by signal {-code} ({name})"
    name = _NAMES.get(code)
    return f"exited with status {code}" + (f" ({name})" if name else "")


def process_runs(pid: int) -> bool:
    """Whether process ``pid`` exists and is neither stopped (SIGSTOP, a debugger) nor a
    zombie: it runs, or sleeps (in a system call, or in a C call holding the GIL)."""
    try:
        return psutil.Process(pid).status() not in (
            psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD,
        )  # fmt: skip
    except psutil.Error:
        return False
