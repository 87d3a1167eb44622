"""One control-plane call to many workers at once, on a bounded pool of threads.

Blocking calls on a few threads rather than ``stub.Method.future(...)`` per worker: a
gRPC future starts a polling thread for its channel, and every worker has a channel of
its own, so a cluster of 512 started 512 threads for one ``Shutdown``.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc

#: The most calls in flight at once (each blocks one thread for a round trip).
FAN_OUT_THREADS = 32

T = TypeVar("T")
R = TypeVar("R")


def call_each(call: Callable[[T], R], targets: Sequence[T]) -> list[R | grpc.RpcError]:
    """``call(target)`` for every target, at most :data:`FAN_OUT_THREADS` at a time: each
    one's result, or the ``grpc.RpcError`` it raised, in the order of ``targets``. Other
    exceptions propagate."""

    def one(target: T) -> R | grpc.RpcError:
        try:
            return call(target)
        except grpc.RpcError as exc:
            return exc

    if len(targets) <= 1:
        return [one(t) for t in targets]
    threads = min(FAN_OUT_THREADS, len(targets))
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="clamor-fan-out") as pool:
        return list(pool.map(one, targets))
