"""The terminal view of step telemetry (``distprof steps`` on a run directory with ``telemetry: true``).

Per role: one table of its ranks (steps kept, median / p90 / max step time, the slowest step, the largest phases
by share of the step time), then its step time over the whole run as sparklines, a character per bucket of
:class:`~distprof.analysis.records.TelemetryTimeline` on one scale: the median over the ranks of each rank's median
in the bucket, and the slowest rank's median. Laid out by :mod:`.termfit` (fits 80 columns).
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from distprof.analysis.records import StepsResult, TelemetryRank, TelemetryTimeline
from distprof.report.termfit import Col, FitTable, say
from distprof.report.terminal import plain
from distprof.report.units import us

__all__ = ["BARS", "sparkline", "telemetry"]

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], lo: float | None = None, hi: float | None = None) -> str:
    """One character per value, scaled from ``lo`` (``▁``) to ``hi`` (``█``); by default the values' own range."""
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = hi - lo
    top = len(BARS) - 1
    return "".join(BARS[0 if span <= 0 else max(0, min(top, int((v - lo) / span * len(BARS))))] for v in values)


def _mid(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _phases(r: TelemetryRank, most: int) -> str:
    return ", ".join(f"{plain(p.name)} {p.share:.0%}" for p in r.phases[:most]) or "-"


def _table(role: str, rows: list[TelemetryRank], phases: int, max_ranks: int) -> FitTable:
    first, last = min(r.first_step for r in rows), max(r.last_step for r in rows)
    worst = max(rows, key=lambda r: r.median_us)
    t = FitTable(Text(f"Step telemetry: {plain(role)}, {len(rows)} rank{'s' if len(rows) > 1 else ''}, "
                      f"steps {first}-{last} (* slowest median)"),
                 [Col("rank", "key"), Col("steps"), Col("median"), Col("p90"), Col("max"), Col("at step"),
                  Col("phases (share)", "text")])
    shown = rows if len(rows) <= max_ranks else sorted(rows, key=lambda r: -r.median_us)[:max_ranks]
    for r in sorted(shown, key=lambda r: r.rank):
        mark = " *" if r is worst and len(rows) > 1 else ""
        t.add_row(f"{r.rank}{mark}", f"{r.steps:,}", us(r.median_us), us(r.p90_us), us(r.max_us),
                  str(r.slowest_step), _phases(r, phases))
    if len(shown) < len(rows):
        t.add_row("...", "", "", "", "", "", f"{len(rows) - len(shown)} more ranks, faster")
    return t


def _timeline_lines(tl: TelemetryTimeline) -> list[Text]:
    """The role's step time over the run, a character per bucket on one scale: the median over its ranks, and
    (several ranks) the slowest rank's, so that one rank turning slow stands out."""
    buckets = [b for b in tl.buckets if b.median_us]
    if len(buckets) < 2:
        return []
    mids = [_mid(list(b.median_us.values())) for b in buckets]
    tops = [max(b.median_us.values()) for b in buckets]
    lo, hi = min(mids), max(tops)
    width = tl.buckets[0].last_step - tl.buckets[0].first_step + 1
    lines = [Text(f"  step time over steps {buckets[0].first_step}-{buckets[-1].last_step}, {width:,} "
                  f"step{'s' if width > 1 else ''} per character, {BARS[0]} {us(lo)} to {BARS[-1]} {us(hi)}:"),
             Text(f"    median rank   {sparkline(mids, lo, hi)}")]
    if any(len(b.median_us) > 1 for b in buckets):
        lines.append(Text(f"    slowest rank  {sparkline(tops, lo, hi)}"))
    return lines


def telemetry(console: Console, d: StepsResult, phases: int = 3, max_ranks: int = 16) -> None:
    """The telemetry tables of ``d`` (nothing when it has none)."""
    rows = d.telemetry or []
    if not rows:
        return
    timelines = {tl.role: tl for tl in d.telemetry_timeline or []}
    for role in sorted({r.role for r in rows}):
        console.print(_table(role, [r for r in rows if r.role == role], phases, max_ranks))
        for line in _timeline_lines(timelines[role]) if role in timelines else []:
            say(console, line, hang=4)
    skipped = sum(r.skipped for r in rows)
    if skipped:
        say(console, Text(f"{skipped:,} telemetry line{'s' if skipped > 1 else ''} could not be read (torn by a "
                          "kill, or not telemetry): left out"))
