#!/usr/bin/env python3
"""Write ``bench/results/REPORT.md`` from every ``bench/results/*.json`` in the common format.

    python bench/run.py report

For each workload (a JSON written by ``common.save``): its title, parameters, page size,
machine, commit and date; per case a table of every system with the median seconds,
min–max over the repetitions, the ratio peer / Clamor (above 1: Clamor is faster), bytes
moved and peak worker RSS in human units, and the note (unavailable, wrong answer, ...);
then the issue's goals, met or missed with the reason; and a bar chart of the ratios,
``bench/results/<workload>.png`` (matplotlib, Agg; skipped with a note without it).
Results in other formats (overhead, recovery, dashboard, paging) are linked by their
own ``.md`` reports.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from harness.results import RESULTS, commit_of, median, median_ci, ratio

#: The README's generated table sits between these lines (``main`` rewrites it).
README = RESULTS.parents[1] / "README.md"
README_BEGIN, README_END = "<!-- bench-summary:begin -->", "<!-- bench-summary:end -->"

#: Workloads in the order the report shows them (others follow, alphabetically).
ORDER = ("lookups", "lookups-network", "replication", "replication-network", "spill", "streaming",
         "streaming-network", "dense", "dense-16cores", "kdtree", "kdtree-network", "logreg",
         "logreg-network", "kmeans", "overhead")


def human_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "—"


def human_seconds(s: float | None) -> str:
    if s is None:
        return "—"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


def is_common(data: Any) -> bool:
    """A result in the common format (``common.save``): a workload and a list of rows."""
    return isinstance(data, dict) and "workload" in data and isinstance(data.get("rows"), list)


def cases(result: dict) -> list[str]:
    seen: list[str] = []
    for r in result["rows"]:
        if r["case"] not in seen:
            seen.append(r["case"])
    return seen


def plot(result: dict) -> str | None:
    """A bar chart of peer / Clamor per case and peer into ``<workload>.png``; its name,
    or ``None`` (no matplotlib, or nothing to plot)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    base = result.get("baseline", "clamor")
    peers = [s for s in dict.fromkeys(r["system"] for r in result["rows"]) if s != base]
    values = {(c, s): ratio(result, s, c, base) for c in cases(result) for s in peers}
    cs = [c for c in cases(result) if any(values[(c, s)] for s in peers)]  # a case of Clamor alone: no bars
    if not cs:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(cs) * max(1, len(peers)) / 2 + 2), 3.6))
    width = 0.8 / max(1, len(peers))
    for j, s in enumerate(peers):
        xs = [i + (j - (len(peers) - 1) / 2) * width for i in range(len(cs))]
        ys = [values[(c, s)] or 0.0 for c in cs]
        bars = ax.bar(xs, ys, width, label=s)
        for b, y in zip(bars, ys):
            if y:
                ax.annotate((f"{y:.0f}×" if y >= 10 else f"{y:.2g}×"), (b.get_x() + b.get_width() / 2, y), ha="center",
                            va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(cs)), cs)
    ax.set_ylabel(f"median time: peer / {base}")
    if max(v or 0 for v in values.values()) > 20:
        ax.set_yscale("log")
    ax.set_title(result.get("title", result["workload"]), fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, result)


def _save(fig, result: dict) -> str:
    """Write a workload's figure next to its JSON; its file name."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    name = f"{result['workload']}.png"
    fig.savefig(RESULTS / name, dpi=110)
    plt.close(fig)
    return name


def machine_line(result: dict) -> str:
    """Where and when a result was measured: date, commit (and whether the tree differed),
    the machine, the command and the peer versions, as the JSON says (older results
    lack some of it: shown as such)."""
    m = result.get("machine", {})
    p = result.get("params") or {}
    commit, dirty = commit_of(result)
    tree = (" with uncommitted changes" if dirty else "" if dirty is False
            else " (whether the tree had uncommitted changes was not recorded)")  # fmt: skip
    memory = f", {m['memory_gib']:g} GiB" if m.get("memory_gib") else ""
    command = result.get("command") or p.get("command")
    versions = ", ".join(f"{k} {v}" for k, v in (result.get("versions") or p.get("versions") or {}).items() if v)
    return (f"Run {result.get('date', '?')} at commit `{commit}`{tree} on "
            f"`{m.get('hostname', '?')}`: {m.get('nproc', '?')} cores ({m.get('cpu', '?')}){memory}, Linux "
            f"{m.get('kernel', '?')}, Python {m.get('python', '?')}"
            + (" — **quick** sizes" if result.get("quick") else "")
            + (f". Command: `{command}`" if command else ". Command: not recorded")
            + (f". Versions: {versions}" if versions else "") + ".")


def limit_row(result: dict, case: str) -> dict | None:
    """The case's physical limit: its fastest limit row (``"limit": True``) with repetitions, if any."""
    return min((r for r in result["rows"] if r["case"] == case and r.get("limit") and r["seconds"]),
               key=lambda r: median(r["seconds"]), default=None)  # fmt: skip


def interval(seconds: list[float]) -> str:
    ci = median_ci(seconds)
    if ci is None:
        return f"— ({len(seconds)} runs)" if seconds else "—"
    return f"{human_seconds(ci[0])}–{human_seconds(ci[1])}"


def section(result: dict) -> list[str]:
    """The Markdown of one workload."""
    ps = result.get("page_size")
    lines = [f"## {result.get('title', result['workload'])} (`{result['workload']}`)", "",
             machine_line(result) + " " + (f"Page size: {human_bytes(ps)}." if ps else "")]
    params = result.get("params") or {}
    if params:
        shown = ", ".join(f"{k} = `{json.dumps(v) if not isinstance(v, str) else v}`"
                          for k, v in params.items()
                          if k not in ("command", "versions") and not (isinstance(v, list) and len(v) > 12))
        lines += ["", f"Parameters: {shown}."]
    return lines + case_tables(result) + measures_table(result) + _goals_and_plots(result, "Goals:")


#: Per workload, the other medians its rows carry (key, heading, unit: "s", "B" or ""),
#: shown in one more table (the case tables show a row's ``seconds`` alone).
MEASURES = {
    "many_workers": [("start_s", "start", "s"), ("first_stage_s", "first stage", "s"), ("stage_s", "stage", "s"),
                     ("read_stage_s", "read stage", "s"), ("close_s", "close", "s"),
                     ("driver_fds_per_worker", "driver fds / worker", ""),
                     ("driver_threads_per_worker", "driver threads / worker", ""),
                     ("driver_rss_per_worker", "driver RSS / worker", "B"),
                     ("driver_idle_cpu_per_worker", "idle driver CPU / worker (s/s)", "")],
}  # fmt: skip


def measures_table(result: dict) -> list[str]:
    """The medians named in :data:`MEASURES` for the workload, a row per system and case."""
    measures = MEASURES.get(result["workload"].split("-")[0])
    if not measures:
        return []
    shown = [m for m in measures if any(m[0] in r for r in result["rows"])]
    lines = ["", "### Every measure (medians)", "",
             "| system | case | " + " | ".join(h for _, h, _ in shown) + " |",
             "|---|---|" + "---:|" * len(shown)]
    for r in result["rows"]:
        cells = []
        for key, _, unit in shown:
            v = r.get(key)
            cells.append("—" if v is None else human_seconds(v) if unit == "s" else human_bytes(v) if unit == "B"
                         else f"{v:.3g}")  # fmt: skip
        lines.append(f"| {r['system']} | {r['case']} | " + " | ".join(cells) + " |")
    return lines


def case_tables(result: dict) -> list[str]:
    """Per case, every row: median, minimum, the 95 % interval, runs, ÷ limit, ÷ baseline."""
    base, lines = result.get("baseline", "clamor"), []
    for case in cases(result):
        limit = limit_row(result, case)
        lines += ["", f"### {case}", "",
                  "| system | median | min | 95 % interval of the median | runs | ÷ limit | peer / " + base
                  + " | bytes moved | peak worker RSS | note |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in (r for r in result["rows"] if r["case"] == case):
            med = median(r["seconds"])
            rt = ratio(result, r["system"], case, base)
            name = f"**{r['system']}**" if r["system"] == base else r["system"]
            if r.get("correct") is False or r.get("checked") is False:
                name += " (**wrong answer**)"
            over_limit = (f"{med / median(limit['seconds']):.2f}×" if limit and med is not None
                          and median(limit["seconds"]) else "—")  # fmt: skip
            if r.get("limit"):
                vs_base = "limit"
            elif r["system"] == base and med is not None:
                vs_base = "1 (baseline)"
            else:
                vs_base = f"**{rt:.2f}×**" if rt is not None else "—"
            lines.append(
                f"| {name} | {human_seconds(med)} | {human_seconds(min(r['seconds'], default=None))} | "
                f"{interval(r['seconds'])} | {len(r['seconds'])} | {over_limit} | {vs_base}"
                f" | {human_bytes(r.get('bytes_moved'))} | {human_bytes(r.get('peak_worker_rss'))}"
                f" | {(r.get('note') or '').replace('|', '/')} |")
    return lines


def _goals_and_plots(result: dict, heading: str) -> list[str]:
    """A workload section's tail: its goals, met or missed (and why), then its figures."""
    lines: list[str] = []
    goals = result.get("goals") or []
    if goals:
        lines += ["", heading, ""]
        for g in goals:
            v = g.get("value")
            state = "**met**" if g.get("met") else "**missed**"
            lines.append(f"- {g['goal']}: {'—' if v is None else f'{v:.2f}'} (target ≥ {g['target']:.2f}) "
                         f"{state}" + (f" — {g['why']}" if g.get("why") and not g.get("met") else ""))
    for name in result.get("plots") or []:
        lines += ["", f"![{name}]({name})"]
    return lines + [""]


# --- dense (issue 29): one table a worker count, first and repeat pass side by side -----

#: The dense workload's systems, in the order its tables show them (then the others, the
#: limits last).
DENSE_SYSTEMS = ("clamor", "shared memory", "ray", "ray (ship keys' values)", "dask",
                 "dask (ship keys' values)", "numpy")


def _dense_systems(result: dict) -> list[str]:
    present = list(dict.fromkeys(r["system"] for r in result["rows"]))
    first = [s for s in DENSE_SYSTEMS if s in present]
    rest = sorted(s for s in present if s not in first)
    return first + [s for s in rest if not s.startswith("limit:")] + [s for s in rest if s.startswith("limit:")]
#: Clamor's counters that say whether a pass faulted (always shown).
DENSE_PAGING = ("faults", "soft_faults", "pages_mapped", "subpage_maps")


def is_dense(result: dict) -> bool:
    return result["workload"] == "dense" or result["workload"].startswith("dense-")


def _dense_cases(result: dict, workers: int) -> tuple[list[str], str | None]:
    """The read cases of ``workers`` (without the pass), in order, and the write case."""
    head, reads, write = f"{workers} workers, ", [], None
    for c in cases(result):
        if not c.startswith(head):
            continue
        if c.endswith((", first pass", ", repeat pass")):
            base = c.rsplit(", ", 1)[0]
            if base not in reads:
                reads.append(base)
        else:
            write = c
    return reads, write


def _dense_row(result: dict, system: str, case: str) -> dict | None:
    return next((r for r in result["rows"] if r["system"] == system and r["case"] == case), None)


def _dense_cell(result: dict, system: str, case: str) -> str:
    r = _dense_row(result, system, case)
    if r is None:
        return "—"
    if not r["seconds"]:
        return "n/a"
    text = human_seconds(median(r["seconds"]))
    if r.get("put_s") is not None:
        text += f" (put {human_seconds(r['put_s'])})"
    q = ratio(result, system, case) if system != "clamor" else None
    if q is not None:
        text += f", {q:.2f}×"
    if r.get("checked") is False:
        text += " **wrong**"
    return text


def _dense_short(case: str) -> str:
    """A case without its worker count (``100 %, 4 a worker, first pass``)."""
    return case.split(", ", 1)[1] if ", " in case else case


def dense_plot(result: dict) -> str | None:
    """Median seconds per case and system, one panel a worker count, into ``<workload>.png``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    workers = sorted((result.get("params") or {}).get("workers_list") or [])
    systems = _dense_systems(result)
    if not workers or not systems:
        return None
    fig, axes = plt.subplots(len(workers), 1, figsize=(11, 4.2 * len(workers)), squeeze=False)
    width = 0.8 / len(systems)
    for ax, w in zip(axes[:, 0], workers):
        reads, write = _dense_cases(result, w)
        cs = [f"{b}, {run}" for b in reads for run in ("first pass", "repeat pass")] + ([write] if write else [])
        for j, s in enumerate(systems):
            ys = []
            for c in cs:
                r = _dense_row(result, s, c)
                ys.append(median(r["seconds"]) if r and r["seconds"] else 0.0)
            xs = [i + (j - (len(systems) - 1) / 2) * width for i in range(len(cs))]
            ax.bar(xs, ys, width, label=s)
        labels = [_dense_short(c).replace(", first pass", "\nfirst").replace(", repeat pass", "\nrepeat")
                  .replace(" a worker", "/worker") for c in cs]
        ax.set_xticks(range(len(cs)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("median seconds")
        ax.set_title(f"{w} workers", fontsize=9)
        ax.legend(fontsize=7, ncol=min(4, len(systems)), loc="upper center", bbox_to_anchor=(0.5, -0.2))
    m = result.get("machine", {})
    fig.suptitle(f"{result.get('title', result['workload'])} — {m.get('nproc', '?')} cores "
                 f"({m.get('hostname', '?')})", fontsize=9)
    return _save(fig, result)


def dense_section(result: dict) -> list[str]:
    """The Markdown of the dense workload: per worker count, the systems side by side."""
    p = result.get("params") or {}
    lines = [f"## {result.get('title', result['workload'])} (`{result['workload']}`)", "", machine_line(result)]
    lines += ["", (f"A {human_bytes(p.get('table_bytes'))} int64 table in pages of "
              f"{human_bytes(result.get('page_size'))}; a task does {p.get('lookups', 0):,} random "
              f"lookups over all of it (100 %) or over 1 % of its pages. First pass: a fresh system, "
              f"from the table in the driver's memory to the last result, the put, scatter or "
              f"shared-memory fill included (shown as *put*), the median of {p.get('first_repeat', '?')}; "
              f"repeat pass: the same stage again, the median of {p.get('repeat', '?')}; write + "
              f"lookups: one driver write then the 100 % stage, the median of "
              f"{p.get('iterations', '?')} iterations. Cells: median, and peer ÷ clamor (above 1: "
              f"Clamor is faster).")]
    systems = _dense_systems(result)
    other = [r["other_cores"] for r in result["rows"] if r.get("other_cores") is not None]
    if other:
        busy = sum(o > 0.1 for o in other)
        lines += ["", (f"Other load (cores busy outside the measured system, per row): up to {max(other):.2f}"
                       + (f"; {busy} of {len(other)} rows above 0.1, i.e. **perturbed**" if busy else "")
                       + ".")]
    if p.get("complete") is False:
        lines += ["", ("**Incomplete**: the run was stopped before every system had run; "
                       "what it measured is below.")]
    for w in sorted(p.get("workers_list") or []):
        reads, write = _dense_cases(result, w)
        cols = [f"{b}, {run}" for b in reads for run in ("first pass", "repeat pass")]
        cols += [write] if write else []
        lines += ["", f"### {w} workers", "",
                  "| system | " + " | ".join(_dense_short(c) for c in cols) + " |",
                  "|---|" + "---:|" * len(cols)]
        for s in systems:
            lines.append(f"| {s} | " + " | ".join(_dense_cell(result, s, c) for c in cols) + " |")
        lines += ["", ("Memory: the growth of the machine's shared memory (`/proc/meminfo` Shmem) over "
                       "the pass, and the worker processes' summed Pss after it."), "",
                  "| system | case | Shmem growth, first pass | workers' Pss, first pass | workers' Pss, repeat pass |",
                  "|---|---|---:|---:|---:|"]
        for s in systems:
            for b in reads:
                f, r = _dense_row(result, s, f"{b}, first pass"), _dense_row(result, s, f"{b}, repeat pass")
                if not f or not f["seconds"]:
                    continue
                lines.append(f"| {s} | {_dense_short(b)} | {human_bytes(f.get('shmem_growth'))} | "
                             f"{human_bytes(f.get('workers_pss'))} | "
                             f"{human_bytes(r.get('workers_pss') if r else None)} |")
        paging = [(c, r["paging"]) for c in cols if (r := _dense_row(result, "clamor", c)) and r.get("paging")]
        if paging:
            lines += ["", ("Clamor's paging counters, the change over the pass, summed over the workers "
                           "(a repeat pass: the largest change of any repetition; `driver.`: the driver's):"), "",
                      "| case | " + " | ".join(DENSE_PAGING) + " | other counters that changed |",
                      "|---|" + "---:|" * len(DENSE_PAGING) + "---|"]
            for c, d in paging:
                rest = ", ".join(f"{k} {v:,}" for k, v in d.items()
                                 if k not in DENSE_PAGING and k not in ("tasks_run", "driver.stages_run",
                                                                         "driver.tasks_run", "driver.epoch"))
                lines.append(f"| {_dense_short(c)} | " + " | ".join(f"{d.get(k, 0):,}" for k in DENSE_PAGING)
                             + f" | {rest or '—'} |")
    notes = [f"- {r['system']}, {r['case']}: {r['note']}" for r in result["rows"] if r.get("note")]
    if notes:
        lines += ["", "Notes:", "", *dict.fromkeys(notes)]
    lines += ["", "#### Every case: median, minimum, the 95 % interval of the median, runs, ÷ the limit",
              *case_tables(result)]
    return lines + _goals_and_plots(
        result, "Goals (issue 29; the value is peer ÷ clamor, so 1/1.5 = 0.67 means within 1.5×):")


def machine_name(result: dict) -> str:
    m = result.get("machine", {})
    return f"{m.get('nproc', '?')} cores, {m.get('cpu', '?')}" + (f", {m['memory_gib']:g} GiB" if m.get("memory_gib") else "")


def machines_table(results: list[dict]) -> list[str]:
    """One line per machine the results come from, and which workloads ran there."""
    by: dict[str, list[str]] = {}
    for r in results:
        by.setdefault(f"`{r.get('machine', {}).get('hostname', '?')}`: {machine_name(r)}", []).append(r["workload"])
    return ["| machine | workloads |", "|---|---|", *(f"| {m} | {', '.join(ws)} |" for m, ws in by.items())]


def headline_table(results: list[dict]) -> list[str]:
    """Per workload and case: Clamor's median, the fastest peer program and peer ÷ Clamor,
    Clamor ÷ the limit, where and when; every number from the JSON."""
    lines = ["| workload | case | clamor median | fastest peer: peer ÷ clamor | clamor ÷ limit | runs | machine | date, commit |",
             "|---|---|---:|---|---:|---:|---|---|"]
    for result in results:
        base = result.get("baseline", "clamor")
        for case in cases(result):
            mine = next((r for r in result["rows"] if r["case"] == case and r["system"] == base), None)
            if mine is None or not mine["seconds"]:
                continue
            peers = [r for r in result["rows"] if r["case"] == case and r["system"] != base
                     and not r.get("limit") and r["seconds"] and r.get("checked") is not False]  # fmt: skip
            best = min(peers, key=lambda r: median(r["seconds"]), default=None)
            limit = limit_row(result, case)
            med = median(mine["seconds"])
            vs = f"{best['system']}: {ratio(result, best['system'], case, base):.2f}×" if best else "—"
            over = f"{med / median(limit['seconds']):.2f}× ({limit['system'][7:]})" if limit else "—"
            commit, dirty = commit_of(result)
            lines.append(f"| [{result['workload']}](bench/results/REPORT.md#{result['workload']}) | {case} | "
                         f"{human_seconds(med)} | {vs} | {over} | {len(mine['seconds'])} | "
                         f"{machine_name(result)} | {str(result.get('date', '?'))[:10]}, "
                         f"`{commit}`{'+' if dirty else ''} |")
    return lines


def write_readme(table: list[str]) -> None:
    """Put ``table`` between the README's markers (nothing if they are missing)."""
    text = README.read_text()
    if README_BEGIN not in text or README_END not in text:
        print(f"no {README_BEGIN} ... {README_END} in {README}: its table is not updated", file=sys.stderr)
        return
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    note = ("<!-- generated by bench/report/summary.py from bench/results/*.json: do not edit by hand; "
            "a + after the commit: the tree had uncommitted changes -->")
    README.write_text(head + README_BEGIN + "\n" + note + "\n" + "\n".join(table) + "\n" + README_END + tail)


def main() -> None:
    results: dict[str, dict] = {}
    others: list[str] = []
    for path in sorted(RESULTS.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"skipping {path.name}: {exc}", file=sys.stderr)
            continue
        if is_common(data):
            results[data["workload"]] = data
        elif (RESULTS / f"{path.stem}.md").exists():
            others.append(f"{path.stem}.md")
    for md in sorted(RESULTS.glob("*.md")):
        if md.name != "REPORT.md" and md.stem not in results and md.name not in others:
            others.append(md.name)
    order = [w for w in ORDER if w in results] + sorted(w for w in results if w not in ORDER)
    lines = ["# Benchmarks: Clamor vs. the peers", "",
             ("Generated by `bench/report/summary.py` from `bench/results/*.json` alone. Ratios are "
              "peer / Clamor of the median times (above 1: Clamor is faster); *÷ limit* is a "
              "system's median over the physical limit's (the `limit:` rows: plain numpy, shared "
              "memory, one plain process) where the workload has one. The interval is a "
              "distribution-free 95 % interval of the median (none under 6 runs). Each section "
              "names its machine, date, commit and command; the machines:"), "",
             *machines_table([results[w] for w in order]), "",
             "Headlines (also in the README):", "", *headline_table([results[w] for w in order]), ""]
    summary = [(w, g) for w in order for g in results[w].get("goals") or []]
    if summary:
        lines += ["| workload | goal | value | target | met |", "|---|---|---:|---:|---|"]
        for w, g in summary:
            v = g.get("value")
            lines.append(f"| [{w}](#{w}) | {g['goal']} | {'—' if v is None else f'{v:.2f}'} | "
                         f"{g['target']:.2f} | {'yes' if g.get('met') else '**no**'} |")
        lines.append("")
    for w in order:
        res = results[w]
        name = dense_plot(res) if is_dense(res) else plot(res)
        res["plots"] = [p for p in res.get("plots") or [] if p != name] + ([name] if name else [])
        lines += [f'<a id="{w}"></a>', "", *(dense_section(res) if is_dense(res) else section(res))]
    if others:
        lines += ["## Other reports", ""] + [f"- [{o}]({o})" for o in others] + [""]
    (RESULTS / "REPORT.md").write_text("\n".join(lines))
    write_readme(headline_table([results[w] for w in order]))
    print(f"wrote {RESULTS / 'REPORT.md'} ({len(order)} workloads, {len(others)} other reports)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
