"""The printed table of a result: the Markdown that the broadcast-table workloads and
most others print after saving their JSON (:func:`markdown`), byte sizes as people read
them (:func:`fmt_bytes`), and the row look-ups the table and the workloads' goals share
(:func:`find`, :func:`limit_row`, :func:`value_ratio`).

``markdown(result, columns)``: per row the median, its 95 % interval, min–max, peer ÷
clamor and ÷ the fastest limit of the case, bytes moved, peak worker RSS, the workload's
own ``columns`` and the note; then the goals, met or missed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from harness.results import median, median_ci, ratio


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def limit_row(rows: Sequence[dict], case: str) -> dict | None:
    """The fastest measured limit row (``"limit": True``) of ``case``."""
    limits = [r for r in rows if r.get("limit") and r["case"] == case and r["seconds"]]
    return min(limits, key=lambda r: median(r["seconds"]), default=None)


def markdown(result: dict, columns: Sequence[tuple[str, Callable[[dict], str]]] = ()) -> str:
    """The rows (median, its 95 % interval, min–max, peer ÷ clamor and ÷ the fastest limit
    per case, bytes, RSS, ``columns``) and goals."""
    head = ["system", "case", "median (s)", "95 % CI (s)", "min–max (s)", "n", "÷ clamor",
            "÷ limit", "bytes moved", "peak worker RSS", *(c[0] for c in columns), "note"]  # fmt: skip
    lines = [f"## {result['title']}", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]  # fmt: skip
    for r in result["rows"]:
        s = r["seconds"]
        q = ratio(result, r["system"], r["case"]) if r["system"] != "clamor" else None
        lim = limit_row(result["rows"], r["case"])
        over = (median(s) / median(lim["seconds"])
                if s and lim and median(s) > 0 and median(lim["seconds"]) > 0 else None)  # fmt: skip
        ci = median_ci(s) if s else None
        cells = [r["system"], r["case"], f"{median(s):.4g}" if s else "—",
                 f"{ci[0]:.4g}–{ci[1]:.4g}" if ci else "—",
                 f"{min(s):.4g}–{max(s):.4g}" if s else "—", len(s), f"{q:.1f}×" if q else "—",
                 f"{over:.1f}×" if over else "—",
                 fmt_bytes(r.get("bytes_moved")), fmt_bytes(r.get("peak_worker_rss")),
                 *(f(r) for _, f in columns), r.get("note", "")]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if result.get("goals"):
        lines += ["", "Goals:", ""]
        for g in result["goals"]:
            v = "n/a" if g["value"] is None else f"{g['value']:.1f}"
            mark = "met" if g["met"] else "**missed**"
            lines.append(f"- {g['goal']}: {v} (target {g['target']:g}) {mark}"
                         + (f" — {g['why']}" if g["why"] else ""))  # fmt: skip
    return "\n".join(lines) + "\n"


def find(rows: Sequence[dict], system: str, case: str) -> dict | None:
    return next((r for r in rows if r["system"] == system and r["case"] == case), None)


def value_ratio(rows: Sequence[dict], key: str, system: str, case: str) -> float | None:
    """``rows[system][key] / rows[clamor][key]`` for ``case`` (e.g. memory)."""
    a, b = find(rows, system, case), find(rows, "clamor", case)
    if not a or not b or not a.get(key) or not b.get(key):
        return None
    return a[key] / b[key]
