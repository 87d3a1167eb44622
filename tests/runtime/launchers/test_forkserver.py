"""Local workers forked from a template process (runtime/worker/template.py,
runtime/launchers/forkserver.py): what the cluster sees of them is what it sees of
workers started one by one, and nothing outlives the cluster or the template."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import psutil
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.errors import ClamorError
from clamor.runtime.launchers.local import LocalLauncher
from clamor.testing.waiting import still_running, wait_for


def template_of(cluster: Cluster) -> psutil.Process:
    """The one template process, a child of this driver, parent of every worker."""
    parents = {psutil.Process(cluster.worker_pid(w)).ppid() for w in cluster.workers}
    assert len(parents) == 1
    template = psutil.Process(parents.pop())
    assert template.ppid() == os.getpid()
    assert template.name() == "clamor-template"
    return template


def random_draw() -> float:
    return float(np.random.rand())


def test_workers_forked_from_one_template_run_tasks_and_draw_their_own_random_numbers(tmp_path):
    with Cluster(3, timeout=60, log_dir=str(tmp_path)) as cluster:
        template = template_of(cluster)
        assert cluster.run_stage([(w, os.getpid, ()) for w in cluster.workers]) == [
            cluster.worker_pid(w) for w in cluster.workers
        ]
        assert {psutil.Process(cluster.worker_pid(w)).name() for w in cluster.workers} == {"clamor-worker"}
        draws = cluster.run_stage([(w, random_draw, ()) for w in cluster.workers])
        assert len(set(draws)) == 3  # not the template's one state, copied three times
        cluster.run(print, "hello from a forked worker", worker=1)
        pids = [cluster.worker_pid(w) for w in cluster.workers]
    assert still_running([*pids, template.pid]) == []
    deadline = time.monotonic() + 5
    log = tmp_path / "worker-1.log"
    while "hello from a forked worker" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the forked worker's output is not in its log"
        time.sleep(0.05)


def test_a_killed_worker_is_replaced_by_a_new_fork_of_the_same_template():
    with Cluster(2, timeout=60) as cluster:
        template = template_of(cluster)
        killed = cluster.worker_pid(0)
        cluster.kill_worker(0)
        assert cluster.wait_for_workers(2, timeout=30) == [1, 2]
        assert psutil.Process(cluster.worker_pid(2)).ppid() == template.pid
        assert killed not in [cluster.worker_pid(w) for w in cluster.workers]
        assert cluster.run_stage([(w, abs, (-w,)) for w in cluster.workers]) == [1, 2]


def test_when_the_template_is_killed_its_workers_die_and_new_ones_come_from_a_new_template():
    with Cluster(2, timeout=60) as cluster:
        template = template_of(cluster)
        pids = [cluster.worker_pid(w) for w in cluster.workers]
        template.send_signal(signal.SIGKILL)
        assert still_running(pids) == []  # they die with it (PR_SET_PDEATHSIG)
        deadline = time.monotonic() + 30
        while {0, 1} & set(cluster.workers):  # both losses seen (each its own way: stream, template)
            assert time.monotonic() < deadline, cluster.workers
            time.sleep(0.05)
        assert cluster.wait_for_workers(2, timeout=60) == [2, 3]
        assert template_of(cluster).pid != template.pid
        assert cluster.run_stage([(w, abs, (-w,)) for w in cluster.workers]) == [2, 3]


@pytest.mark.parametrize("fork", [True, False])
def test_the_launcher_starts_workers_with_or_without_the_template(fork):
    with Cluster(2, timeout=60, launcher=LocalLauncher(fork=fork)) as cluster:
        parents = {psutil.Process(cluster.worker_pid(w)).ppid() for w in cluster.workers}
        assert (parents == {os.getpid()}) is not fork
        assert cluster.run(sum, [1, 2, 3]) == 6


# --- a cluster that grows and shrinks while it runs ---------------------------------------


def slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def test_scale_up_and_down_during_a_running_stage_keeps_the_result_exact():
    import threading

    with Cluster(2, timeout=60) as cluster:
        ds = cluster.range(200, partitions=40).map(slow_square).persist()
        result: list = []
        stage = threading.Thread(target=lambda: result.append(ds.collect()))
        stage.start()
        time.sleep(0.3)
        assert cluster.scale(4) == [0, 1, 2, 3]
        retired = [cluster.worker_pid(w) for w in (1, 2, 3)]
        assert cluster.scale(1) == [0]  # the newest go; not replaced
        stage.join(120)
        assert result == [[x * x for x in range(200)]]
        assert still_running(retired) == []
        assert ds.collect() == [x * x for x in range(200)]  # what the retired held: recomputed
        assert cluster.scale(3) == [0, 4, 5]
        assert sum(cluster.run_stage([(w, slow_square, (w,)) for w in cluster.workers])) == 41
        with pytest.raises(ValueError, match="at least one worker"):
            cluster.scale(0)
        assert cluster.workers == [0, 4, 5]


@pytest.mark.parametrize("fork", [True, False])
def test_close_tells_each_worker_on_its_task_stream_and_each_exits_on_its_own(fork):
    launcher = LocalLauncher(fork=fork)
    cluster = Cluster(3, launcher=launcher, timeout=60)
    assert cluster.run_stage([(None, abs, (-i,)) for i in range(6)]) == list(range(6))
    sent = {w: s["sent_messages"] for w, s in cluster._executor.endpoints.stream_counters().items()}
    pids = [cluster.worker_pid(w) for w in cluster.workers]
    cluster.close()
    assert {w: s["sent_messages"] - sent[w] for w, s in cluster._executor.endpoints.stream_counters().items()} == {0: 1, 1: 1, 2: 1}
    assert [launcher.exitcode(w) for w in range(3)] == [0, 0, 0]  # not killed
    assert still_running(pids) == []


def _mark_and_sleep(path: str, seconds: float) -> None:
    open(path, "w").close()
    time.sleep(seconds)


def test_close_ends_a_worker_busy_with_a_long_task_without_killing_it(tmp_path):
    """The idle worker runs the task on its task stream's reader, which reads the
    stream's shutdown only when the task returns: close tells it by a call as well."""
    launcher = LocalLauncher()
    cluster = Cluster(1, launcher=launcher, timeout=60)
    marker = tmp_path / "running"
    future = cluster.submit(_mark_and_sleep, str(marker), 60.0)
    wait_for(marker.exists, 30, "the task to start")
    cluster.close()
    assert launcher.exitcode(0) == 0  # exited on its own, not killed after the launcher's wait
    assert isinstance(future.exception(10), ClamorError)


def test_scale_counts_a_replacement_already_starting():
    with Cluster(2, timeout=60) as cluster:
        cluster.kill_worker(0)  # its replacement, worker 2, is starting
        cluster.scale(2)
        assert cluster.wait_for_workers(3, timeout=60) == [1, 2]  # no worker 3 besides it
