#!/usr/bin/env python3
"""Page-fault service time on a worker, against the physical limits of this machine.

    python bench/run.py paging [--quick] [--wait-idle SECONDS]

For each page size it measures, on real worker processes (docs/paging.md):

* the time a worker spends per demand-paged fault, for three fetch paths:
  ``shm`` (the worker copies the page out of the driver's memfd), ``tcp`` (the
  driver's page server over loopback) and ``peer`` (the driver redirects the
  request to another worker that holds the page, which serves it);
* the physical limits in the same process tree: one page ``memcpy``
  (``np.copyto`` between two preallocated buffers), one page request/response
  over a raw loopback TCP socket between two processes, and the bulk TCP rate;
* for context: a *soft* fault (a cached page touched again in a new task: the
  userfaultfd round trip and re-mapping, no fetch) and one page copied into
  never-touched memfd pages (what filling a worker's page cache costs the kernel).

and reports the ratios the project's goals are stated in: shm fault ÷ (memcpy +
10 µs) ≤ 3 and tcp fault ÷ raw socket round trip ≤ 2 (plus peer ÷ raw, which
has no goal: a redirected fault is two round trips by design).

Method for the faults: read-ahead off (one request per fault), a fresh cluster
and a fresh arena array per measurement, the array filled on the driver first
(``clamor.configure`` makes large blocks 4 MiB-aligned, so an array of n pages
spans exactly n pages at every page size), one element per page touched
in a random order inside the task, timed with ``time.perf_counter``; the same
loop is run a second time in the same task over the now-mapped pages and its
time subtracted, which removes the Python loop's own cost. The workers' paging
counters are checked to show that exactly one fetch per page went through the
expected path.

Writes ``bench/results/paging.md`` and ``bench/results/paging.json`` and prints
the Markdown. A benchmark, not a test: it never fails on a timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import mmap
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from clamor.runtime.paging import arena
from harness import BUSY_CORES, busy_seconds, wait_until_idle
from harness.machine import git_state, machine
from harness.results import RESULTS
from report.paging import fmt_size, render

import clamor

KiB, MiB = 1 << 10, 1 << 20
FULL_PAGE_SIZES = [4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB]
QUICK_PAGE_SIZES = [4 * KiB, 256 * KiB, 4 * MiB]
MAX_PAGES = 2000  # pages per fault measurement ...
MAX_BYTES = 256 * MiB  # ... and at most this many bytes of them ...
MIN_PAGES = 50  # ... but never fewer pages than this
SHM_GOAL, SHM_SLACK_US, TCP_GOAL = 3.0, 10.0, 2.0
REQUEST_BYTES = 40  # the page protocol's fixed header: what a GET costs on the wire


def n_pages_for(page_size: int) -> int:
    return max(MIN_PAGES, min(MAX_PAGES, MAX_BYTES // page_size))


# --- the task that runs on a worker --------------------------------------------------


def touch_pages(a, indices):
    """Read ``a[i]`` for each i (one per page, random order), twice; time both passes.

    Shipped by value to the worker (this module is ``__main__``). The first pass
    faults every page in; the second runs over mapped pages and measures the loop.
    """
    import time as _time

    idx = list(indices)
    total = 0.0
    t0 = _time.perf_counter()
    for i in idx:
        total += a[i]
    t1 = _time.perf_counter()
    again = 0.0
    for i in idx:
        again += a[i]
    t2 = _time.perf_counter()
    return t1 - t0, t2 - t1, float(total)


COUNTERS = (
    "faults",
    "pages_fetched",
    "from_shm",
    "from_driver",
    "from_peers",
    "redirects",
    "peer_fallbacks",
    "readahead_pages",
    "soft_faults",
)


def counters(cluster, worker: int) -> dict[str, int]:
    stats = cluster.worker_stats()
    entry = next(w for w in stats if w["id"] == worker)
    return {k: int(entry.get(k, 0)) for k in COUNTERS}


def delta(after: dict, before: dict) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def fresh_array(page_size: int, n_pages: int, rng: np.random.Generator):
    """A new, filled arena array of n_pages pages and the element to read on each, shuffled."""
    per_page = page_size // 8
    x = clamor.array(n_pages * per_page, np.float64)
    off = arena.arena_offset(x)
    if off % page_size:
        raise RuntimeError(
            f"array at offset {off} is not aligned to {page_size}-byte pages"
        )
    x.fill(1.0)  # every page real on the driver
    pages = rng.permutation(n_pages)
    indices = pages * per_page + rng.integers(0, per_page, n_pages)
    x[indices] = np.arange(n_pages) + 0.5
    expected = float((np.arange(n_pages) + 0.5).sum())
    return x, indices.tolist(), expected


def timed_touch(
    cluster, worker: int, x, indices: list[int], expected: float, path: str
) -> dict:
    """Run touch_pages on `worker`, return per-page fault time and the counter check."""
    n = len(indices)
    before = counters(cluster, worker)
    first, second, total = cluster.run(touch_pages, x, indices, worker=worker)
    d = delta(counters(cluster, worker), before)
    if path == "soft":  # cached already: a minor fault, mapped again without any fetch
        want = {"faults": 0, "pages_fetched": 0, "soft_faults": n}
    else:
        want = {
            "faults": n,
            "pages_fetched": n,
            "readahead_pages": 0,
            {"shm": "from_shm", "tcp": "from_driver", "peer": "from_peers"}[path]: n,
        }
        if path == "peer":
            want["redirects"] = n
            want["from_driver"] = 0
        else:
            want["from_peers"] = 0
    problems = [f"{k}={d[k]} (expected {v})" for k, v in want.items() if d[k] != v]
    if total != expected:
        problems.append(f"read the wrong bytes: sum {total} != {expected}")
    return {
        "us_per_fault": (first - second) / n * 1e6,
        "first_pass_s": first,
        "second_pass_s": second,
        "counters": d,
        "verified": not problems,
        "problems": problems,
    }


def measure_faults(
    page_size: int, n_pages: int, reps: int, rng: np.random.Generator
) -> dict:
    """`reps` independent measurements per path, each on a fresh cluster and a fresh array.

    A fresh cluster per repetition keeps the repetitions independent: in one long-lived
    cluster the worker caches and the driver's arrays keep growing (an array cannot be
    freed and reused while its pager runs without its refill going to the version log),
    and on this kind of VM the fault times then drift upwards from one array to the next.
    """
    out: dict[str, list[dict]] = {"shm": [], "tcp": [], "peer": [], "soft": []}
    for _ in range(reps):
        with clamor.Cluster(
            workers=1, page_size=page_size, transport="shm", readahead=False
        ) as c:
            warm = warm_up(c, page_size, rng, workers=[0])
            x, idx, expected = fresh_array(page_size, n_pages, rng)
            out["shm"].append(timed_touch(c, 0, x, idx, expected, "shm"))
            # A new task: its first touch of each (cached) page is a soft fault.
            rng.shuffle(idx)
            out["soft"].append(timed_touch(c, 0, x, idx, expected, "soft"))
        del x, warm
        with clamor.Cluster(
            workers=2,
            page_size=page_size,
            transport="tcp",
            readahead=False,
            replication=True,
        ) as c:
            warm = warm_up(c, page_size, rng, workers=[0, 1])
            x, idx, expected = fresh_array(page_size, n_pages, rng)
            out["tcp"].append(timed_touch(c, 0, x, idx, expected, "tcp"))
            idx = idx[:]
            rng.shuffle(idx)  # worker 1's own random order
            out["peer"].append(timed_touch(c, 1, x, idx, expected, "peer"))
            rng.shuffle(idx)
            out["soft"].append(timed_touch(c, 0, x, idx, expected, "soft"))
        del x, warm
    return out


def warm_up(cluster, page_size: int, rng: np.random.Generator, workers: list[int]):
    """Open every connection (worker->driver, worker->peer) and warm the code paths, untimed.

    Returns the small array it used, to be freed only once the cluster is closed."""
    x, idx, _ = fresh_array(page_size, 4, rng)
    for w in workers:
        cluster.run(touch_pages, x, idx, worker=w)
    return x


# --- physical limits -----------------------------------------------------------------

SERVER = r"""
import socket, struct, sys
cap = int(sys.argv[1])
buf = memoryview(bytearray(b"\x5a" * cap))
lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0))
lst.listen(1)
print(lst.getsockname()[1], flush=True)
conn, _ = lst.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
req = bytearray(int(sys.argv[2]))
while True:
    got = conn.recv_into(req, len(req), socket.MSG_WAITALL)
    if got < len(req):
        break
    n = struct.unpack_from("<Q", req)[0]
    while n > 0:
        k = min(n, cap)
        conn.sendall(buf[:k])
        n -= k
"""


class RawServer:
    """A subprocess that answers each REQUEST_BYTES request with the number of bytes it names."""

    def __init__(self, capacity: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(capacity), str(REQUEST_BYTES)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            port = int(self.proc.stdout.readline())
            self.sock = socket.create_connection(("127.0.0.1", port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except BaseException:
            self.close()
            raise
        self.req = bytearray(REQUEST_BYTES)

    def fetch(self, buf: memoryview, n: int) -> None:
        struct.pack_into("<Q", self.req, 0, n)
        self.sock.sendall(self.req)
        done = 0
        while done < n:
            k = min(n - done, len(buf))
            got = self.sock.recv_into(buf[:k], k, socket.MSG_WAITALL)
            if got <= 0:
                raise ConnectionError("the raw socket server went away")
            done += got

    def close(self) -> None:
        sock = getattr(self, "sock", None)
        if sock is not None:
            sock.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


def batches(fn, calls: int, n_batches: int = 5) -> list[float]:
    """Mean µs per call of `fn` over `n_batches` batches of `calls` calls each."""
    out = []
    for _ in range(n_batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out


def measure_memcpy(page_size: int, quick: bool) -> dict:
    src = np.random.default_rng(0).random(page_size // 8)
    dst = np.empty_like(src)
    dst.fill(0.0)
    calls = max(50, min(20000, (512 if not quick else 128) * MiB // page_size))
    batches(lambda: np.copyto(dst, src), max(1, calls // 10), 1)  # warm
    runs = batches(lambda: np.copyto(dst, src), calls)
    return {"calls_per_batch": calls, "batches_us": runs, "us": statistics.median(runs)}


def measure_fresh_copy(page_size: int, quick: bool, how: str) -> dict:
    """Context, not a goal: one page written into never-touched pages of a new memfd
    (as a worker's page cache is), i.e. the copy plus the kernel allocating the pages.

    ``how="pwrite"``: through the file, as the worker pager fills its cache now;
    ``how="mapping"``: ``np.copyto`` through a shared mapping, which traps once per
    4 KiB (how it filled it before)."""
    src = np.random.default_rng(1).random(page_size // 8)
    region = max(8 * page_size, (16 if quick else 64) * MiB)
    count = region // page_size
    per = page_size // 8
    runs = []
    for _ in range(3):
        fd = os.memfd_create("clamor-bench-fresh", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, region)
            if how == "pwrite":
                t0 = time.perf_counter()
                for i in range(count):
                    os.pwrite(fd, src, i * page_size)
                runs.append((time.perf_counter() - t0) / count * 1e6)
            else:
                with mmap.mmap(fd, region) as m:
                    dst = np.frombuffer(m, np.float64)
                    t0 = time.perf_counter()
                    for i in range(count):
                        np.copyto(dst[i * per : (i + 1) * per], src)
                    runs.append((time.perf_counter() - t0) / count * 1e6)
                    del dst
        finally:
            os.close(fd)
    return {"region_bytes": region, "runs_us": runs, "us": statistics.median(runs)}




class LoadMeter:
    """CPU time used on the machine by processes outside this benchmark's process tree.

    System-wide busy time from /proc/stat minus this process, its reaped children (the
    workers of closed clusters) and the raw socket server while it runs.
    """

    def __init__(self) -> None:
        self.tick = os.sysconf("SC_CLK_TCK")
        self.server_pid: int | None = None

    def _server_cpu(self) -> float:
        if self.server_pid is None:
            return 0.0
        try:
            fields = (
                Path(f"/proc/{self.server_pid}/stat")
                .read_text()
                .rsplit(")", 1)[1]
                .split()
            )
            return (int(fields[11]) + int(fields[12])) / self.tick
        except (OSError, IndexError, ValueError):
            return 0.0

    def snapshot(self) -> tuple[float, float, float]:
        busy = busy_seconds()
        own = 0.0
        for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
            ru = resource.getrusage(who)
            own += ru.ru_utime + ru.ru_stime
        return time.monotonic(), busy, own + self._server_cpu()

    @staticmethod
    def others(a: tuple, b: tuple) -> dict:
        wall = b[0] - a[0]
        cpu = max(0.0, (b[1] - a[1]) - (b[2] - a[2]))
        return {
            "wall_s": wall,
            "other_cpu_s": cpu,
            "other_cores": cpu / wall if wall > 0 else 0.0,
        }


def measure_rtt(server: RawServer, page_size: int, quick: bool) -> dict:
    buf = memoryview(bytearray(page_size))
    calls = max(40, min(5000, (256 if not quick else 64) * MiB // page_size))
    batches(lambda: server.fetch(buf, page_size), max(5, calls // 10), 1)  # warm
    runs = batches(lambda: server.fetch(buf, page_size), calls)
    return {"calls_per_batch": calls, "batches_us": runs, "us": statistics.median(runs)}


def measure_bulk(server: RawServer, total: int, reps: int) -> dict:
    buf = memoryview(bytearray(64 * MiB))
    server.fetch(buf, 64 * MiB)  # warm
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        server.fetch(buf, total)
        rates.append(total / (time.perf_counter() - t0))
    return {
        "bytes": total,
        "reps": reps,
        "bytes_per_s": rates,
        "gb_per_s": statistics.median(rates) / 1e9,
    }


# --- report --------------------------------------------------------------------------


def summarize(runs: list[dict]) -> dict:
    us = [r["us_per_fault"] for r in runs]
    return {
        "us": statistics.median(us),
        "min": min(us),
        "max": max(us),
        "verified": all(r["verified"] for r in runs),
    }


def measure_page_size(ps, server, meter, rng, reps: int, quick: bool) -> dict:
    load0 = meter.snapshot()
    n = n_pages_for(ps)
    entry = {
        "n_pages": n,
        "memcpy": measure_memcpy(ps, quick),
        "fresh_copy": measure_fresh_copy(ps, quick, "pwrite"),
        "fresh_copy_mapping": measure_fresh_copy(ps, quick, "mapping"),
        "raw_rtt": measure_rtt(server, ps, quick),
        "faults": measure_faults(ps, n, reps, rng),
    }
    entry["load"] = LoadMeter.others(load0, meter.snapshot())
    return entry


def summary(entry: dict, ps: int, bulk_gb_per_s: float) -> dict:
    s = {
        path: summarize(entry["faults"][path])
        for path in ("shm", "tcp", "peer", "soft")
    }
    s["memcpy_us"] = entry["memcpy"]["us"]
    s["fresh_copy_us"] = entry["fresh_copy"]["us"]
    s["raw_rtt_us"] = entry["raw_rtt"]["us"]
    s["bulk_us"] = ps / (bulk_gb_per_s * 1e9) * 1e6
    s["shm_ratio"] = s["shm"]["us"] / (s["memcpy_us"] + SHM_SLACK_US)
    s["tcp_ratio"] = s["tcp"]["us"] / s["raw_rtt_us"]
    s["peer_ratio"] = s["peer"]["us"] / s["raw_rtt_us"]
    return s


def other_load(meter: LoadMeter) -> float:
    """Cores used by other processes over the next second."""
    a = meter.snapshot()
    time.sleep(1.0)
    return LoadMeter.others(a, meter.snapshot())["other_cores"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="3 page sizes and fewer repetitions"
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help=(
            "wait up to SECONDS for other processes to go quiet: before starting, and "
            "before measuring again a page size they were busy during (twice at most)"
        ),
    )
    args = ap.parse_args()
    page_sizes = QUICK_PAGE_SIZES if args.quick else FULL_PAGE_SIZES
    reps = 2 if args.quick else 7
    bulk_bytes, bulk_reps = (256 * MiB, 3) if args.quick else (1024 * MiB, 3)

    # Blocks of at least the largest page size start on a page boundary for every size.
    clamor.configure(page_size=max(FULL_PAGE_SIZES))
    rng = np.random.default_rng(20240601)
    started = time.perf_counter()
    result: dict = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(numpy=np.__version__, clamor=clamor.__version__),
        "git": git_state(),
        "parameters": {
            "command": "python bench/run.py paging" + (" --quick" if args.quick else ""),
            "quick": args.quick,
            "page_sizes": page_sizes,
            "reps": reps,
            "pages_per_measurement": {str(ps): n_pages_for(ps) for ps in page_sizes},
            "readahead": False,
            "replication": True,
            "request_bytes": REQUEST_BYTES,
            "min_pages": MIN_PAGES,
            "max_pages": MAX_PAGES,
            "max_bytes": MAX_BYTES,
            "bulk_bytes": bulk_bytes,
            "bulk_reps": bulk_reps,
            "shm_goal": SHM_GOAL,
            "shm_slack_us": SHM_SLACK_US,
            "tcp_goal": TCP_GOAL,
        },
        "page_sizes": {},
    }
    meter = LoadMeter()
    if args.wait_idle:
        wait_until_idle(args.wait_idle, lambda: other_load(meter))
    run_start = meter.snapshot()
    server = RawServer(max(page_sizes))
    meter.server_pid = server.proc.pid
    try:
        result["bulk"] = measure_bulk(server, bulk_bytes, bulk_reps)
        print(
            f"bulk TCP: {result['bulk']['gb_per_s']:.2f} GB/s",
            file=sys.stderr,
            flush=True,
        )
        for ps in page_sizes:
            # With --wait-idle, a page size measured while other processes were busy is
            # measured again once they are quiet (twice at most); the quietest attempt wins.
            attempts = []
            for attempt in range(3 if args.wait_idle else 1):
                if attempt:
                    print(
                        f"{fmt_size(ps):>7}: other processes were busy "
                        f"({attempts[-1]['load']['other_cores']:.2f} cores): measuring again",
                        file=sys.stderr,
                        flush=True,
                    )
                    wait_until_idle(args.wait_idle, lambda: other_load(meter))
                attempts.append(
                    measure_page_size(ps, server, meter, rng, reps, args.quick)
                )
                if attempts[-1]["load"]["other_cores"] <= BUSY_CORES:
                    break
            entry = min(attempts, key=lambda e: e["load"]["other_cores"])
            entry["attempts"] = len(attempts)
            s = entry["summary"] = summary(entry, ps, result["bulk"]["gb_per_s"])
            result["page_sizes"][str(ps)] = entry
            print(
                f"{fmt_size(ps):>7}: shm {s['shm']['us']:.1f} tcp {s['tcp']['us']:.1f} "
                f"peer {s['peer']['us']:.1f} memcpy {s['memcpy_us']:.2f} "
                f"raw {s['raw_rtt_us']:.1f} µs (other load "
                f"{entry['load']['other_cores']:.2f} cores)",
                file=sys.stderr,
                flush=True,
            )
        # Load during the measurements kept (not during waits or discarded attempts).
        kept = [e["load"] for e in result["page_sizes"].values()]
        wall = sum(x["wall_s"] for x in kept)
        other = sum(x["other_cpu_s"] for x in kept)
        result["load"] = {
            "wall_s": wall,
            "other_cpu_s": other,
            "other_cores": other / wall if wall else 0.0,
            "whole_run": LoadMeter.others(run_start, meter.snapshot()),
        }
    finally:
        server.close()
    result["elapsed_s"] = time.perf_counter() - started

    RESULTS.mkdir(parents=True, exist_ok=True)
    text = render(result)
    (RESULTS / "paging.md").write_text(text)
    (RESULTS / "paging.json").write_text(json.dumps(result, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
