"""The terminal view of ``distprof watch``: per role the step time per rank over the last steps, the slowest rank,
then the detections with their captures and findings. Fits 80 columns; every name from the run directory is shown
as text, never markup, control characters escaped. Only the CLI calls this."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from distprof.analysis.watch import RoleView, Snapshot
from distprof.util.safetext import visible

__all__ = ["MAX_RANKS", "view"]

MAX_RANKS = 12  # ranks listed per role (the busiest first, then the median one); the others are counted
SPARK = "▁▂▃▄▅▆▇█"
SPARK_STEPS = 20


def _ms(us: float | None) -> str:
    return "-" if us is None else f"{us / 1000:,.1f}"


def _spark(values: list[int | None], top: float) -> str:
    out = []
    for v in values[-SPARK_STEPS:]:
        if v is None:
            out.append(" ")
        else:
            out.append(SPARK[min(len(SPARK) - 1, int(len(SPARK) * v / top)) if top > 0 else 0])
    return "".join(out)


def _shown_ranks(r: RoleView) -> list[Any]:
    busy = {row.rank: sum(b for b in row.busy_us if b is not None) / max(1, sum(b is not None for b in row.busy_us))
            for row in r.ranks}
    ordered = sorted(r.ranks, key=lambda row: (-busy[row.rank], row.rank))
    if len(ordered) <= MAX_RANKS:
        return sorted(ordered, key=lambda row: row.rank)
    keep = [*ordered[:MAX_RANKS - 1], ordered[len(ordered) // 2]]  # the busiest, and the median rank
    return sorted(keep, key=lambda row: row.rank)


def _role_table(r: RoleView) -> RenderableType:
    title = Text.assemble((visible(r.role), "bold"), f"  step {r.newest_step if r.newest_step is not None else '-'}",
                          f"  median step {_ms(r.median_us)} ms")
    if r.slowest_rank is not None:
        title.append(f"  busiest rank {r.slowest_rank} ({_ms(r.slowest_busy_us)} ms a step)", style="yellow")
    t = Table(box=None, pad_edge=False, show_edge=False)
    t.add_column("rank", justify="right", width=6)
    t.add_column("step ms", justify="right", width=9)
    t.add_column("busy ms", justify="right", width=9)
    t.add_column(f"busy, last {SPARK_STEPS} steps", width=SPARK_STEPS + 2, no_wrap=True)
    t.add_column("", width=6)
    rows = _shown_ranks(r)
    top = max((b for row in r.ranks for b in row.busy_us[-SPARK_STEPS:] if b is not None), default=0)
    for row in rows:
        last_busy = next((b for b in reversed(row.busy_us) if b is not None), None)
        flag = Text("SLOW", style="bold red") if row.slow else Text("")
        t.add_row(str(row.rank), _ms(row.last_us), _ms(last_busy), Text(_spark(row.busy_us, top)), flag)
    parts: list[RenderableType] = [title, t]
    if len(r.ranks) > len(rows):
        parts.append(Text(f"  ({len(r.ranks) - len(rows)} more ranks not shown)", style="dim"))
    return Group(*parts)


def _detection(d: dict[str, Any]) -> Text:
    head = Text.assemble((f"step {d.get('step')} ", "bold"), (f"{visible(d.get('rule'))}: ", "red"))
    head.append(visible(d.get("message") or f"{d.get('role')} rank {d.get('rank')}"))
    if d.get("recorded") is False:
        head.append("  (seen by this view only: not recorded)", style="dim")
        return head
    finding = d.get("finding")
    captured = d.get("captured") or []
    if captured:
        head.append(f"\n    captured ranks {', '.join(map(str, captured))}", style="cyan")
    if isinstance(finding, dict):
        head.append(f"\n    finding {visible(finding.get('id'))}: ", style="green")
        head.append(visible(finding.get("claim") or ""))
    elif d.get("reason"):
        head.append(f"\n    no finding: {visible(d['reason'])}", style="dim")
    return head


def view(s: Snapshot, max_detections: int = 6) -> RenderableType:
    """The whole view of one snapshot."""
    parts: list[RenderableType] = []
    mode = "recording" if s.recording else "view only"
    totals = ", ".join(f"{k} {v}" for k, v in s.detections_total.items())
    parts.append(Text.assemble(("distprof watch ", "bold"), visible(s.run_dir), f"  ({mode})\n",
                               f"detections: {totals}; captures {s.captures_total}",
                               f", {len(s.pending)} waiting" if s.pending else ""))
    if not s.roles:
        parts.append(Text("no telemetry yet", style="dim"))
    for r in s.roles:
        parts.append(Text(""))
        parts.append(_role_table(r))
    if s.detections:
        parts.append(Text("\ndetections (newest last)", style="bold"))
        for d in s.detections[-max_detections:]:
            parts.append(_detection(d))
    for p in s.pending:
        parts.append(Text(f"capturing {visible(p['role'])} ranks {', '.join(map(str, p['ranks']))} for "
                          f"{visible(p['rule'])} at step {p['step']} (request {visible(p['request'])})", style="cyan"))
    for e in s.errors:
        parts.append(Text(f"cannot read {visible(e.get('path'))}: {visible(e.get('message'))}", style="red"))
    return Group(*parts)
