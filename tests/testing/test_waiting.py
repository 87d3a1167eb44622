"""The tests' waiting helpers (clamor.testing.waiting): a process that exits, or is a
zombie, counts as gone; one still running is reported after the timeout."""

from __future__ import annotations

import subprocess
import sys

from clamor.testing.waiting import exited, still_running


def test_a_running_process_is_reported_and_an_exited_one_is_not():
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert not exited(child.pid)
        assert still_running([child.pid], timeout=0.2) == [child.pid]
        child.stdin.close()  # it exits; not reaped yet, a zombie counts as gone
        assert still_running([child.pid], timeout=10) == []
        assert exited(child.pid)
    finally:
        child.kill()
        child.wait()
    assert exited(child.pid)  # reaped: no such process
