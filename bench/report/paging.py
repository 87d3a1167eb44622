"""The report of ``bench/workloads/paging.py``: Markdown from its result
(``results/paging.json``): page-fault latency against memcpy and the raw socket."""

from __future__ import annotations

from harness import BUSY_CORES

KiB = 1024
MiB = 1024 * KiB


def fmt_size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB else f"{n // KiB} KiB"

def goal_mark(value: float, goal: float) -> str:
    return "met" if value <= goal else "**not met**"


def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def render(result: dict) -> str:
    p, m, load = result["parameters"], result["machine"], result["load"]
    shm_goal, shm_slack_us, tcp_goal = p["shm_goal"], p["shm_slack_us"], p["tcp_goal"]
    sizes = ", ".join(fmt_size(s) for s in p["page_sizes"])
    parameters = [
        f"page sizes {sizes}",
        (
            f"{p['reps']} repetitions per path and page size, each on a fresh cluster "
            "(after a 4-page warm-up) and a fresh array"
        ),
        (
            f"pages per measurement = max({p['min_pages']}, min({p['max_pages']}, "
            f"{p['max_bytes'] // MiB} MiB / page size))"
        ),
        "`readahead=False`, `replication=True`",
        'shm: `Cluster(workers=1, transport="shm")`',
        (
            'tcp and peer: `Cluster(workers=2, transport="tcp")`, worker 0 reads first (tcp), '
            "then worker 1 (peer, redirected to worker 0)"
        ),
        (
            "one element per page, random order, timed in the task, minus a second pass over "
            "the mapped pages; a fault time is the median over the repetitions (min and max "
            "shown per page size)"
        ),
        "memcpy: `np.copyto` between two preallocated page-size buffers, median of 5 batches",
        (
            f"raw socket: {p['request_bytes']}-byte request → page-size reply (`sendall` / "
            "`recv_into(MSG_WAITALL)`, TCP_NODELAY) between this process and a Python server "
            "subprocess over 127.0.0.1, median of 5 batches"
        ),
        f"bulk TCP: {p['bulk_bytes'] // MiB} MiB in one request, median of {p['bulk_reps']}",
        (
            "write into fresh pages (context only): `os.pwrite` of one page into "
            "never-touched pages of a new memfd, as a worker's page cache is filled (and, "
            "per page size, `np.copyto` through a mapping of such a memfd)"
        ),
    ]
    perturbed = (
        ": **the numbers are perturbed by them**."
        if load["other_cores"] > BUSY_CORES
        else "."
    )
    lines = [
        "# Paging benchmark: fault service time vs. physical limits",
        "",
        (
            f"Run {result['date']} on `{m['hostname']}`: nproc {m['nproc']}, {m['cpu']}, "
            f"Linux {m['kernel']}, Python {m['python']}, numpy {m['numpy']}. "
            f"Command: `{p['command']}` (total {result['elapsed_s']:.0f} s), at commit "
            f"`{result['git']['commit']}`"
            + (
                " with uncommitted changes"
                if result["git"].get("dirty", result["git"].get("runtime_dirty"))
                else ""
            )
            + "."
        ),
        "",
        "Parameters: " + "; ".join(parameters) + ".",
        "",
        (
            f"Goals: shm ÷ (memcpy + {shm_slack_us:g} µs) ≤ {shm_goal:g}; tcp ÷ raw socket "
            f"round trip ≤ {tcp_goal:g}. Peer ÷ raw has no goal: a redirected fault costs a "
            "round trip to the driver (REDIRECT) plus one to the peer."
        ),
        "",
        (
            "Context columns: *soft fault* is a cached page mapped again in a new task (the "
            "userfaultfd round trip with no fetch); *write into fresh pages* is one page "
            "written into never-touched memfd pages, i.e. what filling a worker's page cache "
            "costs before any paging logic; *bulk-rate time* is one page at the bulk TCP rate."
        ),
        "",
        f"Bulk TCP over loopback: **{result['bulk']['gb_per_s']:.2f} GB/s**.",
        "",
        (
            f"Other processes on the machine used {load['other_cpu_s']:.1f} CPU-s during the "
            f"measurements reported ({load['other_cores']:.2f} cores on average){perturbed}"
        ),
        "",
        "## Summary (µs per page, median over repetitions)",
        "",
        row(
            "page",
            "pages",
            "shm",
            "tcp",
            "peer",
            "soft fault",
            "memcpy",
            "raw socket",
            "write into fresh pages",
            "bulk-rate time",
            "shm ÷ (memcpy+10 µs)",
            "tcp ÷ raw",
            "peer ÷ raw",
        ),
        row(*["---:"] * 13),
    ]
    for ps in p["page_sizes"]:
        r = result["page_sizes"][str(ps)]
        s = r["summary"]
        lines.append(
            row(
                fmt_size(ps),
                r["n_pages"],
                f"{s['shm']['us']:.1f}",
                f"{s['tcp']['us']:.1f}",
                f"{s['peer']['us']:.1f}",
                f"{s['soft']['us']:.1f}",
                f"{s['memcpy_us']:.2f}",
                f"{s['raw_rtt_us']:.1f}",
                f"{s['fresh_copy_us']:.1f}",
                f"{s['bulk_us']:.1f}",
                f"{s['shm_ratio']:.2f} ({goal_mark(s['shm_ratio'], shm_goal)})",
                f"{s['tcp_ratio']:.2f} ({goal_mark(s['tcp_ratio'], tcp_goal)})",
                f"{s['peer_ratio']:.2f}",
            )
        )
    for ps in p["page_sizes"]:
        r = result["page_sizes"][str(ps)]
        s = r["summary"]
        lines += [
            "",
            (
                f"## {fmt_size(ps)} pages ({r['n_pages']} pages per measurement, "
                f"{r['n_pages'] * ps / MiB:.1f} MiB per array; other load "
                f"{r['load']['other_cores']:.2f} cores"
                + (" — **perturbed**" if r["load"]["other_cores"] > BUSY_CORES else "")
                + (
                    f"; measured {r['attempts']} times, the quietest kept"
                    if r.get("attempts", 1) > 1
                    else ""
                )
                + ")"
            ),
            "",
            row("measure", "µs per page (median)", "min", "max", "note"),
            row("---", "---:", "---:", "---:", "---"),
        ]
        for path, what, source in (
            ("shm", "shm fault (driver memfd)", "from_shm"),
            ("tcp", "tcp fault (driver page server)", "from_driver"),
            ("peer", "peer fault (REDIRECT, then worker 0)", "from_peers"),
            (
                "soft",
                "soft fault (page cached, re-mapped in a new task)",
                "soft_faults",
            ),
        ):
            q = s[path]
            if not q["verified"]:
                check = "**counter MISMATCH** (see below)"
            elif path == "soft":
                check = f"each run: {r['n_pages']} soft faults, no fetch"
            else:
                check = f"each run: {r['n_pages']} faults, all `{source}`"
            lines.append(
                row(what, f"{q['us']:.1f}", f"{q['min']:.1f}", f"{q['max']:.1f}", check)
            )
        mc, rt, fc, fm = (
            r["memcpy"],
            r["raw_rtt"],
            r["fresh_copy"],
            r["fresh_copy_mapping"],
        )
        lines += [
            row(
                "memcpy (`np.copyto`, warm buffers)",
                f"{mc['us']:.2f}",
                f"{min(mc['batches_us']):.2f}",
                f"{max(mc['batches_us']):.2f}",
                f"{mc['calls_per_batch']} copies per batch",
            ),
            row(
                "raw socket round trip",
                f"{rt['us']:.1f}",
                f"{min(rt['batches_us']):.1f}",
                f"{max(rt['batches_us']):.1f}",
                f"{rt['calls_per_batch']} round trips per batch",
            ),
            row(
                "write into fresh memfd pages (`pwrite`)",
                f"{fc['us']:.1f}",
                f"{min(fc['runs_us']):.1f}",
                f"{max(fc['runs_us']):.1f}",
                "context: page allocation + copy, as the worker fills its cache",
            ),
            row(
                "copy into fresh memfd pages through a mapping",
                f"{fm['us']:.1f}",
                f"{min(fm['runs_us']):.1f}",
                f"{max(fm['runs_us']):.1f}",
                "context: the same with one trap per 4 KiB",
            ),
            row(
                "one page at the bulk TCP rate",
                f"{s['bulk_us']:.1f}",
                "",
                "",
                "context",
            ),
            row(
                "**shm ÷ (memcpy + 10 µs)**",
                f"**{s['shm_ratio']:.2f}**",
                "",
                "",
                f"goal ≤ {shm_goal:g}: {goal_mark(s['shm_ratio'], shm_goal)}",
            ),
            row(
                "**tcp ÷ raw socket**",
                f"**{s['tcp_ratio']:.2f}**",
                "",
                "",
                f"goal ≤ {tcp_goal:g}: {goal_mark(s['tcp_ratio'], tcp_goal)}",
            ),
            row(
                "peer ÷ raw socket",
                f"{s['peer_ratio']:.2f}",
                "",
                "",
                "no goal (two round trips)",
            ),
        ]
    problems = [
        f"{fmt_size(int(ps))} {path}: {'; '.join(run['problems'])}"
        for ps, r in result["page_sizes"].items()
        for path in ("shm", "tcp", "peer", "soft")
        for run in r["faults"][path]
        if run["problems"]
    ]
    if problems:
        lines += ["", "## Counter mismatches", ""] + [f"- {x}" for x in problems]
    return "\n".join(lines) + "\n"
