"""The Clamor kernel (docs/user-guide.md, "The Clamor kernel"): its parts in-process, then its lifecycle through jupyter_client.

Lifecycle checks run real kernels from the installed "clamor" kernelspec and look
at their worker processes with psutil: none while idle, N after the first use,
none after shutdown or restart, none a few seconds after the kernel is SIGKILLed;
an interrupt cancels a long stage and the next one works. Every kernel and worker
a test started is killed in teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
from clamor.kernel import arena_default, cli, session
from clamor.kernel.lazy import LazyCluster
from clamor.runtime.paging import arena
from clamor.testing.waiting import exited, still_running
from jupyter_client import KernelClient, KernelManager
from kernelspec_fixture import clamor_kernelspec  # noqa: F401 - a fixture

WORKER_MODULE = "clamor.runtime.worker.process"

# --- in-process: the arena default, the lazy cluster, the command line ---------------


def test_cell_allocations_put_arrays_of_a_page_or_more_in_the_arena() -> None:
    page = arena.page_size()
    from_thread: list[np.ndarray] = []
    with arena_default.cell_allocations() as threshold:  # session default: on
        assert threshold == page
        big, just_below, small = np.ones(page // 8), np.ones(page // 8 - 1), np.ones(10)
        grown = np.arange(10.0)
        grown.resize(page, refcheck=False)  # a heap block that grows past a page moves
        worker = threading.Thread(target=lambda: from_thread.append(np.ones(page)))
        worker.start()
        worker.join()
    after = np.ones(page)
    assert arena.in_arena(big) and arena.in_arena(grown)
    assert np.array_equal(grown[:10], np.arange(10.0))
    assert not arena.in_arena(just_below) and not arena.in_arena(small)
    assert not arena.in_arena(from_thread[0])  # other threads keep numpy's allocator
    assert not arena.in_arena(after)  # only during the block


def test_arena_default_follows_the_session_config(monkeypatch: pytest.MonkeyPatch) -> None:
    assert arena_default.threshold({}) == arena.page_size()
    for off in (False, "false", "off", "0"):
        assert arena_default.threshold({"arena_default": off}) == 0
    monkeypatch.setitem(session.config, "arena_default", False)
    with arena_default.cell_allocations() as threshold:
        big = np.ones(arena.page_size())
    assert threshold == 0 and not arena.in_arena(big)


def test_lazy_cluster_starts_nothing_until_used(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []

    class FakeCluster:
        workers = (0, 1)

    def get(start: bool = True) -> object:  # the session's: start one if there is none
        if not started:
            started.append(FakeCluster())
        return started[-1]

    monkeypatch.setattr(session, "current", lambda: started[-1] if started else None)
    monkeypatch.setattr(session, "get", get)
    proxy = LazyCluster()
    assert "not started" in repr(proxy)
    assert not proxy.started
    assert "parallelize" in dir(proxy) and "stats" in dir(proxy)
    for probe in ("_ipython_display_", "__array__"):
        assert not hasattr(proxy, probe)  # IPython's display probes do not start workers
    assert "not started" in proxy._repr_html_()  # its rich display neither
    with pytest.raises(TypeError, match="cannot be shipped"):
        pickle.dumps(proxy)
    assert started == []

    assert proxy.workers == (0, 1)  # first use: the session starts its cluster
    assert len(started) == 1 and proxy.started and proxy.get() is started[0]
    assert proxy.workers == (0, 1) and len(started) == 1  # and keeps it


def test_install_kernel_fills_in_this_interpreter(tmp_path: Path) -> None:
    assert cli.main(["install-kernel", "--prefix", str(tmp_path), "--name", "clamor-test"]) == 0
    spec = json.loads((tmp_path / "share/jupyter/kernels/clamor-test/kernel.json").read_text())
    assert spec["argv"] == [sys.executable, "-m", "clamor.kernel", "-f", "{connection_file}"]
    assert spec["display_name"] == "Clamor (Python 3)" and spec["language"] == "python"
    assert (tmp_path / "share/jupyter/kernels/clamor-test/logo-svg.svg").exists()
    help_text = subprocess.run(
        [sys.executable, "-m", "clamor.kernel.cli", "--help"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "install-kernel" in help_text.stdout


# --- helpers for live kernels -------------------------------------------------------------


def _is_live_worker(proc: psutil.Process) -> bool:
    try:
        return (
            proc.status() != psutil.STATUS_ZOMBIE
            and (proc.name() == "clamor-worker" or WORKER_MODULE in " ".join(proc.cmdline()))
        )
    except psutil.Error:
        return False


def workers_of(kernel_pid: int) -> list[psutil.Process]:
    """The live worker processes started by the kernel process ``kernel_pid``."""
    try:
        children = psutil.Process(kernel_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in children if _is_live_worker(p)]


def alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running as processes (zombies count as gone)."""
    return [pid for pid in pids if not exited(pid)]


class Kernel:
    """A Clamor kernel started through jupyter_client, with its client."""

    def __init__(self, name: str) -> None:
        self.km = KernelManager(kernel_name=name)
        self.km.start_kernel()
        self.kc: KernelClient = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.seen: set[int] = set()  # every worker pid observed, for teardown

    @property
    def pid(self) -> int:
        return self.km.provisioner.pid  # type: ignore[union-attr]

    def workers(self) -> list[int]:
        pids = [p.pid for p in workers_of(self.pid)]
        self.seen.update(pids)
        return pids

    def run(self, code: str, timeout: float = 60) -> tuple[dict, str]:
        """Execute ``code``; the reply's content and the text it printed or showed.

        Each request stands alone (``stop_on_error=False``): after an error reply, ipykernel
        aborts execute requests that reach it before its "stop aborting" message does
        (ipython/ipykernel#609), which a test's next request right after it may do."""
        out: list[str] = []

        def hook(msg: dict) -> None:
            content = msg["content"]
            if msg["msg_type"] == "stream":
                out.append(content["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                out.append(content["data"].get("text/plain", "") + "\n")
            elif msg["msg_type"] == "error":
                out.append("\n".join(content["traceback"]))

        reply = self.kc.execute_interactive(
            textwrap.dedent(code), timeout=timeout, output_hook=hook, stop_on_error=False
        )
        return reply["content"], "".join(out)

    def ok(self, code: str, timeout: float = 60) -> str:
        content, text = self.run(code, timeout)
        assert content["status"] == "ok", text
        return text

    def reconnect(self) -> None:
        self.kc.stop_channels()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)

    def kill_all(self) -> None:
        """Teardown: stop the client, the kernel and any worker it left behind."""
        self.kc.stop_channels()
        with contextlib.suppress(Exception):  # teardown goes on
            if self.km.is_alive():
                self.km.shutdown_kernel(now=True)
        for pid in alive(sorted(self.seen)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def start_kernel(clamor_kernelspec: str) -> Iterator[Callable[[], Kernel]]:  # noqa: F811
    kernels: list[Kernel] = []

    def start() -> Kernel:
        kernels.append(Kernel(clamor_kernelspec))
        return kernels[-1]

    yield start
    for kernel in kernels:
        kernel.kill_all()
    leftovers = [pid for kernel in kernels for pid in alive(sorted(kernel.seen))]
    assert not leftovers, f"worker processes left behind: {leftovers}"


USE_CLUSTER = """
assert cluster.range(8, partitions=4).map(lambda i: i * i).collect() == [i * i for i in range(8)]
print("workers:", len(cluster.workers))
"""


def used(text: str) -> int:
    """The number of workers that :data:`USE_CLUSTER` printed."""
    return int(text.rsplit("workers:", 1)[1])


# --- lifecycle ----------------------------------------------------------------------------


@pytest.mark.slow
def test_idle_kernel_has_no_workers_first_use_starts_them_shutdown_ends_them(start_kernel):
    kernel = start_kernel()
    text = kernel.ok("import numpy as np\nprint(clamor.__name__)\ncluster")
    assert "clamor" in text and "not started" in text
    kernel.ok("%clamor help")  # the magics are loaded
    time.sleep(0.5)
    assert kernel.workers() == []

    assert used(kernel.ok(USE_CLUSTER)) == 2
    pids = kernel.workers()
    assert len(pids) == 2

    kernel.km.shutdown_kernel(now=False)  # shutdown_request: do_shutdown closes the cluster
    assert not (left := still_running(pids, 10)), f"workers {left} outlived the kernel"
    assert not kernel.km.is_alive()


@pytest.mark.slow
def test_cells_put_their_arrays_in_the_arena_and_clamor_cells_page_them_in(start_kernel):
    kernel = start_kernel()
    text = kernel.ok(
        """
        import threading
        import numpy as np
        page = cluster.page_size
        big = np.arange(64 * page // 8, dtype=np.float64)   # 64 pages, made by a cell
        small = np.ones(16)
        elsewhere = []
        t = threading.Thread(target=lambda: elsewhere.append(np.ones(page)))
        t.start(); t.join()
        print(clamor.in_arena(big), clamor.in_arena(small), clamor.in_arena(elsewhere[0]))
        """
    )
    assert text.split()[-3:] == ["True", "False", "False"]
    kernel.ok("offsets = [0, 5 * page // 8]")
    kernel.ok(
        """
        %%clamor map offsets --as i --into probes
        big[i] + 1.0
        """
    )
    text = kernel.ok(
        """
        before = cluster.stats()["pages_read"]
        assert [float(v) for v in probes.collect()] == [1.0, 5 * page // 8 + 1.0]
        print(cluster.stats()["pages_read"] - before)
        """
    )
    assert 0 < int(text) < 64  # demand-paged: the pages touched, not the whole array
    kernel.ok("%clamor config arena_default=false")
    text = kernel.ok("print(clamor.in_arena(np.ones(2 * page)))")
    assert text.strip() == "False"


@pytest.mark.slow
def test_interrupt_cancels_the_running_stage_and_the_cluster_stays_usable(start_kernel):
    kernel = start_kernel()
    kernel.ok(USE_CLUSTER)
    pids = kernel.workers()
    msg_id = kernel.kc.execute(
        "import time\n"
        "def spin(i):\n"
        "    end = time.time() + 2.0\n"
        "    while time.time() < end:\n"
        "        pass\n"
        "    return i\n"
        "cluster.range(16, partitions=16).map(spin).collect()",
        stop_on_error=False,  # the next request follows the interrupt's reply at once (see run)
    )
    time.sleep(2.5)  # the stage is running
    t0 = time.monotonic()
    kernel.km.interrupt_kernel()
    reply = kernel.kc.get_shell_msg(timeout=30)
    assert reply["parent_header"]["msg_id"] == msg_id
    assert reply["content"]["status"] == "error"
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    assert time.monotonic() - t0 < 10  # not the 16 s the stage would take
    # the running tasks were interrupted on the workers (Python code stops at once); the
    # next stage runs on the same workers
    assert used(kernel.ok(USE_CLUSTER, timeout=60)) == 2
    assert sorted(kernel.workers()) == sorted(pids)  # SIGINT spared the workers
    assert "tasks_interrupted" in kernel.ok("print(cluster.counters())")


def test_a_failing_call_in_a_plain_cell_shows_the_cells_frames_in_a_few_lines(start_kernel):
    """``cluster.run`` and dataset actions in ordinary cells: the error shows the cell's
    frames on the worker, named as IPython names cells, and the exception; the runtime's
    frames only in ``%clamor traceback``. Other errors look as they always do."""
    kernel = start_kernel()
    kernel.ok(USE_CLUSTER)
    content, text = kernel.run("def f():\n    x = 1\n    return x / 0\ncluster.run(f)")
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert content["status"] == "error" and content["ename"] == "ZeroDivisionError"
    assert len(plain.splitlines()) <= 15, plain
    assert "on a worker" in plain and re.search(r"Cell In\[\d+\], line 3, in f", plain), plain
    assert "return x / 0" in plain and "executor.py" not in plain, plain
    full = kernel.ok("%clamor traceback")
    assert "executor.py" in full or "cluster.py" in full, full
    _, text = kernel.run("cluster.range(4, partitions=4).map(lambda i: 1 / (i - 2)).collect()")
    assert len(text.splitlines()) <= 15 and "ZeroDivisionError" in text, text
    _, text = kernel.run("{}['missing']")  # not Clamor's: IPython's own traceback
    assert "KeyError" in text and "Traceback of the cell" not in text


def test_a_long_action_in_a_plain_cell_shows_a_progress_bar(start_kernel):
    """Not only the magics: any cell whose stages run past ``progress_delay`` shows a bar;
    a cell that runs no task shows none, however long it takes."""
    kernel = start_kernel()
    kernel.ok(USE_CLUSTER)
    text = kernel.ok("import time\nprint(cluster.range(8, partitions=8).map(lambda i: time.sleep(0.5) or i).count())")
    assert re.search(r"\[[#.]+\] \d+/8 tasks, 1 stage", text) and "8\n" in text, text
    assert "tasks" not in kernel.ok("time.sleep(1.5)")
    kernel.ok("%clamor config progress=off")
    assert "tasks," not in kernel.ok("cluster.range(4, partitions=4).map(lambda i: time.sleep(0.8) or i).count()")


@pytest.mark.slow
def test_restart_closes_the_workers_and_the_new_kernel_starts_none_until_used(start_kernel):
    kernel = start_kernel()
    kernel.ok(USE_CLUSTER)
    old_pids, old_kernel = kernel.workers(), kernel.pid
    assert len(old_pids) == 2

    kernel.km.restart_kernel(now=False)
    kernel.reconnect()
    assert kernel.pid != old_kernel
    assert not (left := still_running(old_pids, 10)), f"old workers {left} live on"
    time.sleep(0.5)
    assert kernel.workers() == []
    assert used(kernel.ok(USE_CLUSTER)) == 2
    assert len(kernel.workers()) == 2


@pytest.mark.slow
def test_a_sigkilled_kernel_leaves_no_workers(start_kernel):
    kernel = start_kernel()
    kernel.ok(USE_CLUSTER)
    pids = kernel.workers()
    assert len(pids) == 2
    os.kill(kernel.pid, signal.SIGKILL)
    assert not (left := still_running(pids, 10)), f"workers {left} outlived the kernel"

