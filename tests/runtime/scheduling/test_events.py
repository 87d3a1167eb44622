"""The scheduler's event loop (runtime/scheduling/events.py): events run in the order
posted, one thread at a time; a poster that runs them itself does so only when no other
thread is running events, or waits for it while gathering; nothing posted is left
behind; ``stop`` ends the loop thread; Ctrl-C never stops an event half done."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from clamor.runtime.scheduling.events import EventLoop


def test_post_runs_on_the_loop_thread_and_post_here_on_the_caller():
    ran: list[tuple[str, str]] = []
    loop = EventLoop(lambda batch: [e(None) for e in batch])
    try:
        done = threading.Event()
        loop.post(lambda s: ran.append(("posted", threading.current_thread().name)) or done.set() or [])
        assert done.wait(10)
        loop.post_here([lambda s: ran.append(("here", threading.current_thread().name)) or []])
        assert ran == [("posted", "clamor-scheduler"), ("here", threading.current_thread().name)]
    finally:
        loop.stop()
        loop.thread.join(10)
    assert not loop.thread.is_alive()


def test_while_another_thread_runs_events_post_here_leaves_them_to_it_in_order():
    ran: list[int] = []
    threads: set[str] = set()
    release = threading.Event()

    def run(batch):
        for event in batch:
            event(None)

    loop = EventLoop(run)
    try:
        loop.post(lambda s: release.wait(10) and [])  # holds the loop thread
        time.sleep(0.05)

        def first(s):
            threads.add(threading.current_thread().name)
            ran.append(1)
            return []

        loop.post_here([first])  # the loop thread is busy: it runs this one later
        assert ran == []
        poster = threading.Thread(target=lambda: loop.post_here([lambda s: ran.append(2) or []]))
        poster.start()
        poster.join(10)
        assert ran == []  # still queued behind the busy loop
        release.set()
        deadline = time.monotonic() + 10
        while len(ran) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ran == [1, 2] and threads == {"clamor-scheduler"}
    finally:
        release.set()
        loop.stop()
        loop.thread.join(10)


def test_many_posters_every_event_runs_once_and_each_posters_in_order():
    ran: list[tuple[int, int]] = []
    running = threading.Lock()  # never contended if events run one thread at a time

    def run(batch):
        assert running.acquire(blocking=False), "two threads ran events at once"
        try:
            for event in batch:
                event(None)
        finally:
            running.release()

    loop = EventLoop(run)
    try:
        def poster(p: int) -> None:
            for i in range(300):
                event = lambda s, i=i: ran.append((p, i)) or []
                loop.post_here([event]) if i % 2 else loop.post(event)

        threads = [threading.Thread(target=poster, args=(p,)) for p in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        deadline = time.monotonic() + 10
        while len(ran) < 1200 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(ran) == 1200
        for p in range(4):
            assert [i for q, i in ran if q == p] == list(range(300))
    finally:
        loop.stop()
        loop.thread.join(10)


def test_what_is_gathered_runs_as_one_batch_after_the_events_running_meanwhile():
    batches: list[tuple[str, list[str]]] = []
    release = threading.Event()

    def run(batch):
        batches.append((threading.current_thread().name, [e(None) for e in batch]))

    loop = EventLoop(run)
    here = threading.current_thread().name
    try:
        with loop.gathering():
            loop.post_here([lambda s: "a"])
            loop.post_here([lambda s: "b"])
            assert batches == []  # gathered: nothing runs yet
        assert batches == [(here, ["a", "b"])]  # on the way out, here

        loop.post(lambda s: release.wait(10) and "busy")  # holds the loop thread
        time.sleep(0.05)
        threading.Timer(0.2, release.set).start()
        with loop.gathering():
            loop.post_here([lambda s: "c"])
        # the way out waited for the busy thread, which took "c" along
        assert batches[1:] == [("clamor-scheduler", ["busy"]), ("clamor-scheduler", ["c"])]
        loop.post_here([lambda s: "d"])  # no longer gathering: runs at once
        assert batches[-1] == (here, ["d"])
    finally:
        release.set()
        loop.stop()
        loop.thread.join(10)


def test_ctrl_c_while_the_main_thread_runs_events_is_raised_after_they_ran():
    ran: list[str] = []
    loop = EventLoop(lambda batch: [e(None) for e in batch])

    def interrupted(state):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # the signal arrives while the event runs
        ran.append("first")
        return []

    try:
        with pytest.raises(KeyboardInterrupt):
            loop.post_here([interrupted, lambda s: ran.append("second") or []])
        assert ran == ["first", "second"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        loop.stop()
        loop.thread.join(10)
