"""The scheduler state machine (runtime/scheduling/scheduler.py), events in and instructions out.

Random runs against a fake cluster: the invariants hold, runs are deterministic. No
process is started: each test feeds events to a ``SchedulerState`` and reads the
instructions it returns, as the driver loop would.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from clamor.runtime.errors import (
    MissingPartitionError,
    TaskCrashedError,
    WorkerLostError,
)
from clamor.runtime.scheduling.scheduler import (
    Attempt,
    Cancel,
    Drop,
    Instruction,
    Launch,
    PartitionsLost,
    SchedulerState,
    StageDone,
    StageFailed,
    TaskResult,
)
from clamor.runtime.stage import DRIVER, TaskSpec
from scheduler_events import (
    of,
    outputs_of,
)

# --- randomized --------------------------------------------------------------


class FakeCluster:
    """Fake workers and an oracle for the randomized test: each worker runs its queue in
    order; every instruction is checked against the rules as it is carried out. Some
    cancelled attempts had started before their Cancel arrived: *zombies*, which may
    still report."""

    def __init__(self, state: SchedulerState, rng: random.Random) -> None:
        self.state = state
        self.rng = rng
        self.queues: dict[int, deque[Attempt]] = {}
        self.specs: dict[int, list[TaskSpec]] = {}
        self.done: dict[int, set[int]] = {}  # stage -> finished indices
        self.attempts: dict[tuple[int, int], set[int]] = {}  # (stage, index) -> attempt ids
        self.launches: dict[tuple[int, int], int] = {}  # (stage, index) -> not speculative
        self.losses: dict[tuple[int, int], int] = {}
        self.isolated: set[int] = set()  # attempts of suspects (tasks with losses): run alone
        self.replaced: dict[tuple[int, int], int] = {}  # taken back from slow workers
        self.requeued: set[tuple[int, int]] = set()  # taken back, not launched again yet
        self.taken: dict[int, tuple[int, Attempt]] = {}  # taken back, unreported: id -> (worker, it)
        self.reruns = 0  # launches again after a loss
        self.winners: dict[tuple[int, int], int] = {}  # the attempt whose result counts
        self.zombies: list[tuple[int, Attempt, bool]] = []  # (worker, attempt, taken back)
        self.late_accepted = 0
        self.clock = 0.0
        self.started: dict[int, float] = {}  # worker -> when its head started
        self.trace: list[str] = []  # every instruction, in order
        self.speculated: set[tuple[int, int]] = set()
        self.ended: dict[int, StageDone | StageFailed] = {}
        self.held: set = set()  # outputs of finished stages, until their worker is lost
        self.lost_keys: set = set()
        self.lost_attempts = 0

    def running(self, stage: int, index: int) -> list[tuple[int, Attempt]]:
        queues = self.queues.items()
        return [(w, a) for w, q in queues for a in q if (a.stage, a.index) == (stage, index)]

    def pending(self, stage: int) -> set[int]:
        running = {a.index for q in self.queues.values() for a in q if a.stage == stage}
        return set(range(len(self.specs[stage]))) - self.done[stage] - running

    def apply(self, out: list[Instruction], tick: bool = False) -> None:
        state = self.state
        slow = set(state.slow)
        self.trace += map(repr, out)
        for ins in out:
            if isinstance(ins, Launch):
                assert ins.worker in self.queues, "launch to a lost worker"
                assert 0 < len(state.running(ins.worker)) <= state.limit
                assert ins.worker not in slow or len(state.running(ins.worker)) == 1
                for a in ins.attempts:
                    key = (a.stage, a.index)
                    assert a.stage not in self.ended and a.index not in self.done[a.stage]
                    assert a.spec.worker in (None, ins.worker)
                    assert all(state.holder(k) == h for k, h in a.locations.items())
                    others = self.running(*key)
                    if a.speculative:
                        assert len(ins.attempts) == 1 and not self.queues[ins.worker], "idle"
                        assert len(others) == 1 and others[0][0] != ins.worker
                        assert a.spec.worker is None and key not in self.speculated
                        self.speculated.add(key)
                    else:
                        assert not others, "a second attempt that is no speculative copy"
                        if key in self.requeued:
                            self.requeued.discard(key)
                        elif key in self.launches:
                            self.reruns += 1
                        self.launches[key] = self.launches.get(key, 0) + 1
                        again = self.losses.get(key, 0) + self.replaced.get(key, 0)
                        assert self.launches[key] <= 1 + again
                        if self.losses.get(key) and a.spec.worker is None:  # a suspect
                            assert len(ins.attempts) == 1 and not self.queues[ins.worker], "alone"
                            self.isolated.add(a.id)
                    self.attempts.setdefault(key, set()).add(a.id)
                if not self.queues[ins.worker]:
                    self.started[ins.worker] = self.clock
                self.queues[ins.worker].extend(ins.attempts)
            elif isinstance(ins, Cancel):
                assert ins.worker in self.queues, "cancel sent to a lost worker"
                ids = set(ins.attempts)
                queue = self.queues[ins.worker]
                cancelled = [a for a in queue if a.id in ids]
                assert len(cancelled) == len(ids), "cancel of an attempt not running there"
                self.queues[ins.worker] = deque(a for a in queue if a.id not in ids)
                if queue[0].id in ids:
                    self.started[ins.worker] = self.clock  # the next one starts
                for a in cancelled:
                    key = (a.stage, a.index)
                    taken_back = (
                        a.stage not in self.ended and a.index not in self.done[a.stage]
                    )  # nothing decided for that task: it is placed again
                    if taken_back:
                        assert tick and a.id != queue[0].id and a.spec.worker is None
                        assert ins.worker in slow, "taken back from a worker not marked slow"
                        if not self.running(*key):
                            self.replaced[key] = self.replaced.get(key, 0) + 1
                            self.requeued.add(key)
                        self.taken[a.id] = (ins.worker, a)
                    if self.rng.random() < 0.5:
                        self.zombies.append((ins.worker, a, taken_back))
            elif isinstance(ins, StageDone | StageFailed):
                assert ins.stage in self.specs and ins.stage not in self.ended, "ended twice"
                self.ended[ins.stage] = ins
                self.taken = {i: (w, a) for i, (w, a) in self.taken.items() if a.stage != ins.stage}
                if isinstance(ins, StageDone):
                    n = len(self.specs[ins.stage])
                    assert [r.index for r in ins.results] == list(range(n)), "once per index"
                    assert [r.value for r in ins.results] == [(ins.stage, i) for i in range(n)]
                    assert all(r.attempt in self.attempts[ins.stage, r.index] for r in ins.results)
                    winners = [self.winners[ins.stage, i] for i in range(n)]
                    assert [r.attempt for r in ins.results] == winners, "the first result wins"
                    outputs = (k for r in ins.results for k in r.outputs)
                    self.held.update(k for k in outputs if k not in self.lost_keys)
            elif isinstance(ins, PartitionsLost):
                self.lost_keys.update(ins.keys)
                self.held.difference_update(ins.keys)
            elif isinstance(ins, Drop):
                assert ins.worker == DRIVER or ins.worker in self.queues
        self.check()

    def check(self) -> None:
        state = self.state
        assert all(state.holder(k) in self.queues for k in self.held)
        for worker, queue in self.queues.items():  # the fake workers and the state agree
            assert tuple(sorted(a.id for a in queue)) == state.running(worker)
        for key in {(a.stage, a.index) for q in self.queues.values() for a in q}:
            workers = [w for w, _ in self.running(*key)]
            assert len(workers) == len(set(workers)) <= 2, "copies on distinct workers"
        snapshot = state.snapshot()
        copies = {a.id for q in self.queues.values() for a in q if a.speculative}
        assert set(snapshot["speculative"]) == copies
        assert snapshot["tasks_rerun"] == self.reruns
        assert snapshot["tasks_speculated"] == len(self.speculated)
        assert snapshot["tasks_lost"] == self.lost_attempts
        assert snapshot["tasks_replaced"] == sum(self.replaced.values())
        slow = [w for w, s in snapshot["workers"].items() if s["slow"]]
        assert slow == state.slow and (not slow or len(slow) < len(state.workers))
        caps = {w: 1 if w in slow else state.limit for w in state.workers}
        isolated = {w for w, q in self.queues.items() if any(a.id in self.isolated for a in q)}
        assert all(len(self.queues[w]) == 1 for w in isolated), "nothing behind a suspect"
        room = any(len(state.running(w)) < caps[w] for w in state.workers if w not in isolated)
        idle = any(not self.queues[w] for w in state.workers)
        for stage, counts in snapshot["stages"].items():
            pending = self.pending(stage)
            assert counts["pending"] == len(pending) and counts["done"] == len(self.done[stage])
            unpinned = [i for i in pending if self.specs[stage][i].worker is None]
            if room:  # no worker sits idle while unpinned work is pending (but suspects)
                assert all(self.losses.get((stage, i)) for i in unpinned)
            if idle:  # a suspect waits only for an idle worker
                assert not unpinned

    def submit(self, stage: int, specs: list[TaskSpec], now: float | None) -> None:
        self.specs[stage] = specs
        self.done[stage] = set()
        self.apply(self.state.stage_submitted(stage, specs, now=now))

    def add(self, worker: int, now: float | None) -> None:
        self.queues[worker] = deque()
        self.apply(self.state.worker_added(worker, now=now))

    def lose(self, gone: int, now: float | None) -> None:
        """Lose a worker; check which stages failed (and why) against the rules."""
        active = list(self.state.snapshot()["stages"])
        before = {stage: self.pending(stage) for stage in active}
        lost = list(self.queues.pop(gone))
        self.zombies = [z for z in self.zombies if z[0] != gone]
        self.lost_attempts += len(lost)
        taken = [a for w, a in self.taken.values() if w == gone]  # it may have run them
        self.taken = {i: (w, a) for i, (w, a) in self.taken.items() if w != gone}
        for key in {(a.stage, a.index) for a in lost + taken}:  # once a loss
            self.losses[key] = self.losses.get(key, 0) + 1
        elsewhere = {(a.stage, a.index) for q in self.queues.values() for a in q}
        error = WorkerLostError(gone, "random")
        out = self.state.worker_lost(gone, error, now=now)
        self.apply(out)
        failed = {i.stage: i.error for i in of(out, StageFailed)}
        for stage in active:
            hit = {a.index for a in lost if a.stage == stage}
            again = {i for i in hit if (stage, i) not in elsewhere}
            charged = again | {a.index for a in taken if a.stage == stage and (stage, a.index) not in elsewhere}
            specs = self.specs[stage]
            inputs = {k for i in before[stage] | again for k in specs[i].inputs}
            if any(self.losses[stage, i] >= self.state.max_attempts for i in charged):
                assert isinstance(failed[stage], TaskCrashedError), failed[stage]
            elif not self.queues or any(specs[i].worker == gone for i in hit | before[stage]):
                assert failed[stage] is error
            elif any(self.state.holder(k) is None for k in inputs):
                assert isinstance(failed[stage], MissingPartitionError)
            else:
                assert stage not in failed

    def run_head(self, worker: int, rng: random.Random, now: float | None) -> None:
        """``worker`` ends the attempt it runs: a result, or (rarely) an error."""
        attempt = self.queues[worker].popleft()
        duration, self.started[worker] = self.clock - self.started[worker], self.clock
        key = (attempt.stage, attempt.index)
        assert attempt.index not in self.done[attempt.stage]
        copy_runs = bool(self.running(*key))
        gone = [k for k in attempt.spec.inputs if self.state.holder(k) is None]
        if rng.random() < (0.5 if gone else 0.2 if copy_runs else 0.005):  # gone: no fetch
            out = self.state.task_failed(worker, attempt.id, ValueError(attempt.index), now=now)
            self.apply(out)
            failed = [i.error for i in of(out, StageFailed) if i.stage == attempt.stage]
            if copy_runs:
                assert not failed, "a task error while another attempt runs"
            else:
                (error,) = failed
                assert type(error) is (MissingPartitionError if gone else ValueError)
        else:
            self.done[attempt.stage].add(attempt.index)
            self.winners[key] = attempt.id
            value = (attempt.stage, attempt.index)
            result = TaskResult(
                attempt.index, worker, attempt.id, value, outputs_of(attempt),
                duration=duration,
            )  # fmt: skip
            self.apply(self.state.task_finished(worker, result, now=now))

    def run_zombie(self, rng: random.Random, now: float | None) -> None:
        """A cancelled attempt that had started reports: its result counts only if it was
        taken back from a slow worker and is the first of its index."""
        pick = -1 if rng.random() < 0.5 else rng.randrange(len(self.zombies))  # latest, or any
        worker, attempt, taken_back = self.zombies.pop(pick)
        key = (attempt.stage, attempt.index)
        self.taken.pop(attempt.id, None)  # it reported: no longer charged if its worker is lost
        if rng.random() < 0.2:
            assert self.state.task_failed(worker, attempt.id, ValueError(), now=now) == []
            return
        first = attempt.stage not in self.ended and attempt.index not in self.done[attempt.stage]
        value = (attempt.stage, attempt.index)
        result = TaskResult(attempt.index, worker, attempt.id, value, outputs_of(attempt))
        if taken_back and first:
            self.done[attempt.stage].add(attempt.index)
            self.winners[key] = attempt.id
            self.requeued.discard(key)
            self.late_accepted += 1
        out = self.state.task_finished(worker, result, now=now)
        if not (taken_back and first):
            assert all(isinstance(i, Drop) for i in out), "a late result that does not count"
        self.apply(out)


def random_run(seed: int) -> FakeCluster:
    """Random stages, results, failures, cancels, worker losses (their tasks rerun) and
    ticks (stragglers get copies), on a clock, through a fake loop."""
    rng = random.Random(seed)
    state = SchedulerState(
        window=rng.choice([1, 2, 3, 32]),
        max_attempts=rng.choice([1, 2, 4, 4]),
        speculation=rng.random() < 0.8,
        speculation_factor=rng.choice([1.0, 2.0]),
        speculation_min=rng.choice([0.0, 0.05]),
    )
    fake = FakeCluster(state, rng)
    clock = 0.0
    next_worker, next_stage = 0, 0
    for _ in range(rng.randint(1, 5)):
        fake.add(next_worker, clock)
        next_worker += 1
    for _step in range(5000):
        clock += rng.expovariate(50)
        fake.clock = clock
        now = None if rng.random() < 0.05 else clock
        live = state.workers
        roll = rng.random()
        if next_stage < 8 and roll < 0.06:
            keys = sorted(fake.held)  # inputs from earlier stages' outputs
            specs = []
            for i in range(rng.choice([0, 1, 3, 10, 40])):
                reads = rng.choice([0, 0, 1, 2])
                inputs = tuple(rng.sample(keys, min(len(keys), reads)))
                pin = rng.choice(live) if live and rng.random() < 0.03 else None
                specs.append(TaskSpec(i, inputs=inputs, output=(next_stage, i), worker=pin))
            fake.submit(next_stage, specs, now)
            next_stage += 1
        elif roll < 0.085 and live:
            fake.lose(rng.choice(live), now)
        elif roll < 0.11 or not live:
            fake.add(next_worker, now)
            next_worker += 1
        elif roll < 0.115 and state.snapshot()["stages"]:
            victim = rng.choice(list(state.snapshot()["stages"]))
            fake.apply(state.stage_cancelled(victim, RuntimeError(), now=now))
        elif roll < 0.265:
            fake.apply(state.tick(clock), tick=True)
        elif roll < 0.4 and fake.zombies:
            fake.run_zombie(rng, now)
        else:
            busy = [w for w in live if fake.queues[w]]
            if busy:  # the lowest ids are slower: stragglers
                fake.run_head(rng.choice(busy + busy[-1:] * 3), rng, now)
            elif next_stage >= 8 and not state.snapshot()["stages"]:
                break
    assert next_stage == 8
    for _drain in range(100_000):  # no more losses: everything must end
        if not state.snapshot()["stages"]:
            break
        clock += 0.01
        fake.clock = clock
        fake.apply(state.tick(clock), tick=True)
        busy = [w for w in state.workers if fake.queues[w]]
        assert busy, "active stages, but nothing runs: a hang"
        fake.run_head(rng.choice(busy), rng, clock)
    assert sorted(fake.ended) == list(range(8)), "every submitted stage ends exactly once"
    assert all(not state.running(w) for w in state.workers)
    return fake


@pytest.mark.parametrize("seed", range(60))
def test_random_runs_keep_the_invariants(seed):
    random_run(seed)


def test_the_same_events_give_the_same_instructions():
    first, second = random_run(40), random_run(40)
    assert first.state.counters()["tasks_replaced"] > 0 and first.trace == second.trace


def test_the_random_runs_rerun_and_speculate():
    """The randomized test is worth something only if its runs rerun, speculate, take
    attempts back from slow workers and accept late results of some of those."""
    fakes = [random_run(seed) for seed in range(60)]
    runs = [fake.state.counters() for fake in fakes]
    for counter in ("tasks_rerun", "tasks_speculated", "tasks_lost", "tasks_replaced"):
        assert sum(c[counter] > 0 for c in runs) >= len(runs) // 6, (counter, runs)
    late = [fake.late_accepted for fake in fakes]  # results of attempts taken back that count
    assert sum(n > 0 for n in late) >= len(late) // 6, late
