"""Clamor workers inside an existing Dask distributed cluster.

``Cluster(n, launcher=DaskLauncher(client), host=ADDR)`` starts each
``clamor-worker`` as a subprocess of a Dask worker: one long-running Dask task
per Clamor worker (it secedes from the worker's thread pool, so the Dask
worker stays free for Dask work) runs ``python -m clamor.runtime.worker.process``
with the Dask worker's interpreter, waits for it, and returns its exit status.
This is how Clamor runs where Dask already provides the machines, e.g.
dask-gateway behind JupyterHub. Workers go to the Dask workers round-robin
(all of them, or those named by ``workers=``).

Secrets: the cluster's credentials reach each Dask worker through Dask's own
comm (``client.run``, relayed by the Dask scheduler, which does not keep them),
stay in that worker's memory only until every Clamor worker has registered,
and reach the Clamor worker as a 0600 file it deletes once read. Across hosts,
Dask's comm must therefore be encrypted: use ``tls://`` with Dask's
``security=`` (dask-gateway does this for you), and ``Cluster(tls=True)`` for
Clamor's own traffic.

Liveness: a Dask task may not notice that its process hangs on another host,
so the cluster relies on heartbeats (:meth:`DaskLauncher.observes` is false);
exit statuses come from the finished tasks. :meth:`DaskLauncher.kill` SIGKILLs
the process on its Dask worker (``client.run``); a Clamor worker also dies with
its Dask worker (``PR_SET_PDEATHSIG`` and its ``--parent-pid`` watchdog) and
exits by itself when the driver has been unreachable for a few seconds.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any

from clamor.runtime.credentials import Credentials
from clamor.runtime.errors import MissingExtraError
from clamor.runtime.exitcodes import EXIT_SETUP_FAILED
from clamor.runtime.launchers.base import Launcher, worker_command

logger = logging.getLogger("clamor.dask_launcher")

#: Seconds :meth:`DaskLauncher.kill` and :meth:`DaskLauncher.close` wait for a killed
#: worker's task to report.
KILL_WAIT = 10.0
#: Seconds to wait for a Dask worker to take the credentials at start-up.
STASH_WAIT = 30.0
#: How much of a worker's output its task returns (for the driver's log and errors).
TAIL_BYTES = 8192

# --- the Dask worker's side (module state lives in each Dask worker process) ---------

_lock = threading.Lock()
_credentials: dict[str, str] = {}  # launcher id -> serialized credentials (start-up only)
_running: dict[str, subprocess.Popen] = {}  # launch key -> the clamor-worker process
_killed: set[str] = set()  # launch keys killed before their process started


def _stash_credentials(launcher_id: str, text: str) -> None:
    """Keep a cluster's credentials in this Dask worker until its workers have started."""
    with _lock:
        _credentials[launcher_id] = text


def _drop_credentials(launcher_id: str) -> None:
    with _lock:
        _credentials.pop(launcher_id, None)


def _kill_launched(launch_keys: list[str]) -> dict[str, int | None]:
    """SIGKILL the clamor workers started here under ``launch_keys`` (pid, or ``None``
    if not running); keys not started yet will not start."""
    killed: dict[str, int | None] = {}
    with _lock:
        procs = {key: _running.get(key) for key in launch_keys}
        _killed.update(key for key, proc in procs.items() if proc is None)
    for key, proc in procs.items():
        killed[key] = None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()
            killed[key] = proc.pid
    return killed


def _wait_futures(futures: list[Any], timeout: float | None) -> None:
    """Wait up to ``timeout`` seconds for Dask futures to be done (finished, failed, cancelled).

    ``distributed.wait`` needs a default client; this works with any client."""
    events = []
    for future in futures:
        if not future.done():
            event = threading.Event()
            future.add_done_callback(lambda _f, event=event: event.set())
            events.append(event)
    deadline = None if timeout is None else time.monotonic() + timeout
    for event in events:
        if not event.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
            return


def _tail(path: str, offset: int) -> str:
    """The last :data:`TAIL_BYTES` written to ``path`` after ``offset``."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _run_clamor_worker(
    launcher_id: str,
    connect: str,
    launch_key: str,
    worker_id: int,
    python: str | None,
    host: str | None,
    log_dir: str | None,
) -> dict[str, Any]:
    """A Dask task: run one ``clamor-worker`` here until it exits.

    Returns ``{"code": exit status (negative: signal), "tail": its last output,
    "logged": whether it went to ``log_dir`` on this host}``.
    """
    scratch = None  # the Dask worker's own directory, removed with it
    try:
        import distributed

        scratch = distributed.get_worker().local_directory
        distributed.secede()  # do not hold one of the Dask worker's task slots
    except (ImportError, ValueError):
        pass  # not running in a Dask worker thread (called directly)
    with _lock:
        text = _credentials.get(launcher_id)
    if text is None:
        return {
            "code": EXIT_SETUP_FAILED,
            "tail": "no credentials on this Dask worker (the cluster's start-up is over)",
            "logged": False,
        }
    logged = bool(log_dir) and os.path.isdir(log_dir)  # this host shares the driver's log_dir
    if logged:
        log_path = os.path.join(log_dir, f"worker-{worker_id}.log")  # type: ignore[arg-type]
        log = open(log_path, "ab")  # noqa: SIM115
    else:
        fd, log_path = tempfile.mkstemp(
            prefix=f"clamor-worker-{worker_id}-", suffix=".log", dir=scratch
        )
        log = os.fdopen(fd, "wb")
    offset, token_file = log.tell(), None
    try:
        token_file = Credentials.parse(text).write_temp()
        command = worker_command(connect, token_file, python=python or sys.executable, host=host)
        command += ["--remove-token-file", "--launch-key", launch_key]
        command += ["--parent-pid", str(os.getpid()), "--kill-with-parent"]
        with _lock:
            if launch_key in _killed:
                _killed.discard(launch_key)
                return {"code": -int(signal.SIGKILL), "tail": "", "logged": logged}
            try:
                # This thread waits for the process, so PR_SET_PDEATHSIG (which fires when
                # the starting thread exits) only fires if the Dask worker itself dies.
                proc = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            except OSError as exc:
                return {"code": 127, "tail": f"cannot run {command[0]}: {exc}", "logged": False}
            _running[launch_key] = proc
        try:
            code = proc.wait()
        finally:
            with _lock:
                _running.pop(launch_key, None)
        log.flush()
        return {"code": code, "tail": _tail(log_path, offset), "logged": logged}
    finally:
        log.close()
        if token_file is not None:  # the worker removes it once read; not if it never did
            with contextlib.suppress(FileNotFoundError):
                os.unlink(token_file)
        if not logged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_path)


# --- the driver's side ------------------------------------------------------------------


class DaskLauncher(Launcher):
    """Clamor workers as long-running tasks of an existing Dask cluster.

    ``client``: a ``distributed.Client``, or a Dask scheduler address (then the
    launcher creates its own client and closes it with the cluster).
    ``workers``: the Dask workers to use (addresses or names; default all of them),
    Clamor worker ``i`` goes to ``workers[i % len(workers)]``. ``python``: the
    interpreter on the Dask workers (default: the one running the Dask worker).
    ``host``: the address Clamor workers serve on (default: each one's address
    facing the driver). The driver (``Cluster(host=...)``) must be reachable from the
    Dask workers.
    """

    name = "dask"

    def __init__(
        self,
        client: Any,
        *,
        workers: list[str] | None = None,
        python: str | None = None,
        host: str | None = None,
    ) -> None:
        super().__init__()
        try:
            import distributed
        except ImportError as exc:
            raise MissingExtraError.of("DaskLauncher", exc, extra="dask") from exc

        self._own_client = isinstance(client, str)
        self.client: distributed.Client = (
            distributed.Client(client, set_as_default=False) if self._own_client else client
        )
        self._requested = list(workers) if workers is not None else None
        self.python = python
        self.worker_host = host
        self._id = f"clamor-{secrets.token_hex(8)}"
        self._lock = threading.RLock()
        self._targets: list[str] = []
        self._where: dict[int, str] = {}  # worker id -> Dask worker address
        self._keys_of: dict[int, str] = {}  # worker id -> launch key
        self._futures: dict[int, Any] = {}  # worker id -> distributed.Future
        self._pids: dict[int, int] = {}
        self._results: dict[int, tuple[int | None, str]] = {}  # worker id -> (code, note)
        self._ours_cancelled: set[int] = set()
        self._stashed: set[str] = set()
        self._closed = False
        try:
            self._targets = self._resolve_targets()
        except BaseException:
            if self._own_client:
                self.client.close()
            raise

    # --- Dask workers ---

    def _resolve_targets(self) -> list[str]:
        """The Dask worker addresses to use; a clear error if there are none or unknown ones."""
        info = self.client.scheduler_info(n_workers=-1)["workers"]
        scheduler = getattr(self.client.scheduler, "address", None) or "the Dask scheduler"
        if not info:
            raise ValueError(
                f"the Dask cluster at {scheduler} has no workers: scale it up first "
                f"(e.g. cluster.scale(n); client.wait_for_workers(n))"
            )
        if self._requested is None:
            return sorted(info)
        if not self._requested:
            raise ValueError("workers=[] names no Dask worker (omit it to use all of them)")
        names = {str(w.get("name")): addr for addr, w in info.items()}
        targets, unknown = [], []
        for w in self._requested:
            addr = w if w in info else names.get(str(w))
            (targets if addr else unknown).append(addr or w)
        if unknown:
            raise ValueError(
                f"unknown Dask worker(s) {', '.join(map(str, unknown))} in the Dask cluster at "
                f"{scheduler}; its workers are: {', '.join(sorted(info))}"
            )
        return targets

    def _run_on(
        self, addresses: list[str], fn: Any, *args: Any, timeout: float = KILL_WAIT
    ) -> dict[str, Any]:
        """``client.run`` on those ``addresses`` still in the Dask cluster, for at most
        ``timeout`` seconds. Failures (a worker gone, or too slow) are returned, not raised."""
        try:
            live = self.client.scheduler_info(n_workers=-1)["workers"]
        except Exception as exc:  # noqa: BLE001  (the scheduler itself is unreachable)
            return {addr: exc for addr in addresses}
        result: dict[str, Any] = {
            addr: LookupError(f"Dask worker {addr} has left the Dask cluster")
            for addr in addresses
            if addr not in live
        }
        targets = [addr for addr in addresses if addr in live]
        if not targets:
            return result
        replies: dict[str, Any] = {}

        def call() -> None:
            try:
                replies.update(self.client.run(fn, *args, workers=targets, on_error="return"))
            except Exception as exc:  # noqa: BLE001
                replies.update({addr: exc for addr in targets})

        # client.run has no timeout of its own (a wedged worker holds it for Dask's
        # connect timeout): bound it here.
        thread = threading.Thread(target=call, name="clamor-dask-run", daemon=True)
        thread.start()
        thread.join(timeout)
        for addr in targets:
            late = TimeoutError(f"Dask worker {addr} did not answer within {timeout:g} s")
            result[addr] = replies.get(addr, late)
        return result

    def _stash(self, address: str) -> None:
        if address in self._stashed:
            return
        assert self.credentials is not None, "bind() first"
        text = self.credentials.serialize()
        error = self._run_on([address], _stash_credentials, self._id, text, timeout=STASH_WAIT)[address]
        if isinstance(error, BaseException):
            raise RuntimeError(f"cannot reach Dask worker {address}: {error!r}")  # noqa: TRY004
        self._stashed.add(address)

    # --- Launcher ---

    def start(self, worker_ids: Iterable[int]) -> None:
        """Spawn each id, on the Dask workers as they are now (checked again)."""
        with self._lock:
            self._targets = self._resolve_targets()
        for i in worker_ids:
            self.spawn(i)

    def spawn(self, worker_id: int) -> None:
        """Submit the task that runs worker ``worker_id`` on its Dask worker."""
        with self._lock:
            if self._closed:
                raise RuntimeError("launcher is closed")
            if worker_id in self._futures:
                raise ValueError(f"worker {worker_id} was already started")
            address = self._targets[worker_id % len(self._targets)]
            self._stash(address)
            key = self.new_launch_key(worker_id)
            self._where[worker_id], self._keys_of[worker_id] = address, key
            self._futures[worker_id] = self.client.submit(
                _run_clamor_worker,
                self._id,
                self.connect,
                key,
                worker_id,
                self.python,
                self.worker_host,
                self.log_dir,
                key=f"clamor-worker-{key}-{self._id}",
                workers=[address],
                allow_other_workers=False,
                pure=False,
            )

    def claim(self, launch_key: str, pid: int) -> int | None:
        worker_id = super().claim(launch_key, pid)
        if worker_id is not None:
            self._pids[worker_id] = pid
        return worker_id

    def release_token_file(self) -> None:
        """Forget the credentials on the Dask workers (workers read them only at start-up)."""
        with self._lock:
            stashed, self._stashed = sorted(self._stashed), set()
        if stashed:
            self._run_on(stashed, _drop_credentials, self._id)

    def observes(self, worker_id: int) -> bool:
        return False

    def exitcode(self, worker_id: int) -> int | None:
        """The exit status once the worker's task has finished (``None`` before)."""
        return self._result(worker_id)[0]

    def _result(self, worker_id: int) -> tuple[int | None, str]:
        """``(exit code, note for messages)`` once the task is done; ``(None, "")`` before."""
        with self._lock:
            if worker_id in self._results:
                return self._results[worker_id]
            future = self._futures.get(worker_id)
        if future is None or not future.done():
            return None, ""
        note = ""
        if future.status == "finished":
            try:
                reply = future.result(timeout=KILL_WAIT)
                code, tail = int(reply["code"]), reply.get("tail", "")
            except Exception as exc:  # noqa: BLE001  (any failure to fetch it)
                code, note, tail = EXIT_SETUP_FAILED, f"result unavailable: {exc!r}", ""
            else:
                self._save_log(worker_id, tail, logged=reply.get("logged", False), code=code)
                lines = [line for line in tail.splitlines() if line.strip()]
                if code > 0 and lines:
                    note = f"last output: {lines[-1].strip()}"
        elif future.status == "cancelled":
            if worker_id not in self._ours_cancelled:
                return None, ""  # cancelled behind our back: the process may still run
            code = -int(signal.SIGKILL)
        else:  # "error": e.g. KilledWorker (its Dask worker died, and with it the process)
            try:
                exc = future.exception(timeout=KILL_WAIT)
            except Exception as e:  # noqa: BLE001
                exc = e
            killed = type(exc).__name__ == "KilledWorker"
            code = -int(signal.SIGKILL) if killed else EXIT_SETUP_FAILED
            note = f"Dask task failed: {type(exc).__name__}: {exc}"
        with self._lock:
            self._results.setdefault(worker_id, (code, note))
            return self._results[worker_id]

    def _save_log(self, worker_id: int, tail: str, *, logged: bool, code: int) -> None:
        """Put the output of a worker that ran on another host into the driver's ``log_dir``."""
        if logged or not tail:
            return
        if self.log_dir is not None:
            with contextlib.suppress(OSError):
                path = os.path.join(self.log_dir, f"worker-{worker_id}.log")
                with open(path, "a", encoding="utf-8") as f:
                    f.write(tail)
        elif code != 0:
            logger.warning("clamor worker %d (%s) output:\n%s", worker_id, self.describe(worker_id), tail)

    def wait(self, worker_id: int, timeout: float | None = None) -> int | None:
        """Wait up to ``timeout`` seconds for the worker's task; its exit code or ``None``."""
        future = self._futures.get(worker_id)
        if future is not None:
            _wait_futures([future], timeout)
        return self.exitcode(worker_id)

    def describe(self, worker_id: int) -> str:
        """E.g. ``dask worker tcp://10.0.0.5:40123 (pid 4242)``, with the reason of a failure."""
        address = self._where.get(worker_id)
        if address is None:
            return super().describe(worker_id)
        pid = self._pids.get(worker_id)
        text = f"dask worker {address}" + (f" (pid {pid})" if pid else "")
        note = self._results.get(worker_id, (None, ""))[1]
        return f"{text}: {note}" if note else text

    def kill(self, worker_id: int, pid: int | None = None, timeout: float = KILL_WAIT) -> int | None:
        """SIGKILL the worker's process on its Dask worker; wait (``timeout``) for its exit code."""
        address, key = self._where[worker_id], self._keys_of[worker_id]
        if self.exitcode(worker_id) is None:
            result = self._run_on([address], _kill_launched, [key]).get(address)
            if isinstance(result, BaseException):
                logger.warning("cannot kill clamor worker %d on %s: %r", worker_id, address, result)
            elif pid is not None and result and result.get(key) not in (None, pid):
                logger.warning(
                    "clamor worker %d: killed pid %s on %s, but it registered as pid %d",
                    worker_id, result.get(key), address, pid,
                )
        code = self.wait(worker_id, timeout)
        if code is None and not self._futures[worker_id].done():
            self._cancel([worker_id])  # it never started (or its Dask worker is gone)
        return code

    def _cancel(self, worker_ids: list[int]) -> None:
        futures = [self._futures[i] for i in worker_ids if not self._futures[i].done()]
        with self._lock:
            self._ours_cancelled.update(worker_ids)
        if futures:
            with contextlib.suppress(Exception):
                self.client.cancel(futures, force=True)

    def close(self, timeout: float = 5.0) -> None:
        """Give workers ``timeout`` seconds to exit, SIGKILL the rest, release the Dask tasks."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            pending = [f for f in self._futures.values() if not f.done()]
            _wait_futures(pending, timeout)
            left = [i for i, f in self._futures.items() if not f.done()]
            by_address: dict[str, list[str]] = collections.defaultdict(list)
            for i in left:
                by_address[self._where[i]].append(self._keys_of[i])
            reached = set()
            for address, keys in by_address.items():
                if not isinstance(self._run_on([address], _kill_launched, keys)[address], BaseException):
                    reached.add(address)
            if left:  # those on Dask workers that are gone will not report: do not wait for them
                _wait_futures([self._futures[i] for i in left if self._where[i] in reached], KILL_WAIT)
                self._cancel(left)
            for i in list(self._futures):
                self._result(i)  # keep exit codes (and logs) past the futures' release
            self.release_token_file()
        finally:
            futures, self._futures = self._futures, {}
            for future in futures.values():
                with contextlib.suppress(Exception):
                    future.release()
            if self._own_client:
                with contextlib.suppress(Exception):
                    self.client.close()

    def __repr__(self) -> str:
        return f"<DaskLauncher {len(self._futures)} workers on {len(self._targets)} Dask workers>"
