"""Arena faults are invisible to Python's faulthandler; real crashes are not.

Arena faults are served by userfaultfd threads, so no SIGSEGV handler is
installed anywhere: faulthandler keeps its own, and a genuine segfault
outside the arena still dies with the native traceback it prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import clamor

pytestmark = pytest.mark.slow


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONFAULTHANDLER="1")  # inherited by the workers too
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )


def test_arena_faults_never_wake_faulthandler():
    done = run_python(
        """
        import faulthandler, numpy as np, clamor
        assert faulthandler.is_enabled()
        x = clamor.array(64 * 4096 // 8)
        x[:] = 1.0
        with clamor.Cluster(workers=2, page_size=4096) as c:
            for _ in range(3):
                sums = c.run_stage([(w, lambda a: float(a.sum()), (x,)) for w in c.workers])
                assert sums == [float(x.sum())] * 2, sums
                x[7] += 1.0   # a driver write to a protected page: a write-protect fault
        assert faulthandler.is_enabled()
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout
    assert "Fatal Python error" not in done.stderr


def test_a_real_segfault_in_the_driver_still_crashes_with_a_traceback():
    done = run_python(
        """
        import ctypes, numpy as np, clamor
        from clamor.runtime.paging.pager import DriverPager
        x = clamor.array(1 << 16)
        pager = DriverPager(token=b"t")
        pager.begin_stage()
        x[3] = 2.0              # a handled arena fault first
        ctypes.string_at(0)     # then a real one
        """
    )
    assert done.returncode == -11
    assert "Fatal Python error: Segmentation fault" in done.stderr


def test_a_real_segfault_on_a_worker_is_reported_as_a_lost_worker():
    with clamor.Cluster(workers=1, page_size=4096) as c:
        x = clamor.array(4096)

        def crash(a):
            import ctypes

            float(a.sum())  # arena faults first: handled
            ctypes.string_at(0)

        with pytest.raises(clamor.WorkerLostError, match="SIGSEGV|signal 11"):
            c.run(crash, x)


def test_a_partly_mapped_page_is_mapped_whole_instead_of_faulting_forever():
    # A task-start zap racing the mapping of a page can leave some of its 4 KiB pieces
    # mapped and others not. Made here for real: a worker maps a 256 KiB page, then
    # unmaps all of it but the first piece (MADV_DONTNEED), then reads further in.
    done = run_python(
        """
        import numpy as np, clamor
        x = clamor.array(4 * 262144 // 8, dtype=np.int64)
        x[:] = np.arange(len(x))

        def partly_mapped(a):
            import ctypes, mmap
            libc = ctypes.CDLL(None, use_errno=True)
            page = a[32768:65536]                  # the arena's second 256 KiB page
            first = int(page[0])                   # maps the whole page
            addr = page.__array_interface__["data"][0]
            assert libc.madvise(ctypes.c_void_p(addr + 4096), ctypes.c_size_t(262144 - 4096),
                                mmap.MADV_DONTNEED) == 0, ctypes.get_errno()
            return first, int(page[16384]), int(page[-1]), int(page.sum())

        with clamor.Cluster(workers=1, page_size=262144, transport="tcp") as c:
            got = c.run_stage([(c.workers[0], partly_mapped, (x,))])[0]
        want = (32768, 32768 + 16384, 65535, int(x[32768:65536].sum()))
        assert got == want, (got, want)
        print("ok")
        """,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout
