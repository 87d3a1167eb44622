"""The paging seam with real worker processes: the stage protocol drives a driver's
paging and its workers' (runtime/paging/paging_api.py), and what each side says to the
other travels typed (PagingConfig, PagingInfo, counters)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.errors import ClamorError
from clamor.runtime.launchers.local import LocalLauncher
from clamor.runtime.paging.paging_api import PagingConfig, PagingInfo, PagingKind
from clamor.runtime.paging.read_sets import ReadSet
from clamor.testing.waiting import wait_for

RECORDING_PAGING = """
import numpy as np
from clamor.runtime.paging.paging_api import PagingInfo
from clamor.runtime.paging.read_sets import encode


class RecordingPaging:
    def __init__(self, worker_id, config, token):
        self.worker_id, self.marker = worker_id, config.driver_host
        self.epoch, self.invalidated, self.late = None, [], 0

    def info(self):
        return PagingInfo(host=self.marker, page_port=self.worker_id + 1)

    def begin_task(self, epoch):
        self.epoch = epoch

    def end_task(self):  # the read set, packed as runs; worker 1's is resident (no versions)
        if self.worker_id == 1:
            return encode(np.array([1], np.uint64), np.array([0], np.uint32)), True
        return encode(np.array([self.worker_id], np.uint64), np.array([self.epoch], np.uint32)), False

    def invalidate(self, epoch, pages):
        self.late += self.epoch is not None and self.epoch >= epoch  # a task of its stage ran first
        self.invalidated.append((epoch, list(pages)))

    def stats(self):  # counters only: one per page invalidated, named by epoch and page
        named = {f"invalidated_{e}_{p}": 1 for e, pages in self.invalidated for p in pages}
        return {**named, "cached_pages": 7, "late_invalidations": self.late}
"""

#: A worker whose table of pagings has the recording one under the arena's kind (the
#: driver names a kind; what the worker builds for it is the worker's own business).
RECORDING_WORKER = """
import sys

from clamor.runtime.paging.paging_api import PagingKind
from clamor.runtime.worker import process
from recording_paging import RecordingPaging

process.PAGINGS[PagingKind.ARENA] = RecordingPaging
sys.exit(process.main())
"""


class RecordingLauncher(LocalLauncher):
    """Local workers that run ``script`` (:data:`RECORDING_WORKER`) instead of ``-m clamor...``."""

    def __init__(self, script: str) -> None:
        super().__init__()
        self.script = script

    def command(self) -> list[str]:
        command = super().command()
        at = command.index("-m")
        return [command[0], self.script, *command[at + 2 :]]


def invalidated(stats: dict) -> list[tuple[int, list[int]]]:
    """The recording paging's invalidations, ``(epoch, pages)`` in order, from its counters."""
    pairs = sorted(tuple(map(int, k.split("_")[1:])) for k in stats if k.startswith("invalidated_"))
    return [(e, [p for e2, p in pairs if e2 == e]) for e in sorted({e for e, _ in pairs})]


class RecordingDriverPaging:
    def __init__(self):
        self.events: list[tuple] = []
        self.epoch = 0

    def worker_config(self, worker_id, host):
        self.events.append(("config", worker_id, host))
        return PagingConfig(kind=PagingKind.ARENA, driver_host=f"m{worker_id}")

    def worker_ready(self, worker_id, info):
        self.events.append(("ready", worker_id, info))

    def begin_stage(self):
        self.epoch += 1
        self.events.append(("begin", self.epoch))
        return self.epoch, [10 * self.epoch, 10 * self.epoch + 1] if self.epoch % 2 else []

    def end_stage(self):
        self.events.append(("end", self.epoch))

    def sealed(self):  # the pages the last begin_stage gave a new version: not known here
        return None

    def versions_at(self, runs, epoch):  # a resident read set's versions: its pages' at epoch
        self.events.append(("versions", epoch))
        return np.full(len(ReadSet(runs)), 1000 + epoch, np.uint32)

    def worker_lost(self, worker_id):
        self.events.append(("lost", worker_id))

    def trim_versions(self, floor):
        return 0

    def release(self, epoch):
        self.events.append(("release", epoch))

    def retain(self, epoch):
        self.events.append(("retain", epoch))
        return True

    def stats(self):
        return {"page_size": 4096}

    def version_log_bytes(self):
        return 0

    def close(self):
        self.events.append(("close",))


def test_stage_protocol_drives_the_paging_seam(tmp_path):
    (tmp_path / "recording_paging.py").write_text(textwrap.dedent(RECORDING_PAGING))
    (tmp_path / "recording_worker.py").write_text(textwrap.dedent(RECORDING_WORKER))
    paging = RecordingDriverPaging()
    launcher = RecordingLauncher(str(tmp_path / "recording_worker.py"))
    with Cluster(2, paging=paging, launcher=launcher, timeout=30) as c:
        ready = sorted(e[1:] for e in paging.events if e[0] == "ready")
        assert ready == [(0, PagingInfo(host="m0", page_port=1)), (1, PagingInfo(host="m1", page_port=2))]
        assert ("config", 0, "127.0.0.1") in paging.events

        assert c.run_stage([(0, abs, (1,)), (1, abs, (2,))]) == [
            1,
            2,
        ]  # epoch 1: invalidates 10, 11
        assert c.last_read_sets == [[(0, 1)], [(1, 1001)]]  # worker 1's versions: the driver's
        assert ("versions", 1) in paging.events
        c.run(abs, 1, worker=1)  # epoch 2: nothing to invalidate
        assert c.last_read_sets == [[(1, 1002)]]
        assert ("release", 1) in paging.events  # nothing pinned epoch 1 when its stage ended
        with c.keep_versions(1):  # ... so a replay asks for it back first
            c.run(abs, 1, worker=0, epoch=1)  # a replay at epoch 1 inside stage 3 (invalidates 30, 31)
        assert ("retain", 1) in paging.events
        assert c.last_read_sets == [[(0, 1)]]
        with pytest.raises(ZeroDivisionError):
            c.run(divmod, 1, 0, worker=0)  # stage 4 fails: end_stage all the same
        assert [e for e in paging.events if e[0] in ("begin", "end")] == [
            ("begin", 1),
            ("end", 1),
            ("begin", 2),
            ("end", 2),
            ("begin", 3),
            ("end", 3),
            ("begin", 4),
            ("end", 4),
        ]
        # A worker that ran nothing of stage 3 gets its invalidation on its task stream,
        # ahead of any later attempt but unanswered: a Stats call may arrive before it.
        both = [(1, [10, 11]), (3, [30, 31])]
        wait_for(lambda: all(invalidated(w) == both for w in c.worker_stats()), what="stage 3's invalidations")
        stats = c.stats()
        assert stats["page_size"] == 4096 and stats["stages_run"] == 4
        for w in stats["workers"]:
            assert invalidated(w) == both
            assert w["late_invalidations"] == 0  # each reached the worker before its stage's tasks
            assert w["cached_pages"] == 7 and w["rss_bytes"] > 0

        c.kill_worker(1)
        assert ("lost", 1) in paging.events
        c.run(abs, 1, worker=0)  # stage 5 invalidates the live worker only
        assert invalidated(c.worker_stats()[0])[-1] == (5, [50, 51])
    assert paging.events[-1] == ("close",)


def test_a_worker_whose_invalidation_fails_exits_rather_than_run_on_stale_pages(tmp_path, caplog):
    """The invalidation reaches the worker on its task stream, unanswered: should applying
    it fail, the worker exits with its own status before any task of the stage runs, and
    the driver names that as the reason it lost the worker."""
    failing = RECORDING_PAGING + textwrap.dedent("""
        def _fail(self, epoch, pages):
            raise RuntimeError("cannot invalidate")

        RecordingPaging.invalidate = _fail
    """)
    (tmp_path / "recording_paging.py").write_text(textwrap.dedent(failing))
    (tmp_path / "recording_worker.py").write_text(textwrap.dedent(RECORDING_WORKER))
    launcher = RecordingLauncher(str(tmp_path / "recording_worker.py"))
    # restarts=0: no replacement starts (with the same failing paging) as the cluster closes
    with Cluster(1, paging=RecordingDriverPaging(), launcher=launcher, timeout=30, restarts=0) as c:
        with pytest.raises(ClamorError):
            c.run(abs, 1, worker=0)  # epoch 1 invalidates pages 10 and 11
        assert 0 not in c.workers
    assert "the driver's written pages could not be invalidated" in caplog.text
