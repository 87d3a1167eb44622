"""``clamor-worker``: a worker process of the control plane.

    clamor-worker --connect HOST:PORT --token-file F [--host H] [--parent-pid PID]
                  [--launch-key K] [--remove-token-file]

It serves the ``Worker`` gRPC service on ``H:0``, registers with the driver's
``Scheduler`` at ``HOST:PORT``, builds its paging from the ``WorkerConfig`` it gets
back (``config.paging.kind`` names an entry of :data:`PAGINGS`, a fixed table: the
driver never names code to import), reports Ready, then opens its task stream
(runtime/net/task_stream.py: a connection to the driver's Unix socket
``config.task_stream_unix`` where it shares the driver's network namespace, else TCP
to its port ``config.task_stream_port``) and runs the attempts that come down
it, one at a time, until told to shut down. The stream's end is the worker's: it exits
saying why (the driver closed it or gave up on this worker: ``EXIT_OK`` /
``EXIT_DRIVER_REFUSED``; a broken connection, e.g. a cut link over which no ping came
for 10 s: ``EXIT_DRIVER_UNREACHABLE``). A watchdog thread
heartbeats the driver every second and exits with
:data:`~clamor.runtime.exitcodes.EXIT_DRIVER_UNREACHABLE` when the driver has
been unreachable for 15 s or its process (``--parent-pid``) is gone.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import logging
import os
import random
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable

import grpc
import psutil
from clamor.runtime.credentials import Credentials
from clamor.runtime.exitcodes import (
    EXIT_DRIVER_REFUSED,
    EXIT_DRIVER_UNREACHABLE,
    EXIT_OK,
    EXIT_SETUP_FAILED,
    process_runs,
)
from clamor.runtime.net.messages import (
    decode_key,
    invalidated_pages,
    paging_config,
    spill_policy,
    worker_info_message,
    worker_stats_message,
)
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.task_stream import run_worker_stream
from clamor.runtime.net.transport import (
    connect,
    create_server,
    format_address,
    split_address,
)
from clamor.runtime.paging.memory import WorkerBudget
from clamor.runtime.paging.pager import WorkerPager
from clamor.runtime.paging.paging_api import (
    NullWorkerPaging,
    PagingConfig,
    PagingKind,
    WorkerPaging,
)
from clamor.runtime.storage.bulk import BulkServer
from clamor.runtime.storage.partitions import PartitionStore
from clamor.runtime.storage.spill import SpillingStore
from clamor.runtime.worker.tasks import WorkerExecutor

logger = logging.getLogger("clamor.worker")

HEARTBEAT_INTERVAL = 1.0
#: Consecutive seconds of failed heartbeats after which the worker gives up on the driver:
#: longer than the driver waits for a silent worker (10 s) and than the task stream's
#: keepalive (10 s), and than a loaded driver may take to register a crowd of workers
#: (the first ones must not give up while it registers the others).
HEARTBEAT_PATIENCE = 15.0
_REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION)
#: Task-stream endings by which the driver refuses this worker (any other one but OK:
#: the driver is unreachable).
_STREAM_REFUSALS = (*_REFUSALS, grpc.StatusCode.ABORTED, grpc.StatusCode.ALREADY_EXISTS,
                    grpc.StatusCode.INVALID_ARGUMENT)  # fmt: skip


#: The pagings a worker can build, by the kind its ``WorkerConfig`` names. A fixed table:
#: the driver chooses among these, it never names code for the worker to import. Each
#: is called as ``build(worker_id, config, token)``.
PAGINGS: dict[PagingKind, Callable[[int, PagingConfig, bytes], WorkerPaging]] = {
    PagingKind.NONE: lambda worker_id, config, token: NullWorkerPaging(),
    PagingKind.ARENA: WorkerPager,
}


def _die(code: int, message: str) -> None:
    """Exit the whole process now (even from a thread, even while a task runs)."""
    try:
        sys.stderr.write(f"clamor-worker[{os.getpid()}]: {message}\n")
        sys.stderr.flush()
        sys.stdout.flush()
    finally:
        os._exit(code)


class WorkerServicer(pb_grpc.WorkerServicer):
    """The ``Worker`` service: invalidations, partitions, stats, interrupts and shutdown
    (attempts come on the task stream)."""

    def __init__(self) -> None:
        self.executor: WorkerExecutor | None = None
        self.store: PartitionStore = PartitionStore()  # replaced by a SpillingStore once configured
        self.budget = WorkerBudget(0)
        self.bulk: BulkServer | None = None
        self.shutdown_requested = threading.Event()

    def _ready(self, context) -> WorkerExecutor:
        if self.executor is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "worker is not ready yet")
        return self.executor

    def Invalidate(self, request, context):
        executor = self._ready(context)
        try:
            pages = invalidated_pages(request)
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        executor.exclusive(lambda: executor.paging.invalidate(request.epoch, pages), timeout=50)
        return pb.InvalidateReply()

    def GetPartition(self, request, context):
        key = decode_key(request.key)
        if key not in self.store:
            context.abort(grpc.StatusCode.NOT_FOUND, f"partition {key!r} is not held here")
        return self.store.chunks(key)

    def PutPartition(self, request_iterator, context):
        first, parts = None, []
        for piece in request_iterator:
            first = first or piece
            parts.append(piece.data)
        data = b"".join(parts)
        if first is None or not first.HasField("key") or len(data) != first.total:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a spilled partition arrived incomplete")
        key = decode_key(first.key)
        if not self.store.accept(key, data, first.nbytes):
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"no room for {first.nbytes} bytes")
        return pb.PutReply()

    def DropPartitions(self, request, context):
        self.store.drop(decode_key(k) for k in request.keys)
        return pb.DropReply()

    def Stats(self, request, context):
        executor = self._ready(context)
        stats = {
            "id": executor.worker_id,
            "pid": os.getpid(),
            "tasks_run": executor.tasks_run,
            "tasks_queued": executor.queued,
            "partitions": len(self.store),
            "rss_bytes": psutil.Process().memory_info().rss,
            "partitions_served_bulk": self.bulk.served if self.bulk else 0,
            **self.budget.as_dict(),
        }
        stats.update(self.store.stats())
        stats.update(executor.inputs_read)
        stats.update(executor.paging.stats())
        return pb.StatsReply(stats=worker_stats_message(stats))

    def Interrupt(self, request, context):
        executor = self._ready(context)
        grace = min(max(request.grace, 0.0), 60.0)
        return pb.InterruptReply(stopped=executor.interrupt(list(request.attempt_ids), grace))

    def Shutdown(self, request, context):
        self.shutdown_requested.set()
        return pb.ShutdownReply()


def _local_host_towards(driver_host: str) -> str:
    """The local address this machine uses to reach ``driver_host`` (no packet is sent)."""
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(driver_host, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


#: Answers to a registration that a driver under load gives (a storm of workers
#: registering at once): the worker tries again, later.
_BUSY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED,
         grpc.StatusCode.RESOURCE_EXHAUSTED)  # fmt: skip


def _call_patiently(call, request, what: str, timeout: float):
    """``call(request)`` (a ``Scheduler`` method: registration, readiness), retried for
    ``timeout`` seconds; the worker exits if the driver refuses it or never answers.

    A busy driver's answer (:data:`_BUSY`) is retried after a jittered, doubling pause,
    each try allowed longer than the last: a thousand workers calling at once spread out
    instead of retrying in step. The driver answers a retry as it answered (or is
    answering) the first try: a registration by its launch key and pid, a readiness by
    the worker's id.
    """
    deadline = time.monotonic() + timeout
    last, pause, patience = "no attempt", 0.1, 2.0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            _die(EXIT_DRIVER_UNREACHABLE, f"{what}: cannot reach the driver: {last}")
        try:
            return call(request, timeout=min(patience, remaining), wait_for_ready=True)
        except grpc.RpcError as exc:
            code = exc.code()
            if code not in _BUSY:
                _die(EXIT_DRIVER_REFUSED, f"{what}: the driver refused: {code.name}: {exc.details()}")
            last = f"{code.name}: {exc.details()}"
        time.sleep(min(random.uniform(0, pause), max(0.0, deadline - time.monotonic())))
        pause, patience = min(2 * pause, 2.0), min(2 * patience, 16.0)


def _kill_with_parent(parent_pid: int) -> None:
    """``PR_SET_PDEATHSIG``: the kernel SIGKILLs us when the thread that started us exits."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(
                1, int(signal.SIGKILL), 0, 0, 0
            )  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        _die(EXIT_DRIVER_UNREACHABLE, f"the driver process {parent_pid} is gone")


def _process_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _watchdog(scheduler, worker_id: int, parent_pid: int | None, every: int = 1) -> None:
    """Heartbeat the driver every ``every`` seconds; exit when it is gone (its process is
    looked at every second). Runs in a daemon thread."""
    child_of_parent = parent_pid is not None and os.getppid() == parent_pid
    failing_since: float | None = None
    for tick in itertools.count(1):
        time.sleep(HEARTBEAT_INTERVAL)
        try:  # out of file descriptors (a flood of connections), /proc cannot be read: next time
            gone = parent_pid is not None and (
                (child_of_parent and os.getppid() != parent_pid) or _process_gone(parent_pid)
            )
        except (OSError, psutil.Error) as exc:
            logger.warning("cannot check the driver process %s: %s", parent_pid, exc)
            gone = False
        if gone:
            _die(EXIT_DRIVER_UNREACHABLE, f"the driver process {parent_pid} is gone")
        if tick % every and failing_since is None:
            continue
        try:
            reply = scheduler.Heartbeat(
                pb.HeartbeatRequest(worker_id=worker_id), timeout=HEARTBEAT_INTERVAL
            )
        except grpc.RpcError as exc:
            if exc.code() in _REFUSALS:
                _die(EXIT_DRIVER_REFUSED, f"the driver refused a heartbeat: {exc.details()}")
            now = time.monotonic()
            failing_since = failing_since or now
            if now - failing_since >= HEARTBEAT_PATIENCE:
                _die(
                    EXIT_DRIVER_UNREACHABLE,
                    f"the driver has been unreachable for {HEARTBEAT_PATIENCE:.0f} s",
                )
            continue
        failing_since = None
        if not reply.ok:
            _die(EXIT_DRIVER_REFUSED, f"the driver no longer knows worker {worker_id}")


def _serve_stream(
    address: str, unix_name: str, credentials: Credentials, worker_id: int,
    executor: WorkerExecutor, shutdown: threading.Event, parent_pid: int | None,
) -> None:  # fmt: skip
    """Serve the task stream (at the driver's Unix socket ``unix_name`` if this host has
    it, else ``address``); when it ends (and no shutdown is under way), exit saying why.
    A silent driver is waited for while its process runs (``parent_pid``, on this host:
    it may hold its GIL), or while the kernel keeps the TCP link (another host)."""
    vouch = (lambda: process_runs(parent_pid)) if parent_pid is not None else (lambda: True)
    code, why = run_worker_stream(address, credentials.token.encode(), credentials.tls, worker_id,
                                  executor.apply, executor.report_to, unix_name, vouch)  # fmt: skip
    if shutdown.is_set():
        return  # the main thread exits
    if code == grpc.StatusCode.OK:
        _die(EXIT_OK, f"worker {worker_id}: {why}")
    exit_code = EXIT_DRIVER_REFUSED if code in _STREAM_REFUSALS else EXIT_DRIVER_UNREACHABLE
    _die(exit_code, f"worker {worker_id}: {why}")


def budget_of(config: pb.WorkerConfig) -> WorkerBudget:
    """This worker's budget, split as the driver split it (see runtime/paging/memory.py)."""
    return WorkerBudget(int(config.memory_budget), bool(config.zero_copy))


def build_paging(worker_id: int, config: PagingConfig, token: bytes) -> WorkerPaging:
    """The paging ``config.kind`` names, from :data:`PAGINGS`."""
    return PAGINGS[config.kind](worker_id, config, token)


def _spilling_store(
    worker_id: int, config: pb.WorkerConfig, scheduler: pb_grpc.SchedulerStub, servicer: WorkerServicer
) -> SpillingStore:
    """The partition store within this worker's partition budget (R3S)."""
    budget = budget_of(config).partitions

    def find_peers(nbytes: int) -> list[tuple[int, str]]:
        try:
            reply = scheduler.SpillPeers(pb.SpillPeersRequest(worker_id=worker_id, nbytes=nbytes), timeout=30)
        except grpc.RpcError as exc:
            logger.warning("no spill peers from the driver (%s): spilling to disk", exc.code().name)
            return []
        return [(p.worker_id, p.address) for p in reply.peers]

    return SpillingStore(
        worker_id, budget, spill_policy(config.spill), config.spill_dir,
        find_peers, lambda address: servicer.executor.peer(address),
    )  # fmt: skip


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="clamor-worker", description="Run a Clamor worker process.")
    p.add_argument(
        "--connect", required=True, metavar="HOST:PORT", help="the driver's scheduler address"
    )
    p.add_argument(
        "--token-file", required=True, metavar="F", help="file holding the cluster token"
    )
    p.add_argument(
        "--host", help="address to serve on (default: the local address facing the driver)"
    )
    p.add_argument("--parent-pid", type=int, help="exit when this process (the driver) is gone")
    p.add_argument(
        "--kill-with-parent",
        action="store_true",
        help="get SIGKILLed by the kernel when the parent (--parent-pid) exits (Linux)",
    )
    p.add_argument(
        "--launch-key",
        default="",
        metavar="K",
        help="the key its launcher gave this worker (names the worker id it reserved)",
    )
    p.add_argument(
        "--remove-token-file",
        action="store_true",
        help="delete the token file once read (launchers that copy it to another host)",
    )
    p.add_argument(
        "--register-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="give up on the driver after S seconds (default 60: a driver registering "
        "hundreds of workers at once may take a while)",
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``clamor-worker``; does not return once registered (the process exits)."""
    args = _parse_args(argv)
    if args.kill_with_parent and args.parent_pid is not None:
        _kill_with_parent(args.parent_pid)
    logging.basicConfig(
        level=os.environ.get("CLAMOR_LOG_LEVEL", "WARNING").upper(),
        format=f"clamor-worker[{os.getpid()}] %(levelname)s %(name)s: %(message)s",
    )
    try:
        credentials = Credentials.read(args.token_file)
        if args.remove_token_file:
            os.unlink(args.token_file)
        driver_host, _ = split_address(args.connect)
    except (OSError, ValueError) as exc:
        _die(EXIT_SETUP_FAILED, str(exc))
    host = args.host or _local_host_towards(driver_host)

    servicer = WorkerServicer()
    token, tls = credentials.token, credentials.tls
    server, address = create_server(
        token, [(pb_grpc.add_WorkerServicer_to_server, servicer)], host=host, max_workers=4, tls=tls
    )
    scheduler = pb_grpc.SchedulerStub(connect(args.connect, token, tls=tls, control=True))
    request = pb.RegisterRequest(pid=os.getpid(), host=host, address=address, launch_key=args.launch_key)
    reply = _call_patiently(scheduler.Register, request, f"registration with {args.connect}", args.register_timeout)
    worker_id = reply.worker_id
    threading.Thread(
        target=_watchdog,
        args=(scheduler, worker_id, args.parent_pid, max(1, reply.config.heartbeat_every)),
        name="clamor-watchdog",
        daemon=True,
    ).start()

    try:
        config = reply.config
        # The token is the worker's own: the driver never sends it.
        paging = build_paging(worker_id, paging_config(config.paging), credentials.token.encode())
        info = paging.info()
    except Exception as exc:
        logger.exception("paging set-up failed")
        _die(
            EXIT_SETUP_FAILED,
            f"worker {worker_id}: paging set-up failed: {type(exc).__name__}: {exc}",
        )
    servicer.budget = budget_of(config)
    servicer.store = _spilling_store(worker_id, config, scheduler, servicer)
    servicer.executor = WorkerExecutor(worker_id, paging, scheduler, credentials, servicer.store,
                                       shutdown=servicer.shutdown_requested)  # fmt: skip
    if not tls:  # partitions to peers over plain TCP (runtime/storage/bulk.py); with TLS, gRPC only
        servicer.bulk = BulkServer(token.encode(), host, servicer.store.lookup)
    ready = worker_info_message(info, servicer.bulk.port if servicer.bulk else 0)
    _call_patiently(scheduler.Ready, pb.ReadyRequest(worker_id=worker_id, info=ready),
                    f"worker {worker_id}: Ready", args.register_timeout)  # fmt: skip
    logger.info("worker %d serving on %s", worker_id, address)
    executor = servicer.executor
    stream_address = format_address(driver_host, int(config.task_stream_port))
    threading.Thread(
        target=_serve_stream,
        args=(stream_address, config.task_stream_unix, credentials, worker_id, executor,
              servicer.shutdown_requested, args.parent_pid),
        name="clamor-stream",
        daemon=True,
    ).start()

    servicer.shutdown_requested.wait()
    server.stop(grace=1.0, timeout=2.0, join=False)  # os._exit follows: a wedged task may hold a handler
    if isinstance(servicer.store, SpillingStore):
        servicer.store.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OK)  # a task still running (wedged) must not keep the process alive


if __name__ == "__main__":
    sys.exit(main())
