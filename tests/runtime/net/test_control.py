"""The control plane with real processes: Cluster, clamor-worker, gRPC transport."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time

import cloudpickle
import grpc
import psutil
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.cluster_workers import WorkerRegistry
from clamor.runtime.credentials import Credentials, InsecureTokenFile, new_token
from clamor.runtime.errors import (
    ClamorError,
    RemoteTraceback,
    SerializationError,
    TaskError,
    WorkerLostError,
)
from clamor.runtime.exitcodes import EXIT_DRIVER_UNREACHABLE
from clamor.runtime.launchers.base import worker_command
from clamor.runtime.launchers.local import LocalLauncher
from clamor.runtime.net import transport
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.observe import observer
from clamor.runtime.paging.paging_api import (
    NullDriverPaging,
    PagingConfig,
    PagingKind,
)
from clamor.testing.waiting import exited, still_running

# Workers cannot import this test module: ship its functions and classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class CustomError(ValueError):
    pass


class NeedsTwoArgs(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")


def fail_deep(message):
    raise CustomError(message)


def fail(message):
    fail_deep(message)


def raise_needs_two_args():
    raise NeedsTwoArgs(1, 2)


def divide_late(a, b):
    """Fails (b = 0) only after the other worker's tiny tasks have run: a stage's error
    cancels its attempts still queued elsewhere."""
    time.sleep(0.3)
    return divmod(a, b)


def pid_and(value):
    return os.getpid(), value


@pytest.fixture(scope="module")
def cluster():
    with Cluster(2, paging=NullDriverPaging(), timeout=30, restarts=0) as c:
        yield c


# --- running tasks ---------------------------------------------------------------


def test_run_on_each_worker(cluster):
    pid0, v0 = cluster.run(pid_and, "a", worker=0)
    pid1, v1 = cluster.run(pid_and, value="b", worker=1)
    assert (v0, v1) == ("a", "b")
    assert pid0 != pid1 and os.getpid() not in (pid0, pid1)
    assert {w["id"]: w["pid"] for w in cluster.worker_stats()} == {0: pid0, 1: pid1}
    assert cluster.workers == [0, 1]


def test_run_stage_runs_concurrently_in_order(cluster):
    before = cluster.stats()
    calls = [(i % 2, pid_and, (i,)) for i in range(20)]
    results = cluster.run_stage(calls)
    assert [v for _, v in results] == list(range(20))
    pids = {w["id"]: w["pid"] for w in cluster.worker_stats()}
    assert [p for p, _ in results] == [pids[i % 2] for i in range(20)]
    after = cluster.stats()
    assert after["tasks_run"] - before["tasks_run"] == 20
    assert after["stages_run"] - before["stages_run"] == 1
    assert cluster.last_read_sets == [[] for _ in range(20)]

    # Two one-second tasks on two workers overlap.
    start = time.monotonic()
    cluster.run_stage([(0, time.sleep, (1,)), (1, time.sleep, (1,))])
    assert time.monotonic() - start < 1.8


def append_and_count(items: list, extra: list) -> tuple[int, bool]:
    items.append(len(items))
    return len(items), extra is items


def test_run_stage_calls_that_share_an_argument_still_get_copies_of_their_own(cluster):
    shared, other = [], []
    calls = [(i % 2, append_and_count, (shared, shared if i % 3 else other)) for i in range(6)]
    # each call mutates its own copy; an object passed twice is one object within a call
    assert cluster.run_stage(calls) == [(1, False), (1, True), (1, True), (1, False), (1, True), (1, True)]
    assert shared == [] and other == []


def test_a_stages_function_keeps_its_state_between_its_calls_on_one_worker(cluster):
    def count(key, seen=[]):  # noqa: B006 - loaded once per worker for the stage, as Dask and Ray do
        seen.append(key)
        return len(seen)

    assert cluster.run_stage([(0, count, (k,)) for k in range(4)]) == [1, 2, 3, 4]
    assert cluster.run_stage([(0, count, (k,)) for k in range(2)]) == [1, 2]  # a new stage loads it anew


def test_remote_exception_is_reraised_as_same_type(cluster):
    with pytest.raises(CustomError, match="boom") as info:
        cluster.run(fail, "boom", worker=1)
    exc = info.value
    assert type(exc) is CustomError
    assert "fail_deep" in exc.remote_traceback and "boom" in exc.remote_traceback
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "fail_deep" in str(exc.__cause__)
    # The cluster stays usable, and a failing stage still runs its other tasks.
    assert cluster.run(abs, -3, worker=1) == 3
    before = cluster.stats()["tasks_run"]
    with pytest.raises(ZeroDivisionError):
        cluster.run_stage([(0, abs, (-1,)), (1, divide_late, (1, 0)), (0, abs, (-2,))])
    # the error ends the stage at once; the other worker's reports may come just after it
    deadline = time.monotonic() + 10
    while cluster.stats()["tasks_run"] - before < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cluster.stats()["tasks_run"] - before == 3
    assert cluster.run_stage([(0, abs, (-4,)), (1, abs, (-5,))]) == [4, 5]


def test_unreconstructable_exception_becomes_task_error(cluster):
    with pytest.raises(TaskError) as info:
        cluster.run(raise_needs_two_args)
    exc = info.value
    assert exc.type_name.endswith("NeedsTwoArgs") and exc.message == "1/2"
    assert "raise_needs_two_args" in exc.remote_traceback


def test_unpicklable_closure_fails_before_anything_is_sent(cluster):
    lock = threading.Lock()
    before = cluster.stats()
    before_workers = [w["tasks_run"] for w in before["workers"]]
    with pytest.raises(SerializationError) as info:
        cluster.run(lambda: lock.locked())
    assert isinstance(info.value, TypeError)
    assert "'lock'" in str(info.value) and "lock" in str(info.value).split("(a ")[1]
    after = cluster.stats()
    assert (after["tasks_run"], after["stages_run"]) == (before["tasks_run"], before["stages_run"])
    assert [w["tasks_run"] for w in after["workers"]] == before_workers


def test_oversized_payload_is_refused_before_sending(cluster):
    before = cluster.stats()["tasks_run"]
    with pytest.raises(SerializationError, match="MiB limit"):
        cluster.run(len, b"x" * (transport.MAX_MESSAGE_BYTES + 1))
    assert cluster.stats()["tasks_run"] == before


# --- security ----------------------------------------------------------------------


def test_wrong_token_and_protocol_are_refused(cluster, caplog):
    worker_address = cluster.worker_stats()[0]["address"]
    for address, call in [
        (worker_address, lambda ch: pb_grpc.WorkerStub(ch).Stats(pb.StatsRequest(), timeout=5)),
        (
            cluster.address,
            lambda ch: pb_grpc.SchedulerStub(ch).Heartbeat(pb.HeartbeatRequest(), timeout=5),
        ),
    ]:
        with transport.connect(address, "0" * 64) as channel:
            with pytest.raises(grpc.RpcError) as info:
                call(channel)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "token" in info.value.details()
        with grpc.insecure_channel(address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                call(channel)
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with transport.connect(address, cluster._token, protocol="999") as channel:
            with pytest.raises(grpc.RpcError) as info:
                call(channel)
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "999" in info.value.details()
            assert f"protocol version {transport.PROTOCOL_VERSION}" in info.value.details()
        with transport.connect(address, cluster._token) as channel:
            call(channel)  # the right token and version pass
    refusals = [
        r for r in caplog.records if r.name == "clamor.transport" and "refused" in r.getMessage()
    ]
    assert len(refusals) >= 3  # the scheduler's (in this process)


class _StopsItsServer(pb_grpc.SchedulerServicer):
    """A handler that stops the server it runs in (as a cluster collected on a handler
    thread does in its finalizer)."""

    server: transport.Server
    stopped = threading.Event()

    def Heartbeat(self, request, context):
        self.server.stop(grace=None)  # cancels this very call too
        self.stopped.set()
        return pb.HeartbeatReply(ok=True)


def test_a_server_stopped_from_its_own_handler_ends_without_joining_itself():
    token = new_token()
    servicer = _StopsItsServer()
    servicer.server, address = transport.create_server(token, [(pb_grpc.add_SchedulerServicer_to_server, servicer)])
    before = {t for t in threading.enumerate() if t.name.startswith("clamor-grpc")}
    with transport.connect(address, token) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.SchedulerStub(channel).Heartbeat(pb.HeartbeatRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    assert servicer.stopped.wait(10), "stop() raised or hung in the handler"
    deadline = time.monotonic() + 10
    while any(t.is_alive() for t in threading.enumerate() if t.name.startswith("clamor-grpc") and t not in before):
        assert time.monotonic() < deadline, "the handler pool's threads did not end"
        time.sleep(0.05)
    servicer.server.stop()  # again, from the test's thread: nothing left to wait for


def test_token_files_are_private(tmp_path):
    token = new_token()
    assert len(token) == 64 and token != new_token()
    path = Credentials(token).write_temp(dir=str(tmp_path))
    other = tmp_path / "token"
    Credentials(token).write(str(other))
    for p in (path, str(other)):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
        assert Credentials.read(p).token == token
    with pytest.raises(FileExistsError):  # never overwrites (O_EXCL)
        Credentials(token).write(str(other))
    os.chmod(other, 0o640)
    with pytest.raises(InsecureTokenFile, match="chmod 600"):
        Credentials.read(str(other))


def test_credentials_with_tls_round_trip_through_a_private_file(tmp_path):
    creds = Credentials.generate(tls=True)
    assert creds.tls is not None and b"BEGIN CERTIFICATE" in creds.tls.ca
    assert creds.tls.ca != Credentials.generate(tls=True).tls.ca  # one CA per cluster
    path = creds.write_temp(dir=str(tmp_path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert Credentials.read(path) == creds
    assert Credentials.parse(creds.token) == Credentials(creds.token)  # a bare token: no TLS
    for bad in ("", "{}", '{"token": ""}', '{"token": "t", "tls": {"ca": "x"}}', "{oops"):
        with pytest.raises(ValueError):
            Credentials.parse(bad)


def test_observers_query_snapshots_and_stats_with_the_token(cluster):
    creds = cluster._credentials
    stats = observer.query(cluster.address, creds, "stats")
    assert [w["id"] for w in stats["workers"]] == cluster.workers
    snap = observer.query(cluster.address, creds, "snapshot")
    assert [w.id for w in snap.workers] == cluster.workers
    with pytest.raises(grpc.RpcError) as info:
        observer.query(cluster.address, creds, "secrets")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as info:
        observer.query(cluster.address, Credentials("0" * 64), "stats")
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_launch_key_claims_only_its_own_reservation():
    launcher = LocalLauncher()
    key = launcher.new_launch_key(3)
    assert launcher.claim("", 1) is None and launcher.claim("3-forged", 1) is None
    # a key names a process this launcher started: an unknown pid cannot claim it
    launcher._procs[3] = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert launcher.claim(key, launcher._procs[3].pid + 1) is None
        key = launcher.new_launch_key(3)
        assert launcher.claim(key, launcher._procs[3].pid) == 3
        assert launcher.claim(key, launcher._procs[3].pid) is None  # one use only
    finally:
        launcher.close()


# --- faults --------------------------------------------------------------------------


def test_lost_workers_raise_worker_lost_error():
    with Cluster(2, paging=NullDriverPaging(), timeout=30, restarts=0) as c:
        pid0 = c.worker_stats()[0]["pid"]
        killer = threading.Timer(1.0, c.kill_worker, (0,))
        killer.start()
        start = time.monotonic()
        with pytest.raises(WorkerLostError) as info:
            c.run_stage([(0, time.sleep, (60,)), (1, abs, (-1,))])
        assert time.monotonic() - start < 6
        assert info.value.worker_id == 0 and "SIGKILL" in str(info.value)
        assert exited(pid0)
        assert c.workers == [1]
        assert c.run(abs, -7, worker=1) == 7
        with pytest.raises(WorkerLostError):
            c.run(abs, -7, worker=0)
        assert [w["alive"] for w in c.worker_stats()] == [False, True]

        # A worker whose process exits on its own mid-task.
        start = time.monotonic()
        with pytest.raises(WorkerLostError, match="exited with status 3"):
            c.run(os._exit, 3, worker=1)
        assert time.monotonic() - start < 6
        assert c.workers == []


def test_a_worker_the_driver_finds_unreachable_and_kills_keeps_that_reason(monkeypatch):
    """The thread that finds a stopped worker unreachable kills it and says so; a refresh
    that sees the process dead in between must not get in first with a bare "killed by
    signal 9" (the keepalive test's flake on a loaded machine, made certain here)."""
    with Cluster(2, paging=NullDriverPaging(), speculation=False, timeout=30, restarts=0) as c:
        launcher = c.registry.launcher
        kill = launcher.kill

        def kill_then_refresh(worker_id: int, *args: object) -> int | None:
            code = kill(worker_id, *args)
            c.registry.refresh()  # the executor's poll, running between the kill and the marking
            return code

        monkeypatch.setattr(launcher, "kill", kill_then_refresh)
        os.kill(c.worker_pid(0), signal.SIGSTOP)  # alive to its launcher, answers nothing
        c.registry.on_unreachable(0, "its task stream ended (test)")
        worker = c.registry.get(0)
        assert worker.lost_told.wait(30)
        assert worker.lost.startswith("its task stream ended (test); unreachable (no reply); "
                                      "killed: killed by signal 9"), worker.lost  # fmt: skip
        assert c.workers == [1]
        # kill_worker's own reason wins over a refresh in the same way
        c.kill_worker(1)
        assert c.registry.get(1).lost.endswith("(kill_worker)"), c.registry.get(1).lost


def test_a_worker_whose_register_call_times_out_keeps_its_id_when_it_retries(monkeypatch):
    """A loaded driver answers Register after the worker's 2 s deadline: the worker retries
    with the same launch key and must get the same id, not a new one (the reserved id then
    stayed "registered but not ready" and a 72-worker start waited for it until its timeout)."""
    calls: list[int] = []
    retried = threading.Event()
    on_register, register = WorkerRegistry.on_register, WorkerRegistry._register

    def counting(self: WorkerRegistry, request: pb.RegisterRequest) -> pb.RegisterReply:
        calls.append(request.pid)
        if len(calls) == 2:
            retried.set()
        return on_register(self, request)

    def first_one_late(self: WorkerRegistry, request: pb.RegisterRequest) -> pb.RegisterReply:
        if len(calls) == 1:
            assert retried.wait(30), "the worker did not retry Register"
        return register(self, request)

    monkeypatch.setattr(WorkerRegistry, "on_register", counting)
    monkeypatch.setattr(WorkerRegistry, "_register", first_one_late)
    with Cluster(1, paging=NullDriverPaging(), timeout=60) as c:
        assert len(calls) >= 2 and set(calls) == {c.worker_pid(0)}
        assert c.workers == [0] and [w["id"] for w in c.worker_stats()] == [0]
        assert c.run(abs, -3, worker=0) == 3


def test_a_worker_whose_ready_call_times_out_is_added_once_when_it_retries(monkeypatch):
    """A loaded driver answers Ready after the worker's 2 s deadline (1,000 workers on 16
    cores: one was CANCELLED and exited): the worker retries, the retry waits for the
    first answer, and the worker is added once."""
    calls: list[int] = []
    made: list[int] = []
    retried = threading.Event()
    on_ready, make_ready = WorkerRegistry.on_ready, WorkerRegistry._make_ready

    def counting(self: WorkerRegistry, worker_id: int, message: pb.WorkerInfo) -> None:
        calls.append(worker_id)
        if len(calls) == 2:
            retried.set()
        on_ready(self, worker_id, message)

    def first_one_late(self: WorkerRegistry, worker, message: pb.WorkerInfo) -> None:
        assert retried.wait(30), "the worker did not retry Ready"
        made.append(worker.id)
        make_ready(self, worker, message)

    monkeypatch.setattr(WorkerRegistry, "on_ready", counting)
    monkeypatch.setattr(WorkerRegistry, "_make_ready", first_one_late)
    with Cluster(1, paging=NullDriverPaging(), timeout=60) as c:
        assert calls[:2] == [0, 0] and made == [0]
        assert c.workers == [0]
        assert c.run(abs, -3, worker=0) == 3


def test_startup_failure_names_the_workers():
    class BadPaging:
        def worker_config(self, worker_id, host):
            return PagingConfig(kind=PagingKind.ARENA)  # no arena described: the pager cannot start

        def worker_ready(self, worker_id, info): ...
        def begin_stage(self):
            return 1, []

        def end_stage(self): ...
        def worker_lost(self, worker_id): ...
        def stats(self):
            return {}

        def close(self): ...

    start = time.monotonic()
    with pytest.raises(ClamorError, match=r"worker 0 \(pid \d+\) exited with status 72"):
        Cluster(1, paging=BadPaging(), timeout=30)
    assert time.monotonic() - start < 15


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_command(connect: str, token_file: str, *extra: str) -> list[str]:
    return worker_command(connect, token_file) + list(extra)


def test_worker_exits_70_when_driver_unreachable(tmp_path):
    token_file = Credentials(new_token()).write_temp(dir=str(tmp_path))
    cmd = _worker_command(f"127.0.0.1:{_free_port()}", token_file, "--register-timeout", "1")
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)
    assert proc.returncode == EXIT_DRIVER_UNREACHABLE
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot reach the driver" in lines[0]


def test_a_worker_the_launcher_sees_heartbeats_less_often_than_one_it_cannot(tmp_path, monkeypatch):
    """Heartbeats cost the driver CPU; a local worker's liveness is its process's, so it
    sends one every OBSERVED_HEARTBEAT_EVERY s; a worker started outside the launcher one
    a second (the driver counts it lost after 10 s without)."""
    beats: list[int] = []
    on_heartbeat = WorkerRegistry.on_heartbeat
    monkeypatch.setattr(WorkerRegistry, "on_heartbeat", lambda self, w: beats.append(w) or on_heartbeat(self, w))
    with Cluster(1, paging=NullDriverPaging(), timeout=30) as c:
        token_file = c._credentials.write_temp(dir=str(tmp_path))
        outside = subprocess.Popen(_worker_command(c.address, token_file))
        try:
            deadline = time.monotonic() + 20
            while 1 not in c.workers and time.monotonic() < deadline:
                time.sleep(0.1)
            assert c.workers == [0, 1]
            beats.clear()
            time.sleep(10.5)
            # about 2 against about 10: a heartbeat that times out on a loaded machine is
            # retried a second later, so a local worker may send one or two more
            assert beats.count(0) <= beats.count(1) / 2, beats
        finally:
            outside.kill()
            outside.wait()


def test_worker_exits_when_parent_process_is_gone(tmp_path):
    with Cluster(1, paging=NullDriverPaging(), timeout=30) as c:
        token_file = c._credentials.write_temp(dir=str(tmp_path))
        parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        worker = subprocess.Popen(
            _worker_command(c.address, token_file, "--parent-pid", str(parent.pid))
        )
        try:
            deadline = time.monotonic() + 20
            while 1 not in c.workers and time.monotonic() < deadline:
                time.sleep(0.1)
            assert c.workers == [0, 1]  # an external worker registers as the next id
            assert c.run(pid_and, 1, worker=1) == (worker.pid, 1)
            parent.kill()
            parent.wait()
            assert worker.wait(timeout=10) == EXIT_DRIVER_UNREACHABLE
            with pytest.raises(WorkerLostError):
                c.run(abs, 1, worker=1)
            assert c.run(abs, -1, worker=0) == 1
        finally:
            for p in (parent, worker):
                p.kill()
                p.wait()


DRIVER = """
import sys, threading, time
from clamor.runtime.cluster import Cluster
from clamor.runtime.cluster_workers import WorkerRegistry
box = []
if sys.argv[1] == "thread":  # no PR_SET_PDEATHSIG: the watchdog alone must do it
    t = threading.Thread(target=lambda: box.append(Cluster(2, timeout=30)))
    t.start(); t.join()
else:
    box.append(Cluster(2, timeout=30))
print(" ".join(str(w["pid"]) for w in box[0].worker_stats()), flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("spawned_from", ["main", "thread"])
def test_workers_die_with_a_sigkilled_driver(spawned_from):
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, spawned_from], stdout=subprocess.PIPE, text=True
    )
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(0.5)
        assert not any(exited(p) for p in pids)  # alive while the driver (and not its thread) lives
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        assert still_running(pids, 10) == []
    finally:
        driver.kill()
        driver.wait()


UNCLOSED = """
import sys
import numpy as np, clamor
x = clamor.asarray(np.arange(1000.0))
c = clamor.Cluster(workers=2, timeout=30)
print(" ".join(str(w["pid"]) for w in c.worker_stats()), flush=True)
assert c.run(lambda a: float(a.sum()), x) == float(x.sum())
if sys.argv[1] == "raise":
    raise RuntimeError("the script fails with its cluster open")
"""


@pytest.mark.parametrize("ending", ["return", "raise"])
def test_a_script_that_never_closes_its_cluster_still_exits(ending):
    """Interpreter exit closes open clusters before Python joins the gRPC server's threads
    (the task streams' handlers would otherwise wait for their workers forever)."""
    driver = subprocess.Popen([sys.executable, "-c", UNCLOSED, ending], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in driver.stdout.readline().split()]
        _, err = driver.communicate(timeout=60)
        assert driver.returncode == (1 if ending == "raise" else 0), err[-2000:]
        assert err.count("Traceback") == (ending == "raise")  # its own error, nothing from closing
        assert still_running(pids, 10) == []
    finally:
        driver.kill()
        driver.wait()


@pytest.mark.parametrize("fork", [True, False])
def test_close_leaves_no_child_processes(fork):
    launcher = LocalLauncher(fork=fork)
    commands = []
    command = launcher.command
    launcher.command = lambda: commands.append(command()) or commands[-1]
    c = Cluster(2, paging=NullDriverPaging(), timeout=30, launcher=launcher)
    pids = [w["pid"] for w in c.worker_stats()]
    token_file = commands[0][commands[0].index("--token-file") + 1]
    assert not os.path.exists(token_file)  # removed once the workers have read it
    c.close()
    c.close()  # idempotent
    assert still_running(pids, 1) == []
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    assert not children & set(pids)
    with pytest.raises(ClamorError, match="closed"):
        c.run(abs, 1)
