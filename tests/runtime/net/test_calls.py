"""One call to many workers (runtime/net/calls.py): every target's answer, in order, on
a bounded number of threads; a failed call is an answer, not an exception."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from clamor.runtime.net import calls


class Refused(grpc.RpcError):
    pass


def test_each_target_gets_its_answer_in_order_and_a_refusal_is_returned():
    refused = Refused()

    def call(n: int) -> int:
        if n == 3:
            raise refused
        time.sleep(0.001 * (10 - n))  # later targets answer first
        return n * n

    assert calls.call_each(call, list(range(10))) == [0, 1, 4, refused, 16, 25, 36, 49, 64, 81]


def test_at_most_fan_out_threads_calls_are_in_flight():
    lock, now, most = threading.Lock(), [0], [0]

    def call(_: int) -> None:
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        time.sleep(0.002)
        with lock:
            now[0] -= 1

    calls.call_each(call, list(range(4 * calls.FAN_OUT_THREADS)))
    assert 1 < most[0] <= calls.FAN_OUT_THREADS


def test_an_error_that_is_not_a_call_failure_propagates():
    with pytest.raises(ZeroDivisionError):
        calls.call_each(lambda n: 1 / n, [1, 0, 2])
    assert calls.call_each(lambda n: n, []) == []
