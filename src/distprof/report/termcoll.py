"""The collective report in the terminal (``distprof summary``): one table of :class:`~.records_comm.CollectiveRow`
and, per role, who arrives last. Only the CLI calls this (through :func:`.terminal.summary`)."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.text import Text

from distprof.analysis.records_comm import CollectiveRow
from distprof.report.termfit import BLANK, Col, FitTable, say
from distprof.report.units import us
from distprof.util.safetext import visible

__all__ = ["collectives", "last_arrivals", "size"]


def size(v: int | float | None) -> str:
    """Bytes in decimal units (as nccl-tests and the GB/s beside them count)."""
    if v is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:,.2f} {unit}"
    return f"{v:,.0f} B"



def _gbps(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f} GB/s"


def last_arrivals(rows: list[CollectiveRow]) -> list[str]:
    """Per role: the rank that arrived last most often over all its matched collectives, as a sentence."""
    by_role: dict[str | None, Counter] = {}
    for r in rows:
        c = by_role.setdefault(r.role, Counter())
        c.update({int(k): n for k, n in r.last_arrivals.items()})
    out = []
    for role, c in by_role.items():
        total = sum(c.values())
        if not total:
            continue
        rank, n = max(c.items(), key=lambda kv: (kv[1], -kv[0]))
        where = f" of role {visible(role)}" if role else ""
        out.append(f"Rank {rank} arrived last in {n / total:.1%} of {total:,} collectives{where}.")
    return out


def collectives(console: Console, rows: list[CollectiveRow]) -> None:
    """The collective report: per role, process group and collective (transfer: the shortest duration among the
    ranks, summed; skew: the median spread of start times); then who arrives last, and why figures are missing."""
    if not rows:
        return
    t = FitTable("Collectives per process group (transfer: shortest rank's duration, summed; skew: median spread "
                 "of start times; bandwidth per nccl-tests)",
                 [Col("role", "key", once=True), Col("group", "key"), Col("name", "name"), Col("count"),
                  Col("bytes"), Col("transfer"), Col("skew"), Col("algbw"), Col("busbw"),
                  Col("last", "fixed", empty=BLANK)])
    for r in rows:
        group = r.group + (f" ({r.group_desc})" if r.group_desc else "")
        last = "-" if r.last_rank is None or r.last_share is None else f"{r.last_rank} ({r.last_share:.0%})"
        t.add_row(Text(visible(r.role or "")), Text(visible(group)), Text(visible(r.name)), f"{r.count:,}",
                  size(r.bytes), us(r.min_dur_us), us(r.skew_us), _gbps(r.algbw_gbps), _gbps(r.busbw_gbps), last)
    console.print(t)
    for line in last_arrivals(rows):
        say(console, line)
    for note in dict.fromkeys(r.note for r in rows if r.note):
        say(console, f"Collectives: {note}.")
