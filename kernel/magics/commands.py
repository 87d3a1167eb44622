"""The ``%clamor`` line subcommands: the session's cluster, faults, checkpoints, config.

A mixin of :class:`~clamor.kernel.magics.magics.ClamorMagics` (``self.shell``,
``self.cluster()``, ``self.hidden()``). Each ``cmd_<name>`` gets the parsed
arguments and prints a short report; errors are ``UsageError`` (bad input) or
shortened runtime errors, never a stack dump.
"""

from __future__ import annotations

import os
import types
from typing import Any

from clamor.kernel import session
from clamor.kernel.magics import errors, parsing
from clamor.runtime.cluster import Cluster
from clamor.runtime.data import checkpoint
from clamor.runtime.data.dataset import Dataset
from clamor.runtime.net import shipping
from clamor.runtime.paging.arena import format_bytes
from IPython.core.error import UsageError

#: Checkpoints started by ``%clamor checkpoint`` (shown by ``%clamor status``).
checkpoints: list[checkpoint.CheckpointHandle] = []


def table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


class LineCommands:
    shell: Any

    # --- helpers ---

    def _current(self) -> Cluster:
        cluster = self.cluster(start=False)  # type: ignore[attr-defined]
        if cluster is None:
            raise UsageError("no cluster is running (start one with %clamor start -n N)")
        return cluster

    def _persisted(self, cluster: Cluster) -> list[str]:
        ns = self.shell.user_ns
        return sorted(n for n, v in ns.items() if not n.startswith("_")  # not the output cache
                      and isinstance(v, Dataset) and v.is_persisted and v._runner is cluster)  # fmt: skip

    def _restart(self, workers: int | None, force: bool, verb: str) -> None:
        old = session.current()
        if old is not None and not force:
            kept = self._persisted(old)
            if kept:
                raise UsageError(
                    f"{verb} restarts the cluster and the persisted datasets {', '.join(kept)} "
                    "would be lost (their partitions live on the workers). Add --force to "
                    f"restart anyway, or save them first: %clamor checkpoint PATH {' '.join(kept)}"
                )
        with errors.short():
            cluster = session.start(workers)
        if old is not None:  # names bound to the old cluster now mean the new one
            ns = self.shell.user_ns
            for name in [n for n, v in ns.items() if v is old]:
                ns[name] = cluster
        stats = cluster.worker_stats()
        pids = ", ".join(str(w["pid"]) for w in stats)
        note = " (datasets of the previous cluster cannot be used: build them again)" if old else ""
        print(f"{len(stats)} workers (pids {pids}) at {cluster.address}{note}")

    # --- lifecycle ---

    def cmd_start(self, args: Any) -> None:
        self._restart(args.workers, args.force, "start")

    def cmd_scale(self, args: Any) -> None:
        cluster = session.current()
        if cluster is None:  # nothing to grow: start one that size
            self._restart(args.workers, False, "scale")
            return
        before = len(cluster.workers)
        with errors.short():
            workers = cluster.scale(args.workers)
        print(f"{before} -> {len(workers)} workers (ids {_ids(workers)}); the same cluster: its "
              "datasets go on (kept partitions of retired workers are recomputed when needed)")  # fmt: skip

    def cmd_stop(self, args: Any) -> None:
        if session.current() is None:
            print("no cluster is running")
            return
        session.close()
        print("cluster stopped")

    def cmd_status(self, args: Any) -> None:
        cluster = self.cluster(start=False)  # type: ignore[attr-defined]
        if cluster is None:
            print(f"no cluster is running; a magic starts the default one ({session.default_workers()} "
                  "workers), or %clamor start -n N")  # fmt: skip
            return
        stats = cluster.stats()
        workers = stats["workers"]
        alive = sum(1 for w in workers if w["alive"])
        print(f"cluster at {cluster.address}: {alive} of {len(workers)} workers alive, "
              f"{stats['stages_run']} stages, {stats['tasks_run']} tasks run "
              f"({stats.get('tasks_rerun', 0)} rerun, {stats.get('tasks_speculated', 0)} speculated, "
              f"{stats.get('tasks_recomputed', 0)} recomputed)")  # fmt: skip
        print(f"pages read {stats['pages_read']}: {stats['pages_mapped']} mapped in place (zero copy), "
              f"{stats['pages_fetched']} copied ({format_bytes(stats['bytes_served_by_driver'])} from the "
              f"driver, {format_bytes(stats['bytes_served_by_peers'])} from peers), page size "
              f"{format_bytes(stats['page_size'])}")  # fmt: skip
        rows = []
        for w in workers:
            state = "yes" if w["alive"] else "no"
            if not w["alive"] and w.get("lost"):
                state = f"no: {w['lost']}"
            rows.append([w["id"], w["pid"], w["host"], state, w.get("tasks_run", "-"),
                         w.get("pages_mapped", 0) + w.get("pages_fetched", 0), w.get("cached_pages", "-"),
                         format_bytes(w["rss_bytes"]) if "rss_bytes" in w else "-"])  # fmt: skip
        print(table(["worker", "pid", "host", "alive", "tasks", "pages", "cached", "rss"], rows))
        for handle in checkpoints:
            print(f"checkpoint {handle!r}" + (f": {handle.error}" if handle.error else ""))

    # --- faults ---

    def _worker(self, cluster: Cluster, worker: int) -> dict:
        known = {w["id"]: w for w in cluster.worker_stats()}
        if worker not in known:
            raise UsageError(f"no worker {worker}; workers: {', '.join(map(str, sorted(known))) or 'none'}")
        if not known[worker]["alive"]:
            raise UsageError(f"worker {worker} is already lost: {known[worker].get('lost', '')}")
        return known[worker]

    def cmd_kill(self, args: Any) -> None:
        cluster = self._current()
        info = self._worker(cluster, args.worker)
        try:
            cluster.kill_worker(args.worker)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        print(f"worker {args.worker} (pid {info['pid']}) killed; its tasks run elsewhere and "
              "lost partitions are recomputed from lineage when needed")  # fmt: skip

    def cmd_slow(self, args: Any) -> None:
        cluster = self._current()
        info = self._worker(cluster, args.worker)
        try:
            cluster.slow_worker(args.worker, args.factor)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.factor == 1:
            print(f"worker {args.worker} (pid {info['pid']}) runs at full speed again")
        else:
            print(f"worker {args.worker} (pid {info['pid']}) now runs {args.factor:g}x slower "
                  f"(%clamor slow {args.worker} 1 restores it)")  # fmt: skip

    # --- checkpoints ---

    def _checkpoint_all(self) -> tuple[dict, dict, list[str]]:
        """Every user variable worth saving: persisted datasets and what pickles."""
        variables, datasets, skipped = {}, {}, []
        hidden = self.hidden()  # type: ignore[attr-defined]
        for name, value in self.shell.user_ns.items():
            if name.startswith("_") or name in hidden:
                continue
            if isinstance(value, types.ModuleType | type | Cluster | checkpoint.CheckpointHandle):
                continue
            if isinstance(value, Dataset):
                (datasets.__setitem__(name, value) if value.is_persisted else skipped.append(name))
                continue
            try:
                shipping.dumps(value)
            except Exception:  # noqa: BLE001 - whatever cannot be pickled is left out
                skipped.append(name)
                continue
            variables[name] = value
        return variables, datasets, skipped

    def cmd_checkpoint(self, args: Any) -> None:
        ns = self.shell.user_ns
        skipped: list[str] = []
        if args.names:
            missing = [n for n in args.names if n not in ns]
            if missing:
                raise UsageError(f"no variable {', '.join(map(repr, missing))} to checkpoint")
            variables = {n: ns[n] for n in args.names if not isinstance(ns[n], Dataset)}
            datasets = {n: ns[n] for n in args.names if isinstance(ns[n], Dataset)}
            loose = [n for n, d in datasets.items() if not d.is_persisted]
            if loose:
                raise UsageError(f"a checkpoint saves persisted datasets: call {loose[0]}.persist() "
                                 f"first (not persisted: {', '.join(loose)})")  # fmt: skip
        else:
            variables, datasets, skipped = self._checkpoint_all()
        cluster = self.cluster(start=False)  # type: ignore[attr-defined]
        with errors.short():
            if cluster is not None:
                handle = cluster.checkpoint(args.path, variables=variables, datasets=datasets)
            else:
                handle = checkpoint.start(None, args.path, variables, datasets)
        checkpoints[:] = [h for h in checkpoints if not h.done()] + [handle]
        names = ", ".join([*variables, *datasets]) or "the arena only"
        print(f"checkpoint of {names} to {handle.path} started (arena epoch {handle.epoch}); "
              "it continues in the background (%clamor status shows when it is done)")  # fmt: skip
        if skipped:
            print(f"left out (cannot be pickled, or datasets not persisted): {', '.join(sorted(skipped))}")

    def cmd_restore(self, args: Any) -> None:
        path = os.path.expanduser(args.path)
        cluster = self.cluster(start=False)  # type: ignore[attr-defined]
        with errors.short():
            restored = checkpoint.restore(path, cluster)
        self.shell.push({**restored.variables, **restored.datasets}, interactive=True)
        what = ", ".join(restored.variables) or "no variables"
        print(f"restored from {restored.path} (arena epoch {restored.epoch}): {what}")
        if restored.datasets:
            kind = "persisted datasets" if cluster is not None else "lists of partitions (no cluster ran)"
            print(f"datasets, as {kind}: {', '.join(restored.datasets)}")

    # --- settings, inspection ---

    def cmd_config(self, args: Any) -> None:
        if not args.settings:
            rows = [[k, repr(session.config[k]), o.doc] for k, o in session.OPTIONS.items()]
            print(table(["key", "value", ""], rows))
            return
        pairs = []
        for setting in args.settings:
            key, eq, value = setting.partition("=")
            if not eq or not key:
                raise UsageError(f"expected key=value, got {setting!r}\n  {parsing.usage('config')}")
            pairs.append((key.strip(), value))
        for key, _ in pairs:  # check every key before changing any
            if key not in session.OPTIONS:
                raise parsing.unknown(key, list(session.OPTIONS), "config key")
        for key, value in pairs:
            try:
                stored = session.set_config(key, value)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            later = session.current() is not None and (key == "workers" or session.OPTIONS[key].cluster)
            print(f"{key} = {stored!r}" + (" (applies at the next %clamor start or scale)" if later else ""))

    def cmd_traceback(self, args: Any) -> None:
        print(errors.last_full_traceback or "no error to show")

    def cmd_help(self, args: Any) -> None:
        print(type(self).clamor.__doc__)


def _ids(workers: list[int]) -> str:
    """``0-3, 7`` for ``[0, 1, 2, 3, 7]``."""
    runs: list[list[int]] = []
    for w in workers:
        if runs and w == runs[-1][-1] + 1:
            runs[-1].append(w)
        else:
            runs.append([w])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
