"""The report's throughput sections: achieved TFLOP/s and MFU (per rank and step, and the top ops as roofline points
against the device's peaks), and the collective report (per process group and collective).

The figures are ``summary``'s (:mod:`distprof.analysis.mfu`, :mod:`distprof.analysis.collectives`); this module only
lays them out, as HTML tables and one plotly figure (the roofline). Each section is a :class:`Block`:
:func:`blocks` gives them for an Investigation and :func:`distprof.report.page.render` places them after the plots
(``tables=``). A section that does not apply says why (no shapes: ``record_shapes`` is needed; no collectives).

Trace text is untrusted: every string goes through :func:`_e` (:func:`html.escape` of its visible form) before it
reaches the page, and every string inside the roofline figure through :func:`.base.label`.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any

import plotly.graph_objects as go
from msgspec import UNSET

from distprof.analysis.mfu import NEEDS_SHAPES, flop_op_names
from distprof.analysis.records_comm import CollectiveRow
from distprof.analysis.records_flops import FlopsRow, RooflinePoint
from distprof.report.base import fig, label
from distprof.report.termcoll import last_arrivals, size
from distprof.util.safetext import visible

__all__ = ["COLLECTIVES", "FLOPS", "MAX_ROWS", "Block", "blocks", "collectives_block", "flops_block"]

FLOPS = "flops"  # the sections' element ids (beside the plots' Plot ids)
COLLECTIVES = "collectives"
MAX_ROWS = 64  # rows of the per-rank table (the lowest MFU first beyond it; summary --json has them all)
CSS = (".numbers{border-collapse:collapse;font-size:13px;margin:6px 0 10px}"
       ".numbers th,.numbers td{padding:2px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}"
       ".numbers th{color:#555;font-weight:600}.numbers td.t,.numbers th.t{text-align:left;white-space:normal;"
       "overflow-wrap:anywhere;max-width:420px}.tablewrap{overflow-x:auto}")


@dataclass
class Block:
    """One section of tables (and figures) in the page: its element id, title, caption, body (HTML written here,
    every trace string escaped), the plotly figures its ``<div class="plot" id=KEY>`` elements hold, a note."""
    id: str
    title: str
    caption: str
    html: str = ""
    figures: dict[str, go.Figure] = field(default_factory=dict)
    note: str | None = None


def _e(s: Any) -> str:
    return html.escape(visible(s), quote=True)


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def _flop(v: float | None) -> str:
    """FLOPs in decimal units (``2.86 T``, ``412.0 G``)."""
    if v is None:
        return "-"
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if abs(v) >= scale:
            return f"{v / scale:,.3g} {unit}" if v / scale < 100 else f"{v / scale:,.0f} {unit}"
    return f"{v:,.0f}"


def _rate(v: float | None) -> str:
    """TFLOP/s: one decimal from 1 up, three significant digits below (DLRM's 0.0123)."""
    return "-" if v is None else f"{v:,.1f}" if abs(v) >= 1 else f"{v:.3g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}" if v >= 0.001 or v == 0 else f"{v:.3%}"


def _dur(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us:,.1f} µs" if abs(us) < 1000 else f"{us / 1000:,.2f} ms" if abs(us) < 1e6 else f"{us / 1e6:,.2f} s"


def _table(head: list[str], rows: list[list[str]], text_cols: tuple[int, ...] = (), cls: str = "numbers") -> str:
    """A table of cells already escaped (``text_cols``: left-aligned, wrapping columns)."""
    def cell(tag: str, j: int, v: str) -> str:
        return f'<{tag} class="t">{v}</{tag}>' if j in text_cols else f"<{tag}>{v}</{tag}>"
    th = "".join(cell("th", j, _e(h)) for j, h in enumerate(head))
    body = "".join("<tr>" + "".join(cell("td", j, v) for j, v in enumerate(r)) + "</tr>" for r in rows)
    return (f'<div class="tablewrap"><table class="{cls}"><thead><tr>{th}</tr></thead><tbody>{body}</tbody>'
            "</table></div>")


# ---- FLOPs and MFU ----------------------------------------------------------------------------------------------
def _flops_rows(rows: list[FlopsRow]) -> str:
    shown = [r for r in rows if r.flops is not None]
    more = 0
    if len(shown) > MAX_ROWS:
        more = len(shown) - MAX_ROWS
        shown = sorted(shown, key=lambda r: (r.mfu is None, r.mfu if r.mfu is not None else 0.0))[:MAX_ROWS]
    cells = [[_e(r.role or "-"), _e("?" if r.rank is None else r.rank), _e("-" if r.step is None else r.step),
              _dur(r.wall_us), _flop(r.flops), _rate(r.tflops_per_s), _pct(r.mfu),
              _e(f"{r.peak_tflops:,.1f} {r.dtype or ''} ({r.peak_source})" if r.peak_tflops is not None else "-"),
              _e(r.device or "-"), _dur(r.kernel_us), _flop(r.recompute_flops)]
             for r in shown]
    out = _table(["role", "rank", "step", "wall", "FLOPs", "TFLOP/s", "MFU", "peak TFLOP/s", "device", "FLOP ops' "
                  "kernels", "recomputed FLOPs"], cells, text_cols=(0, 8))
    if more:
        out += f'<p class="caption">{more} more rows (the {MAX_ROWS} with the lowest MFU are shown; summary --json ' \
               "lists every rank and step).</p>"
    return out


def _bound_share(p: RooflinePoint) -> float | None:
    """How close an op comes to its roof: TFLOP/s over the peak for a compute-bound op, GB/s over the peak
    bandwidth for a memory-bound one (and for an op without FLOPs)."""
    if p.flops and p.bound == "compute" and p.tflops_per_s is not None and p.peak_tflops:
        return p.tflops_per_s / p.peak_tflops
    if p.gbps is not None and p.peak_tbps:
        return p.gbps / (p.peak_tbps * 1e3)
    return None


def _ops_rows(points: list[RooflinePoint]) -> str:
    cells = [[_e(p.name), _e(p.shapes or "-"), _e(p.dtype or "-"), f"{p.count:,}", _dur(p.kernel_us),
              _rate(p.tflops_per_s) if p.flops else "-", _num(p.gbps, ",.0f"),
              _num(p.intensity, ",.1f") if p.flops else "-", _e(p.bound or "-"), _pct(_bound_share(p))]
             for p in points]
    return _table(["op", "input shapes", "dtype", "calls", "kernel time", "TFLOP/s", "GB/s", "FLOP/byte", "bound",
                   "of its roof"], cells, text_cols=(0, 1))


def roofline(points: list[RooflinePoint]) -> go.Figure | None:
    """The top FLOP ops as points (arithmetic intensity, achieved TFLOP/s) under the device's roof: min(peak
    TFLOP/s, intensity x peak TB/s). None when no op has FLOPs and a kernel time."""
    pts = [p for p in points if p.flops and p.intensity and p.tflops_per_s]
    if not pts:
        return None
    f = fig("Roofline: the top ops' achieved TFLOP/s against their FLOPs per byte", height=440,
            xaxis={"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
            yaxis={"type": "log", "title": {"text": "achieved TFLOP/s"}})
    roofs = {(p.device, p.dtype, p.peak_tflops, p.peak_tbps) for p in pts if p.peak_tflops and p.peak_tbps}
    lo = min(p.intensity for p in pts if p.intensity) / 4
    hi = max(p.intensity for p in pts if p.intensity) * 4
    for device, dtype, peak, tbps in sorted(roofs, key=lambda r: tuple(map(str, r))):
        ridge = peak / tbps  # FLOP/byte where the bandwidth roof meets the compute roof
        xs = [min(lo, ridge / 4), ridge, max(hi, ridge * 4)]
        f.add_trace(go.Scatter(x=xs, y=[min(peak, x * tbps) for x in xs], mode="lines", line={"dash": "dot"},
                               name=label(f"roof: {device} {dtype or ''} ({peak:,.0f} TFLOP/s, {tbps:g} TB/s)"),
                               hoverinfo="skip"))
    f.add_trace(go.Scatter(
        x=[p.intensity for p in pts], y=[p.tflops_per_s for p in pts], mode="markers", name="ops",
        marker={"size": [max(6.0, min(24.0, 4 + math.sqrt(p.kernel_us) / 4)) for p in pts]},
        customdata=[[label(p.name), label(p.shapes), f"{p.kernel_us:,.1f}", p.count] for p in pts],
        hovertemplate="%{customdata[0]} %{customdata[1]}<br>%{y:,.1f} TFLOP/s at %{x:,.1f} FLOP/byte<br>"
                      "%{customdata[2]} µs of kernels, %{customdata[3]} calls<extra></extra>"))
    return f


def flops_block(s: Any) -> Block:
    """The FLOPs and MFU section of a summary (:class:`~distprof.analysis.records.SummaryResult`)."""
    title = "Achieved TFLOP/s and MFU"
    caption = ("Model FLOPs of the ops that carry the work, computed from their recorded input shapes (matrix "
               "products, convolutions, attention; recomputed forward ops not counted), over each step's wall time "
               "(the step until its device work ends): TFLOP/s = FLOPs / wall; MFU = FLOPs / (wall x peak), the peak "
               "of the trace's device for the ops' dtype (summary --peak-tflops overrides it). Top ops: each op at "
               "one set of input shapes, over all ranks, against its kernels' device time; compute- or memory-bound "
               "by the device's ridge point (peak FLOP/s over peak bytes/s).")
    rows = [] if s.flops is None or not isinstance(s.flops, list) else s.flops
    if not rows:
        has_matrix = any(o.name in flop_op_names() for o in s.ops)
        note = f"No FLOPs: {NEEDS_SHAPES}." if has_matrix else \
            "No FLOPs: these traces hold no matrix product, convolution or attention op."
        return Block(FLOPS, title, caption, note=note)
    body = []
    for r in rows:
        if r.flops is None and r.reason is not UNSET:
            who = f"{r.role} rank {r.rank}" if r.role else f"rank {r.rank}"
            body.append(f'<p class="na">{_e(f"{who}: {r.reason}.")}</p>')
    body.append(_flops_rows(rows))
    points = s.flops_ops if isinstance(s.flops_ops, list) else []
    figures: dict[str, go.Figure] = {}
    if points:
        body.append("<h3>Top ops by kernel time, as roofline points</h3>")
        body.append(_ops_rows(points))
        f = roofline(points)
        if f is not None:
            figures[f"{FLOPS}-0"] = f
            body.append(f'<div class="plot" id="{FLOPS}-0"></div>')
    return Block(FLOPS, title, caption, "".join(body), figures)


# ---- collectives ------------------------------------------------------------------------------------------------
def _gbps(v: float | None) -> str:
    return "-" if v is None else f"{v:,.2f} GB/s"


def _coll_cells(r: CollectiveRow) -> list[str]:
    group = r.group + (f" ({r.group_desc})" if r.group_desc else "")
    last = "-" if r.last_rank is None or r.last_share is None else f"{r.last_rank} ({r.last_share:.0%})"
    imbalance = None if r.imbalance is UNSET else r.imbalance
    return [_e(r.role or "-"), _e(group), _e(r.name), _e("-" if r.group_size is None else r.group_size),
            f"{r.count:,}", _e(size(r.bytes)), _e(size(r.bytes_per_call)), _dur(r.min_dur_us), _dur(r.dur_median_us),
            _dur(r.skew_us), _gbps(r.algbw_gbps), _gbps(r.busbw_gbps), _e(last),
            "-" if imbalance is None else f"{imbalance:,.2f}", _e(r.note or "")]


def collectives_block(rows: list[CollectiveRow] | None) -> Block:
    """The collective report: per role, process group and collective."""
    title = "Collectives per process group"
    caption = ("Collectives matched across ranks (the k-th of a group and kind on one rank is the k-th on every "
               "other). bytes: the collective's size S from the trace's collective metadata (message elements x the "
               "dtype's size), summed; transfer: per call the shortest duration among the ranks that took part, "
               "summed (median per call beside it); skew: the median spread of the ranks' start times; algbw = S / "
               "transfer, busbw = algbw x NCCL's factor for the collective (nccl-tests' formulas); last: the rank "
               "that started last most often and its share; imbalance: all-to-all-v, the largest rank's split over "
               "the mean (max over calls).")
    if not rows:
        return Block(COLLECTIVES, title, caption, note="No collectives in these traces.")
    body = _table(["role", "group", "collective", "group size", "count", "bytes", "per call", "transfer",
                   "median", "skew", "algbw", "busbw", "last (share)", "imbalance", "note"],
                  [_coll_cells(r) for r in rows], text_cols=(0, 1, 2, 14))
    lines = "".join(f"<li>{_e(t)}</li>" for t in last_arrivals(rows))
    return Block(COLLECTIVES, title, caption, body + (f'<ul class="caption">{lines}</ul>' if lines else ""))


def blocks(inv: Any) -> list[Block]:
    """The report's throughput sections for an Investigation: FLOPs/MFU, then the collective report."""
    s = inv.summary
    return [flops_block(s), collectives_block(s.collectives if isinstance(s.collectives, list) else None)]
