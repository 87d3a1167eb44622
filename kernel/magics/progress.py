"""A live progress bar for long actions, reusable by the kernel::

    from clamor.kernel.magics.progress import progress
    with progress(cluster):          # nothing shows if the block ends within ~1 s
        ds.count()

A background thread reads the scheduler's snapshot (per active stage ``total``,
``pending``, ``running``, ``done``; per worker ``running``, ``tasks_done``) a few
times a second. In a notebook (an ipykernel shell) the bar is one display
updated in place (``display(..., display_id=True)``); elsewhere it is one text
line rewritten with ``\\r``. The session's ``config["progress"]`` turns it off and
``config["progress_delay"]`` is the delay. Nested uses show one bar.
"""

from __future__ import annotations

import contextlib
import contextvars
import html
import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from clamor.kernel import session
from clamor.runtime.paging.arena import format_bytes

if TYPE_CHECKING:
    from clamor.runtime.cluster import Cluster

__all__ = ["ProgressBar", "in_notebook", "progress", "watch_cells"]

logger = logging.getLogger("clamor.kernel.progress")
_active = threading.local()


def in_notebook() -> bool:
    """Whether output goes to a Jupyter front end (an ipykernel shell) rather than a terminal."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
    except ImportError:
        return "ZMQ" in type(shell).__name__
    return isinstance(shell, ZMQInteractiveShell)


def snapshot(cluster: Cluster) -> dict:
    """The scheduler's snapshot: without calling the workers when the cluster allows."""
    if hasattr(cluster, "scheduler_snapshot"):
        return cluster.scheduler_snapshot()
    return cluster.stats()["scheduler"]


class ProgressBar:
    """Tasks done / total over the stages seen since it started, and per worker."""

    WIDTH = 30

    def __init__(self, cluster: Cluster, *, notebook: bool | None = None, out: Any = None) -> None:
        self.cluster = cluster
        self.notebook = in_notebook() if notebook is None else notebook
        self.out = out
        self.started = time.monotonic()
        self.stages: dict[Any, list[int]] = {}  # id -> [done, total]
        self.active: set = set()
        self.ended: set = set()
        #: Whether stages that ended are counted as complete (not after a failure).
        self.succeeded = True
        self.workers: dict[Any, dict] = {}
        self._base: dict[Any, int] | None = None
        #: Bytes the workers read from the arena since the bar started (mapped in place,
        #: served by the driver or by peers), from the driver's own counters.
        self.paged = 0
        self._paged_base: int | None = None
        self._handle: Any = None
        self._width = 0
        self.shown = False

    # --- state ---

    def poll(self) -> None:
        snap = snapshot(self.cluster)
        stages = snap.get("stages", {})
        self.ended |= self.active - set(stages)  # finished (or failed) since the last poll
        self.active = set(stages)
        for sid, st in stages.items():
            self.stages[sid] = [int(st.get("done", 0)), int(st.get("total", 0))]
        workers = snap.get("workers", {})
        if self._base is None:
            self._base = {w: s.get("tasks_done", 0) for w, s in workers.items()}
        self.workers = {
            w: {"running": s.get("running", 0), "done": s.get("tasks_done", 0) - self._base.get(w, 0)}
            for w, s in workers.items()
        }
        paged = _paged(self.cluster)
        if self._paged_base is None:
            self._paged_base = paged
        self.paged = max(0, paged - self._paged_base)

    @property
    def done(self) -> int:
        """Tasks done: of the stages seen, or by the workers if more (a short stage can
        start and end between two polls)."""
        by_workers = sum(max(0, s["done"]) for s in self.workers.values())
        ended = self.ended if self.succeeded else set()
        by_stages = sum(t if sid in ended else d for sid, (d, t) in self.stages.items())
        return max(by_stages, by_workers)

    @property
    def total(self) -> int:
        return max(sum(t for _, t in self.stages.values()), self.done)

    # --- rendering ---

    def text(self, final: str = "") -> str:
        total, done = self.total, self.done
        filled = self.WIDTH * done // total if total else 0
        bar = "#" * filled + "." * (self.WIDTH - filled)
        stages = len(self.stages)
        workers = " ".join(
            f"w{w}:{s['done']}" + (f"+{s['running']}" if s["running"] else "")
            for w, s in sorted(self.workers.items())
        )
        elapsed = time.monotonic() - self.started
        line = f"[{bar}] {done}/{total} tasks, {stages} stage{'s' if stages != 1 else ''}"
        if done and elapsed > 0:
            rate = done / elapsed
            line += f", {rate:.3g} tasks/s"
            if not final and total > done:
                line += f", ETA {(total - done) / rate:.0f} s"
        if self.paged:
            line += f", {format_bytes(self.paged)} paged"
        line += f" | {workers}" if workers else ""
        return f"{line} | {elapsed:.1f} s{f' {final}' if final else ''}"

    def html(self, final: str = "") -> str:
        total = max(self.total, 1)
        rows = "".join(
            f"<span style='margin-right:1em'>w{w}: {s['done']} done"
            + (f", {s['running']} running" if s["running"] else "")
            + "</span>"
            for w, s in sorted(self.workers.items())
        )
        summary = html.escape(self.text(final).split("] ", 1)[1])
        return (
            f"<div><progress value='{self.done}' max='{total}' style='width:20em'></progress> "
            f"{summary}<br><small>{rows}</small></div>"
        )

    def _repr_html_(self) -> str:
        return self.html()

    def __repr__(self) -> str:
        return self.text()

    def show(self, final: str = "") -> None:
        if self.notebook:
            from IPython.display import display

            view = _View(self.text(final), self.html(final))
            if self._handle is None:
                self._handle = display(view, display_id=True)
            else:
                self._handle.update(view)
        else:
            line = self.text(final)
            out = self.out or sys.stdout
            out.write("\r" + line + " " * max(0, self._width - len(line)) + ("\n" if final else ""))
            out.flush()
            self._width = len(line)
        self.shown = True


def _paged(cluster: Cluster) -> int:
    """Bytes the workers read from the arena so far (0 without a pager's counters)."""
    try:
        stats = cluster.paging.stats()
    except Exception:  # noqa: BLE001 - a fake cluster, or one closing: no figure
        return 0
    return sum(int(stats.get(k, 0)) for k in ("bytes_mapped", "bytes_served_by_driver", "bytes_served_by_peers"))


class _View:
    """One frozen rendering (a notebook display keeps the object it was given)."""

    def __init__(self, text: str, html: str) -> None:
        self._text, self._html = text, html

    def __repr__(self) -> str:
        return self._text

    def _repr_html_(self) -> str:
        return self._html


class _Runner:
    def __init__(self, bar: ProgressBar, delay: float, interval: float, quiet: bool = False) -> None:
        self.bar, self.delay, self.interval, self.quiet = bar, delay, interval, quiet
        self.stop = threading.Event()
        context = contextvars.copy_context()  # ipykernel: output goes to this cell
        self.thread = threading.Thread(target=context.run, args=(self._run,), name="clamor-progress", daemon=True)

    def _run(self) -> None:
        if self.stop.wait(self.delay):
            return
        while not self.stop.is_set():
            try:
                self.bar.poll()
                if self.bar.stages or self.bar.done or not self.quiet:
                    self.bar.show()
            except Exception:  # e.g. the cluster was closed meanwhile
                logger.debug("progress bar update failed", exc_info=True)
            self.stop.wait(self.interval)

    def finish(self, outcome: str) -> None:
        self.bar.succeeded = outcome == "done"
        self.stop.set()
        self.thread.join(timeout=5)
        if self.bar.shown:
            with contextlib.suppress(Exception):
                self.bar.poll()
                self.bar.show(final=outcome)


@contextlib.contextmanager
def progress(
    cluster: Cluster | None = None, *, delay: float | None = None, interval: float = 0.25,
    enabled: bool | None = None, notebook: bool | None = None, out: Any = None,
    quiet: bool = False,
) -> Iterator[ProgressBar | None]:  # fmt: skip
    """Show a live progress bar while the block runs, once it has run ``delay`` seconds.

    ``cluster``: default the session's current one (no cluster: nothing to show).
    ``enabled``/``delay``: default the session's ``progress``/``progress_delay``.
    ``quiet``: nothing shows until the cluster has run a task (a cell's own work).
    Yields the :class:`ProgressBar` (``None`` when disabled or nested).
    """
    cluster = cluster if cluster is not None else session.current()
    enabled = session.config["progress"] if enabled is None else enabled
    if not enabled or cluster is None or getattr(_active, "on", False):
        yield None
        return
    bar = ProgressBar(cluster, notebook=notebook, out=out)
    delay = session.config["progress_delay"] if delay is None else delay
    runner = _Runner(bar, delay, interval, quiet)
    try:
        bar.poll()  # the baseline of the per-worker counts
    except Exception:  # a progress bar never breaks an action
        logger.debug("no progress bar: the scheduler snapshot failed", exc_info=True)
        bar = None
    if bar is None:
        yield None
        return
    _active.on = True
    outcome = "interrupted"
    try:
        runner.thread.start()
        yield bar
        outcome = "done"
    except KeyboardInterrupt:
        raise
    except BaseException:
        outcome = "failed"
        raise
    finally:
        _active.on = False
        runner.finish(outcome)


def watch_cells(shell: Any) -> None:
    """Every cell that runs the cluster's stages for longer than ``progress_delay`` (a
    ``collect()``, a ``cluster.run``, a loop of actions) shows one progress bar, as the
    magics do: IPython's ``pre_run_cell`` / ``post_run_cell`` events open and close it."""
    open_bars: list[contextlib.AbstractContextManager] = []

    def pre(info: Any) -> None:
        cluster = _watched()
        if cluster is not None:
            bar = progress(cluster, quiet=True)
            bar.__enter__()
            open_bars.append(bar)

    def post(result: Any) -> None:
        while open_bars:
            error = getattr(result, "error_in_exec", None)
            with contextlib.suppress(BaseException):
                open_bars.pop().__exit__(type(error) if error else None, error, None)

    shell.events.register("pre_run_cell", pre)
    shell.events.register("post_run_cell", post)


def _watched() -> Any:
    """The cluster a cell's bar follows: the session's, else the one cluster this
    process has open (none, or several: no bar)."""
    cluster = session.current()
    if cluster is not None:
        return cluster
    from clamor.runtime.cluster import open_clusters

    clusters = open_clusters()
    return clusters[0] if len(clusters) == 1 else None
