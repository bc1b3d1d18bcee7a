"""The report's plots: one :class:`Section` per :class:`~distprof.analysis.diagnose.Plot` id, made with plotly.py
from the figures an :class:`~distprof.analysis.analyze.Investigation` already holds (nothing is recomputed
from events, and no event is embedded: every plot is per rank, per step or per name, so its size grows
with ranks x steps, never with the trace). Top kernels and ops are in :mod:`.tops`, the findings' own
evidence (trace links, the worst step's timeline) in :mod:`.evidence`.

Every string that comes from a trace goes through :func:`.base.label` before it reaches plotly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

import plotly.graph_objects as go

from distprof.analysis.analyze import Investigation
from distprof.analysis.diagnose import Plot
from distprof.analysis.records import (
    CommOverlap,
    DeviceTime,
    FileFacts,
    HostTime,
    IdleFigure,
    LaunchFigure,
    RankStep,
    StepRow,
    StepsResult,
    StragglersResult,
    SummaryRank,
    SummaryResult,
    WaitPair,
)
from distprof.analysis.records_diag import DiffResult, DiffRow
from distprof.report import memplot, rltimeline, tops
from distprof.report.base import Section, label
from distprof.report.base import by_role as _roles
from distprof.report.base import fig as _fig
from distprof.report.base import height as _height
from distprof.report.base import rank_name as _rank_name
from distprof.report.base import short as _short

__all__ = ["MATRIX_MAX_RANKS", "STEP_VIEWS", "Section", "diff_section", "label", "sections"]

MATRIX_MAX_RANKS = 64
"""Above this many ranks in a role the wait matrix keeps the ``MATRIX_TOP`` ranks that caused and that
suffered the most waiting, and sums every other rank into an "others" row and column."""
MATRIX_TOP = 24
TOP_NAMES = tops.TOP_NAMES  # bars in the diff plot
TOP_PHASES = 10  # phases stacked per role; the rest are summed as "other phases"


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def _fmt_ms(us: float) -> str:
    return f"{us:,.0f} µs" if us < 1000 else f"{us / 1000:,.1f} ms"


# ---- step time ------------------------------------------------------------------------------------------
STEP_VIEWS = (("duration", "dur_us"), ("busy", "busy_us"), ("waited", "waited_us"))
"""The step-time heatmap's buttons, in order."""
_PREFER = ("busy_us", "waited_us", "dur_us")  # between views that differ about as much across ranks


def opening_view(z: dict[str, list[list[float | None]]]) -> tuple[str, dict[str, float]]:
    """Which view the heatmap opens on: the one whose values differ most between the ranks of one step
    (``spread``: the largest max - min over the ranks of a step, in µs), preferring busy to waited to duration
    within 10% of the largest. In a synchronous job every rank's duration is about the same (the ranks ahead
    wait for the one behind), so duration alone hides the rank that holds the others back. With one rank (no
    spread) it opens on duration."""
    spread = {}
    for key, grid in z.items():
        cols = zip(*grid, strict=True) if grid else ()
        spread[key] = max((max(v) - min(v) for col in cols if (v := [x for x in col if x is not None])), default=0.0)
    best = max(spread.values(), default=0.0)
    if best <= 0:
        return "dur_us", spread
    return next(k for k in _PREFER if spread.get(k, 0.0) >= 0.9 * best), spread


_Grid = dict[str, list[list[float | None]]]  # view ("dur_us" ...) -> rows (ranks) x columns (steps), ms


def _rank_key(x: RankStep) -> tuple[int, str]:
    """A rank's place on a step-time axis: its number, or a file without a rank by its path (first)."""
    return (-1 if x.rank is None else x.rank, x.path if x.rank is None else "")


def _step_grid(role_rows: list[StepRow]) -> tuple[list[str], list[str], _Grid]:
    """One role's heatmap: its step labels (x), rank names (y) and each view's grid of ms."""
    step_keys = [r.step if not r.window else tuple(r.window) for r in role_rows]
    step_labels = [str(k) if not isinstance(k, tuple) else f"{k[0]}-{k[1]}" for k in step_keys]
    order = sorted({_rank_key(x) for r in role_rows for x in r.ranks})
    at = {k: i for i, k in enumerate(order)}
    names = [label(_rank_name(None, None if k[0] < 0 else k[0], k[1], bare=True)) for k in order]
    n, m = len(order), len(role_rows)
    z: _Grid = {key: [[None] * m for _ in range(n)] for key in ("dur_us", "busy_us", "waited_us")}
    for j, r in enumerate(role_rows):
        for x in r.ranks:
            i = at[_rank_key(x)]
            ms = {"dur_us": x.dur_us, "busy_us": x.busy_us, "waited_us": x.waited_us}
            for key, grid in z.items():
                grid[i][j] = round(ms[key] / 1000.0, 3)
    return step_labels, names, z


def _opening_why(role: str | None, first: str, spread: dict[str, float], n: int) -> str:
    """The caption's words on why a role's heatmap opens on ``first``."""
    view = dict((k, v) for v, k in STEP_VIEWS)[first]
    who = role if role else "all ranks"  # (the caption is plain text, escaped by the page)
    if first == "dur_us" and n < 2:
        return f"{who}: one rank, so it opens on duration"
    return (f"{who} opens on {view}: ranks differ by up to {spread[first]:,.1f} ms in a step "
            + (f"(duration by up to {spread['dur_us']:,.1f} ms)" if first != "dur_us" else
               f"(busy by up to {spread['busy_us']:,.1f} ms)"))


def _step_heatmap(role: str | None, step_labels: list[str], names: list[str], z: _Grid, first: str) -> go.Figure:
    # The buttons sit at the top left, under the title, away from plotly's toolbar (top right).
    fig = _fig(f"Step time, {label(role)}" if role else "Step time", height=_height(len(names), 14) + 40,
               xaxis={"title": "step", "type": "category"},
               yaxis={"title": "rank", "type": "category", "autorange": "reversed"},
               margin={"l": 60, "r": 20, "t": 100, "b": 50})
    hover = "rank %{y}<br>step %{x}<br>%{z:.2f} ms<extra></extra>"
    fig.add_trace(go.Heatmap(z=z[first], x=step_labels, y=names, colorscale="Viridis",
                             colorbar={"title": "ms"}, hovertemplate=hover, hoverongaps=False))
    fig.update_layout(updatemenus=[{
        "type": "buttons", "direction": "right", "x": 0, "xanchor": "left", "y": 1, "yanchor": "bottom",
        "pad": {"b": 8}, "active": [k for _, k in STEP_VIEWS].index(first), "showactive": True,
        "buttons": [{"label": lab, "method": "restyle", "args": [{"z": [z[key]]}]} for lab, key in STEP_VIEWS]}])
    return fig


def step_time(steps: StepsResult) -> Section:
    s = Section(Plot.STEP_TIME, "Step time per rank and step",
                "Each cell is one rank's step (ProfilerStep, or a capture window): from the buttons its duration, "
                "its time blocked in collectives waiting for peers (waited) and the rest (busy = duration - "
                "waited). In a synchronous job every rank's step lasts about as long, because the ranks ahead wait "
                "for the one behind: the rank holding the others back shows the most busy time and the least "
                "waiting. So each heatmap (one per role) opens on the view whose values differ most between the "
                "ranks of a step")
    rows = steps.steps or []
    if not rows:
        s.caption += "."
        s.note = "No steps in these traces (no ProfilerStep#N ranges and no run-directory capture windows)."
        return s
    why = []
    for role, role_rows in _roles(rows).items():
        step_labels, names, z = _step_grid(role_rows)
        first, spread = opening_view(z)
        why.append(_opening_why(role, first, spread, len(names)))
        s.figures.append(_step_heatmap(role, step_labels, names, z, first))
    s.caption += ": " + "; ".join(why) + "."
    return s


# ---- phases ---------------------------------------------------------------------------------------------
_PhaseTimes = dict[tuple, dict[str, float]]  # (role, rank or -1, path of a file without a rank) -> phase -> µs


def _phase_times(steps: StepsResult, files: Iterable[FileFacts]) -> tuple[_PhaseTimes, _PhaseTimes]:
    """Each rank's phases' self and wall time, its files summed, keyed by its role as ``steps`` names it."""
    # A file's role label ("actor", or "actor (run 2)" when ranks of different runs share a folder) as steps has it.
    who: dict[str, tuple[str | None, int | None]] = {}
    for r in steps.steps:
        for x in r.ranks:
            who[x.path] = (r.role, x.rank)
    self_us: _PhaseTimes = defaultdict(lambda: defaultdict(float))
    wall_us: _PhaseTimes = defaultdict(lambda: defaultdict(float))
    for f in files:
        role, rank = who.get(f.path, (f.role, f.rank))
        key = (role, -1 if rank is None else rank, "" if rank is not None else f.path)
        for name, (_count, _total, wall, self_) in f.phases.items():
            self_us[key][name] += self_
            wall_us[key][name] += wall
    return self_us, wall_us


def _phase_figure(role: str | None, keys: list[tuple], self_us: _PhaseTimes, wall_us: _PhaseTimes) -> go.Figure:
    """One role's stacked bars: its ``TOP_PHASES`` largest phases per rank, the rest as "other phases"."""
    totals: dict[str, float] = defaultdict(float)
    for k in keys:
        for name, v in self_us[k].items():
            totals[name] += v
    top = [n for n, v in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])) if v > 0][:TOP_PHASES]
    x = [label(_rank_name(None, None if k[1] < 0 else k[1], k[2], bare=True)) for k in keys]
    fig = _fig(f"Phases (self time), {label(role)}" if role else "Phases (self time)",
               height=460, barmode="stack", xaxis={"title": "rank", "type": "category"},
               yaxis={"title": "ms"}, legend={"title": {"text": "phase"}},
               showlegend=True)  # plotly hides the legend of a single trace: a role of one phase names it too
    for name in top:
        fig.add_trace(go.Bar(
            x=x, y=[round(self_us[k].get(name, 0.0) / 1000, 3) for k in keys], name=label(_short(name)),
            # The name once per figure (meta), not once per rank: the page must not grow as name length x ranks.
            meta=label(name), customdata=[round(wall_us[k].get(name, 0.0) / 1000, 3) for k in keys],
            hovertemplate="%{meta}<br>rank %{x}<br>self %{y:.2f} ms, wall %{customdata:.2f} ms"
                          "<extra></extra>"))
    rest = [sum(v for n, v in self_us[k].items() if n not in top) / 1000 for k in keys]
    if any(rest):
        fig.add_trace(go.Bar(x=x, y=[round(v, 3) for v in rest], name="other phases", marker_color="#D9D9D9",
                             hovertemplate="other phases<br>rank %{x}<br>self %{y:.2f} ms<extra></extra>"))
    return fig


def phases(steps: StepsResult, files: Iterable[FileFacts]) -> Section:
    """``files``: each file's facts, whose ``phases`` hold each phase's self time on that file."""
    s = Section(Plot.PHASES, "Phase breakdown per role",
                "Per rank, the time each phase (record_function / distprof.annotate range) was the innermost open "
                "annotation of its thread (self time, summed over the analysed time), so the segments add up "
                "without counting a nested phase twice. The hover also gives the phase's wall time (the time it "
                "was open). The largest phases of each role are shown, the rest summed as \"other phases\".")
    self_us, wall_us = _phase_times(steps, files)
    if not any(v for v in self_us.values()):
        s.note = ("No phases: these traces have no user annotations (torch.profiler.record_function or "
                  "distprof.annotate).")
        return s
    by_role: dict[str | None, list[tuple]] = defaultdict(list)
    for key in sorted(self_us, key=lambda k: (k[0] or "", k[1], k[2])):
        by_role[key[0]].append(key)
    s.figures = [_phase_figure(role, keys, self_us, wall_us) for role, keys in by_role.items()]
    return s


# ---- per-rank figures from summary ---------------------------------------------------------------------------
def _rank_axis(ranks: list[SummaryRank]) -> list[str]:
    return [label(_rank_name(r.role, r.rank, r.path)) for r in ranks]


def _device(r: SummaryRank) -> DeviceTime | None:
    return r.temporal.device if r.temporal else None


def _host(r: SummaryRank) -> HostTime | None:
    return r.temporal.host if r.temporal else None


def _has_device(r: SummaryRank) -> bool:
    return bool((d := _device(r)) is not None and d.span_us)


HOST_PARTS = (("compute", "compute", "#4C78A8"), ("communication", "communication", "#E45756"),
              ("in_phases", "in annotated phases (no ops traced)", "#F58518"), ("idle", "idle", "#BAB0AC"))
DEVICE_PARTS = (("compute", "compute", "#4C78A8"), ("communication", "communication", "#E45756"),
                ("memory", "memory", "#EECA3B"), ("idle", "idle", "#BAB0AC"))


def _host_parts(t: HostTime) -> dict[str, tuple[float, float]]:
    """A rank's host figures as the plot's parts, (share, µs) each: idle less the time inside annotated phases."""
    ph, ph_us = t.in_phases_share or 0.0, t.in_phases_us or 0.0
    return {"compute": (t.compute_share or 0.0, t.compute_us),
            "communication": (t.communication_share or 0.0, t.communication_us),
            "in_phases": (ph, ph_us),
            "idle": (max((t.idle_share or 0.0) - ph, 0.0), max(t.idle_us - ph_us, 0.0))}


def _device_parts(d: DeviceTime) -> dict[str, tuple[float, float]]:
    """A rank's device figures as the plot's parts, (share, µs) each."""
    return {"compute": (d.compute_share or 0.0, d.compute_us),
            "communication": (d.communication_share or 0.0, d.communication_us),
            "memory": (d.memory_share or 0.0, d.memory_us), "idle": (d.idle_share or 0.0, d.idle_us)}


def temporal(summary: SummaryResult) -> Section:
    s = Section(Plot.TEMPORAL, "Temporal breakdown per rank",
                "Where each rank's time goes (HTA's temporal breakdown). Device: over the device span, compute "
                "(a compute kernel runs), exposed communication (a collective runs and no compute does), memory "
                "(memcpy/memset only) and idle (nothing runs). Host, for ranks without device events (CPU-only "
                "jobs): compute (a CPU op runs outside communication threads), communication (a collective runs "
                "and no compute: on gloo, waiting for peers), in annotated phases (no op runs but a "
                "record_function / distprof.annotate phase is open: the rank is busy in code that runs no traced "
                "op, such as Python, a C extension, I/O or a sleep) and idle (no op and no phase).")
    ranks = summary.ranks or []
    dev = [r for r in ranks if _has_device(r)]
    host = [r for r in ranks if not _has_device(r) and (h := _host(r)) is not None and h.span_us]
    for kind, rows, parts in (("device", dev, DEVICE_PARTS), ("host", host, HOST_PARTS)):
        if not rows:
            continue
        x = _rank_axis(rows)
        fig = _fig(f"{kind.capitalize()} time per rank", height=440, barmode="stack", showlegend=True,
                   xaxis={"title": "rank", "type": "category"}, yaxis={"title": "share of span", "tickformat": ".0%"})
        if kind == "host":
            vals = [_host_parts(h) for r in rows if (h := _host(r)) is not None]
        else:
            vals = [_device_parts(d) for r in rows if (d := _device(r)) is not None]
        for part, name, color in parts:
            fig.add_trace(go.Bar(
                x=x, y=[v[part][0] for v in vals], name=name, marker_color=color,
                customdata=[round(v[part][1] / 1000, 3) for v in vals],
                hovertemplate=f"{name}<br>%{{x}}<br>%{{y:.1%}} of span, %{{customdata:.2f}} ms<extra></extra>"))
        s.figures.append(fig)
    if not s.figures:
        s.note = "No rank has a traced span (no events inside the selection)."
    return s


def _communicating(summary: SummaryResult) -> tuple[list[SummaryRank], list[str], list[CommOverlap]]:
    """The ranks that communicate, where ("device": collective kernels, else "host"), and their overlap figures."""
    rows, kinds, figs = [], [], []
    for r in summary.ranks or []:
        if not r.overlap:
            continue
        for kind, fig in (("device", r.overlap.device), ("host", r.overlap.host)):
            if fig is not None and fig.communication_us:
                rows.append(r)
                kinds.append(kind)
                figs.append(fig)
                break
    return rows, kinds, figs


def _no_overlap_note(rows: list[SummaryRank], kinds: list[str], ov: list[CommOverlap]) -> str:
    """Why nothing overlaps: no compute traced at all, or compute and collectives taking turns."""
    comm = sum(o.communication_us for o in ov)
    figs = [_device(r) if k == "device" else _host(r) for r, k in zip(rows, kinds, strict=True)]
    computes = [f.compute_us if f is not None else 0.0 for f in figs]
    why = ("these ranks trace no compute at all" if not any(computes) else
           "compute and collectives take turns: no compute runs while a collective does"
           + (" (on gloo the calling thread waits for each collective; gloo runs it on threads of its own)"
              if "host" in kinds else ""))
    return (f"Nothing overlaps: {_fmt_ms(comm)} of communication on {len(rows)} rank"
            f"{'s' if len(rows) != 1 else ''}, none of it while computing, because {why}.")


def _overlap_figure(rows: list[SummaryRank], kinds: list[str], ov: list[CommOverlap]) -> go.Figure:
    fig = _fig("Communication overlapped by compute", height=420, barmode="stack", showlegend=True,
               xaxis={"title": "rank", "type": "category"},
               yaxis={"title": "share of communication time", "tickformat": ".0%", "range": [0, 1]})
    custom = [[k, round(o.communication_us / 1000, 3), round(o.overlapped_us / 1000, 3)]
              for o, k in zip(ov, kinds, strict=True)]
    share = [min(max(o.share or 0.0, 0.0), 1.0) for o in ov]
    x = _rank_axis(rows)
    for name, y, color in (("overlapped", share, "#54A24B"), ("not overlapped", [1 - v for v in share], "#E45756")):
        fig.add_trace(go.Bar(
            x=x, y=y, marker_color=color, name=name, customdata=custom,
            hovertemplate=f"%{{x}} (%{{customdata[0]}})<br>{name} %{{y:.1%}}<br>communication %{{customdata[1]:.2f}} "
                          "ms, overlapped %{customdata[2]:.2f} ms<extra></extra>"))
    return fig


def overlap(summary: SummaryResult) -> Section:
    s = Section(Plot.OVERLAP, "Communication overlapped by compute, per rank",
                "Of the time a rank communicates, the share during which it also computes (green; HTA's "
                "comm/compute overlap: device kernels, else host collectives against CPU ops on CPU-only ranks) "
                "and the share it does not (red). Green is better: communication that overlaps compute costs no "
                "step time. A collective kernel spins while it waits for late peers, so a low share on a rank "
                "that waits (see who waits for whom) is that wait.")
    rows, kinds, ov = _communicating(summary)
    if not rows:
        s.note = ("No communication in these traces (no collective kernels and no host collectives), so nothing "
                  "to overlap.")
        return s
    if not any(o.overlapped_us for o in ov):
        s.note = _no_overlap_note(rows, kinds, ov)
    s.figures.append(_overlap_figure(rows, kinds, ov))
    return s


def _idle(r: SummaryRank) -> IdleFigure | None:
    return r.idle if isinstance(r.idle, IdleFigure) else None


def _launch(r: SummaryRank) -> LaunchFigure | None:
    return r.launch if isinstance(r.launch, LaunchFigure) else None


def idle(summary: SummaryResult) -> Section:
    s = Section(Plot.IDLE, "Device idle by cause, and kernel launches",
                "Top: each rank's device idle time split by cause (HTA's idle time breakdown): host wait (the "
                "stream ran out of work and waited for the CPU to launch more), kernel wait (gaps under 30 µs "
                "between queued kernels) and other (waiting for another stream, a peer or a sync). Bottom: launch "
                "delay (device start minus the end of the launch call) per rank, p50 and p95 on a log scale (a typical "
                "launch waits a few µs, the slow ones hundreds: on a linear scale p50 would not show), and the share "
                "of short launches (device time below the call's own time); ranks with launch-bound steps are marked "
                "above their p95.")
    rows = [(r, f) for r in summary.ranks or [] if (f := _idle(r)) is not None]
    if not rows:
        s.note = "Not applicable: these traces have no device events (a CPU-only job), so there is no device idle time."
        return s
    x = _rank_axis([r for r, _ in rows])
    fig = _fig("Device idle by cause", height=420, barmode="stack", showlegend=True,
               xaxis={"title": "rank", "type": "category"},
               yaxis={"title": "ms"})
    causes = (("host_wait", "#E45756", [f.host_wait_us for _, f in rows]),
              ("kernel_wait", "#EECA3B", [f.kernel_wait_us for _, f in rows]),
              ("other", "#BAB0AC", [f.other_us for _, f in rows]))
    for part, color, values in causes:
        fig.add_trace(go.Bar(
            x=x, y=[round(v / 1000, 3) for v in values], name=part.replace("_", " "),
            marker_color=color, customdata=[f.idle_share or 0.0 for _, f in rows],
            hovertemplate=f"{part.replace('_', ' ')}<br>%{{x}}<br>%{{y:.2f}} ms "
                          f"(device idle %{{customdata:.1%}} of span)<extra></extra>"))
    s.figures.append(fig)
    lrows = [(r, la) for r, _ in rows if (la := _launch(r)) is not None and la.launches]
    if lrows:
        s.figures.append(_launch_delay(lrows))
    return s


def _launch_delay(lrows: list[tuple[SummaryRank, LaunchFigure]]) -> go.Figure:
    """Launch delay per rank, p50 and p95 on a log scale; launch-bound ranks marked above their p95."""
    lx = _rank_axis([r for r, _ in lrows])
    # p50 is often a few µs and p95 hundreds: on a linear axis p50 is a bar no one can see. A log axis with
    # a marker per quantile, joined by a line per rank, keeps both readable whatever their ratio (a
    # delay <= 0, clock skew between host and device, is drawn at the axis floor; the hover has its value).
    custom = [[la.launches, la.short_share or 0.0,
               "launch-bound in steps " + ", ".join(map(str, la.launch_bound_steps))
               if la.launch_bound_steps else "not launch-bound"] for _, la in lrows]
    q = {"p50": [la.delay_us.p50 for _, la in lrows], "p95": [la.delay_us.p95 for _, la in lrows]}
    pos = [v for k in q for v in q[k] if v > 0]
    floor = min(pos) / 2 if pos else 0.1

    def shown(v: float) -> float:
        return v if v > 0 else floor

    top = max([shown(v) for v in q["p95"]] + [floor])
    fig = _fig("Kernel launch delay (log scale)", height=400, showlegend=True,
               xaxis={"title": "rank", "type": "category"},
               yaxis={"title": "µs", "type": "log", "dtick": 1,  # one tick per decade
                      "range": [math.log10(floor / 2), math.log10(top * 3)]})

    link_x, link_y = [], []
    for i, name in enumerate(lx):
        link_x += [name, name, None]
        link_y += [shown(q["p50"][i]), shown(q["p95"][i]), None]
    fig.add_trace(go.Scatter(x=link_x, y=link_y, mode="lines", line={"color": "#BBBBBB", "width": 2},
                             hoverinfo="skip", showlegend=False))
    for k, color, symbol in (("p50", "#4C78A8", "circle"), ("p95", "#F58518", "diamond")):
        fig.add_trace(go.Scatter(
            x=lx, y=[shown(v) for v in q[k]], mode="markers", name=f"delay {k}",
            marker={"color": color, "symbol": symbol, "size": 10},
            customdata=[[*c, v] for c, v in zip(custom, q[k], strict=True)],
            hovertemplate=f"%{{x}}<br>delay {k} %{{customdata[3]:.1f}} µs<br>%{{customdata[0]}} launches, "
                          "%{customdata[1]:.0%} short<br>%{customdata[2]}<extra></extra>"))
    bound = [i for i, (_, la) in enumerate(lrows) if la.launch_bound_steps]
    if bound:
        fig.add_trace(go.Scatter(x=[lx[i] for i in bound], y=[shown(q["p95"][i]) * 1.6 for i in bound],
                                 mode="markers", name="launch-bound", marker={"symbol": "triangle-down", "size": 9,
                                                                             "color": "#222"},
                                 hovertemplate="%{x}: launch-bound<extra></extra>"))
    return fig


# ---- who waits for whom ---------------------------------------------------------------------------------
def waits(stragglers: StragglersResult) -> Section:
    s = Section(Plot.WAITS, "Who waits for whom",
                "Each cell is the time a rank (row) spent blocked in collectives waiting for another rank (column) "
                "to arrive, summed over the analysed steps; each blocked instant is charged once, to the last "
                "arrival of the oldest collective blocking it (as stragglers measures it). A bright column is a "
                f"rank that holds the others back. Roles with more than {MATRIX_MAX_RANKS} ranks show the "
                f"{MATRIX_TOP} ranks that caused and that suffered the most waiting; every other rank is summed "
                "into \"others\".")
    cells = [c for c in stragglers.wait_matrix or [] if c.wait_us]
    if not cells:
        why = "only one rank" if len({(w.role, w.rank) for w in stragglers.waits or []}) < 2 \
            else "no rank waited for another"
        s.note = (f"Nothing to show: {why} in these traces (waiting is measured at collectives matched across "
                  "the ranks of a role).")
        return s
    s.figures = [_waits_figure(role, rows) for role, rows in _roles(cells).items()]
    return s


def _matrix_ranks(rows: list[WaitPair]) -> tuple[list[int], list[int], dict[int, float], dict[int, float]]:
    """The matrix's columns (culprits) and rows (waiters): every rank, or above ``MATRIX_MAX_RANKS`` the
    ``MATRIX_TOP`` that caused and that suffered the most waiting; and the waiting each caused and suffered."""
    caused: dict[int, float] = defaultdict(float)
    suffered: dict[int, float] = defaultdict(float)
    for c in rows:
        caused[c.culprit] += c.wait_us
        suffered[c.waiter] += c.wait_us
    ranks = set(caused) | set(suffered)
    if len(ranks) > MATRIX_MAX_RANKS:
        cols = sorted(sorted(caused, key=lambda r: (-caused[r], r))[:MATRIX_TOP])
        rws = sorted(sorted(suffered, key=lambda r: (-suffered[r], r))[:MATRIX_TOP])
    else:
        cols = rws = sorted(ranks)
    return cols, rws, caused, suffered


def _wait_matrix(rows: list[WaitPair]) -> tuple[list[str], list[str], list[list[float | None]]]:
    """One role's heatmap: culprit labels (x), waiter labels (y), ms waited (None: none), the ranks left out
    summed into an "others" row and column."""
    cols, rws, caused, suffered = _matrix_ranks(rows)
    ci = {r: i for i, r in enumerate(cols)}
    ri = {r: i for i, r in enumerate(rws)}
    others_c = others_r = False
    grid = [[0.0] * (len(cols) + 1) for _ in range(len(rws) + 1)]
    for c in rows:
        i, j = ri.get(c.waiter, len(rws)), ci.get(c.culprit, len(cols))
        others_r |= i == len(rws)
        others_c |= j == len(cols)
        grid[i][j] += c.wait_us / 1000
    if not others_r:
        grid.pop()
    if not others_c:
        for g in grid:
            g.pop()
    y = [str(r) for r in rws] + ([f"others ({len(suffered) - len(rws)})"] if others_r else [])
    x = [str(r) for r in cols] + ([f"others ({len(caused) - len(cols)})"] if others_c else [])
    return x, y, [[round(v, 3) if v else None for v in g] for g in grid]


def _waits_figure(role: str | None, rows: list[WaitPair]) -> go.Figure:
    x, y, z = _wait_matrix(rows)
    fig = _fig(f"Who waits for whom, {label(role)}" if role else "Who waits for whom",
               height=_height(len(y), 18, 360, 820),
               xaxis={"title": "waited for (culprit rank)", "type": "category", "side": "bottom"},
               yaxis={"title": "waiter rank", "type": "category", "autorange": "reversed"})
    fig.add_trace(go.Heatmap(z=z, x=x, y=y, colorscale="Reds", colorbar={"title": "ms"}, hoverongaps=False,
                             hovertemplate="rank %{y} waited %{z:.2f} ms for rank %{x}<extra></extra>"))
    return fig


# ---- run-to-run diff ----------------------------------------------------------------------------------
def diff_section(d: DiffResult | None, a: str = "", b: str = "") -> Section:
    """The ``--compare`` plot from :func:`distprof.analysis.diff.compare`'s result (A: this run, B: the other)."""
    s = Section(Plot.DIFF, "Run-to-run diff",
                f"What changed from this run (A) to the compared run (B), the {TOP_NAMES} largest changes: kernels "
                "by summed duration, CPU ops by self time, phases by wall time, device categories by time. Red: "
                "slower in B; green: faster.")
    if d is None:
        s.note = "Not requested: give --compare OTHER (library: compare=OTHER) to compare this run with another."
        return s
    per_step = d.compares == "per_step"  # as `distprof diff`: means per step and rank, else totals

    def figs(r: DiffRow) -> tuple[float, float, float]:
        """A's time, B's and the change: per step (a diff comparing per step has them for every row) or in total."""
        if per_step:
            return r.a_per_step_us or 0.0, r.b_per_step_us or 0.0, r.change_per_step_us or 0.0
        return r.a_us, r.b_us, r.change_us

    s.caption += (" Compared per step (each side's time divided by its steps and ranks), so runs profiled for "
                  "different numbers of steps compare fairly." if per_step else
                  " Compared in total: a side has traces without steps (see the warnings).")
    rows = [(r, *figs(r)) for r in d.rows if figs(r)[2]][:TOP_NAMES]
    if not rows:
        s.note = "No difference: both runs have the same kernels, ops, phases and categories with the same times."
        return s
    y = [label(f"{i}. {r.kind}: {_short(r.name)}") for i, (r, *_) in enumerate(rows, 1)]
    unit = "ms per step" if per_step else "ms"
    fig = _fig(f"B minus A: {label(_short(b))} vs {label(_short(a))}", height=_height(len(rows), 24, 320, 720),
               xaxis={"title": f"change ({unit})"}, yaxis={"type": "category", "autorange": "reversed"},
               margin={"l": 20, "r": 20, "t": 50, "b": 50})
    fig.add_trace(go.Bar(
        x=[round(c / 1000, 3) for *_, c in rows], y=y, orientation="h",
        marker_color=["#E45756" if c > 0 else "#54A24B" for *_, c in rows],
        customdata=[[label(r.kind), label(r.name), round(ta / 1000, 3), round(tb / 1000, 3),
                     "" if r.ratio is None else f"x{r.ratio:.2f}", r.a_count, r.b_count] for r, ta, tb, _ in rows],
        hovertemplate="%{customdata[0]}: %{customdata[1]}<br>A %{customdata[2]:.2f} " + unit + " (%{customdata[5]}), "
                      "B %{customdata[3]:.2f} " + unit + " (%{customdata[6]})<br>change %{x:+.2f} " + unit +
                      " %{customdata[4]}<extra></extra>"))
    s.figures.append(fig)
    return s


def sections(inv: Investigation, diff: DiffResult | None = None, a: str = "", b: str = "") -> list[Section]:
    """Every plot of the report, in :attr:`Plot.ALL` order (memory over time only with memory data, the diff only
    with ``diff``)."""
    out = [step_time(inv.steps), phases(inv.steps, inv.files),
           temporal(inv.summary), overlap(inv.summary), waits(inv.stragglers),
           tops.kernels(inv), tops.ops(inv), idle(inv.summary), rltimeline.rl_timeline(inv.steps)]
    if inv.summary.memory:
        out.append(memplot.memory_section(inv.summary.memory))
    if diff is not None:
        out.append(diff_section(diff, a, b))
    return out
