"""The report's memory-over-time plot (:data:`~distprof.analysis.diagnose.Plot.MEMORY`): per rank and source,
allocated and reserved memory against time, from ``summary``'s ``memory`` rows (their ``series``, at most 240 points
each; :mod:`distprof.analysis.memory`)."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from distprof.analysis.diagnose import Plot
from distprof.analysis.records_mem import MemoryRow
from distprof.report.base import Section, label
from distprof.report.base import fig as _fig
from distprof.report.memview import who

__all__ = ["memory_section"]


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
        s.note = ("No memory over time: no allocation history here (torch={'profile_memory': True} traces record "
                  "it, and cuda_memory snapshots while memory history is on).")
        return s
    f = _fig("Memory over time (GB)", xaxis={"title": "ms"}, yaxis={"title": "GB"})
    for r in rows[:32]:
        name = f"{who(r)} ({r.source})"
        f.add_trace(_trace(r, "allocated", f"{name} allocated"))
        if any((r.series or {}).get("reserved", [])):
            f.add_trace(_trace(r, "reserved", f"{name} reserved", "dash"))
    s.figures.append(f)
    return s
