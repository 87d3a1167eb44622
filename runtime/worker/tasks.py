"""A worker's task execution: one attempt at a time, results reported in batches.

The driver's messages on the task stream (runtime/net/task_stream.py) go to
:meth:`WorkerExecutor.apply`, which queues launched attempts, drops cancelled ones and
frees dropped partitions, then runs the next attempt on the stream's own thread if
nothing else runs: handing it to another thread would cost a wake-up and a GIL
hand-off, a noticeable part of a short stage. Attempts run in order, one at a time per worker
process; the runner thread runs the attempts queued behind that one, the
work that must come between two attempts (:meth:`WorkerExecutor.exclusive`, e.g. page
invalidations), and while an attempt holds the stream's thread it tells the driver
every :data:`PING_INTERVAL` s that this worker is alive (the pings that come meanwhile
are answered after). Results go up the stream
(:meth:`WorkerExecutor.report_to`): at once when no attempt waits behind them, else
(tiny tasks) every :data:`REPORT_BATCH` results or :data:`REPORT_DELAY` s. Inputs are
fetched on first use from this worker's store, a peer's ``GetPartition`` or the
driver's ``FetchPartition``.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from clamor.runtime.credentials import Credentials
from clamor.runtime.errors import ClamorError
from clamor.runtime.exitcodes import EXIT_INVALIDATION_FAILED
from clamor.runtime.net import shipping
from clamor.runtime.net.messages import decode_key, encode_key, invalidated_pages
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.shipping import encode_exception
from clamor.runtime.net.task_stream import MAX_BATCH_BYTES, PING_INTERVAL
from clamor.runtime.net.transport import connect
from clamor.runtime.paging.paging_api import WorkerPaging
from clamor.runtime.stage import DRIVER, PartitionKey, TaskContext, run_fused, run_program
from clamor.runtime.storage.bulk import BulkClient, fetch_partition
from clamor.runtime.storage.partitions import PartitionStore, approx_nbytes, detach
from clamor.runtime.worker.interrupts import Interrupter

logger = logging.getLogger("clamor.worker")

#: Results larger than this stay on the worker; the driver fetches them in chunks.
INLINE_REPLY_BYTES = 1 << 20
#: The counters of :attr:`WorkerExecutor.inputs_read`.
INPUT_SOURCES = ("partitions_read_here", "partitions_fetched_from_peers", "partitions_fetched_from_driver")
#: Programs of this many recent stages are kept.
PROGRAM_CACHE = 16
#: Seconds a peer that did not answer is waited for once more: the driver counts a worker
#: lost at most ~10 s after the last message from it (task-stream pings, heartbeats).
PEER_PATIENCE = 12.0
#: While attempts wait, results go up this many to a message, or this many seconds after
#: the last message (the driver refills its window of 32 per worker as they come back).
REPORT_BATCH = 16
REPORT_DELAY = 0.002


@dataclasses.dataclass
class _Encoded:
    """A stage's program as it arrived. It is decoded on the task thread, inside the
    first attempt's task and so at the stage's epoch: unpickling may read arena pages
    (sklearn's ``KDTree.__setstate__`` does), which on the gRPC thread would happen at
    whatever epoch the previous task had, outside any read set."""

    data: bytes


@dataclasses.dataclass
class _Queued:
    stage: int
    epoch: int
    assignment: pb.Assignment


class _PendingPuts:
    """What an attempt keeps on this worker (its outputs, a large reply), held back
    until it ends: only an attempt the driver still wants puts them in the store. A
    cancelled one may run past its stage's barrier, on pages the driver has rewritten
    since; its partitions, which the driver never registers, would stay behind."""

    def __init__(self) -> None:
        self.values: list[tuple[PartitionKey, Any, bool]] = []

    def put(self, key: PartitionKey, value: Any, spillable: bool = True) -> int:
        """Hold ``value`` as ``key`` (a copy if it views the arena: a snapshot now);
        its size in bytes."""
        value = detach(value)
        self.values.append((key, value, spillable))
        return approx_nbytes(value)


@dataclasses.dataclass
class _Exclusive:
    """Work run by the runner thread between two attempts (e.g. a page invalidation)."""

    fn: Callable[[], None]
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    error: BaseException | None = None


class WorkerExecutor:
    """Runs the attempts the driver launches on this worker."""

    def __init__(
        self,
        worker_id: int,
        paging: WorkerPaging,
        scheduler: pb_grpc.SchedulerStub,
        credentials: Credentials,
        store: PartitionStore,
        shutdown: threading.Event | None = None,
    ) -> None:
        self.worker_id = worker_id
        #: Set when the driver says the cluster is closing (the process then exits).
        self.shutdown = shutdown if shutdown is not None else threading.Event()
        self.tasks_run = 0
        self.paging = paging
        self._scheduler = scheduler
        self._credentials = credentials
        self._store = store
        self._programs: OrderedDict[int, Any] = OrderedDict()
        self._queue: collections.deque[_Queued | _Exclusive] = collections.deque()
        self._cancelled: set[int] = set()
        self._finished: list[pb.TaskReport] = []
        self._finished_bytes = 0
        self._last_report = 0.0  # when results last went up
        self._send: Callable[[pb.WorkerMessage], object] | None = None
        self._moved: list[pb.PartitionMove] = []  # spills, sent after the reports of their time
        self._cond = threading.Condition()
        self._peers: dict[str, pb_grpc.WorkerStub] = {}
        #: Where the inputs of this worker's tasks came from (reported in its stats).
        self.inputs_read = collections.Counter(dict.fromkeys(INPUT_SOURCES, 0))
        #: Partitions from peers' bulk servers (``None`` with TLS: gRPC streams only).
        self.bulk = None if credentials.tls else BulkClient(credentials.token.encode())
        self._running: int | None = None  # the attempt running now
        self._busy = False  # a thread runs a queued item now (an attempt or exclusive work)
        self._interrupts = Interrupter()
        threading.Thread(target=self._run_loop, name="clamor-tasks", daemon=True).start()

    # --- from the task stream ---

    def apply(self, message: pb.DriverMessage) -> None:
        """A message from the driver, in its order: launches, cancels, partition drops;
        then the attempts queued, on this thread, while no other item runs. A shutdown
        sets :attr:`shutdown` and nothing else runs."""
        if message.shutdown:
            self.shutdown.set()
            return
        if message.HasField("invalidate"):
            self._queue_invalidation(message.invalidate)
        for request in message.launches:
            self.launch(request, wake=False)
        if message.cancel:
            self.cancel(list(message.cancel))
        if message.drop:
            self.drop(message.drop)
        self._run_here()

    def launch(self, request: pb.LaunchRequest, wake: bool = True) -> None:
        """Queue the request's attempts (its program is decoded when the first runs);
        ``wake``: for the runner thread to run."""
        if request.program:
            with self._cond:
                self._programs[request.stage_id] = _Encoded(request.program)
                while len(self._programs) > PROGRAM_CACHE:
                    self._programs.popitem(last=False)
        with self._cond:
            for a in request.attempts:
                if a.attempt_id in self._cancelled:  # the Cancel overtook this Launch
                    self._cancelled.discard(a.attempt_id)
                    continue
                self._queue.append(_Queued(request.stage_id, request.epoch, a))
            if wake:
                self._cond.notify_all()

    def cancel(self, attempt_ids: list[int]) -> None:
        """Abandon queued attempts; a running one finishes but its result is not sent."""
        with self._cond:
            self._cancelled.update(attempt_ids)
            self._queue = collections.deque(
                q
                for q in self._queue
                if isinstance(q, _Exclusive) or q.assignment.attempt_id not in self._cancelled
            )

    def interrupt(self, attempt_ids: list[int], grace: float) -> bool:
        """Abandon these attempts and raise :class:`TaskInterrupted` in the one running, if
        any; whether none of them runs ``grace`` seconds later (a long C call does)."""
        ids = set(attempt_ids)
        self.cancel(attempt_ids)
        self._interrupts.interrupt(ids)
        deadline = time.monotonic() + grace
        while True:
            with self._cond:
                if self._running not in ids:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def drop(self, keys: Iterable[pb.PartitionKey]) -> None:
        """Free partitions; a key that does not decode (a user's pickled key) is logged and skipped."""
        decoded = []
        for key in keys:
            try:
                decoded.append(decode_key(key))
            except Exception:  # whatever unpickling a user key raises
                logger.exception("the driver dropped a partition key that does not decode")
        self._store.drop(decoded)

    def _queue_invalidation(self, request: pb.InvalidateRequest) -> None:
        """Queue the driver's page invalidation behind the attempts queued so far (so before
        those sent after it), without waiting. Should it fail, the worker must not run
        another task on stale pages: it exits, and the driver reports it lost."""
        def invalidate() -> None:
            try:
                self.paging.invalidate(request.epoch, invalidated_pages(request))
            except BaseException:
                logger.critical("worker %d: invalidating the pages written before epoch %d failed; exiting",
                                self.worker_id, request.epoch, exc_info=True)  # fmt: skip
                os._exit(EXIT_INVALIDATION_FAILED)

        self._queue_exclusive(invalidate)

    def _queue_exclusive(self, fn: Callable[[], None]) -> _Exclusive:
        """Queue ``fn`` for the runner thread behind the items queued so far."""
        item = _Exclusive(fn)
        with self._cond:
            self._queue.append(item)
            self._cond.notify_all()
        return item

    def exclusive(self, fn: Callable[[], None], timeout: float | None = None) -> None:
        """Run ``fn`` on the runner thread after the attempts queued so far, and wait.

        Page invalidations go this way: they never overlap a running task, and
        attempts launched after them see the invalidated pages.
        """
        item = self._queue_exclusive(fn)
        if not item.done.wait(timeout):
            raise TimeoutError(f"worker {self.worker_id} is busy with a task that does not end")
        if item.error is not None:
            raise item.error

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._queue) + (self._running is not None)

    # --- running the queue: the stream's thread or the runner thread ---

    def _take(self, attempts_only: bool = False) -> _Queued | _Exclusive | None:
        """(Under ``_cond``.) The next queued item, for this thread to run with :meth:`_do`;
        ``None`` if another item runs now or nothing (with ``attempts_only``: no attempt)
        is next."""
        if self._busy or not self._queue or (attempts_only and not isinstance(self._queue[0], _Queued)):
            return None
        self._busy = True
        item = self._queue.popleft()
        if isinstance(item, _Queued):
            self._running = item.assignment.attempt_id
        return item

    def _run_here(self) -> None:
        """On the stream's thread: run the next attempt if nothing runs (the latency of a
        small stage); the rest is the runner thread's, so that this thread goes back to
        reading and keeps its queue fed."""
        with self._cond:
            item = self._take(attempts_only=True)
            if item is None:
                if self._queue:
                    self._cond.notify_all()
                return
        self._do(item)  # its end wakes the runner for what was queued meanwhile

    def _wake_runner(self) -> None:
        """(Under ``_cond``, an item just ended.) Wake the runner thread if something is
        queued for it: waking it for nothing cost each small stage a thread switch."""
        if self._queue:
            self._cond.notify_all()

    def _run_loop(self) -> None:
        """The runner thread: items the stream's thread left; a sign of life for the
        driver while an attempt holds that thread."""
        while True:
            with self._cond:
                while (item := self._take()) is None:
                    if not self._cond.wait(PING_INTERVAL) and self._busy:
                        break  # the stream's thread runs an attempt: say this worker lives
            if item is None:
                self._report([pb.WorkerMessage()])  # an empty message (off the lock)
            else:
                self._do(item)

    def _do(self, item: _Queued | _Exclusive) -> None:
        """Run ``item`` (this thread took it) and report its result."""
        if isinstance(item, _Exclusive):
            try:
                item.fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                item.error = exc
            with self._cond:
                self._busy = False
                item.done.set()
                self._wake_runner()
            return
        program = self._programs.get(item.stage)
        if program is None:
            report = _error_report(
                item.assignment.attempt_id,
                ClamorError(f"stage {item.stage}'s program never reached worker {self.worker_id}"),
                item.assignment.index,
            )
            pending = _PendingPuts()
        else:
            report, pending = self._run(program, item)
        with self._cond:  # a Cancel after this: the driver ignores the report and drops its outputs
            cancelled = item.assignment.attempt_id in self._cancelled
            self._cancelled.discard(item.assignment.attempt_id)
        if not cancelled:
            for key, value, spillable in pending.values:
                self._store.put(key, value, spillable)
        with self._cond:
            self._running, self._busy = None, False
            self.tasks_run += 1
            self._moved += self._store.drain_moves()  # with (or after) this attempt's report
            self._wake_runner()
            if not cancelled:
                self._finished.append(report)
                self._finished_bytes += report.ByteSize()
            batches = self._batches()
        self._report(batches)

    def _run(self, program: Any, item: _Queued) -> tuple[pb.TaskReport, _PendingPuts]:
        """Run an attempt: its report, and what it keeps here if it is still wanted."""
        a = item.assignment
        start = time.perf_counter()
        pending = _PendingPuts()
        try:  # an input key that does not decode fails the attempt, not this thread
            locations = {decode_key(i.key): (i.holder, i.address, i.bulk_address) for i in a.inputs}
        except Exception as exc:  # noqa: BLE001
            return _error_report(a.attempt_id, exc, a.index), pending
        fetched: dict[PartitionKey, Any] = {}

        def fetch(key: PartitionKey) -> Any:
            if key not in fetched:
                fetched[key] = self._fetch(key, *locations[key])
            return fetched[key]

        payloads = list(a.payloads)
        ctx = TaskContext(a.index, tuple(locations), fetch, pending.put, payloads[0] if payloads else b"")
        read_set, resident = b"", False
        try:
            self.paging.begin_task(item.epoch)
            try:
                with self._interrupts.user_code(a.attempt_id):
                    if isinstance(program, _Encoded):  # errors (a module missing here) fail the attempt
                        program = self._decode(item.stage, program)
                    if a.count > 1:  # one read set for all; a task that raises ends it, by its index
                        values = run_fused(program, ctx, a.count, payloads)
                        value = values if any(v is not None for v in values) else None
                    else:
                        value = run_program(program, ctx)
            finally:
                read_set, resident = self.paging.end_task()
            report = pb.TaskReport(attempt_id=a.attempt_id, index=a.index, status=pb.OK)
            if a.HasField("output"):
                ctx.put(decode_key(a.output), value)
            if a.reply and value is not None:  # no value: None (the common empty reply)
                self._encode_value(report, a.attempt_id, value, pending)
            if updates := ctx.accumulator_updates:
                report.accumulators = shipping.dumps(updates)
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the driver
            report = _error_report(a.attempt_id, exc, ctx.index)
        report.outputs.extend(
            pb.PartitionInfo(key=encode_key(k), nbytes=n) for k, n in ctx.outputs.items()
        )
        if read_set:
            report.read_runs, report.resident = read_set, resident
        report.duration = time.perf_counter() - start
        return report, pending

    @staticmethod
    def _encode_value(report: pb.TaskReport, attempt_id: int, value: Any, pending: _PendingPuts) -> None:
        data = shipping.dumps(value)
        if len(data) <= INLINE_REPLY_BYTES:
            report.value = data
        else:  # kept here; the driver streams it with GetPartition, then drops it
            key = ("reply", attempt_id)
            pending.put(key, value, spillable=False)  # on its way out
            report.value_key.CopyFrom(encode_key(key))

    def _fetch(self, key: PartitionKey, holder: int, address: str, bulk_address: str) -> Any:
        """An input from where the driver says it is. Not from this worker's store unless
        it holds the key: a copy here may be a late attempt's, which the driver drops when
        it hears of it (a partition a peer spilled here, its holder says where it went)."""
        if holder == self.worker_id:
            self.inputs_read["partitions_read_here"] += 1
            return self._store.get(key)
        self.inputs_read["partitions_fetched_from_" + ("driver" if holder == DRIVER else "peers")] += 1
        request = pb.PartitionRequest(key=encode_key(key))
        if holder == DRIVER:
            where = "the driver"
            stream = lambda: self._scheduler.FetchPartition(request, timeout=600)
        else:
            where = f"worker {holder} at {address}"
            stream = lambda: self._peer_stream(address, request)
        return fetch_partition(self.bulk, bulk_address, key, stream, where)

    def _peer_stream(self, address: str, request: pb.PartitionRequest) -> Iterator[pb.Chunk]:
        """``GetPartition`` from a peer. One that did not answer at all (the connection
        attempt timed out: a cut link, not a refusal) is waited for up to
        :data:`PEER_PATIENCE` s more, longer than the driver takes to count a cut-off
        worker lost, so that the attempt then fails with its input known missing
        (recomputed from lineage) rather than as a task error that fails its stage."""
        start = time.monotonic()
        call = self.peer(address).GetPartition(request, timeout=600)
        try:
            first = next(call, None)  # a peer that cannot be reached fails here
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() - start < 1.0:
                raise
            call = self.peer(address).GetPartition(request, timeout=PEER_PATIENCE, wait_for_ready=True)
            first = next(call, None)
        return itertools.chain([] if first is None else [first], call)

    def peer(self, address: str) -> pb_grpc.WorkerStub:
        """A Worker stub for the peer at ``address`` (one channel per peer, kept)."""
        stub = self._peers.get(address)
        if stub is None:
            stub = self._peers[address] = pb_grpc.WorkerStub(connect(
                address, self._credentials.token, tls=self._credentials.tls
            ))
        return stub

    def _decode(self, stage: int, encoded: _Encoded) -> Any:
        """The stage's program, decoded once (the stage's later attempts reuse it)."""
        program = shipping.loads(encoded.data)
        with self._cond:
            if self._programs.get(stage) is encoded:
                self._programs[stage] = program
        return program

    # --- results, up the task stream ---

    def report_to(self, send: Callable[[pb.WorkerMessage], object]) -> None:
        """Send results with ``send`` (the task stream is open: attempts come on it)."""
        with self._cond:
            self._send = send

    def _batches(self) -> list[pb.WorkerMessage]:
        """The results to send now (under ``_cond``): all of them when no attempt waits,
        else none until :data:`REPORT_BATCH` are in or :data:`REPORT_DELAY` s
        passed; a message carries up to about ``MAX_BATCH_BYTES``, and the moves go with
        the last one, never ahead of the reports taken before them."""
        if self._send is None or not (self._finished or self._moved):
            return []
        now = time.monotonic()
        waiting = bool(self._queue) and isinstance(self._queue[0], _Queued)
        if waiting and len(self._finished) < REPORT_BATCH \
                and self._finished_bytes < MAX_BATCH_BYTES and now - self._last_report < REPORT_DELAY:
            return []
        self._last_report = now
        batches, batch, size = [], [], 0
        for report in self._finished:
            batch.append(report)
            size += report.ByteSize()
            if size >= MAX_BATCH_BYTES:
                batches.append(pb.WorkerMessage(reports=batch))
                batch, size = [], 0
        batches.append(pb.WorkerMessage(reports=batch, moved=self._moved))
        self._finished, self._finished_bytes, self._moved = [], 0, []
        return batches

    def _report(self, batches: list[pb.WorkerMessage]) -> None:
        """Send ``batches`` (off ``_cond``); a broken stream is left to its reader, which
        ends the process."""
        try:
            for message in batches:
                self._send(message)
        except OSError as exc:
            logger.warning("results could not be sent up the task stream: %s", exc)


def _error_report(attempt_id: int, exc: BaseException, index: int = 0) -> pb.TaskReport:
    return pb.TaskReport(
        attempt_id=attempt_id, index=index, status=pb.ERROR, **encode_exception(exc)
    )


