"""The terminal view of ``distprof hang`` (:class:`~distprof.analysis.records_hang.HangResult`): the verdict, one
row per rank (state, step, phase, where it is, what it waits in), then the stacks of the stuck ranks."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from distprof.analysis.records_hang import HangResult

__all__ = ["view"]

_STYLE = {"stuck": "red", "stuck_in_c": "red", "waiting": "yellow", "no_evidence": "red", "running": "green",
          "resumed": "green"}


def _clock(t: float | None) -> str:
    return "" if not t else time.strftime("%H:%M:%S", time.localtime(t))


def view(res: HangResult, frames: int = 8) -> Group:
    """The verdict, the ranks' table and the stuck ranks' innermost ``frames`` frames."""
    parts: list[RenderableType] = [Text(res.verdict, style="bold red" if res.hung else "bold green")]
    table = Table(box=None, pad_edge=False, title=f"role {res.role}" if res.role else None, title_justify="left")
    for col in ("rank", "state", "step", "phase", "since", "where", "waits in"):
        table.add_column(col, overflow="fold")
    for r in res.ranks:
        w = r.waiting_in
        waits = f"{w.get('name')} #{w.get('seq')} (group {w.get('group')})" if w else ""
        table.add_row(f"{r.role}/{r.rank}" if r.role and r.role != res.role else str(r.rank),
                      Text(r.state, style=_STYLE.get(r.state, "")), "" if r.step is None else str(r.step),
                      r.phase or "", _clock(r.since), Text(r.frame or ""), Text(waits))
    parts.append(table)
    by = {r.rank: r for r in res.ranks if r.role == res.role}
    for rank in res.stuck_ranks:
        s = by.get(rank)
        if s is None or not s.stack:
            continue
        parts.append(Text(f"rank {rank} ({s.state}), innermost last:", style="bold"))
        parts.extend(Text("  " + line) for line in s.stack[-frames:])
    if res.errors:
        parts.append(Text(f"{len(res.errors)} evidence file(s) could not be read:", style="yellow"))
        parts.extend(Text(f"  {e.get('path')}: {e.get('message')}") for e in res.errors[:10])
    return Group(*parts)
