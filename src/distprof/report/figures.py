"""The report's plots: one :class:`Section` per :class:`~distprof.analysis.diagnose.Plot` id, made with plotly.py
from the figures an :class:`~distprof.analysis.analyze.Investigation` already holds (nothing is recomputed
from events, and no event is embedded: every plot is per rank, per step or per name, so its size grows
with ranks x steps, never with the trace).

Every string that comes from a trace (kernel, op and phase names, roles, paths) goes through :func:`label`
before it reaches plotly: plotly.js renders a subset of HTML in titles, tick labels, legends and hovers,
so a name must arrive as text. plotly.js decodes ``&lt;``, ``&gt;``, ``&amp;`` and numeric entities back
to characters for display (not ``&quot;``), hence the numeric forms for quotes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

import plotly.graph_objects as go

from ..analysis.ranks import unranked_label
from ..analysis.diagnose import Plot
from ..analysis.vocab import is_sync_op, is_sync_runtime
from ..safetext import visible

__all__ = ["Section", "label", "sections", "diff_section", "MATRIX_MAX_RANKS"]

MATRIX_MAX_RANKS = 64
"""Above this many ranks in a role the wait matrix keeps the ``MATRIX_TOP`` ranks that caused and that
suffered the most waiting, and sums every other rank into an "others" row and column."""
MATRIX_TOP = 24
TOP_NAMES = 20  # bars in the top kernels / ops / diff plots
TOP_PHASES = 10  # phases stacked per role; the rest are summed as "other phases"
LABEL_CHARS = 70  # a kernel's templated name can be thousands of characters: the axis shows its start

_ENTITIES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;"})

_TEMPLATE = go.layout.Template(layout={
    "font": {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12, "color": "#222"},
    "plot_bgcolor": "white", "paper_bgcolor": "white", "hoverlabel": {"align": "left"},
    "xaxis": {"gridcolor": "#e5e5e5", "zerolinecolor": "#bbb", "automargin": True},
    "yaxis": {"gridcolor": "#e5e5e5", "zerolinecolor": "#bbb", "automargin": True},
    "colorway": ["#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6",
                 "#9D755D", "#79706E"],
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
})


def label(s: Any) -> str:
    """``s`` as text for plotly (titles, ticks, legends, hovers): markup characters become entities."""
    return visible(s).translate(_ENTITIES)


def _short(s: str) -> str:
    return s if len(s) <= LABEL_CHARS else s[:LABEL_CHARS - 1] + "…"


@dataclass
class Section:
    """One plot of the report: its element id (a :class:`Plot` id), a title and caption, and its figures;
    no figures and a ``note`` when it does not apply to these traces."""
    id: str
    title: str
    caption: str
    figures: list[go.Figure] = field(default_factory=list)
    note: str | None = None


def _fig(title: str, height: int = 420, **layout: Any) -> go.Figure:
    return go.Figure(layout={"template": _TEMPLATE, "title": {"text": title, "x": 0, "xanchor": "left"},
                             "height": height, **layout})


def _ms(us: float | None) -> float | None:
    return None if us is None else us / 1000.0


def _rank_name(role: str | None, rank: int | None, path: str = "", bare: bool = False) -> str:
    """A rank's axis label, plain text (escaped by the caller): ``actor 3`` or ``rank 3`` (``3`` when ``bare``:
    a plot of one role), ``? (file name)`` for a file whose rank is unknown."""
    r = str(rank) if rank is not None else unranked_label(path)
    return r if bare else f"{role} {r}" if role else f"rank {r}"


def _roles(rows: Iterable[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    out: dict[str | None, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        out[r.get("role")].append(r)
    return out


def _height(n: int, per: float = 16, lo: int = 320, hi: int = 900) -> int:
    return int(min(hi, max(lo, 120 + per * n)))


# ---- step time ------------------------------------------------------------------------------------------
def step_time(steps: dict[str, Any]) -> Section:
    s = Section(Plot.STEP_TIME, "Step time per rank and step",
                "Each cell is one rank's step (ProfilerStep, or a capture window): its duration, and from the "
                "menu its time blocked in collectives waiting for peers (waited) and the rest (busy = duration "
                "- waited). In a synchronous job every rank's step lasts about as long, because the ranks ahead "
                "wait for the one behind: the rank holding the others back shows the most busy time and the "
                "least waiting. One heatmap per role.")
    rows = steps.get("steps") or []
    if not rows:
        s.note = "No steps in these traces (no ProfilerStep#N ranges and no run-directory capture windows)."
        return s
    for role, role_rows in _roles(rows).items():
        step_keys = [r["step"] if not r.get("window") else tuple(r["window"]) for r in role_rows]
        step_labels = [str(k) if not isinstance(k, tuple) else f"{k[0]}-{k[1]}" for k in step_keys]
        ranks: dict[tuple, int] = {}
        for r in role_rows:
            for x in r["ranks"]:
                ranks.setdefault((-1 if x["rank"] is None else x["rank"], x["path"] if x["rank"] is None else ""), 0)
        order = sorted(ranks)
        for i, k in enumerate(order):
            ranks[k] = i
        names = [label(_rank_name(None, None if k[0] < 0 else k[0], k[1], bare=True)) for k in order]
        n, m = len(order), len(role_rows)
        z = {key: [[None] * m for _ in range(n)] for key in ("dur_us", "busy_us", "waited_us")}
        for j, r in enumerate(role_rows):
            for x in r["ranks"]:
                i = ranks[(-1 if x["rank"] is None else x["rank"], x["path"] if x["rank"] is None else "")]
                for key, grid in z.items():
                    grid[i][j] = round(_ms(x.get(key, 0.0)), 3)
        fig = _fig(f"Step time, {label(role)}" if role else "Step time", height=_height(n, 14),
                   xaxis={"title": "step", "type": "category"},
                   yaxis={"title": "rank", "type": "category", "autorange": "reversed"})
        hover = "rank %{y}<br>step %{x}<br>%{z:.2f} ms<extra></extra>"
        fig.add_trace(go.Heatmap(z=z["dur_us"], x=step_labels, y=names, colorscale="Viridis",
                                 colorbar={"title": "ms"}, hovertemplate=hover, hoverongaps=False))
        fig.update_layout(updatemenus=[{
            "type": "buttons", "direction": "right", "x": 1, "xanchor": "right", "y": 1.12, "yanchor": "bottom",
            "buttons": [{"label": lab, "method": "restyle", "args": [{"z": [z[key]]}]}
                        for lab, key in (("duration", "dur_us"), ("busy", "busy_us"), ("waited", "waited_us"))]}])
        s.figures.append(fig)
    return s


# ---- phases ---------------------------------------------------------------------------------------------
def phases(summary: dict[str, Any], steps: dict[str, Any], files: Iterable[tuple[Any, dict[str, Any]]]) -> Section:
    """``files``: (FileInfo, summary part) per file, whose ``phases`` hold each phase's self time on that file."""
    s = Section(Plot.PHASES, "Phase breakdown per role",
                "Per rank, the time each phase (record_function / distprof.annotate range) was the innermost open "
                "annotation of its thread (self time, summed over the analysed time), so the segments add up "
                "without counting a nested phase twice. The hover also gives the phase's wall time (the time it "
                "was open). The largest phases of each role are shown, the rest summed as \"other phases\".")
    # A file's role label ("actor", or "actor (run 2)" when ranks of different runs share a folder) as steps has it.
    who: dict[str, tuple[str | None, int | None]] = {}
    for r in steps.get("steps") or []:
        for x in r["ranks"]:
            who[x["path"]] = (r["role"], x["rank"])
    self_us: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wall_us: dict[tuple, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for info, part in files:
        role, rank = who.get(info.path, (info.role, info.rank))
        key = (role, -1 if rank is None else rank, "" if rank is not None else info.path)
        for name, (_count, _total, wall, self_) in part.get("phases", {}).items():
            self_us[key][name] += self_
            wall_us[key][name] += wall
    if not any(v for v in self_us.values()):
        s.note = "No phases: these traces have no user annotations (torch.profiler.record_function or distprof.annotate)."
        return s
    by_role: dict[str | None, list[tuple]] = defaultdict(list)
    for key in sorted(self_us, key=lambda k: (k[0] or "", k[1], k[2])):
        by_role[key[0]].append(key)
    for role, keys in by_role.items():
        totals: dict[str, float] = defaultdict(float)
        for k in keys:
            for name, v in self_us[k].items():
                totals[name] += v
        top = [n for n, v in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])) if v > 0][:TOP_PHASES]
        x = [label(_rank_name(None, None if k[1] < 0 else k[1], k[2], bare=True)) for k in keys]
        fig = _fig(f"Phases (self time), {label(role)}" if role else "Phases (self time)",
                   height=460, barmode="stack", xaxis={"title": "rank", "type": "category"},
                   yaxis={"title": "ms"}, legend={"title": {"text": "phase"}})
        for name in top:
            fig.add_trace(go.Bar(
                x=x, y=[round(self_us[k].get(name, 0.0) / 1000, 3) for k in keys], name=label(_short(name)),
                customdata=[[label(name), round(wall_us[k].get(name, 0.0) / 1000, 3)] for k in keys],
                hovertemplate="%{customdata[0]}<br>rank %{x}<br>self %{y:.2f} ms, wall %{customdata[1]:.2f} ms"
                              "<extra></extra>"))
        rest = [sum(v for n, v in self_us[k].items() if n not in top) / 1000 for k in keys]
        if any(rest):
            fig.add_trace(go.Bar(x=x, y=[round(v, 3) for v in rest], name="other phases", marker_color="#D9D9D9",
                                 hovertemplate="other phases<br>rank %{x}<br>self %{y:.2f} ms<extra></extra>"))
        s.figures.append(fig)
    return s


# ---- per-rank figures from summary ---------------------------------------------------------------------------
def _rank_axis(ranks: list[dict[str, Any]]) -> list[str]:
    return [label(_rank_name(r.get("role"), r.get("rank"), r.get("path", ""))) for r in ranks]


def _has_device(r: dict[str, Any]) -> bool:
    return bool(((r.get("temporal") or {}).get("device") or {}).get("span_us"))


def temporal(summary: dict[str, Any]) -> Section:
    s = Section(Plot.TEMPORAL, "Temporal breakdown per rank",
                "Where each rank's time goes (HTA's temporal breakdown). Device: over the device span, compute "
                "(a compute kernel runs), exposed communication (a collective runs and no compute does), memory "
                "(memcpy/memset only) and idle (nothing runs). Host, for ranks without device events (CPU-only "
                "jobs): compute (a CPU op runs outside communication threads), communication (a collective runs "
                "and no compute: on gloo, waiting for peers) and idle.")
    ranks = summary.get("ranks") or []
    dev = [r for r in ranks if _has_device(r)]
    host = [r for r in ranks if not _has_device(r) and ((r.get("temporal") or {}).get("host") or {}).get("span_us")]
    for kind, rows, parts in (("device", dev, (("compute", "#4C78A8"), ("communication", "#E45756"),
                                               ("memory", "#EECA3B"), ("idle", "#BAB0AC"))),
                              ("host", host, (("compute", "#4C78A8"), ("communication", "#E45756"),
                                              ("idle", "#BAB0AC")))):
        if not rows:
            continue
        x = _rank_axis(rows)
        fig = _fig(f"{kind.capitalize()} time per rank", height=440, barmode="stack",
                   xaxis={"title": "rank", "type": "category"}, yaxis={"title": "share of span", "tickformat": ".0%"})
        for part, color in parts:
            t = [r["temporal"][kind] for r in rows]
            fig.add_trace(go.Bar(
                x=x, y=[v.get(f"{part}_share", 0.0) for v in t], name=part, marker_color=color,
                customdata=[round(v.get(f"{part}_us", 0.0) / 1000, 3) for v in t],
                hovertemplate=f"{part}<br>%{{x}}<br>%{{y:.1%}} of span, %{{customdata:.2f}} ms<extra></extra>"))
        s.figures.append(fig)
    if not s.figures:
        s.note = "No rank has a traced span (no events inside the selection)."
    return s


def overlap(summary: dict[str, Any]) -> Section:
    s = Section(Plot.OVERLAP, "Communication overlapped by compute, per rank",
                "Of the time a rank communicates, the share during which it also computes (HTA's comm/compute "
                "overlap; device kernels, else host collectives against CPU ops on CPU-only ranks). Higher is "
                "better: communication that overlaps compute costs no step time. A collective kernel spins while "
                "it waits for late peers, so a low share on a rank that waits (see who waits for whom) is that wait.")
    rows, kinds = [], []
    for r in summary.get("ranks") or []:
        ov = r.get("overlap") or {}
        kind = "device" if (ov.get("device") or {}).get("communication_us") else \
            "host" if (ov.get("host") or {}).get("communication_us") else None
        if kind:
            rows.append(r)
            kinds.append(kind)
    if not rows:
        s.note = "No communication in these traces (no collective kernels and no host collectives), so nothing to overlap."
        return s
    fig = _fig("Communication overlapped by compute", height=420, xaxis={"title": "rank", "type": "category"},
               yaxis={"title": "overlapped share", "tickformat": ".0%", "range": [0, 1]})
    ov = [r["overlap"][k] for r, k in zip(rows, kinds)]
    fig.add_trace(go.Bar(
        x=_rank_axis(rows), y=[o.get("share") or 0.0 for o in ov], marker_color="#54A24B", name="overlapped",
        customdata=[[k, round(o["communication_us"] / 1000, 3), round(o.get("overlapped_us", 0.0) / 1000, 3)]
                    for o, k in zip(ov, kinds)],
        hovertemplate="%{x} (%{customdata[0]})<br>%{y:.1%} overlapped<br>communication %{customdata[1]:.2f} ms, "
                      "overlapped %{customdata[2]:.2f} ms<extra></extra>"))
    s.figures.append(fig)
    return s


def idle(summary: dict[str, Any]) -> Section:
    s = Section(Plot.IDLE, "Device idle by cause, and kernel launches",
                "Top: each rank's device idle time split by cause (HTA's idle time breakdown): host wait (the "
                "stream ran out of work and waited for the CPU to launch more), kernel wait (gaps under 30 µs "
                "between queued kernels) and other (waiting for another stream, a peer or a sync). Bottom: launch "
                "delay (device start minus the end of the launch call) per rank, p50 and p95, and the share of "
                "short launches (device time below the call's own time); ranks with launch-bound steps are marked.")
    rows = [r for r in summary.get("ranks") or [] if (r.get("idle") or {}).get("applicable")]
    if not rows:
        s.note = "Not applicable: these traces have no device events (a CPU-only job), so there is no device idle time."
        return s
    x = _rank_axis(rows)
    fig = _fig("Device idle by cause", height=420, barmode="stack", xaxis={"title": "rank", "type": "category"},
               yaxis={"title": "ms"})
    for part, color in (("host_wait", "#E45756"), ("kernel_wait", "#EECA3B"), ("other", "#BAB0AC")):
        fig.add_trace(go.Bar(
            x=x, y=[round(r["idle"].get(f"{part}_us", 0.0) / 1000, 3) for r in rows], name=part.replace("_", " "),
            marker_color=color, customdata=[r["idle"].get("idle_share") or 0.0 for r in rows],
            hovertemplate=f"{part.replace('_', ' ')}<br>%{{x}}<br>%{{y:.2f}} ms "
                          f"(device idle %{{customdata:.1%}} of span)<extra></extra>"))
    s.figures.append(fig)
    lrows = [r for r in rows if (r.get("launch") or {}).get("applicable") and (r["launch"].get("launches") or 0)]
    if lrows:
        lx = _rank_axis(lrows)
        fig = _fig("Kernel launch delay", height=400, barmode="group", xaxis={"title": "rank", "type": "category"},
                   yaxis={"title": "µs"})
        custom = [[r["launch"]["launches"], r["launch"].get("short_share") or 0.0,
                   "launch-bound in steps " + ", ".join(map(str, r["launch"].get("launch_bound_steps") or []))
                   if r["launch"].get("launch_bound_steps") else "not launch-bound"] for r in lrows]
        for q, color in (("p50", "#4C78A8"), ("p95", "#F58518")):
            fig.add_trace(go.Bar(
                x=lx, y=[r["launch"]["delay_us"][q] for r in lrows], name=f"delay {q}", marker_color=color,
                customdata=custom,
                hovertemplate=f"%{{x}}<br>delay {q} %{{y:.1f}} µs<br>%{{customdata[0]}} launches, "
                              "%{customdata[1]:.0%} short<br>%{customdata[2]}<extra></extra>"))
        bound = [i for i, r in enumerate(lrows) if r["launch"].get("launch_bound_steps")]
        if bound:
            fig.add_trace(go.Scatter(x=[lx[i] for i in bound], y=[lrows[i]["launch"]["delay_us"]["p95"] for i in bound],
                                     mode="markers", name="launch-bound", marker={"symbol": "triangle-down", "size": 9,
                                                                                 "color": "#222"},
                                     hovertemplate="%{x}: launch-bound<extra></extra>"))
        s.figures.append(fig)
    return s


# ---- who waits for whom ---------------------------------------------------------------------------------
def waits(stragglers: dict[str, Any]) -> Section:
    s = Section(Plot.WAITS, "Who waits for whom",
                "Each cell is the time a rank (row) spent blocked in collectives waiting for another rank (column) "
                "to arrive, summed over the analysed steps; each blocked instant is charged once, to the last "
                "arrival of the oldest collective blocking it (as stragglers measures it). A bright column is a "
                f"rank that holds the others back. Roles with more than {MATRIX_MAX_RANKS} ranks show the "
                f"{MATRIX_TOP} ranks that caused and that suffered the most waiting; every other rank is summed "
                "into \"others\".")
    cells = [c for c in stragglers.get("wait_matrix") or [] if c.get("wait_us")]
    if not cells:
        why = "only one rank" if len({(w.get("role"), w.get("rank")) for w in stragglers.get("waits") or []}) < 2 \
            else "no rank waited for another"
        s.note = (f"Nothing to show: {why} in these traces (waiting is measured at collectives matched across "
                  "the ranks of a role).")
        return s
    for role, rows in _roles(cells).items():
        caused: dict[int, float] = defaultdict(float)
        suffered: dict[int, float] = defaultdict(float)
        for c in rows:
            caused[c["culprit"]] += c["wait_us"]
            suffered[c["waiter"]] += c["wait_us"]
        ranks = set(caused) | set(suffered)
        if len(ranks) > MATRIX_MAX_RANKS:
            cols = sorted(sorted(caused, key=lambda r: (-caused[r], r))[:MATRIX_TOP])
            rws = sorted(sorted(suffered, key=lambda r: (-suffered[r], r))[:MATRIX_TOP])
        else:
            cols = rws = sorted(ranks)
        ci = {r: i for i, r in enumerate(cols)}
        ri = {r: i for i, r in enumerate(rws)}
        others_c = others_r = False
        grid = [[0.0] * (len(cols) + 1) for _ in range(len(rws) + 1)]
        for c in rows:
            i, j = ri.get(c["waiter"], len(rws)), ci.get(c["culprit"], len(cols))
            others_r |= i == len(rws)
            others_c |= j == len(cols)
            grid[i][j] += c["wait_us"] / 1000
        if not others_r:
            grid.pop()
        if not others_c:
            for g in grid:
                g.pop()
        y = [str(r) for r in rws] + ([f"others ({len(suffered) - len(rws)})"] if others_r else [])
        x = [str(r) for r in cols] + ([f"others ({len(caused) - len(cols)})"] if others_c else [])
        z = [[round(v, 3) if v else None for v in g] for g in grid]
        fig = _fig(f"Who waits for whom, {label(role)}" if role else "Who waits for whom",
                   height=_height(len(y), 18, 360, 820),
                   xaxis={"title": "waited for (culprit rank)", "type": "category", "side": "bottom"},
                   yaxis={"title": "waiter rank", "type": "category", "autorange": "reversed"})
        fig.add_trace(go.Heatmap(z=z, x=x, y=y, colorscale="Reds", colorbar={"title": "ms"}, hoverongaps=False,
                                 hovertemplate="rank %{y} waited %{z:.2f} ms for rank %{x}<extra></extra>"))
        s.figures.append(fig)
    return s


# ---- top kernels and ops -------------------------------------------------------------------------------
def _top_bars(title: str, rows: list[dict[str, Any]], value: str, what: str) -> go.Figure:
    rows = rows[:TOP_NAMES]
    # Numbered so that two names cut to the same first characters stay two bars.
    y = [label(f"{i}. {_short(r['name'])}") for i, r in enumerate(rows, 1)]
    fig = _fig(title, height=_height(len(rows), 24, 300, 700), xaxis={"title": "ms"},
               yaxis={"type": "category", "autorange": "reversed"}, margin={"l": 20, "r": 20, "t": 50, "b": 50})
    fig.add_trace(go.Bar(
        x=[round(r[value] / 1000, 3) for r in rows], y=y, orientation="h", marker_color="#4C78A8",
        customdata=[[label(r["name"]), r["count"], r.get("share") or 0.0] for r in rows],
        hovertemplate=f"%{{customdata[0]}}<br>{what} %{{x:.2f}} ms, %{{customdata[2]:.1%}}<br>"
                      "%{customdata[1]} calls<extra></extra>"))
    return fig


def kernels(summary: dict[str, Any]) -> Section:
    s = Section(Plot.KERNELS, "Top device kernels",
                f"The {TOP_NAMES} device events (kernels, memcpy, memset) with the most summed duration over all "
                "ranks, and their share of all device event time.")
    rows = summary.get("kernels") or []
    if not rows:
        s.note = "Not applicable: these traces have no device events (a CPU-only job)."
        return s
    s.figures.append(_top_bars("Top kernels (summed duration over all ranks)", rows, "total_us", "total"))
    return s


def _syncs(inv: Any) -> list[dict[str, Any]]:
    """Blocking host-device syncs inside the steps, over all files: what the host_sync finding points at."""
    total: dict[str, list[float]] = {}
    for f in inv.run.files:
        parts = f.parts.get("step_names") or f.parts.get("summary") or {}
        for which, keep in (("runtime", is_sync_runtime), ("ops", is_sync_op)):
            for name, v in (parts.get(which) or {}).items():
                if keep(name):
                    t = total.setdefault(name, [0, 0.0])
                    t[0] += v[0]
                    t[1] += v[1]
    return sorted(({"name": n, "count": c, "total_us": us} for n, (c, us) in total.items() if us > 0),
                  key=lambda r: (-r["total_us"], r["name"]))


def ops(summary: dict[str, Any], syncs: list[dict[str, Any]] | None = None) -> Section:
    s = Section(Plot.OPS, "Top CPU ops and host-device syncs",
                f"The {TOP_NAMES} CPU ops with the most self time over all ranks (their time minus the ops nested "
                "directly inside them, so nested ops are not counted twice), and their share of all ops' self time. "
                "Below, when there are any: the calls that block the host until the device catches up "
                "(cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, aten::item ...), their "
                "summed duration inside the steps over all ranks.")
    rows = sorted(summary.get("ops") or [], key=lambda r: (-r["self_us"], r["name"]))
    if not rows and not syncs:
        s.note = "No CPU ops in these traces."
        return s
    if rows:
        s.figures.append(_top_bars("Top CPU ops (self time over all ranks)", rows, "self_us", "self"))
    if syncs:
        s.figures.append(_top_bars("Blocking host-device syncs inside the steps (over all ranks)", syncs,
                                   "total_us", "total"))
    return s


# ---- run-to-run diff ----------------------------------------------------------------------------------
def diff_section(d: dict[str, Any] | None, a: str = "", b: str = "") -> Section:
    """The ``--compare`` plot from :func:`distprof.analysis.diff.compare`'s result (A: this run, B: the other)."""
    s = Section(Plot.DIFF, "Run-to-run diff",
                f"What changed from this run (A) to the compared run (B), the {TOP_NAMES} largest changes: kernels "
                "by summed duration, CPU ops by self time, phases by wall time, device categories by time. Red: "
                "slower in B; green: faster.")
    if d is None:
        s.note = "Not requested: give --compare OTHER (library: compare=OTHER) to compare this run with another."
        return s
    rows = [r for r in d.get("rows") or [] if r["change_us"]][:TOP_NAMES]
    if not rows:
        s.note = "No difference: both runs have the same kernels, ops, phases and categories with the same times."
        return s
    y = [label(f"{i}. {r['kind']}: {_short(r['name'])}") for i, r in enumerate(rows, 1)]
    fig = _fig(f"B minus A: {label(_short(b))} vs {label(_short(a))}", height=_height(len(rows), 24, 320, 720),
               xaxis={"title": "change (ms)"}, yaxis={"type": "category", "autorange": "reversed"},
               margin={"l": 20, "r": 20, "t": 50, "b": 50})
    fig.add_trace(go.Bar(
        x=[round(r["change_us"] / 1000, 3) for r in rows], y=y, orientation="h",
        marker_color=["#E45756" if r["change_us"] > 0 else "#54A24B" for r in rows],
        customdata=[[label(r["kind"]), label(r["name"]), round(r["a_us"] / 1000, 3), round(r["b_us"] / 1000, 3),
                     "" if r["ratio"] is None else f"x{r['ratio']:.2f}", r["a_count"], r["b_count"]] for r in rows],
        hovertemplate="%{customdata[0]}: %{customdata[1]}<br>A %{customdata[2]:.2f} ms (%{customdata[5]}), "
                      "B %{customdata[3]:.2f} ms (%{customdata[6]})<br>change %{x:+.2f} ms %{customdata[4]}"
                      "<extra></extra>"))
    s.figures.append(fig)
    return s


def sections(inv: Any, diff: dict[str, Any] | None = None, a: str = "", b: str = "") -> list[Section]:
    """Every plot of the report, in :attr:`Plot.ALL` order (the diff only with ``diff``)."""
    out = [step_time(inv.steps),
           phases(inv.summary, inv.steps, [(r.info, r.parts["summary"]) for r in inv.run.files]),
           temporal(inv.summary), overlap(inv.summary), waits(inv.stragglers), kernels(inv.summary),
           ops(inv.summary, _syncs(inv)), idle(inv.summary)]
    if diff is not None:
        out.append(diff_section(diff, a, b))
    return out
