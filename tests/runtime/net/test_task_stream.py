"""The task stream (runtime/net/task_stream.py): one gRPC stream per worker carries its
launches, cancels and drops down and its results up, batched.

Real processes: many tiny tasks come back in order, several per message; a worker
SIGKILLed with attempts queued on it ends its stream and they rerun elsewhere; a
message that does not decode, from a stranger or from a worker, is refused by name and
the cluster keeps running stages; a cut link (simulated hosts, needs root) ends the
stream through the channels' keepalive and the worker counts as lost, with a
``WorkerLostError`` once no worker is left. The order of the driver's items is checked
on a :class:`DriverLink` alone.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time

import grpc
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.errors import WorkerLostError
from clamor.runtime.net import task_stream, transport
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.runtime.stage import StageSpec, TaskSpec

SESSION = f"/{task_stream.SERVICE}/Session"


def index_of(ctx):
    return ctx.index


def sleepy(ctx):
    time.sleep(0.02)
    return ctx.index


def lost_reason(cluster: Cluster, worker: int) -> str:
    return next(w["lost"] for w in cluster.worker_stats() if w["id"] == worker)


# --- the driver's end alone ------------------------------------------------------------


def test_items_leave_in_issue_order_batched_but_never_reordered():
    link = task_stream.DriverLink(7)
    launch = lambda stage: pb.LaunchRequest(stage_id=stage, attempts=[pb.Assignment(attempt_id=stage)])
    link.launch(launch(1))
    link.launch(launch(2))
    link.cancel([1])
    link.drop([b"k1"])
    link.launch(launch(3))  # after a cancel and a drop: a message of its own
    link.cancel([3])
    link.close()
    link.launch(launch(4))  # after close: never sent
    messages = list(link.messages())
    assert [([m.stage_id for m in msg.launches], list(msg.cancel), list(msg.drop)) for msg in messages] == [
        ([1, 2], [1], [b"k1"]),
        ([3], [3], []),
    ]
    assert (link.sent_messages, link.sent_attempts) == (2, 3)


def test_a_large_batch_is_cut_into_several_messages():
    link = task_stream.DriverLink(0)
    program = b"p" * (task_stream.MAX_BATCH_BYTES // 3)
    for stage in range(7):
        link.launch(pb.LaunchRequest(stage_id=stage, program=program))
    link.close()
    messages = list(link.messages())
    assert [m.stage_id for msg in messages for m in msg.launches] == list(range(7))
    assert len(messages) == 3
    assert all(msg.ByteSize() < task_stream.MAX_BATCH_BYTES * 1.5 for msg in messages)


# --- a cluster ---------------------------------------------------------------------------


@pytest.fixture
def cluster():
    with Cluster(2, paging=NullDriverPaging(), speculation=False, timeout=30) as c:
        yield c


def test_many_tiny_tasks_come_back_in_order_several_per_message(cluster):
    n = 10_000
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(n)])) == list(range(n))
    streams = cluster.stats()["task_streams"]
    assert sorted(streams) == [0, 1]
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


def _raw_session(channel: grpc.Channel):
    """Session without the generated codec: requests go as given bytes."""
    return channel.stream_stream(SESSION, request_serializer=lambda b: b,
                                 response_deserializer=pb.DriverMessage.FromString)  # fmt: skip


def test_streams_that_do_not_start_right_are_refused_by_name(cluster):
    with transport.connect(cluster.address, cluster._token) as channel:
        session = _raw_session(channel)
        cases = [
            (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "does not decode"),
            (pb.WorkerMessage(worker_id=99).SerializeToString(), grpc.StatusCode.FAILED_PRECONDITION,
             "worker 99 is not ready"),
            (pb.WorkerMessage(worker_id=1).SerializeToString(), grpc.StatusCode.ALREADY_EXISTS,
             "worker 1 has a task stream already"),
        ]  # fmt: skip
        for first, code, words in cases:
            with pytest.raises(grpc.RpcError) as info:
                list(session(iter([first]), timeout=30))
            assert info.value.code() == code and words in info.value.details()
    assert cluster.workers == [0, 1]  # the real streams go on
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(6)])) == list(range(6))


def test_a_worker_that_sends_an_undecodable_message_is_lost_and_its_tasks_rerun(cluster):
    """A fake worker registers, opens its stream, takes a launch and answers garbage."""
    with transport.connect(cluster.address, cluster._token) as channel:
        scheduler = pb_grpc.SchedulerStub(channel)
        reply = scheduler.Register(pb.RegisterRequest(pid=os.getpid(), host="127.0.0.1",
                                                      address="127.0.0.1:9"), timeout=30)  # fmt: skip
        fake = reply.worker_id
        scheduler.Ready(pb.ReadyRequest(worker_id=fake, info=pickle.dumps({})), timeout=30)
        assert cluster.workers == [0, 1, fake]
        launched = threading.Event()
        ended: list[grpc.RpcError] = []

        def requests():
            yield pb.WorkerMessage(worker_id=fake).SerializeToString()
            launched.wait(30)
            yield b"\x0a\xff"  # a length past the end: not a WorkerMessage

        def serve():
            try:
                for message in _raw_session(channel)(requests(), timeout=60):
                    if message.launches:
                        launched.set()
            except grpc.RpcError as exc:
                ended.append(exc)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        before = cluster.counters()["tasks_rerun"]
        n = 30
        assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(n)])) == list(range(n))
        assert launched.is_set()
        thread.join(30)
    assert fake not in cluster.workers and cluster.workers == [0, 1]
    assert cluster.counters()["tasks_rerun"] > before
    assert "does not decode" in lost_reason(cluster, fake)
    assert ended and ended[0].code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "does not decode" in ended[0].details()
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(4)])) == [0, 1, 2, 3]


@pytest.mark.slow
def test_a_worker_that_stops_answering_is_lost_through_the_keepalive_of_its_stream(cluster):
    """SIGSTOP: the process still runs as far as its launcher can tell and no connection
    is reset; only the pings that the driver's server sends on the stream find out
    (transport's control-plane ping options: ~10 s)."""
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
                 speculation=False, timeout=60) as cluster:  # fmt: skip
        assert cluster.workers == [0, 1]
        threading.Timer(0.5, net.cut, (launcher.host_of(0),)).start()
        start = time.monotonic()
        n = 200  # 4 s of work on one worker
        assert cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(n)])) == list(range(n))
        assert cluster.workers == [1]
        assert time.monotonic() - start < 60  # keepalive: ~10 s, not a call's deadline
        reason = lost_reason(cluster, 0)
        assert "task stream" in reason or "status 70" in reason, reason

        # Nothing left to run on: a clear error, not a hang.
        threading.Timer(0.5, net.cut, (launcher.host_of(1),)).start()
        with pytest.raises(WorkerLostError, match="worker 1"):
            cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(2000)]))
        assert cluster.workers == []
