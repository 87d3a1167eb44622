"""The task stream (runtime/net/task_stream.py): one connection per worker (a Unix socket
on the driver's host, TCP from elsewhere) carries its launches, cancels and drops down
and its results up.

On a socket pair: the driver's items arrive in issue order, small ones written at once
and a large one through the writer thread; a closed link tells the worker why; silence
ends a stream on both ends. Real processes: many tiny tasks come back in order, several
per message; a worker SIGKILLed with attempts queued on it ends its stream and they rerun
elsewhere; a stream without the token is hung up on; one that does not start right, or
a message that does not decode from a worker, is refused by name and the cluster keeps
running stages; a stopped worker or a cut link (simulated hosts, needs root) ends the
stream through its pings and the worker counts as lost, with a ``WorkerLostError`` once
no worker is left.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import grpc
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.errors import WorkerLostError
from clamor.runtime.net import task_stream, transport
from clamor.runtime.net.messages import decode_key, encode_key
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.stream_server import StreamPoller
from clamor.runtime.net.task_stream import END, MESSAGE, PING, Connection, DriverLink
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.runtime.stage import StageSpec, TaskSpec


def index_of(ctx):
    return ctx.index


def sleepy(ctx):
    time.sleep(0.02)
    return ctx.index


def past_the_link_timeout(ctx):
    """Busy for longer than a silent stream lives; says which thread ran it."""
    time.sleep(task_stream.LINK_TIMEOUT + 1.0)
    return threading.current_thread().name


def lost_reason(cluster: Cluster, worker: int) -> str:
    return next(w["lost"] for w in cluster.worker_stats() if w["id"] == worker)


# --- one link on a socket pair ----------------------------------------------------------


def launch(stage: int, program: bytes = b"") -> pb.LaunchRequest:
    return pb.LaunchRequest(stage_id=stage, program=program, attempts=[pb.Assignment(attempt_id=stage)])


def attached(link: DriverLink) -> tuple[Connection, list]:
    """``link`` attached to one end of a socket pair, read by a thread (the results it
    gets, then ``("end", why)``); the worker's end."""
    ours, theirs = socket.socketpair()
    events: list = []
    conn = Connection(ours)

    def read():
        assert link.attach(conn)
        link.read_until_end(conn, lambda w, reports, moved: events.append([r.attempt_id for r in reports]),
                   lambda w, why: events.append(("end", why)))  # fmt: skip

    threading.Thread(target=read, daemon=True).start()
    return Connection(theirs), events


def received(conn: Connection, until: int, out: list | None = None) -> list[tuple[int, bytes]]:
    """Frames from ``conn`` (appended to ``out`` as they come) until one of kind ``until``."""
    out = [] if out is None else out
    for kind, body in conn.frames():
        out.append((kind, body))
        if kind == until:
            return out
    raise AssertionError(f"the stream ended before a frame of kind {until}: {out}")


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def items(frames: list[tuple[int, bytes]]) -> list:
    out = []
    for kind, body in frames:
        if kind == MESSAGE:
            m = pb.DriverMessage.FromString(body)
            out += [("launch", r.stage_id) for r in m.launches] + [("cancel", list(m.cancel))] * bool(m.cancel)
            out += [("drop", [decode_key(k) for k in m.drop])] * bool(m.drop)
    return out


def test_items_arrive_in_issue_order_a_large_one_through_the_writer_and_close_says_why():
    link = DriverLink(7)
    link.launch(launch(1))  # before the worker connects: waits for it
    worker, events = attached(link)
    frames: list = []
    threading.Thread(target=received, args=(worker, END, frames), daemon=True).start()
    wait_for(lambda: frames)
    link.launch(launch(2))
    link.cancel([1])
    link.launch(launch(3, b"p" * (3 * task_stream.INLINE_BYTES)))  # the writer thread's
    link.drop([encode_key(("k", 1))])  # behind it: never ahead
    link.launch(launch(4))
    wait_for(lambda: len(frames) == 6)
    link.close("the driver counts worker 7 as lost", grpc.StatusCode.ABORTED)
    link.launch(launch(5))  # after close: never sent
    wait_for(lambda: frames[-1][0] == END)
    assert items(frames) == [("launch", 1), ("launch", 2), ("cancel", [1]), ("launch", 3),
                             ("drop", [("k", 1)]), ("launch", 4)]  # fmt: skip
    assert task_stream.parse_end(frames[-1][1]) == (grpc.StatusCode.ABORTED, "the driver counts worker 7 as lost")
    assert (link.sent_messages, link.sent_attempts) == (6, 4)
    time.sleep(0.1)
    assert events == []  # the driver closed it: not reported as an end


def test_the_writer_thread_runs_only_while_there_is_a_backlog(monkeypatch):
    monkeypatch.setattr(task_stream, "WRITER_IDLE", 0.2)
    link = DriverLink(3)
    worker, _ = attached(link)
    frames: list = []
    threading.Thread(target=received, args=(worker, END, frames), daemon=True).start()
    wait_for(lambda: link.connected)
    link.launch(launch(1))  # small: written by the issuing thread, no writer
    wait_for(lambda: len(frames) == 1)
    assert link.writer is None
    for stage in (2, 3):  # a large one each time: a writer thread, which then ends
        link.launch(launch(stage, b"p" * (3 * task_stream.INLINE_BYTES)))
        wait_for(lambda stage=stage: len(frames) == stage)
        writer = link.writer
        assert writer is not None and writer.name == "clamor-stream-out-3"
        wait_for(lambda writer=writer: not writer.is_alive())
    link.launch(launch(4))
    wait_for(lambda: len(frames) == 4)
    assert items(frames) == [("launch", s) for s in (1, 2, 3, 4)]
    link.close()


def test_the_issuing_thread_never_waits_for_a_worker_that_reads_nothing():
    """A worker busy sending its results reads nothing meanwhile. What its socket does not
    take at once is left to the link's writer thread, so the thread running the
    scheduler's events goes on (and can read those results); all arrives in order."""
    link = DriverLink(5)
    worker, _ = attached(link)
    n = 2_000  # 4 KB launches, 8 MB in all: far beyond what a socket buffers
    issuer = threading.Thread(target=lambda: [link.launch(launch(i, b"p" * 4096)) for i in range(n)])
    issuer.start()
    issuer.join(30)
    assert not issuer.is_alive(), "the issuing thread waits on a worker that does not read"
    link.cancel([7])
    frames: list = []
    threading.Thread(target=received, args=(worker, END, frames), daemon=True).start()
    wait_for(lambda: sum(kind == MESSAGE for kind, _ in frames) == n + 1, timeout=30)
    assert items(frames) == [("launch", i) for i in range(n)] + [("cancel", [7])]
    link.close()


def test_results_are_handed_on_and_a_worker_that_hangs_up_is_reported():
    link = DriverLink(3)
    worker, events = attached(link)
    report = lambda *ids: pb.WorkerMessage(reports=[pb.TaskReport(attempt_id=i) for i in ids])
    worker.send(task_stream.frame(MESSAGE, report(1, 2).SerializeToString()))
    worker.send(task_stream.frame(MESSAGE, report(3).SerializeToString()))
    worker.close()
    deadline = time.monotonic() + 10
    while len(events) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events[:2] == [[1, 2], [3]] and events[2][0] == "end" and "connection" in events[2][1]
    assert (link.received_messages, link.received_reports) == (2, 3) and link.closed


def test_silence_ends_the_stream_on_both_ends(monkeypatch):
    """The driver pings; a worker that stops answering is reported after LINK_TIMEOUT,
    and the worker's end gives up on a driver it stops hearing from."""
    monkeypatch.setattr(task_stream, "PING_INTERVAL", 0.05)
    monkeypatch.setattr(task_stream, "LINK_TIMEOUT", 0.5)
    link = DriverLink(1)
    worker, events = attached(link)
    pings = [kind for kind, _ in received(worker, PING)]  # the worker reads, never answers
    assert pings == [PING]
    start = time.monotonic()
    while not events and time.monotonic() - start < 10:
        time.sleep(0.01)
    assert events and events[0][0] == "end" and "nothing heard for" in events[0][1], events
    assert 0.4 < time.monotonic() - start < 5

    quiet, _ = socket.socketpair()  # a driver that never sends
    with pytest.raises(task_stream.LinkTimeout):
        list(Connection(quiet).frames())


def test_silence_of_an_end_someone_vouches_for_does_not_end_the_stream(monkeypatch):
    """A worker whose task holds the GIL cannot answer: while its process runs (the
    cluster vouches for it), its silence is waited out; once nobody vouches, it ends."""
    monkeypatch.setattr(task_stream, "LINK_TIMEOUT", 0.2)
    alive = [True]
    mine, other = socket.socketpair()
    conn = Connection(mine)
    conn.vouch = lambda: alive[0]
    conn.last_heard -= 5.0
    conn.check_heard()  # vouched for: no error
    alive[0] = False
    with pytest.raises(task_stream.LinkTimeout, match="nothing heard for 5 s"):
        conn.check_heard()
    conn.close()
    other.close()


def test_tcp_streams_are_watched_by_the_kernel():
    """Keepalive probes and a user timeout: the kernel, which answers them whatever the
    process does, finds a cut link within LINK_TIMEOUT; a Unix socket needs none."""
    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as sock:
        task_stream.keep_alive(sock)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == task_stream.LINK_TIMEOUT * 1000
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == int(task_stream.PING_INTERVAL)
    unix, other = socket.socketpair()
    task_stream.keep_alive(unix)  # nothing to set
    assert unix.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 0
    unix.close()
    other.close()


# --- a cluster ---------------------------------------------------------------------------


def test_the_poller_ends_its_thread_and_closes_its_fds():
    before = set(os.listdir("/proc/self/fd"))
    poller = StreamPoller(lambda *a: None, lambda *a: None)
    assert poller.thread.is_alive() and set(os.listdir("/proc/self/fd")) > before  # epoll, eventfd
    poller.close()
    assert not poller.thread.is_alive() and set(os.listdir("/proc/self/fd")) <= before


@pytest.fixture
def cluster():
    with Cluster(2, paging=NullDriverPaging(), speculation=False, timeout=30, restarts=0) as c:
        yield c


def test_many_tiny_tasks_come_back_in_order_several_per_message(cluster):
    n = 10_000
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(n)])) == list(range(n))
    streams = cluster.stats()["task_streams"]
    assert sorted(streams) == [0, 1]
    assert {s["transport"] for s in streams.values()} == {"unix"}  # same host: no TCP stack
    sent = sum(s["sent_messages"] for s in streams.values())
    attempts = sum(s["sent_attempts"] for s in streams.values())
    received = sum(s["received_messages"] for s in streams.values())
    reports = sum(s["received_reports"] for s in streams.values())
    assert attempts == reports == n
    assert sent < attempts / 4  # launches go several to a message (32 per worker at first)
    assert received < reports  # results too: those that finished while one was sent


def test_a_worker_killed_mid_stream_has_its_queued_tasks_rerun_on_the_others(cluster):
    victim = 0
    pid = cluster.worker_pid(victim)
    before = cluster.counters()["tasks_rerun"]
    threading.Timer(0.4, os.kill, (pid, signal.SIGKILL)).start()
    n = 150
    assert cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(n)])) == list(range(n))
    assert cluster.workers == [1]
    assert cluster.counters()["tasks_rerun"] > before  # its queue (up to the window) ran again
    reason = lost_reason(cluster, victim)
    assert "SIGKILL" in reason, reason
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(4)])) == [0, 1, 2, 3]


@pytest.mark.slow
def test_an_attempt_that_holds_the_streams_thread_past_the_link_timeout_keeps_its_worker(cluster):
    # An idle worker runs the attempt on the thread that reads its stream (no hand-off),
    # which then answers no ping for 11 s: the runner thread's keep-alives carry it.
    ran_on = cluster.execute(StageSpec(past_the_link_timeout, [TaskSpec(0, worker=0)]))
    assert ran_on == ["clamor-stream"]
    assert cluster.workers == [0, 1]
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(4)])) == [0, 1, 2, 3]


def stream_address(cluster: Cluster) -> str:
    host, _ = transport.split_address(cluster.address)
    return transport.format_address(host, cluster._streams.port)


def raw_stream(cluster: Cluster, first: bytes) -> Connection:
    """A task stream to ``cluster`` whose first message is ``first`` (any bytes)."""
    return task_stream.open_stream(stream_address(cluster), cluster._token.encode(), None, first)


def test_streams_that_do_not_start_right_are_refused_by_name(cluster):
    cases = [
        (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "does not decode"),
        (pb.WorkerMessage(worker_id=99).SerializeToString(), grpc.StatusCode.FAILED_PRECONDITION,
         "worker 99 is not ready"),
        (pb.WorkerMessage(worker_id=1).SerializeToString(), grpc.StatusCode.ALREADY_EXISTS,
         "worker 1 has a task stream already"),
    ]  # fmt: skip
    wait_for(lambda: all(cluster._executor.link_of(w).transport for w in (0, 1)))  # both connected
    for first, code, words in cases:
        conn = raw_stream(cluster, first)
        end = received(conn, END)[-1][1]
        conn.close()
        got, why = task_stream.parse_end(end)
        assert got == code and words in why, (got, why)
    host, port = transport.split_address(stream_address(cluster))
    with socket.create_connection((host, port), timeout=30) as stranger:  # another token
        with pytest.raises(ConnectionError):
            transport.prove_token_client(stranger, b"not the token")
    assert cluster._streams.refused == len(cases) + 1
    assert cluster.workers == [0, 1]  # the real streams go on
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(6)])) == list(range(6))


def test_a_worker_that_sends_an_undecodable_message_is_lost_and_its_tasks_rerun(cluster):
    """A fake worker registers, opens its stream, takes a launch and answers garbage."""
    with transport.connect(cluster.address, cluster._token) as channel:
        scheduler = pb_grpc.SchedulerStub(channel)
        reply = scheduler.Register(pb.RegisterRequest(pid=os.getpid(), host="127.0.0.1",
                                                      address="127.0.0.1:9"), timeout=30)  # fmt: skip
        fake = reply.worker_id
        scheduler.Ready(pb.ReadyRequest(worker_id=fake, info=pb.WorkerInfo()), timeout=30)
    assert cluster.workers == [0, 1, fake]
    conn = raw_stream(cluster, pb.WorkerMessage(worker_id=fake).SerializeToString())
    ended: list[tuple[grpc.StatusCode, str]] = []

    def serve():
        for kind, body in conn.frames():
            if kind == MESSAGE and pb.DriverMessage.FromString(body).launches:
                conn.send(task_stream.frame(MESSAGE, b"\x0a\xff"))  # a length past the end
            elif kind == END:
                ended.append(task_stream.parse_end(body))
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    before = cluster.counters()["tasks_rerun"]
    n = 30
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(n)])) == list(range(n))
    thread.join(30)
    conn.close()
    assert fake not in cluster.workers and cluster.workers == [0, 1]
    assert cluster.counters()["tasks_rerun"] > before
    assert "does not decode" in lost_reason(cluster, fake)
    assert ended and ended[0][0] == grpc.StatusCode.INVALID_ARGUMENT and "does not decode" in ended[0][1]
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(4)])) == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_worker_that_stops_answering_is_lost_through_the_pings_of_its_stream(cluster):
    """SIGSTOP: the process still runs as far as its launcher can tell and no connection
    is reset; only the driver's pings on the stream find out (~10 s)."""
    victim = 0
    threading.Timer(0.4, os.kill, (cluster.worker_pid(victim), signal.SIGSTOP)).start()
    n = 100
    assert cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(n)])) == list(range(n))
    assert cluster.workers == [1]
    reason = lost_reason(cluster, victim)
    assert "task stream ended" in reason and "killed" in reason, reason


# --- a cut link (simulated hosts) ----------------------------------------------------------


@pytest.fixture
def net(tmp_path):
    from clamor.testing import netns

    with netns.checked(2, tmp_path / "netns") as network:
        yield network


#: Workers whose heartbeat watchdog waits 10 minutes: only the task stream can notice a cut.
PATIENT_WORKER = (
    "import sys; from clamor.runtime.worker import process; "
    "process.HEARTBEAT_PATIENCE = 600.0; sys.exit(process.main(sys.argv[1:]))"
)


def _patient_launcher(net):
    from clamor.testing import netns

    class PatientLauncher(netns.NamespaceLauncher):
        def command(self) -> list[str]:
            command = super().command()
            at = command.index("-m")
            return [*command[:at], "-c", PATIENT_WORKER, *command[at + 2 :]]

    return PatientLauncher(net)


@pytest.mark.slow
def test_a_cut_link_ends_the_stream_and_the_worker_is_lost(net):
    launcher = _patient_launcher(net)
    with Cluster(2, launcher=launcher, host=net.driver_address, paging=NullDriverPaging(),
                 speculation=False, timeout=60, restarts=0) as cluster:  # fmt: skip
        assert cluster.workers == [0, 1]
        transports = lambda: {s["transport"] for s in cluster.stats()["task_streams"].values()}
        wait_for(lambda: "" not in transports())  # both streams open
        assert transports() == {"tcp"}  # another network namespace: the driver's Unix socket is not there
        threading.Timer(0.5, net.cut, (launcher.host_of(0),)).start()
        start = time.monotonic()
        n = 200  # 4 s of work on one worker
        assert cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(n)])) == list(range(n))
        assert cluster.workers == [1]
        assert time.monotonic() - start < 60  # pings: ~10 s, not a call's deadline
        reason = lost_reason(cluster, 0)
        assert "task stream" in reason or "status 70" in reason, reason

        # Nothing left to run on: a clear error, not a hang.
        threading.Timer(0.5, net.cut, (launcher.host_of(1),)).start()
        with pytest.raises(WorkerLostError, match="worker 1"):
            cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(2000)]))
        assert cluster.workers == []
