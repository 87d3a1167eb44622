#!/usr/bin/env python3
"""The driver's page directory: time and memory per page request, 2 to 1,000 holders.

    python bench/run.py directory [--quick] [--pages P] [--requests N] [--repeat R]

A micro-benchmark of ``runtime/paging/native/driver_pager.c``'s directory, no
cluster: a real driver pager in this process, 1,000 fake peers registered through
the C API (``clamor_driver_set_peer``: redirects name them, nobody connects), and
P pages each made held by H workers (H = 2, 64, 256, 1,000) through the page
protocol itself, each holder telling the driver with HAVE under its worker id
(``page_client.py``). A page with up to 7 holders keeps their ids in its entry;
beyond, a 1,024-bit bitmap. At each H, one client (a worker id that holds
nothing) sends pipelined requests over one connection, cycling over the P pages,
in batches of 512 sent at once and then read back:

* ``redirect``: a GET the driver answers with REDIRECT to a holder (two random
  choices among the live holders, the less loaded wins): the directory's read path;
* ``page``: a GET with NO_REDIRECT: the page served (4 KiB copied and sent), the
  client recorded as a holder (present already after the first round);
* ``have``: a HAVE adding the client as a holder, then a HAVE dropping it (eviction
  notice): the directory's write path, two messages, counted as two requests.

Each row's seconds are per request (wall time of the batches / requests), one per
repetition; ``H holders ÷ 2 holders`` is the report's ratio column, so flat means 1.
The time includes the page server's socket reads and writes for each request, as a
worker's requests do; the directory's own part is what changes with H. Each row also
has the CPU time per request of the driver's thread serving the connection
(``server_cpu_seconds``, Linux's per-thread CPU clock), which the client's Python
does not blur.

Memory: the directory's bytes per page (the 16-byte entry of every arena page, and
the holder bitmaps of the hot pages, from the driver's counters ``directory_bytes``
and ``holder_bitmaps``; the page the client synchronises on is held like the hot
pages and counted with them), and what a 64-bit-per-page bitset (the old limit of
64 workers) or a 1,024-bit one would take for comparison.

Writes ``bench/results/directory.json``; prints a Markdown table. A benchmark, not a
test: it never fails on a timing.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import numpy as np
from clamor.runtime.paging import arena
from clamor.runtime.paging import page_client as pc
from clamor.runtime.paging.native import _native
from clamor.runtime.paging.pager import MAX_WORKERS, DriverPager
from harness import progress
from harness.results import row, save

import clamor

PAGE = 4096
TOKEN = b"directory-benchmark"
HOLDERS = (2, 64, 256, 1000)
PEERS = max(HOLDERS)
ASKER = MAX_WORKERS - 1  # the measuring client: a worker id that holds nothing
BATCH = 512  # requests in flight at once (their replies fit the socket buffers)
REPLY = np.dtype([("magic", "<u4"), ("version", "<u2"), ("type", "<u2"), ("page", "<u8"), ("epoch", "<u4"),
                  ("aux", "<u4"), ("flags", "<u4"), ("aux2", "<u4"), ("length", "<u8")])  # fmt: skip
OPS = ("redirect", "page", "have")


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise ConnectionError("the page server closed the connection")
        got += k
    return bytes(buf)


def make_holders(pager: DriverPager, workers: range, pages: np.ndarray, version: int, sync: int) -> None:
    """Each of ``workers`` tells the driver it holds every page (HAVE, as from shared
    memory), then waits for a reply to a GET so that all of them were handled."""
    haves = b"".join(pc.pack(pc.HAVE, int(p), version, 0, 0) for p in pages)
    for w in workers:
        with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=w) as c:
            c.send_raw(haves)
            (reply,) = c.get(sync, version, flags=pc.NO_REDIRECT)
            assert reply.type == pc.PAGE


def batches(sock: socket.socket, requests: list[bytes], reply_bytes: int, expect: int | None) -> float:
    """Send the requests ``BATCH`` at a time, read each batch's replies; the seconds taken."""
    t0 = time.perf_counter()
    for i in range(0, len(requests), BATCH):
        chunk = requests[i : i + BATCH]
        sock.sendall(b"".join(chunk))
        if expect is None:
            continue
        data = recv_exact(sock, reply_bytes * len(chunk))
        if reply_bytes == REPLY.itemsize:
            types = np.frombuffer(data, REPLY)["type"]
        else:
            types = np.frombuffer(data, np.uint8).reshape(len(chunk), reply_bytes)[:, :REPLY.itemsize]
            types = np.frombuffer(types.tobytes(), REPLY)["type"]
        assert (types == expect).all(), f"unexpected replies: {np.unique(types)}"
    return time.perf_counter() - t0


def thread_cpu(tid: int | None) -> float:
    """CPU seconds of this process's thread ``tid`` (Linux's per-thread CPU clock); 0 without."""
    return time.clock_gettime((~tid << 3) | 6) if tid is not None else 0.0


def measure_ops(pager: DriverPager, pages: np.ndarray, version: int, epoch: int, sync: int,
                n: int, repeat: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:  # fmt: skip
    """Seconds per request of each operation, one per repetition: wall time at the client,
    and CPU time of the driver's thread serving the connection."""
    cycle = np.resize(pages, n)
    redirect = [pc.pack(pc.GET, int(p), epoch, 1, 0) for p in cycle]
    page = [pc.pack(pc.GET, int(p), epoch, 1, pc.NO_REDIRECT) for p in cycle]
    have = [pc.pack(pc.HAVE, int(p), version, 0, f) for p in cycle[: n // 2] for f in (0, 1)]
    out: dict[str, list[float]] = {op: [] for op in OPS}
    cpu: dict[str, list[float]] = {op: [] for op in OPS}
    threads = set(os.listdir("/proc/self/task"))
    with pc.PageClient("127.0.0.1", pager.port, TOKEN, client_id=ASKER) as c:
        new = set(os.listdir("/proc/self/task")) - threads  # the page server's thread for c
        server = int(new.pop()) if len(new) == 1 else None
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        for _ in range(repeat):
            # redirects first: the asker holds nothing yet (a later `page` round makes it a
            # holder, which it then skips as a target, as a worker's own pages are)
            c0 = thread_cpu(server)
            out["redirect"].append(batches(c.sock, redirect, REPLY.itemsize, pc.REDIRECT) / n)
            c1 = thread_cpu(server)
            out["page"].append(batches(c.sock, page, REPLY.itemsize + PAGE, pc.PAGE) / n)
            c2 = thread_cpu(server)
            t = batches(c.sock, have, 0, None)
            t0 = time.perf_counter()
            (reply,) = c.get(sync, version, flags=pc.NO_REDIRECT)  # every HAVE handled by now
            out["have"].append((t + time.perf_counter() - t0) / len(have))
            c3 = thread_cpu(server)
            if server is not None:
                cpu["redirect"].append((c1 - c0) / n)
                cpu["page"].append((c2 - c1) / n)
                cpu["have"].append((c3 - c2) / (len(have) + 1))
            for p in pages:  # the asker holds nothing again
                c.send_raw(pc.pack(pc.HAVE, int(p), version, 0, 1))
            c.get(sync, version, flags=pc.NO_REDIRECT)
    return out, cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer pages and requests")
    ap.add_argument("--pages", type=int, default=None, help="hot pages (256; quick 64)")
    ap.add_argument("--requests", type=int, default=None, help="requests per repetition (50,000; quick 10,000)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions (5; quick 3)")
    args = ap.parse_args()
    p = {"pages": args.pages or (64 if args.quick else 256),
         "requests": args.requests or (10_000 if args.quick else 50_000),
         "repeat": args.repeat or (3 if args.quick else 5), "page_size": PAGE, "batch": BATCH,
         "holders": list(HOLDERS), "peers_registered": PEERS}  # fmt: skip

    lib = _native.lib
    pager = DriverPager(page_size=PAGE, token=TOKEN, transport="tcp", replication=True)
    rows, memory = [], []
    try:
        for w in range(PEERS):
            assert lib.clamor_driver_set_peer(w, b"127.0.0.1", 20000 + w) == 0
        data = clamor.array((p["pages"] + 1) * PAGE // 8, np.float64)
        data[:] = 1.0
        first = arena.arena_offset(data) // PAGE
        pages, sync = np.arange(first, first + p["pages"]), first + p["pages"]
        epoch, _ = pager.begin_stage()
        pager.end_stage()
        version = int(pager.page_stats(first, 1)["version"][0])
        d0 = pager.stats()["driver"]
        num_pages = d0["num_pages"]
        have = 0
        for h in HOLDERS:
            t0 = time.perf_counter()
            make_holders(pager, range(have, h), pages, version, sync)
            have = h
            counts = pager.page_holders(first, p["pages"])[0]
            assert (counts == h).all(), (h, np.unique(counts))
            d = pager.stats()["driver"]
            progress(f"{h} holders on each of {p['pages']} pages ({time.perf_counter() - t0:.1f} s to register)")
            per, cpu = measure_ops(pager, pages, version, epoch, sync, p["requests"], p["repeat"])
            bitmaps = d["holder_bitmaps"] - d0["holder_bitmaps"]
            mem = {
                "holders": h,
                "entry_bytes_per_page": 16,
                # the sync page has as many holders as the hot pages: P + 1 pages held by h
                "bitmap_bytes_per_hot_page": 128 * bitmaps / (p["pages"] + 1),
                "directory_bytes": d["directory_bytes"],
                "directory_bytes_per_arena_page": d["directory_bytes"] / num_pages,
                "bitset64_bytes_per_page": 8,
                "bitset1024_bytes_per_page": MAX_WORKERS // 8,
            }
            memory.append(mem)
            for op in OPS:
                server_us = round(statistics.median(cpu[op]) * 1e6, 3) if cpu[op] else None
                rows.append(row(f"{h} holders", op, per[op], median_us=round(statistics.median(per[op]) * 1e6, 3),
                                server_cpu_seconds=cpu[op], server_cpu_median_us=server_us, **mem))  # fmt: skip
                progress(f"  {op}: {statistics.median(per[op]) * 1e6:.2f} µs per request, "
                         f"server thread CPU {server_us} µs")
    finally:
        pager.close()

    result = {"workload": "directory", "quick": args.quick, "baseline": "2 holders", "page_size": PAGE,
              "title": f"The driver's page directory: time per request with 2 to {PEERS:,} holders "
                       f"of each of {p['pages']} pages",
              "params": {**p, "command": " ".join(["python bench/run.py directory", *sys.argv[1:]])},
              "rows": rows, "memory": memory}  # fmt: skip
    path = save(result)
    print("Per request, µs: wall time at the client (the driver's thread's CPU time)\n")
    print("| holders | redirect | page | have | directory bytes per held page |")
    print("|---:|---:|---:|---:|---:|")
    for mem in memory:
        h = mem["holders"]
        cell = {r["case"]: f"{r['median_us']:.2f} ({r['server_cpu_median_us']})" for r in rows if r["holders"] == h}
        print(f"| {h} | {cell['redirect']} | {cell['page']} | {cell['have']} | "
              f"{16 + mem['bitmap_bytes_per_hot_page']:.0f} |")
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
