"""Memory answers in the terminal (:mod:`distprof.analysis.memory`'s rows, ``summary``'s ``memory``): per rank the
peak allocated and reserved and its moment, the largest live blocks at the peak by origin, allocated at each step's
start, and an OOM's explanation. Laid out by :mod:`.termfit` (fits 80 columns). No plotly here (the CLI imports it):
the report's plot is :mod:`.memplot`.
"""

from __future__ import annotations

from msgspec import UNSET
from rich.console import Console
from rich.text import Text

from distprof.analysis.memory import fmt_bytes
from distprof.analysis.records import SummaryResult
from distprof.analysis.records_mem import MemoryRow
from distprof.report.base import rank_name
from distprof.report.termfit import Col, FitTable, say
from distprof.util.safetext import visible as plain

__all__ = ["memory", "who"]

TOP = 5


def _rows(s: SummaryResult) -> list[MemoryRow]:
    return list(s.memory) if s.memory is not UNSET and s.memory else []


def who(r: MemoryRow) -> str:
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
        t.add_row(plain(who(r)), f"{r.source} {r.device_type or ''}".strip(), fmt_bytes(r.peak_allocated_bytes),
                  fmt_bytes(r.peak_reserved_bytes), "-" if r.at.step is None else str(r.at.step),
                  Text(plain(r.at.phase or "-")))
    console.print(t)
    for r in rows:
        if r.top:
            t = FitTable(Text(f"{plain(who(r))}: largest live blocks at the peak, by origin"),
                         [Col("frame or phase", "name"), Col("bytes"), Col("blocks")])
            for g in r.top[:top]:
                origin = g.frame or g.phase or "-"
                if g.frame and g.phase:
                    origin += f" [{g.phase}]"
                t.add_row(Text(plain(origin)), fmt_bytes(g.bytes), str(g.blocks) if g.blocks else "-")
            console.print(t)
        if len(r.steps) >= 2:
            say(console, f"{plain(who(r))}: allocated at step start: " + ", ".join(
                f"{x.step}: {fmt_bytes(x.allocated_bytes)}" for x in r.steps[:12]) +
                (" ..." if len(r.steps) > 12 else ""))
        if r.oom is not None:
            for line in r.oom.lines:
                say(console, f"{plain(who(r))} OOM: {plain(line)}")
