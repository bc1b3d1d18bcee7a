"""Memory answers in the terminal and in the HTML report (:mod:`distprof.analysis.memory`'s rows, ``summary``'s
``memory``): per rank the peak allocated and reserved and its moment, the largest live blocks at the peak by origin,
allocated at each step's start, and an OOM's explanation; the report's plot is memory over time per rank
(:data:`~distprof.analysis.diagnose.Plot.MEMORY`). Laid out by :mod:`.termfit` (fits 80 columns).
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from msgspec import UNSET
from rich.console import Console
from rich.text import Text

from distprof.analysis.diagnose import Plot
from distprof.analysis.memory import fmt_bytes
from distprof.analysis.records import SummaryResult
from distprof.analysis.records_mem import MemoryRow
from distprof.report.base import Section, label, rank_name
from distprof.report.base import fig as _fig
from distprof.report.termfit import Col, FitTable, say
from distprof.util.safetext import visible as plain

__all__ = ["memory", "memory_section"]

TOP = 5


def _rows(s: SummaryResult) -> list[MemoryRow]:
    return list(s.memory) if s.memory is not UNSET and s.memory else []


def _who(r: MemoryRow) -> str:
    return rank_name(r.role, r.rank, r.path)


def memory(console: Console, s: SummaryResult, top: int = TOP) -> None:
    """The memory tables of a summary (nothing when it has no memory answers)."""
    rows = _rows(s)
    if not rows:
        return
    console.print()
    t = FitTable(Text("Memory per rank: the peak and its moment"),
                 [Col("rank", "key"), Col("source", "fixed"), Col("allocated"), Col("reserved"), Col("step", "key"),
                  Col("phase", "name")])
    for r in rows:
        t.add_row(plain(_who(r)), f"{r.source} {r.device_type or ''}".strip(), fmt_bytes(r.peak_allocated_bytes),
                  fmt_bytes(r.peak_reserved_bytes), "-" if r.at.step is None else str(r.at.step),
                  Text(plain(r.at.phase or "-")))
    console.print(t)
    for r in rows:
        if r.top:
            t = FitTable(Text(f"{plain(_who(r))}: largest live blocks at the peak, by origin"),
                         [Col("frame or phase", "name"), Col("bytes"), Col("blocks")])
            for g in r.top[:top]:
                origin = g.frame or g.phase or "-"
                if g.frame and g.phase:
                    origin += f" [{g.phase}]"
                t.add_row(Text(plain(origin)), fmt_bytes(g.bytes), str(g.blocks) if g.blocks else "-")
            console.print(t)
        if len(r.steps) >= 2:
            say(console, f"{plain(_who(r))}: allocated at step start: " + ", ".join(
                f"{x.step}: {fmt_bytes(x.allocated_bytes)}" for x in r.steps[:12]) +
                (" ..." if len(r.steps) > 12 else ""))
        if r.oom is not None:
            for line in r.oom.lines:
                say(console, f"{plain(_who(r))} OOM: {plain(line)}")


def _trace(r: MemoryRow, key: str, name: str, dash: str | None = None) -> go.Scatter:
    pts = r.series or {}
    t0 = (pts.get("time_us") or [0])[0]
    return go.Scatter(x=[(t - t0) / 1e3 for t in pts.get("time_us", [])], y=[v / 1e9 for v in pts.get(key, [])],
                      mode="lines", name=label(name), line={"dash": dash} if dash else {},
                      hovertemplate="%{y:.3f} GB at %{x:.1f} ms<extra>" + label(name) + "</extra>")


def memory_section(rows: Sequence[MemoryRow] | None) -> Section:
    """The report's memory-over-time plot: per rank (and source), allocated and reserved against time."""
    s = Section(Plot.MEMORY, "Memory over time per rank",
                "Allocated (solid) and reserved (dashed) memory per rank, from profile_memory traces' [memory] "
                "events or allocator snapshots' replayed history; time from each source's first event. The peak "
                "survives the thinning to at most 240 points.")
    rows = [r for r in rows or [] if r.series and r.series.get("time_us")]
    if not rows:
        s.note = ("No memory answers: capture with torch={'profile_memory': True} or backend='cuda_memory' for "
                  "memory over time.")
        return s
    f = _fig("Memory over time (GB)", xaxis={"title": "ms"}, yaxis={"title": "GB"})
    for r in rows[:32]:
        who = f"{_who(r)} ({r.source})"
        f.add_trace(_trace(r, "allocated", f"{who} allocated"))
        if any((r.series or {}).get("reserved", [])):
            f.add_trace(_trace(r, "reserved", f"{who} reserved", "dash"))
    s.figures.append(f)
    return s
