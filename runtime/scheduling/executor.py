"""The driver's thin loop around the scheduler state machine.

Events (a stage submitted, tasks finished, a worker lost, partitions dropped)
are run in order, one thread at a time (runtime/scheduling/events.py: the loop
thread, or the task stream's reader that brought the results), which feed them to
:class:`~clamor.runtime.scheduling.scheduler.SchedulerState` and carry out the
instructions it returns: ``Launch``, ``Cancel`` and ``Drop`` go down the worker's
task stream (runtime/net/task_stream.py: one long-lived TCP connection per worker,
which brings its results back too), ``StageDone`` / ``StageFailed`` resolve
the waiting caller. All scheduling decisions live in the state machine; this module
only does I/O, and its events never wait on a worker.

:meth:`Executor.execute` runs one stage inside the paging protocol
(``paging_api``): a new epoch, page invalidations on every worker, the tasks,
then ``end_stage``; the stage's accumulator updates are merged at its barrier,
once per task index.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import numpy as np
from clamor.runtime import deadlines
from clamor.runtime.data import accumulators
from clamor.runtime.errors import (
    ActionTimeoutError,
    ClamorError,
    NoWorkersError,
    SerializationError,
    TaskCrashedError,
    WorkerLostError,
)
from clamor.runtime.net import shipping
from clamor.runtime.net.messages import decode_key, encode_key
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from clamor.runtime.net.shipping import decode_exception
from clamor.runtime.net.task_stream import DriverLink
from clamor.runtime.observe.telemetry import Telemetry
from clamor.runtime.paging.paging_api import DriverPaging
from clamor.runtime.paging.read_sets import ReadSet, ReadSetCache
from clamor.runtime.paging.versions import VersionKeeper
from clamor.runtime.scheduling import fusion
from clamor.runtime.scheduling.endpoints import Endpoints
from clamor.runtime.scheduling.events import Event, EventLoop
from clamor.runtime.scheduling.fusion import FusionPolicy
from clamor.runtime.scheduling.scheduler import (
    Cancel,
    Drop,
    Launch,
    PartitionsLost,
    SchedulerState,
    StageDone,
    StageFailed,
    TaskEnded,
    TaskResult,
)
from clamor.runtime.scheduling.stopping import Stopper
from clamor.runtime.scheduling.streaming import TaskStream
from clamor.runtime.stage import DRIVER, PartitionKey, StageSpec, TaskSpec
from clamor.runtime.storage.bulk import BulkClient
from clamor.runtime.storage.partitions import PartitionStore

logger = logging.getLogger("clamor.executor")
T = TypeVar("T")

#: How often a waiting stage checks that its workers are still alive.
POLL_INTERVAL = 0.1

@dataclasses.dataclass
class _StageRun:
    program: bytes
    epoch: int
    future: concurrent.futures.Future
    name: str = ""
    recompute: bool = False
    stream: TaskStream | None = None  # a streaming stage's link with its caller
    sent_to: set[int] = dataclasses.field(default_factory=set)
    #: a fused stage's chunks, ``(first index, count)`` per attempt index (empty: not fused)
    chunks: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    #: the tasks' own payloads, by index (empty: none has one)
    payloads: list[bytes] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class _Kept:
    """A task result too large to travel inline: it waits on ``worker`` under ``key``."""

    worker: int
    key: PartitionKey


class Executor:
    """Runs stages on the workers it is told about.

    ``paging``: the driver pager (stage protocol). ``poll``: called while a stage
    waits, to detect lost workers. ``unstaffed()``: why no worker can take a task now
    or later (``None`` if one can): a waiting stage then fails with
    :class:`NoWorkersError`. ``unreachable(worker, error)``: a call to a
    worker failed or its task stream ended; the owner decides whether it is lost
    (and then calls :meth:`worker_lost`). ``min_ref_bytes``: arena arrays at least this large
    travel by reference. ``bulk``: fetches partitions from workers' bulk servers
    (``None``: gRPC streams only, e.g. with TLS).
    """

    def __init__(
        self,
        paging: DriverPaging,
        *,
        poll: Callable[[], None],
        unstaffed: Callable[[], str | None] = lambda: None,
        unreachable: Callable[[int, str], None],
        min_ref_bytes: Callable[[], int | None],
        versions: VersionKeeper | None = None,
        window: int = 32,
        speculation: bool = True,
        speculation_factor: float = 2.0,
        bulk: BulkClient | None = None,
        fuse: bool = True,
        kill: Callable[[int, str], None] = lambda worker, why: None,
    ) -> None:
        self._paging = paging
        #: Stops the running attempts of stages that are over (kills workers that do not).
        self.stopper = Stopper(kill)
        self._poll = poll
        self._unstaffed = unstaffed
        self._unreachable = unreachable
        self._min_ref_bytes = min_ref_bytes
        #: What the driver's version log keeps (epoch pins, release, trimming).
        self.versions = versions if versions is not None else VersionKeeper(paging)
        self._polled = 0.0  # when execute last polled for lost workers
        self._state = SchedulerState(
            window=window, speculation=speculation, speculation_factor=speculation_factor
        )
        #: Whether tiny tasks run in chunks (runtime/scheduling/fusion.py).
        self.fusion = FusionPolicy(enabled=fuse)
        #: Its ways to the workers: task-stream links and stubs.
        self.endpoints = Endpoints(unreachable, bulk)
        self._stages: dict[int, _StageRun] = {}
        self._stage_ids = itertools.count(1)
        self._stage_lock = threading.Lock()
        self.driver_store = PartitionStore()
        #: The driver's own bulk server, serving ``driver_store`` ("": none, e.g. with TLS).
        self.driver_bulk_address = ""
        #: What the views read: attempts, stages and events (runtime/observe/telemetry.py).
        self.telemetry = Telemetry()
        self._closed = False
        self.stages_run = 0
        self.tasks_run = 0
        #: The last stage's read sets, one per task (fused tasks share their attempt's).
        self.last_read_sets: list[ReadSet] = []
        self._read_sets = ReadSetCache()  # equal reports (a worker's resident pages) decode once
        self.last_epoch = 0
        self._events = EventLoop(self._run_batch)

    # --- events ---

    def _post(self, event: Event) -> None:
        self._events.post(event)

    def gathering(self) -> contextlib.AbstractContextManager:
        """The results :meth:`task_finished` gets on this thread meanwhile run together,
        here, on the way out (the task-stream poller's wake-up)."""
        return self._events.gathering()

    def ask(self, question: Callable[[SchedulerState], T]) -> T:
        """``question(state)``, answered in turn with the events (the state is not thread-safe)."""
        answer: list[T] = []
        self._post_and_wait(lambda s: answer.append(question(s)) or [])
        return answer[0]

    def _post_and_wait(self, event: Callable[[SchedulerState], list]) -> None:
        """Post ``event`` and wait until the loop has run it (and sent its instructions)."""
        if self._closed:
            raise ClamorError("the cluster is closed")
        done = threading.Event()

        def run(state: SchedulerState) -> list:
            try:
                return event(state)
            finally:
                done.set()

        self._post(run)
        while not done.wait(POLL_INTERVAL):
            if self._closed:
                raise ClamorError("the cluster is closed")

    def _run_batch(self, events: list[Event]) -> None:
        """Run events queued together; their launches to one worker go in one message (a
        batch of finished tasks refills in one go)."""
        launches: dict[int, list] = {}
        for event in events:
            try:
                for instruction in event(self._state):
                    if isinstance(instruction, Launch):
                        launches.setdefault(instruction.worker, []).extend(instruction.attempts)
                        continue
                    self._flush(launches)
                    self._carry_out(instruction)
            except Exception:
                logger.exception("scheduler event failed")
        self._flush(launches)

    def _flush(self, launches: dict[int, list]) -> None:
        for worker, attempts in launches.items():
            self._launch(Launch(worker, tuple(attempts)))
        launches.clear()

    def worker_added(
        self, worker: int, stub: pb_grpc.WorkerStub, address: str, bulk_address: str = ""
    ) -> None:
        self.endpoints.add(worker, stub, address, bulk_address)
        self.telemetry.worker_added(worker)
        self._post(lambda s: s.worker_added(worker, now=time.monotonic()))

    def worker_lost(self, worker: int, error: WorkerLostError) -> None:
        self.endpoints.lost(worker, f"the driver counts worker {worker} as lost: {error}")
        self.telemetry.worker_lost(worker, str(error))
        self._post(lambda s: s.worker_lost(worker, error, now=time.monotonic()))

    def link_of(self, worker: int) -> DriverLink | None:
        """Worker ``worker``'s task-stream link, for its stream to attach (``None``: not
        ready, or lost)."""
        return self.endpoints.open_link(worker)

    def stream_ended(self, worker: int, why: str) -> None:
        """A worker's task stream ended without the driver closing it."""
        if not self._closed:
            self._unreachable(worker, why)

    def task_finished(
        self, worker: int, reports: Iterable[pb.TaskReport], moved: Iterable[pb.PartitionMove] = ()
    ) -> None:
        """Results from a worker's task stream: decode the reports into events (the
        successes in a row as one, refilled once), then the partitions the worker spilled
        (after the outputs those reports register); run them on this thread (the stream's
        reader) unless events run elsewhere."""
        now = time.monotonic()
        events: list[Event] = []
        finished: list[TaskResult] = []  # the successes since the last event
        self.telemetry.finished_many((r.attempt_id, r.status == pb.OK, r.duration) for r in reports)
        for report in reports:
            self.tasks_run += 1
            if report.status == pb.OK:
                try:
                    result = self._decode_result(worker, report)
                except Exception as exc:  # noqa: BLE001 - whatever the unpickler raises
                    error = SerializationError(
                        f"the result of a task on worker {worker} cannot be unpickled in the "
                        f"driver: {type(exc).__name__}: {exc}"
                    )
                    events.append(lambda s, a=report.attempt_id, e=error: s.task_failed(worker, a, e, now=now))
                    finished = []  # successes after it: an event of their own, after it
                else:
                    if not finished:
                        events.append(lambda s, rs=finished: s.tasks_finished(worker, rs, now=now))
                    finished.append(result)
                    continue
            else:
                error = decode_exception(
                    report.error, report.traceback, report.error_type, report.error_message
                )
                events.append(lambda s, a=report.attempt_id, e=error: s.task_failed(worker, a, e, now=now))
                finished = []
        try:
            moves = {decode_key(m.key): (m.holder, m.tier, m.nbytes) for m in moved}
        except Exception:  # a key that does not decode: placement only
            logger.exception("worker %d reported partition moves that do not decode", worker)
            moves = {}
        if moves:
            events.append(lambda s: s.partitions_moved(worker, moves))
        self._events.post_here(events)

    def _decode_result(self, worker: int, report: pb.TaskReport) -> TaskResult:
        kept: tuple[PartitionKey, ...] = ()
        if report.HasField("value_key"):
            kept = (decode_key(report.value_key),)
            value: Any = _Kept(worker, kept[0])
        else:
            value = shipping.loads(report.value) if report.value else None
        return TaskResult(
            index=report.index,
            worker=worker,
            attempt=report.attempt_id,
            value=value,
            outputs={decode_key(o.key): o.nbytes for o in report.outputs} if report.outputs else {},
            accumulator_updates=report.accumulators or {},
            read_set=self._read_sets.get(report.read_runs),
            resident=report.resident,
            duration=report.duration,
            kept=kept,
        )

    # --- instructions ---

    def _carry_out(self, instruction: Any) -> None:
        if isinstance(instruction, TaskEnded):
            run = self._stages.get(instruction.stage)
            if run is not None and run.stream is not None:
                run.stream.on_task(instruction.index, instruction.result, instruction.error)
        elif isinstance(instruction, Cancel):
            self.telemetry.cancelled(instruction.attempts)
            if (link := self.endpoints.link(instruction.worker)) is not None:
                link.cancel(instruction.attempts)
                if instruction.stop:
                    self.stopper.stop(instruction.worker, self.endpoints.get(instruction.worker).stub,
                                      instruction.attempts)  # fmt: skip
        elif isinstance(instruction, StageDone | StageFailed):
            run = self._stages.pop(instruction.stage, None)
            error = instruction.error if isinstance(instruction, StageFailed) else None
            if isinstance(error, TaskCrashedError) and run is not None:
                error.name_stage(run.name, run.chunks[error.index] if run.chunks else None)
            self.telemetry.stage_ended(instruction.stage, error)
            if run is not None and not run.future.done():
                if isinstance(instruction, StageDone):
                    run.future.set_result(list(instruction.results))
                else:
                    run.future.set_exception(instruction.error)
        elif isinstance(instruction, Drop):
            if instruction.worker == DRIVER:
                self.driver_store.drop(instruction.keys)
            elif (link := self.endpoints.link(instruction.worker)) is not None:
                link.drop(encode_key(k) for k in instruction.keys)
        elif isinstance(instruction, PartitionsLost):
            logger.warning("%d partition(s) lost with their worker", len(instruction.keys))

    def _launch(self, launch: Launch) -> None:
        by_stage: dict[int, list] = {}
        for attempt in launch.attempts:
            by_stage.setdefault(attempt.stage, []).append(attempt)
        for stage, attempts in by_stage.items():
            run = self._stages.get(stage)
            if run is None:
                continue
            request = pb.LaunchRequest(stage_id=stage, epoch=run.epoch)
            if launch.worker not in run.sent_to:
                request.program = run.program
                run.sent_to.add(launch.worker)
            for attempt in attempts:
                request.attempts.append(self._assignment(attempt))
            self.telemetry.launched(launch.worker, attempts, run.name, run.recompute)
            if (link := self.endpoints.link(launch.worker)) is not None:
                link.launch(request)

    def _assignment(self, attempt: Any) -> pb.Assignment:
        spec = attempt.spec
        inputs = []
        for key in spec.inputs:
            holder = attempt.locations[key]
            endpoint = self.endpoints.get(holder)
            address, bulk = (endpoint.address, endpoint.bulk_address) if endpoint else ("", "")
            if holder == DRIVER:
                bulk = self.driver_bulk_address
            inputs.append(pb.InputLocation(key=encode_key(key), holder=holder, address=address,
                                           bulk_address=bulk))  # fmt: skip
        run = self._stages.get(attempt.stage)
        index, count = run.chunks[attempt.index] if run is not None and run.chunks else (attempt.index, 0)
        return pb.Assignment(
            attempt_id=attempt.id,
            index=index,
            inputs=inputs,
            output=encode_key(spec.output) if spec.output is not None else None,
            reply=spec.reply,
            count=count,
            payloads=run.payloads[index:index + max(count, 1)] if run is not None else (),
        )

    # --- stages ---

    def execute(self, stage: StageSpec, live: Callable[[], list[int]],
                stream: TaskStream | None = None) -> list[Any]:  # fmt: skip
        """Run ``stage`` to its barrier; the ``reply`` values in task index order.

        ``live``: the current live worker ids (for page invalidation). The program
        is pickled before anything is sent (a :class:`SerializationError` names
        the culprit). A task error, a lost worker or a missing input fails the
        whole stage with that error once the scheduler says so; a
        ``KeyboardInterrupt`` cancels the stage and propagates. With ``stream``, the stage
        streams (futures): ``stream.on_task(index, result, error)`` as each task ends (on
        the events' thread: it must not wait; :meth:`value_of` gives the result's value),
        a task's error ends that task alone, ``stream.cancel`` ends one task (stopping it),
        and the values returned are ``None``.
        """
        program = shipping.pack_program(stage.program, self._min_ref_bytes())
        if stage.epoch is not None:
            self.versions.check_replay(stage.epoch)
        with self._stage_lock:
            # At most every POLL_INTERVAL here (and while the stage waits): a worker that
            # dies also ends its task stream, which reports it at once.
            if time.monotonic() - self._polled >= POLL_INTERVAL:
                self._poll()
                self._polled = time.monotonic()
            epoch, pages = self._begin_stage()
            self.stages_run += 1
            try:
                if len(pages):
                    self.endpoints.invalidate(epoch, pages, live())
                self._trim_versions(epoch, live)
                stage_id = next(self._stage_ids)
                run = _StageRun(program, epoch if stage.epoch is None else stage.epoch,
                                concurrent.futures.Future(), stage.name, stage.recompute, stream)  # fmt: skip
                if any(task.payload for task in stage.tasks):
                    run.payloads = [task.payload for task in stage.tasks]
                self._stages[stage_id] = run
                key = fusion.program_key(stage)
                size = 1 if stream else self.fusion.chunk(key, len(stage.tasks), self.endpoints.linked)
                if size > 1:
                    run.chunks = fusion.chunks(len(stage.tasks), size)
                    reply = stage.tasks[0].reply
                    tasks = [TaskSpec(i, reply=reply) for i in range(len(run.chunks))]
                else:
                    tasks = self._with_cached(stage.tasks)
                self.telemetry.stage_started(stage_id, stage.name, len(tasks), run.epoch,
                                             stage.recompute)  # fmt: skip
                # the same program over the same tasks (a rerun after a failure): the tasks'
                # losses carry over, so that one which kills its workers is found out
                identity = (hash((program, *run.payloads)), len(tasks), size)
                submit = lambda s: self._submit(s, stage_id, tasks, run.future, identity, stream)
                try:
                    results = self._with_versions(self._wait(stage_id, run, submit), run.epoch)
                except BaseException:
                    self._settle_stops()  # the next stage finds its workers free
                    raise
                finally:
                    self._stages.pop(stage_id, None)
            finally:
                self._paging.end_stage()
                self.versions.stage_ended(epoch, replay=stage.epoch is not None, keeps_lineage=stage.keeps_lineage)
        counts = [c for _, c in run.chunks] or [1] * len(results)
        self.fusion.learn(key, [r.duration for r in results], counts)
        self.last_read_sets = [r.read_set for r, c in zip(results, counts) for _ in range(c)]
        self.last_epoch = run.epoch
        if stream is not None:
            values = [None] * len(results)  # each went to the stream's caller already
        elif run.chunks:
            values = [v for r, c in zip(results, counts) for v in (self.value_of(r) or [None] * c)]
        else:
            values = [self.value_of(r) for r in results]
        self._merge_accumulators(results)
        return values

    def _with_cached(self, tasks: list[TaskSpec]) -> list[TaskSpec]:
        """Tasks that say which arena ranges they read, told which workers cache them."""
        if not any(t.reads for t in tasks):
            return list(tasks)
        return [
            dataclasses.replace(t, cached=tuple(sorted(self._paging.cached_bytes(t.reads).items())))
            if t.reads else t
            for t in tasks
        ]

    def _submit(self, state: SchedulerState, stage_id: int, tasks: list, future, key: Any,
                stream: TaskStream | None) -> list:  # fmt: skip
        try:
            out = state.stage_submitted(stage_id, tasks, now=time.monotonic(), key=key, streaming=stream is not None)
        except Exception as exc:  # noqa: BLE001 - e.g. bad task indices: the caller gets it
            self.telemetry.stage_ended(stage_id, exc)
            future.set_exception(exc)
            return []
        if stream is not None:  # its tasks cancelled so far, and from now on
            def stop(index: int, error: BaseException) -> None:
                self._post(lambda s: s.task_cancelled(stage_id, index, error, now=time.monotonic()))

            for index, error in stream.attach(stop).items():
                out += state.task_cancelled(stage_id, index, error, now=time.monotonic())
        return out

    def _wait(self, stage_id: int, run: _StageRun, submit: Event) -> list[TaskResult]:
        """Submit the stage (here, unless another thread runs events: waking the loop
        thread cost a 2-task stage about 7 % of its time) and return its results once it is
        done; until this thread's deadline (runtime/deadlines.py), then
        :class:`ActionTimeoutError`. Ctrl-C or the deadline cancel the stage (its running
        attempts are stopped, see :meth:`_settle_stops`)."""
        limit = deadlines.current()
        try:
            self._events.post_here([submit])
            while True:
                wait = POLL_INTERVAL if limit is None else min(POLL_INTERVAL, limit[0] - time.monotonic())
                try:
                    return run.future.result(timeout=max(0.0, wait))
                except concurrent.futures.TimeoutError:
                    if limit is not None and time.monotonic() >= limit[0]:
                        raise self._timed_out(stage_id, run, limit) from None
                    self._poll()
                    if (why := self._unstaffed()) is not None:  # it would wait for ever
                        raise self._cancel(stage_id, NoWorkersError(f"stage {run.name or stage_id!r}", why))
                    self._post(lambda s: s.tick(time.monotonic()))  # stragglers: speculation
        except KeyboardInterrupt as interrupt:
            error = ClamorError(f"stage {stage_id} was interrupted")
            error.__cause__ = interrupt
            self._cancel(stage_id, error)
            raise

    def _timed_out(self, stage_id: int, run: _StageRun, limit: tuple[float, float, str]) -> ActionTimeoutError:
        """Cancel a stage past its action's deadline; the error to raise."""
        progress = self.ask(lambda s: s.snapshot()["stages"].get(stage_id))
        _, seconds, action = limit
        done = "" if progress is None else f" ({progress['done']} of {progress['total']} tasks done)"
        error = ActionTimeoutError(f"{action} did not finish within {seconds:g} s: stage {run.name or stage_id!r}"
                                   f"{done} was cancelled and its running tasks stopped")  # fmt: skip
        return self._cancel(stage_id, error)

    def _cancel(self, stage_id: int, error: BaseException) -> BaseException:
        """Cancel a waiting stage (its running attempts stopped); ``error``, to raise."""
        self._post(lambda s: s.stage_cancelled(stage_id, error))
        return error

    def _settle_stops(self) -> None:
        """After a stage ended badly: wait until the events so far are carried out (its
        cancels among them) and its running attempts stopped, or their workers killed."""
        with contextlib.suppress(ClamorError):
            self._post_and_wait(lambda s: [])
        self.stopper.wait()

    def _begin_stage(self) -> tuple[int, np.ndarray]:
        """Seal a new epoch (stage lock held): the epoch and the pages to invalidate. The
        read-set cache learns which pages it gave a new version."""
        epoch, pages = self._paging.begin_stage()
        self._read_sets.sealed(epoch, self._paging.sealed())
        return epoch, pages

    def _with_versions(self, results: list[TaskResult], epoch: int) -> list[TaskResult]:
        """Resident read sets with the versions their pages have at ``epoch`` (the stage's),
        read from the driver's page table before the next stage start can seal a newer one."""
        return [r if not r.resident else dataclasses.replace(
                    r, resident=False, read_set=self._read_sets.at(r.read_set, epoch, self._paging.versions_at))
                for r in results]  # fmt: skip

    def seal_epoch(self, live: Callable[[], list[int]]) -> int:
        """Seal a new arena epoch between two stages and pin it (``versions.unpin`` when
        done): from now on the driver's first write to a page copies its old bytes into
        the version log, so the arena as of the epoch stays readable (a checkpoint). The
        ``live`` workers drop the pages written since the last stage."""
        with self._stage_lock:
            epoch, pages = self._begin_stage()
            try:
                if len(pages):
                    self.endpoints.invalidate(epoch, pages, live())
            finally:
                self._paging.end_stage()
            self.versions.pin(epoch)  # before the next stage can end and release it
        return epoch

    def _trim_versions(self, epoch: int, live: Callable[[], list[int]]) -> None:
        """Free the page versions no stage from here on reads (bounded version log).

        An attempt of an earlier stage may still run on a worker (cancelled ones finish on
        their own); an ``Invalidate`` call runs on each worker's task thread between
        attempts, so once every worker has answered one, none is left.
        """
        floor = self.versions.trimmable(epoch)
        if floor is not None:
            self.endpoints.invalidate(epoch, [], live(), barrier=True)
            self.versions.trim(floor)

    def value_of(self, result: TaskResult) -> Any:
        """A task's reply: as it came, or fetched from the worker keeping a large one."""
        if not isinstance(result.value, _Kept):
            return result.value
        kept = result.value
        try:
            return self.fetch(kept.key, holder=kept.worker)
        finally:
            if (link := self.endpoints.link(kept.worker)) is not None:
                link.drop([encode_key(kept.key)])

    @staticmethod
    def _merge_accumulators(results: list[TaskResult]) -> None:
        updates = [r.accumulator_updates for r in results]
        if any(updates):
            accumulators.merge([shipping.loads(u) if u else {} for u in updates])

    # --- partitions ---

    def holder(self, key: PartitionKey) -> int | None:
        return self._state.holder(key)

    def put(self, key: PartitionKey, value: Any) -> None:
        size = self.driver_store.put(key, value)
        self._post_and_wait(lambda s: s.partitions_added(DRIVER, {key: size}))

    def drop(self, keys: Iterable[PartitionKey]) -> None:
        """Forget ``keys`` (``holder`` says ``None`` on return); the holders free them soon
        after. Datasets call this from garbage-collection finalizers, which may run on any
        thread: on a thread running events it only queues the event."""
        keys = list(keys)
        if self._closed:
            return
        event = lambda s: s.partitions_dropped(keys)
        if threading.current_thread() is self._events.runner:
            self._post(event)
        else:
            self._post_and_wait(event)

    def fetch(self, key: PartitionKey, holder: int | None = None) -> Any:
        """Bring partition ``key`` to the driver, in chunks, from wherever it is held."""
        holder = self.holder(key) if holder is None else holder
        if holder is None:
            raise ClamorError(f"partition {key!r} is held by no live worker")
        if holder == DRIVER:
            return self.driver_store.get(key)
        return self.endpoints.fetch(key, holder)

    def driver_chunks(self, key: PartitionKey) -> Iterator[pb.Chunk]:
        """The Scheduler's ``FetchPartition``: a driver-held partition as chunks."""
        return self.driver_store.chunks(key)

    def snapshot(self) -> dict:
        return self._state.snapshot()

    def counters(self) -> dict[str, int]:
        """The scheduler's counters: ``tasks_rerun``, ``tasks_speculated``, ``tasks_replaced``,
        ``tasks_lost`` (plain ints: safe to read from any thread); the stopper's
        ``tasks_interrupted`` and ``tasks_not_stopped`` (their workers killed)."""
        return {**self._state.counters(), "tasks_interrupted": self.stopper.interrupted,
                "tasks_not_stopped": self.stopper.killed}  # fmt: skip

    def close(self) -> None:
        self._closed = True
        self.stopper.close()
        for run in list(self._stages.values()):
            if not run.future.done():
                run.future.set_exception(ClamorError("the cluster was closed"))
        self._events.stop()
        self.endpoints.close()  # ends each task stream: its reader and writer threads return

    def join(self, timeout: float = 5.0) -> None:
        """Wait for the loop thread and the task streams' readers and writers to end after
        :meth:`close` (they end with their streams, which it closed)."""
        deadline = time.monotonic() + timeout
        for thread in [self._events.thread, *self.endpoints.threads()]:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
