"""Fusing tiny tasks: a stage of many tasks, each too short to be worth an attempt of
its own, runs them in chunks of consecutive indices, one attempt per chunk.

An attempt costs the driver tens of microseconds (the scheduler's bookkeeping, a
launch and a report on the wire, telemetry), which a task of a few microseconds cannot
hide: thousands of them on many workers queue behind the driver. A fused attempt (``Assignment.count``)
runs its tasks in turn on one worker, with one read set, and reports their values as
one list; the executor hands the caller one value per task as before.

When: the stage's tasks are plain (no input partitions, no output key, not pinned, no
declared reads, one ``reply`` setting; no lineage, recompute or replay stage), and the
last stage of the same program (its code object) had a median task time under
``tiny``. So a program's first stage always runs a task per attempt and measures it,
and a program that turns slow is unfused from its next stage on. Chunks leave each worker
at least ``chunks_per_worker`` of them (balance, stragglers), and hold at most
``max_chunk`` tasks. The views then show a fused stage's chunks as its tasks.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from clamor.runtime.scheduling.scheduler_policy import median
from clamor.runtime.stage import StageSpec

#: How many programs' task times are remembered.
PROGRAMS = 256


def program_key(stage: StageSpec) -> Any:
    """What identifies the stage's program across stages (its code object), or ``None``
    if its tasks cannot be fused (see the module docstring)."""
    code = getattr(stage.program, "__code__", None)
    if code is None or stage.epoch is not None or stage.recompute or stage.keeps_lineage:
        return None
    reply = stage.tasks[0].reply if stage.tasks else True
    for t in stage.tasks:  # a loop, not any(...): a tenth of a tiny task's time
        if t.inputs or t.output is not None or t.worker is not None or t.reads or t.reply != reply:
            return None
    return code


@dataclasses.dataclass
class FusionPolicy:
    """How many tasks each attempt of a stage runs (:meth:`chunk`), from what the
    program's last stage took (:meth:`learn`)."""

    enabled: bool = True
    tiny: float = 200e-6
    chunks_per_worker: int = 8
    max_chunk: int = 64
    _medians: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict, repr=False)

    def chunk(self, key: Any, tasks: int, workers: Callable[[], int]) -> int:
        """Tasks per attempt for a stage of ``tasks`` tasks of program ``key`` on
        ``workers()`` workers (asked only if it matters; 1: not fused)."""
        if not self.enabled or key is None or tasks < 2 * self.chunks_per_worker:
            return 1
        last = self._medians.get(key)
        if last is None or last > self.tiny:
            return 1
        return max(1, min(self.max_chunk, tasks // (max(1, workers()) * self.chunks_per_worker)))

    def learn(self, key: Any, durations: Sequence[float], counts: Sequence[int]) -> None:
        """Program ``key``'s stage ran: its attempts' ``durations`` (seconds), of
        ``counts`` tasks each."""
        if key is None or not durations:
            return
        self._medians[key] = median(sorted(d / c for d, c in zip(durations, counts)))
        self._medians.move_to_end(key)
        while len(self._medians) > PROGRAMS:
            self._medians.popitem(last=False)


def chunks(tasks: int, size: int) -> list[tuple[int, int]]:
    """``(first index, count)`` of each chunk of ``size`` consecutive tasks."""
    return [(first, min(size, tasks - first)) for first in range(0, tasks, size)]
