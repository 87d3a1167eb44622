"""Interrupting a task's thread (runtime/worker/interrupts.py): only inside the user's
code, at most once per attempt, and never after the user's code returned."""

from __future__ import annotations

import threading
import time

import pytest
from clamor.runtime.worker.interrupts import Interrupter, TaskInterrupted


def run_in_thread(body) -> tuple[threading.Thread, list]:
    out: list = []

    def target() -> None:
        try:
            out.append(body())
        except BaseException as exc:  # noqa: BLE001 - what the test looks at
            out.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    return thread, out


def test_a_python_loop_in_user_code_is_interrupted():
    interrupter = Interrupter()
    started = threading.Event()

    def task() -> str:
        with interrupter.user_code(7):
            started.set()
            while True:
                pass

    thread, out = run_in_thread(task)
    assert started.wait(5)
    assert interrupter.interrupt({7})
    thread.join(5)
    assert not thread.is_alive() and isinstance(out[0], TaskInterrupted)


def test_an_except_exception_in_the_task_does_not_swallow_it():
    interrupter = Interrupter()
    started = threading.Event()

    def task() -> str:
        with interrupter.user_code(1):
            started.set()
            while True:
                try:
                    time.sleep(0.001)
                except Exception:  # noqa: BLE001, S112 - what a careless task does
                    continue

    thread, out = run_in_thread(task)
    assert started.wait(5)
    interrupter.interrupt({1})
    thread.join(5)
    assert isinstance(out[0], TaskInterrupted)


def test_other_attempts_and_code_outside_user_code_are_not_interrupted():
    interrupter = Interrupter()
    assert not interrupter.interrupt({1})  # nothing runs
    inside, release = threading.Event(), threading.Event()

    def task() -> str:
        with interrupter.user_code(2):
            inside.set()
            release.wait(5)
        for _ in range(200_000):  # the worker's own code after the task: never hit
            pass
        return "done"

    thread, out = run_in_thread(task)
    assert inside.wait(5)
    assert not interrupter.interrupt({1, 3})  # another attempt
    release.set()
    thread.join(5)
    assert out == ["done"]
    assert not interrupter.interrupt({2})  # over


@pytest.mark.parametrize("repeat", range(20))
def test_an_interrupt_not_delivered_before_the_user_code_returns_is_withdrawn(repeat):
    """Raised while the task is in a C call (a sleep), which returns at the end of the
    block: the worker's code after it runs undisturbed."""
    interrupter = Interrupter()
    inside = threading.Event()

    def task() -> str:
        try:
            with interrupter.user_code(5):
                inside.set()
                time.sleep(0.05)  # the exception waits for the next bytecode
        except TaskInterrupted:
            outcome = "interrupted in the block"
        else:
            outcome = "withdrawn"
        try:
            for _ in range(100_000):  # the worker's own code after the task
                pass
        except TaskInterrupted:
            return "leaked past the block"
        return outcome

    thread, out = run_in_thread(task)
    assert inside.wait(5)
    interrupter.interrupt({5})
    thread.join(5)
    assert out[0] in ("interrupted in the block", "withdrawn")
