"""The terminal view of ``distprof hang`` (:class:`~distprof.analysis.records_hang.HangResult`): the verdict, one
row per rank (state, step, phase, where it is, what it waits in), then the stacks of the stuck ranks."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from distprof.analysis.hang import clock_text
from distprof.analysis.records_hang import HangRank, HangResult

__all__ = ["view"]

_STYLE = {"stuck": "red", "stuck_in_c": "red", "waiting": "yellow", "no_evidence": "red", "running": "green",
          "resumed": "green"}


def _rows(res: HangResult) -> list[tuple[str, HangRank]]:
    """The table's rows: one per rank, a run of consecutive ranks of one role without evidence in one row
    (``4-4095``: a world of thousands where few ranks wrote)."""
    out: list[tuple[str, HangRank]] = []
    run: list[HangRank] = []

    def flush() -> None:
        if run:
            first, last = run[0], run[-1]
            name = str(first.rank) if first is last else f"{first.rank}-{last.rank}"
            out.append((f"{first.role}/{name}" if first.role and first.role != res.role else name, first))
            run.clear()

    for r in res.ranks:
        if r.state == "no_evidence" and not r.evidence and run and run[-1].role == r.role \
                and run[-1].rank + 1 == r.rank:
            run.append(r)
            continue
        flush()
        if r.state == "no_evidence" and not r.evidence:
            run.append(r)
        else:
            out.append((f"{r.role}/{r.rank}" if r.role and r.role != res.role else str(r.rank), r))
    flush()
    return out


def view(res: HangResult, frames: int = 8) -> Group:
    """The verdict, the ranks' table and the stuck ranks' innermost ``frames`` frames."""
    parts: list[RenderableType] = [Text(res.verdict, style="bold red" if res.hung else "bold green")]
    table = Table(box=None, pad_edge=False, title=Text(f"role {res.role}") if res.role else None,
                  title_justify="left")
    for col in ("rank", "state", "step", "phase", "since", "where", "waits in"):
        table.add_column(col, overflow="fold")
    for name, r in _rows(res):  # every cell a Text: names from the evidence are never read as rich markup
        w = r.waiting_in
        waits = f"{w.get('name')} #{w.get('seq')} (group {w.get('group')})" if w else ""
        table.add_row(Text(name), Text(r.state, style=_STYLE.get(r.state, "")),
                      Text("" if r.step is None else str(r.step)), Text(r.phase or ""), Text(clock_text(r.since)),
                      Text(r.frame or ""), Text(waits))
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
        for e in res.errors[:10]:  # a message that names its file already is not prefixed with it again
            path, msg = str(e.get("path") or ""), str(e.get("message") or "")
            parts.append(Text(f"  {msg}" if msg.startswith(path) else f"  {path}: {msg}"))
    return Group(*parts)
