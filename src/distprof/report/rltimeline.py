"""The report's RL step timeline (:data:`~distprof.analysis.diagnose.Plot.RL_STEPS`): the worst and the median RL
step of a job with several roles (``steps``' ``rl_steps``, :mod:`distprof.analysis.rlsteps`), one lane per role
and rank: its busy time as bars, the rest of the step shaded (waiting for another role), its phases on it, and the
critical path on a lane of its own. Its size is bounded: at most :data:`MAX_LANES` lanes, and ``rlsteps`` keeps
at most ``LANE_SPANS`` busy spans and ``LANE_PHASES`` phases per lane."""

from __future__ import annotations

import plotly.graph_objects as go

from distprof.analysis.diagnose import Plot
from distprof.analysis.records import StepsResult
from distprof.analysis.rlsteps import RLStep
from distprof.report.base import Section, label
from distprof.report.base import fig as _fig
from distprof.report.base import height as _height

__all__ = ["MAX_LANES", "TOP_PHASES", "rl_timeline"]

MAX_LANES = 48
TOP_PHASES = 10  # phase names with a legend entry of their own; the others are one "other phases" trace
PATH = "critical path"


def _picked(rl: list[RLStep]) -> list[tuple[str, RLStep]]:
    """The worst step (the longest; the first of equals) and the median one (in time order among equals)."""
    by_dur = sorted(rl, key=lambda s: s.duration_us)
    worst, median = max(rl, key=lambda s: s.duration_us), by_dur[(len(by_dur) - 1) // 2]
    return [("worst", worst)] + ([("median", median)] if median is not worst else [])


def _figure(kind: str, s: RLStep) -> go.Figure:
    t0 = s.start_us
    lanes = s.lanes[:MAX_LANES]
    names = [label(f"{x['role']} {'?' if x['rank'] is None else x['rank']}") for x in lanes]
    ms = lambda v: round((v - t0) / 1000.0, 3)  # noqa: E731
    f = _fig(f"RL step {label(s.step)} ({kind}: {s.duration_us / 1000:,.1f} ms), path "
             + label(" > ".join(s.critical_path)), height=_height(len(lanes) + 1, 28),
             barmode="overlay", xaxis={"title": "ms from the step's start"},
             yaxis={"type": "category", "autorange": "reversed", "title": ""},
             margin={"l": 140, "r": 20, "t": 60, "b": 110},
             legend={"orientation": "h", "yanchor": "top", "y": -0.25})  # below the axis title, never on it
    ys = [label(PATH), *names]
    f.add_trace(go.Bar(name="waiting (idle)", orientation="h", y=ys[1:], base=[0.0] * len(names),
                       x=[round(s.duration_us / 1000.0, 3)] * len(names), marker={"color": "rgba(160,160,160,0.35)"},
                       width=0.8, hovertemplate="%{y}: no traced work<extra></extra>"))
    by: list[str] = []
    bx: list[float] = []
    bb: list[float] = []
    for name, x in zip(names, lanes, strict=True):
        for a, b in x["busy"]:
            by.append(name)
            bb.append(ms(a))
            bx.append(round((b - a) / 1000.0, 3))
    f.add_trace(go.Bar(name="busy", orientation="h", y=by, base=bb, x=bx, width=0.8, marker={"color": "#4c78a8"},
                       hovertemplate="%{y}: busy %{x:.2f} ms from %{base:.2f} ms<extra></extra>"))
    total: dict[str, float] = {}
    for x in lanes:
        for n, a, b in x["phases"]:
            total[n] = total.get(n, 0.0) + b - a
    top = sorted(total, key=lambda n: -total[n])[:TOP_PHASES]
    groups: dict[str, tuple[list, list, list, list]] = {}
    for name, x in zip(names, lanes, strict=True):
        for n, a, b in x["phases"]:
            g = groups.setdefault(n if n in top else "other phases", ([], [], [], []))
            g[0].append(name)
            g[1].append(ms(a))
            g[2].append(round((b - a) / 1000.0, 3))
            g[3].append(label(n))
    for n, (y, base, w, text) in groups.items():
        f.add_trace(go.Bar(name=label(n), orientation="h", y=y, base=base, x=w, width=0.4, customdata=text,
                           hovertemplate="%{y}: %{customdata} %{x:.2f} ms<extra></extra>"))
    p = s.path or []
    f.add_trace(go.Bar(name=PATH, orientation="h", y=[label(PATH)] * len(p), base=[ms(g["start_us"]) for g in p],
                       x=[round((g["end_us"] - g["start_us"]) / 1000.0, 3) for g in p], width=0.8,
                       customdata=[label(g["role"]) for g in p], marker={"color": "#e45756"},
                       hovertemplate="path: %{customdata} %{x:.2f} ms<extra></extra>"))
    return f


def rl_timeline(steps: StepsResult) -> Section:
    s = Section(Plot.RL_STEPS, "RL steps: the worst and the median step across roles",
                "One lane per role and rank, from the step's first start to its last end: bars where its traced "
                "work (or Ray task) runs, the shaded rest is time it waits for another role; its phases are the "
                "thin bars on it. The top lane is the critical path: the chain of roles that bounds the step.")
    rl: list[RLStep] = steps.rl_steps or []
    if not rl:
        s.note = "One role only (or no steps): the RL step view needs a job with several roles (rollout, actor ...)."
        return s
    s.figures = [_figure(kind, step) for kind, step in _picked(rl)]
    return s
