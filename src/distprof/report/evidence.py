"""Each finding's way into the evidence: the trace files of its ranks and steps, and its worst step drawn as
a timeline (ranks x time: phases, compute, collectives, waiting), the view one otherwise opens Perfetto for.

Trace files are linked relative to the report's folder when the report sits above them (``distprof report RUN``
writes ``RUN/report.html``), so the links still work when the folder is moved or archived; otherwise the
path is shown as text. A link's target is the file's relative path percent-encoded (``:`` included, so no
name can become a ``javascript:`` URL); the text shown is escaped by the page like every other string.

The timeline comes from :mod:`distprof.analysis.timeline` (one compact extract per file, read with the
rest); a finding names a role, ranks and steps (``evidence``), and its worst step is the one of its steps
where its first rank (the one holding the others back) cost the others the most waiting, else its longest.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import plotly.graph_objects as go

from distprof.analysis import timeline as timeline_mod
from distprof.analysis.diagnose import Finding
from distprof.analysis.investigation import Investigation
from distprof.analysis.records import StepRow
from distprof.report.base import fig, label, role_labels, short
from distprof.report.viewer import open_command
from distprof.rundir.layout import is_url

__all__ = [
    "MAX_RANKS",
    "MAX_TIMELINES",
    "Evidence",
    "TraceLink",
    "for_findings",
    "relative_href",
    "timeline_figure",
    "worst_step",
]

MAX_RANKS = 8
"""Ranks drawn in a finding's timeline: its own ranks first (the culprit, then the most affected)."""
MAX_FILES = 16
MAX_TIMELINES = 6
"""Findings (the costliest first) that get a timeline: the page stays a few hundred kB above the plots."""
PHASE_COLORS = ["#4C78A8", "#54A24B", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6", "#9D755D", "#2F6B9A",
                "#88B04B", "#C9A227"]
LANES = {  # (offset, width) inside a rank's row (y = the rank's index, the first at the top)
    "step": (-0.46, 0.92), "phase": (-0.40, 0.30), "compute": (-0.06, 0.14), "collective": (0.10, 0.14),
    "waiting": (0.26, 0.16)}


@dataclass
class TraceLink:
    rank: int | None
    steps: str
    path: str
    href: str | None  # relative, percent-encoded; None when the report does not sit above the file


@dataclass
class Evidence:
    """What the page shows under a finding."""
    files: list[TraceLink] = field(default_factory=list)
    more_files: int = 0
    timeline: go.Figure | None = None
    caption: str | None = None  # plain text: which step, why it is the worst, what the lanes are
    step: dict[str, Any] | None = None  # the step drawn: {"role", "step", "ranks"}
    open_command: str | None = None  # the shell command that opens these ranks and steps in Perfetto (viewer.py)


def relative_href(path: str, out: str | None) -> str | None:
    """``path`` as a link from the page ``out``: relative, percent-encoded (``:`` too); None when ``out`` does not sit
    above it (or either is a URL)."""
    if not out or is_url(path) or is_url(out):
        return None
    rel = os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(out)))
    if rel == os.pardir or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        return None
    return quote(rel.replace(os.sep, "/"), safe="/")


def _steps_text(info: Any) -> str:
    if info.steps:
        s = sorted(info.steps)
        return f"step {s[0]}" if len(s) == 1 else f"steps {s[0]}-{s[-1]}" if s == list(range(s[0], s[-1] + 1)) \
            else "steps " + ", ".join(map(str, s[:8])) + (" ..." if len(s) > 8 else "")
    if info.window:
        return f"steps {info.window[0]}-{info.window[1]}"
    return "no steps"


def _covers(info: Any, steps: list[Any]) -> bool:
    if not steps:
        return True
    for s in steps:
        if isinstance(s, (list, tuple)) and len(s) == 2:
            if info.window and list(info.window) == list(s):
                return True
            if any(s[0] <= n <= s[1] for n in info.steps):
                return True
        elif s in info.steps or (info.window and info.window[0] <= s <= info.window[1]):
            return True
    return False


def trace_links(inv: Investigation, f: Finding, out: str | None) -> tuple[list[TraceLink], int]:
    """The files of ``f``'s role and ranks holding its steps (its first ranks first), at most ``MAX_FILES``."""
    ev = f.evidence
    if not ev.ranks:
        return [], 0
    who = role_labels(r.info for r in inv.run.files)
    order = {r: i for i, r in enumerate(dict.fromkeys(ev.ranks))}
    hits = [r.info for r in inv.run.files if r.info.rank in order and _covers(r.info, ev.steps)
            and (ev.role is None or who.get(r.info.path) == ev.role or r.info.role == ev.role)]
    hits.sort(key=lambda i: (order[i.rank], i.steps[:1] or (i.window or [0])[:1], i.path))
    links = [TraceLink(i.rank, _steps_text(i), i.path, relative_href(i.path, out)) for i in hits[:MAX_FILES]]
    return links, max(len(hits) - MAX_FILES, 0)


def _same_step(row: StepRow, s: Any) -> bool:
    if isinstance(s, (list, tuple)):
        return row.window is not None and list(row.window) == list(s)
    return bool(row.step == s)


def worst_step(inv: Investigation, f: Finding) -> tuple[StepRow, str] | None:
    """The ``steps`` row of ``f``'s worst step and why it is: where ``f``'s first rank cost the others the most
    waiting, else the longest (on ``f``'s ranks). None for a finding with no rank and no step."""
    ev = f.evidence
    if not ev.ranks and not ev.steps:
        return None
    rows = [r for r in inv.steps.steps or [] if (r.role or None) == (ev.role or None)]
    if not rows and ev.role is None:
        rows = list(inv.steps.steps or [])
    if ev.steps:
        rows = [r for r in rows if any(_same_step(r, s) for s in ev.steps)]
    if not rows:
        return None
    mine = set(ev.ranks)

    def caused(row: StepRow) -> float:
        return next((x.wait_caused_us or 0.0 for x in row.ranks if ev.ranks and x.rank == ev.ranks[0]), 0.0)

    def longest(row: StepRow) -> float:
        return max((x.dur_us for x in row.ranks if not mine or x.rank in mine), default=0.0)

    row = max(rows, key=lambda r: (caused(r), longest(r)))
    name = _step_name(row)
    if caused(row) > 0:
        why = f"{name}, where rank {ev.ranks[0]} cost the others the most waiting ({_ms(caused(row))})"
    else:
        why = f"{name}, the longest of the finding's steps ({_ms(longest(row))})"
    return row, why


def _step_name(row: StepRow) -> str:
    return (f"steps {row.window[0]}-{row.window[1]}" if row.window else f"step {row.step}") \
        + (f" of {row.role}" if row.role else "")


def _ms(us: float) -> str:
    return f"{us:,.0f} µs" if us < 1000 else f"{us / 1000:,.1f} ms" if us < 1e6 else f"{us / 1e6:,.2f} s"


def shown_ranks(row: StepRow, f: Finding) -> list[int]:
    """The finding's ranks in this step (at most ``MAX_RANKS``); a finding of one rank gets, for contrast, the rank
    that waited most in the step (else the shortest step)."""
    ev = f.evidence
    present = [x.rank for x in row.ranks if x.rank is not None]
    shown = [r for r in dict.fromkeys(ev.ranks) if r in present][:MAX_RANKS]
    rest = [x for x in row.ranks if x.rank is not None and x.rank not in shown]
    if not shown and row.slowest_rank in present:
        shown = [row.slowest_rank]
        rest = [x for x in rest if x.rank != row.slowest_rank]
    if len(shown) < 2 and rest:
        shown.append(max(rest, key=lambda x: (x.waited_us or 0.0, -x.dur_us, -x.rank)).rank)
    return shown


def timeline_figure(tl: timeline_mod.StepTimeline, title: str) -> go.Figure:
    """Ranks (rows, in ``tl``'s order, the first at the top) x time (ms from the earliest rank's step start)."""
    t0 = tl.start_us
    n = len(tl.ranks)
    totals: dict[str, float] = {}
    for r in tl.ranks:
        for name, a, b in r.phases:
            totals[name] = totals.get(name, 0.0) + (b - a)
    top = sorted(totals, key=lambda k: (-totals[k], k))[:len(PHASE_COLORS)]
    items = len(top) + (len(totals) > len(top)) + 4  # legend entries: phases, step, compute, collective, waiting
    f = fig(label(title), height=int(max(130 + 56 * n, 110 + 20 * items)), barmode="overlay", showlegend=True,
            xaxis={"title": "ms from the step's start (earliest rank)", "zeroline": False},
            yaxis={"tickvals": list(range(n)), "ticktext": [label(f"rank {r.rank}") for r in tl.ranks],
                   "autorange": "reversed", "range": [n - 0.5, -0.5], "showgrid": False, "zeroline": False},
            legend={"traceorder": "normal"}, margin={"l": 70, "r": 20, "t": 50, "b": 50})

    def ms(v: float) -> float:
        return round((v - t0) / 1000, 3)

    def bars(lane: str, spans: list[tuple[int, float, float]], name: str, color: str, hover: str,
             custom: list | None = None, opacity: float = 1.0, meta: str | None = None) -> None:
        if not spans:
            return
        off, width = LANES[lane]
        f.add_trace(go.Bar(
            orientation="h", y=[i for i, _, _ in spans], base=[ms(a) for _, a, _ in spans],
            x=[round((b - a) / 1000, 3) for _, a, b in spans], offset=off, width=width, name=name,
            marker={"color": color, "line": {"width": 0}}, opacity=opacity, customdata=custom, meta=meta,
            hovertemplate=hover + "<extra></extra>"))

    span = "%{x:.2f} ms from %{base:.2f} ms"
    bars("step", [(i, r.start_us, r.end_us) for i, r in enumerate(tl.ranks)], "step", "#EFEFEF",
         f"%{{y}}: its step, {span}", opacity=1.0)
    for k, name in enumerate(top):
        bars("phase", [(i, a, b) for i, r in enumerate(tl.ranks) for nm, a, b in r.phases if nm == name],
             label(short(name)), PHASE_COLORS[k], f"%{{meta}}<br>{span}", meta=label(name))  # (no name is a template)
    bars("phase", [(i, a, b) for i, r in enumerate(tl.ranks) for nm, a, b in r.phases if nm not in top],
         "other phases", "#D9D9D9", f"another phase<br>{span}")
    bars("compute", [(i, a, b) for i, r in enumerate(tl.ranks) for a, b in r.compute], "compute", "#555555",
         f"compute<br>{span}")
    coll = [(i, nm, a, b) for i, r in enumerate(tl.ranks) for nm, a, b in r.collectives]
    bars("collective", [(i, a, b) for i, _, a, b in coll], "collective", "#F58518", f"%{{customdata}}<br>{span}",
         custom=[label(nm) for _, nm, _, _ in coll])
    wait = [(i, c, a, b) for i, r in enumerate(tl.ranks) for c, a, b in r.waiting]
    bars("waiting", [(i, a, b) for i, _, a, b in wait], "waiting for a later rank", "#D62728",
         f"waiting for rank %{{customdata}}<br>{span}", custom=[c for _, c, _, _ in wait])
    return f


def for_findings(inv: Investigation, findings: list[Finding], out: str | None = None) -> list[Evidence]:
    """One :class:`Evidence` per finding, in order. Timelines only for the first ``MAX_TIMELINES`` findings that name
    ranks or steps, and only when ``inv`` was read with the ``timeline`` extract."""
    out_ev = []
    drawn = 0
    has_timeline = inv.has_timelines
    for f in findings:
        ev = Evidence()
        ev.files, ev.more_files = trace_links(inv, f, out)
        if ev.files:  # one file: open it; several: archive the finding's ranks and steps, then open that
            ev.open_command = open_command(ev.files[0].path) if len(ev.files) == 1 else open_command(
                inv.path, f.evidence.ranks, f.evidence.steps, f.evidence.role, out=f"{f.id}.tar")
        picked = worst_step(inv, f) if has_timeline and drawn < MAX_TIMELINES else None
        if picked is not None:
            row, why = picked
            ranks = shown_ranks(row, f)
            step = row.window if row.window else row.step
            tl = inv.step_timeline(row.role, step, ranks)
            if tl is not None:
                drawn += 1
                ev.step = {"role": row.role, "step": step, "ranks": [r.rank for r in tl.ranks]}
                ev.timeline = timeline_figure(tl, f"Worst step: {_step_name(row)}")
                shown = ", ".join(str(r.rank) for r in tl.ranks)
                ev.caption = (f"The finding's worst step: {why}. One row per rank ({shown}): "
                              "its step (grey), its top-level phases, compute, collectives, and the time it was "
                              "blocked in a collective waiting for a later rank (red; the hover names that rank). "
                              f"Drawn to within 1/{timeline_mod.RESOLUTION} of the step: closer intervals are merged.")
        out_ev.append(ev)
    return out_ev
