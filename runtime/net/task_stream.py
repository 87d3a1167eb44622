"""The task stream: one long-lived bidirectional gRPC stream per worker (``Scheduler.Session``).

A worker opens it once ``Ready`` returned and keeps it for its lifetime. Down it go the
driver's launches, cancels and partition drops; up it come the results of the worker's
attempts. It replaces a unary ``Launch`` call per batch of attempts and a
``TaskFinished`` call per batch of results: each was a full gRPC round trip in Python
(~0.45 ms on a 2-core VM), two per stage at least. Both ends batch: a message carries
everything that queued while the previous one was being sent (up to
:data:`MAX_BATCH_BYTES`), so 10,000 tiny tasks do not wait on one message each.

Order: the driver's items reach the worker in the order issued (a cancel never
overtakes its launch). A :class:`~clamor.runtime.net.proto.clamor_pb2.DriverMessage`
is applied launches first, then cancels, then drops, so the sender starts a new
message rather than put an item ahead of one issued before it.

Failure: the stream's end, either way and for any reason, means the worker is lost.
A killed process resets the connection; a cut link fails the keepalive pings that
``transport`` sets on the driver's server and the workers' channels to it (the stream
ends ~10 s after the cut, on both ends); a message that does not decode, or a second
stream for the same worker, is refused with the reason. The driver then counts the
worker lost (``on_end``: its attempts rerun elsewhere) and the worker exits, saying
why (:func:`run_worker_stream`).

Driver side: :class:`DriverLink` (an outbox the executor fills without ever blocking,
sent by the gRPC handler thread of the worker's ``Session``, and a reader thread
that hands results on); :func:`serve` is that handler. Worker side:
:func:`run_worker_stream`. The handler is registered with :func:`add_session_handler`,
which hands it the raw bytes, so that it decodes them itself and names what failed.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc
from google.protobuf.message import DecodeError

#: A message gathers queued items up to about this size (one larger item goes alone).
MAX_BATCH_BYTES = 4 << 20
SERVICE = "clamor.v1.Scheduler"

# Item kinds, in the order a DriverMessage applies them; _END makes the sender return.
_LAUNCH, _CANCEL, _DROP = 0, 1, 2
_END: Any = object()

#: ``on_results(worker, reports, moved)``: a WorkerMessage's content.
OnResults = Callable[[int, Iterable[pb.TaskReport], Iterable[pb.PartitionMove]], None]
#: ``on_end(worker, why)``: the stream ended without the driver closing it.
OnEnd = Callable[[int, str], None]


class DriverLink:
    """The driver's end of one worker's task stream.

    :meth:`launch`, :meth:`cancel` and :meth:`drop` only queue (the executor's thread
    never waits on a worker); the ``Session`` handler's thread sends the queue as
    :class:`pb.DriverMessage` batches (:meth:`messages`). Items queued before the
    worker opens its stream wait for it. :meth:`close` ends the stream.
    """

    def __init__(self, worker: int) -> None:
        self.worker = worker
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # (kind, payload) or _END
        self._lock = threading.Lock()
        self._context: grpc.ServicerContext | None = None
        self._closed = False
        self.reader: threading.Thread | None = None
        #: Counters (read from any thread): messages each way, attempts sent, reports received.
        self.sent_messages = self.sent_attempts = self.received_messages = self.received_reports = 0

    # --- the executor's side ---

    def launch(self, request: pb.LaunchRequest) -> None:
        self._outbox.put((_LAUNCH, request))

    def cancel(self, attempts: Iterable[int]) -> None:
        self._outbox.put((_CANCEL, list(attempts)))

    def drop(self, keys: Iterable[bytes]) -> None:
        """Free partitions on the worker (pickled keys)."""
        self._outbox.put((_DROP, list(keys)))

    def close(self, why: str = "", code: grpc.StatusCode = grpc.StatusCode.OK) -> None:
        """End the stream (what is still queued is not sent); the worker gets ``code`` and
        ``why`` as the call's status. ``on_end`` is not called: the driver knows."""
        self._finish(why, code)

    def _finish(self, why: str, code: grpc.StatusCode) -> bool:
        """Close once; False if it was closed already (then nothing changes)."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            context = self._context
        if context is not None and code != grpc.StatusCode.OK:
            context.set_code(code)
            context.set_details(why)
        self._outbox.put(_END)
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    # --- the Session handler's side ---

    def _attach(self, context: grpc.ServicerContext) -> bool:
        with self._lock:
            if self._context is not None or self._closed:
                return False
            self._context = context
            return True

    def messages(self) -> Iterator[pb.DriverMessage]:
        """The queued items as messages, in issue order, until the stream is closed."""
        item = self._outbox.get()
        while item is not _END:
            message, item = self._batch(item)
            self.sent_messages += 1
            yield message
            if item is None:
                item = self._outbox.get()

    def _batch(self, item: tuple[int, Any]) -> tuple[pb.DriverMessage, Any]:
        """A message of ``item`` and the items queued behind it; returns it with the item
        that goes next (``None``: none taken yet)."""
        message = pb.DriverMessage()
        phase, size = _LAUNCH, 0
        while True:
            kind, payload = item
            if kind < phase:
                return message, item  # issued after a kind applied later: next message
            phase = kind
            if kind == _LAUNCH:
                message.launches.append(payload)
                size += payload.ByteSize()
                self.sent_attempts += len(payload.attempts)
            elif kind == _CANCEL:
                message.cancel.extend(payload)
                size += 10 * len(payload)
            else:
                message.drop.extend(payload)
                size += sum(len(k) + 4 for k in payload)
            if size >= MAX_BATCH_BYTES:
                return message, None
            try:
                item = self._outbox.get_nowait()
            except queue.Empty:
                return message, None
            if item is _END:
                return message, _END

    def _read(self, requests: Iterator[bytes], on_results: OnResults, on_end: OnEnd) -> None:
        """The reader thread: results to ``on_results`` until the stream ends; then, unless
        the driver closed it, ``on_end`` with why."""
        why, code = "its task stream ended (connection closed)", grpc.StatusCode.OK
        try:
            for data in requests:
                try:
                    message = pb.WorkerMessage.FromString(data)
                except DecodeError as exc:
                    why = f"worker {self.worker} sent a task-stream message that does not decode ({exc})"
                    code = grpc.StatusCode.INVALID_ARGUMENT
                    break
                self.received_messages += 1
                self.received_reports += len(message.reports)
                if message.reports or message.moved:
                    on_results(self.worker, message.reports, message.moved)
        except grpc.RpcError as exc:  # the server's own carries no code: the call is gone
            status = getattr(exc, "code", None)
            why = "its task stream ended" + (f" ({status().name}: {exc.details()})" if status
                                             else " (connection lost or call cancelled)")  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - whatever handling the results raised
            why = f"the driver could not take worker {self.worker}'s results: {type(exc).__name__}: {exc}"
            code = grpc.StatusCode.INTERNAL
        if self._finish(why, code):
            on_end(self.worker, why)


def serve(
    requests: Iterator[bytes],
    context: grpc.ServicerContext,
    link_of: Callable[[int], DriverLink | None],
    on_results: OnResults,
    on_end: OnEnd,
) -> Iterator[pb.DriverMessage]:
    """The ``Session`` handler: the first message names the worker; its link's
    :meth:`DriverLink.messages` are the responses, and a reader thread takes the results.

    Refused: a first message that does not decode (``INVALID_ARGUMENT``), a worker the
    driver does not have ready (``FAILED_PRECONDITION``), a second stream for one
    worker (``ALREADY_EXISTS``).
    """
    data = next(requests, None)
    if data is None:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a task stream must start with its worker id")
    try:
        first = pb.WorkerMessage.FromString(data)
    except DecodeError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                      f"the first task-stream message does not decode ({exc})")  # fmt: skip
    link = link_of(first.worker_id)
    if link is None:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                      f"worker {first.worker_id} is not ready here, or was lost")  # fmt: skip
    if not link._attach(context):
        context.abort(grpc.StatusCode.ALREADY_EXISTS,
                      f"worker {first.worker_id} has a task stream already")  # fmt: skip
    context.add_callback(lambda: link._outbox.put(_END))  # the call ended: stop sending
    link.reader = threading.Thread(target=link._read, args=(requests, on_results, on_end),
                                   name=f"clamor-stream-{first.worker_id}", daemon=True)  # fmt: skip
    link.reader.start()
    return link.messages()


def add_session_handler(handler: Callable[[Iterator[bytes], grpc.ServicerContext], Any],
                        server: grpc.Server) -> None:  # fmt: skip
    """Serve ``Scheduler.Session`` with ``handler``, which gets the requests as raw bytes
    (it decodes them itself). Register it before ``add_SchedulerServicer_to_server``:
    the first handler that knows a method serves it."""
    method = grpc.stream_stream_rpc_method_handler(
        handler, response_serializer=pb.DriverMessage.SerializeToString
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Session": method}),))


# --- the worker's end ---------------------------------------------------------------


def run_worker_stream(
    scheduler: pb_grpc.SchedulerStub,
    worker_id: int,
    outgoing: Iterator[pb.WorkerMessage],
    apply: Callable[[pb.DriverMessage], None],
) -> tuple[grpc.StatusCode, str]:
    """Open this worker's task stream and serve it until it ends: each DriverMessage
    goes to ``apply`` (on this thread, in order), ``outgoing`` is sent (gRPC takes its
    messages on a thread of its own). Returns how the stream ended: ``OK`` when the
    driver closed it (the cluster closes), else the code and what happened."""

    def messages() -> Iterator[pb.WorkerMessage]:
        yield pb.WorkerMessage(worker_id=worker_id)
        yield from outgoing

    call = scheduler.Session(messages())
    try:
        for message in call:
            apply(message)
    except grpc.RpcError as exc:
        return exc.code(), f"the task stream ended: {exc.code().name}: {exc.details()}"
    except Exception as exc:  # noqa: BLE001 - a message this worker cannot apply
        call.cancel()
        return grpc.StatusCode.INTERNAL, (
            f"a task-stream message could not be applied: {type(exc).__name__}: {exc}"
        )
    return grpc.StatusCode.OK, "the driver closed the task stream"
