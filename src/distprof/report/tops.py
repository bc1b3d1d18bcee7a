"""The report's top kernels, top CPU ops and blocking host-device syncs, one figure per role.

Roles of one job run different code (a rollout engine's kernels, an actor's optimizer ops), so their names
are never added together: each role's figure sums its own ranks' files (the per-file extracts of
``summary`` and ``step_names``), and its title names the role and how many ranks it sums.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from distprof.analysis.analyze import Investigation
from distprof.analysis.diagnose import Plot
from distprof.analysis.records import FileFacts
from distprof.report.base import Section, fig, height, label, short
from distprof.trace.vocab import is_sync_op, is_sync_runtime

__all__ = ["TOP_NAMES", "kernels", "ops"]

TOP_NAMES = 20  # bars per figure


def _bars(title: str, rows: list[dict[str, Any]], value: str, what: str) -> go.Figure:
    rows = rows[:TOP_NAMES]
    # Numbered so that two names cut to the same first characters stay two bars.
    y = [label(f"{i}. {short(r['name'])}") for i, r in enumerate(rows, 1)]
    f = fig(title, height=height(len(rows), 24, 300, 700), xaxis={"title": "ms"},
            yaxis={"type": "category", "autorange": "reversed"}, margin={"l": 20, "r": 20, "t": 50, "b": 50})
    f.add_trace(go.Bar(
        x=[round(r[value] / 1000, 3) for r in rows], y=y, orientation="h", marker_color="#4C78A8",
        customdata=[[label(r["name"]), r["count"], r.get("share") or 0.0] for r in rows],
        hovertemplate=f"%{{customdata[0]}}<br>{what} %{{x:.2f}} ms, %{{customdata[2]:.1%}}<br>"
                      "%{customdata[1]} calls<extra></extra>"))
    return f


def per_role(inv: Investigation, table: Callable[[FileFacts], dict[str, tuple]], value: int
             ) -> dict[str | None, tuple[list[dict[str, Any]], int]]:
    """role -> (rows ``{"name", "count", "total_us", "share", ...}`` by the ``value``-th figure descending, ranks
    summed). ``table(file)`` gives a file's ``{name: (count, total_us[, self_us])}``."""
    acc: dict[str | None, dict[str, list[float]]] = defaultdict(dict)
    ranks: dict[str | None, set] = defaultdict(set)
    for f in inv.files:
        role = f.label
        ranks[role].add(f.rank if f.rank is not None else f.path)
        for name, v in table(f).items():
            a = acc[role].setdefault(name, [0.0] * len(v))
            for i, x in enumerate(v):
                a[i] += x
    out = {}
    for role in sorted(acc, key=lambda r: r or ""):
        total = sum(v[value] for v in acc[role].values())
        rows: list[dict[str, Any]]
        rows = [{"name": n, "count": int(v[0]), "total_us": v[1], "self_us": v[2] if len(v) > 2 else None,
                 "share": v[value] / total if total else 0.0} for n, v in acc[role].items() if v[value] > 0]
        rows.sort(key=lambda r: (-(r["self_us"] if value == 2 else r["total_us"]), r["name"]))
        if rows:
            out[role] = (rows, len(ranks[role]))
    return out


def _title(what: str, role: str | None, n: int, how: str) -> str:
    ranks = f"{n} rank{'s' if n != 1 else ''}"
    return f"{what}, {label(role)} ({how}, {ranks})" if role else f"{what} ({how} over {ranks})"


def kernels(inv: Investigation) -> Section:
    s = Section(Plot.KERNELS, "Top device kernels",
                f"Per role, the {TOP_NAMES} device events (kernels, memcpy, memset) with the most summed duration "
                "over the role's ranks, and their share of the role's device event time (roles run different "
                "code, so they are never added together).")
    roles = per_role(inv, lambda f: f.kernels, 1)
    if not roles:
        s.note = "Not applicable: these traces have no device events (a CPU-only job)."
        return s
    for role, (rows, n) in roles.items():
        s.figures.append(_bars(_title("Top kernels", role, n, "summed duration"), rows, "total_us", "total"))
    return s


def _syncs(f: FileFacts) -> dict[str, tuple]:
    """Blocking host-device syncs inside the steps of one file: what the host_sync finding points at."""
    return {name: tuple(v[:2]) for table, keep in ((f.step_runtime, is_sync_runtime), (f.step_ops, is_sync_op))
            for name, v in table.items() if keep(name)}


def ops(inv: Investigation) -> Section:
    s = Section(Plot.OPS, "Top CPU ops and host-device syncs",
                f"Per role, the {TOP_NAMES} CPU ops with the most self time over the role's ranks (their time minus "
                "the ops nested directly inside them, so nested ops are not counted twice), and their share of the "
                "role's ops' self time (roles run different code, so they are never added together). Below, when "
                "there are any: the calls that block the host until the device catches up (cudaDeviceSynchronize, "
                "cudaStreamSynchronize, cudaEventSynchronize, aten::item ...), their summed duration inside the "
                "steps over the role's ranks.")
    op_roles = per_role(inv, lambda f: f.ops, 2)
    sync_roles = per_role(inv, _syncs, 1)
    if not op_roles and not sync_roles:
        s.note = "No CPU ops in these traces."
        return s
    for role, (rows, n) in op_roles.items():
        s.figures.append(_bars(_title("Top CPU ops", role, n, "self time"), rows, "self_us", "self"))
    for role, (rows, n) in sync_roles.items():
        s.figures.append(_bars(_title("Blocking host-device syncs inside the steps", role, n, "summed"), rows,
                               "total_us", "total"))
    return s
