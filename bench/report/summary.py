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

from harness.results import RESULTS, median, ratio, spread

#: Workloads in the order the report shows them (others follow, alphabetically).
ORDER = ("lookups", "lookups-network", "replication", "replication-network", "spill", "streaming",
         "streaming-network", "kdtree", "kdtree-network", "logreg", "logreg-network", "kmeans", "overhead")


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
    cs = cases(result)
    values = {(c, s): ratio(result, s, c, base) for c in cs for s in peers}
    if not any(v for v in values.values()):
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
    fig.tight_layout()
    name = f"{result['workload']}.png"
    fig.savefig(RESULTS / name, dpi=110)
    plt.close(fig)
    return name


def section(result: dict) -> list[str]:
    """The Markdown of one workload."""
    m = result.get("machine", {})
    base = result.get("baseline", "clamor")
    ps = result.get("page_size")
    lines = [f"## {result.get('title', result['workload'])} (`{result['workload']}`)", ""]
    lines.append(
        f"Run {result.get('date', '?')} at commit `{result.get('commit') or '?'}` on "
        f"`{m.get('hostname', '?')}` (nproc {m.get('nproc', '?')}, {m.get('cpu', '?')}, "
        f"Linux {m.get('kernel', '?')}, Python {m.get('python', '?')})"
        + (" — **quick** sizes" if result.get("quick") else "") + ". "
        + (f"Page size: {human_bytes(ps)}." if ps else "Page size: n/a.")
    )
    params = result.get("params") or {}
    if params:
        shown = ", ".join(f"{k} = `{json.dumps(v) if not isinstance(v, str) else v}`"
                          for k, v in params.items() if not (isinstance(v, list) and len(v) > 12))
        lines += ["", f"Parameters: {shown}."]
    for case in cases(result):
        lines += ["", f"### {case}", "",
                  "| system | median | min–max | peer / " + base + " | bytes moved | peak worker RSS | note |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for r in (r for r in result["rows"] if r["case"] == case):
            med, sp = median(r["seconds"]), spread(r["seconds"])
            rt = ratio(result, r["system"], case, base)
            name = f"**{r['system']}**" if r["system"] == base else r["system"]
            if r.get("correct") is False:
                name += " (**wrong answer**)"
            lines.append(
                f"| {name} | {human_seconds(med)} | "
                + (f"{human_seconds(sp[0])}–{human_seconds(sp[1])}" if sp else "—") + " | "
                + ("1 (baseline)" if r["system"] == base and med is not None else
                   f"**{rt:.2f}×**" if rt is not None else "—")
                + f" | {human_bytes(r.get('bytes_moved'))} | {human_bytes(r.get('peak_worker_rss'))}"
                + f" | {(r.get('note') or '').replace('|', '/')} |")
    goals = result.get("goals") or []
    if goals:
        lines += ["", "Goals:", ""]
        for g in goals:
            v = g.get("value")
            state = "**met**" if g.get("met") else "**missed**"
            lines.append(f"- {g['goal']}: {'—' if v is None else f'{v:.2f}'} (target ≥ {g['target']:.2f}) "
                         f"{state}" + (f" — {g['why']}" if g.get("why") and not g.get("met") else ""))
    for name in result.get("plots") or []:
        lines += ["", f"![{name}]({name})"]
    return lines + [""]


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
             ("Ratios are peer / Clamor of the median times (above 1: Clamor is faster). "
              "Numbers are from one 2-core machine unless a section says nproc 16 (a 16-core machine: `scale`, `driver_scale` and the sections named `-16cores`); min–max shows the spread of the repetitions."),
             ""]
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
        name = plot(res)
        res["plots"] = [p for p in res.get("plots") or [] if p != name] + ([name] if name else [])
        lines += [f'<a id="{w}"></a>', "", *section(res)]
    if others:
        lines += ["## Other reports", ""] + [f"- [{o}]({o})" for o in others] + [""]
    (RESULTS / "REPORT.md").write_text("\n".join(lines))
    print(f"wrote {RESULTS / 'REPORT.md'} ({len(order)} workloads, {len(others)} other reports)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
