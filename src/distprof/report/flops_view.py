"""The terminal view of FLOPs and MFU (``distprof summary`` on traces written with ``record_shapes``): one row per
role, rank and step (wall time, model TFLOP, achieved TFLOP/s, MFU, the peak used), then the top ops as roofline
points, each op with the input shapes that make it one point (their kernels' time, TFLOP/s, GB/s, FLOPs per byte,
which side of the device's ridge); and ``distprof steps``' table of the same per-step figures (:func:`steps_flops`).
A run whose traces have matrix ops but no shapes gets one line saying ``record_shapes`` is needed. Laid out by
:mod:`.termfit` (fits 80 columns). The figures are :mod:`distprof.analysis.mfu`'s.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET
from rich.console import Console
from rich.text import Text

from distprof.analysis.mfu import NEEDS_SHAPES, flop_op_names
from distprof.analysis.records import StepsResult, SummaryResult
from distprof.analysis.records_flops import RooflinePoint
from distprof.report.termfit import Col, FitTable, say
from distprof.report.units import share, us
from distprof.util.safetext import visible as plain

__all__ = ["flops", "op_label", "steps_flops"]

TOP = 8



def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def op_label(p: RooflinePoint) -> str:
    """An op with the input shapes that tell its rows apart (``aten::mul [8,1024,768]x[8,1024,768]``)."""
    return plain(p.name) + (f" {plain(p.shapes)}" if p.shapes else "")


def steps_flops(console: Console, d: StepsResult) -> None:
    """``distprof steps``: each rank's model FLOPs, achieved TFLOP/s and MFU per step (:mod:`~distprof.analysis.mfu`'s
    figures, as ``summary``'s), or once why there are none (no shapes: ``record_shapes`` is needed)."""
    if d.flops_reason is not UNSET:
        say(console, f"FLOPs and MFU: {d.flops_reason}.")
        return
    rows = [(row, x) for row in d.steps for x in row.ranks if x.flops is not UNSET]
    if not rows:
        return
    console.print()
    t = FitTable(Text("Achieved TFLOP/s and MFU per step (model FLOPs from the ops' shapes; MFU = FLOPs / (wall x "
                      "peak); wall: the step to the end of its device work)"),
                 [Col("role", "key", once=True), Col("step", "key"), Col("rank", "key"), Col("wall"),
                  Col("TFLOP"), Col("TFLOP/s"), Col("MFU"), Col("peak TFLOP/s")])
    for row, x in rows:
        t.add_row(plain(row.role or "-"), str(row.step), "?" if x.rank is None else str(x.rank),
                  us(_v(x.flops_wall_us)),
                  _num(_v(x.flops) / 1e12, ",.3f"), _num(_v(x.tflops_per_s), ",.1f"), share(_v(x.mfu)),
                  _num(_v(x.peak_tflops), ",.0f"))
    console.print(t)


def _v(x: Any) -> Any:
    return None if x is UNSET else x


def flops(console: Console, s: SummaryResult, top: int = TOP) -> None:
    """The FLOPs tables of a summary, or why there are none (nothing when the run has no matrix ops)."""
    if s.flops is UNSET:
        if any(o.name in flop_op_names() for o in s.ops):
            say(console, f"FLOPs and MFU: {NEEDS_SHAPES}.")
        return
    rows = [r for r in s.flops if r.reason is UNSET]
    for r in s.flops:
        if r.reason is not UNSET:
            say(console, f"FLOPs and MFU, {plain(r.role)} rank {r.rank}: {r.reason}.")
    if rows:
        console.print()
        t = FitTable(Text("Model FLOPs and MFU per step (MFU = FLOPs / (wall x peak))"),
                     [Col("role", "key", once=True), Col("rank", "key"), Col("step", "key"), Col("wall"),
                      Col("TFLOP"), Col("TFLOP/s"), Col("MFU"), Col("peak", "fixed")])
        for r in rows:
            peak = "-" if r.peak_tflops is None else f"{r.peak_tflops:,.0f} {r.dtype or ''}".strip()
            t.add_row(plain(r.role or "-"), "?" if r.rank is None else str(r.rank),
                      "-" if r.step is None else str(r.step), us(r.wall_us), _num((r.flops or 0) / 1e12, ",.3f"),
                      _num(r.tflops_per_s, ",.1f"), share(r.mfu), peak)
        console.print(t)
    if s.flops_ops:
        t = FitTable(Text("Top ops by kernel time, as roofline points (all ranks; an op per set of input shapes; "
                          "FLOP/B: per byte)"),
                     [Col("name [input shapes]", "name"), Col("kernel"), Col("TFLOP/s"), Col("GB/s"), Col("FLOP/B"),
                      Col("bound", "fixed")])
        for p in s.flops_ops[:top]:
            t.add_row(Text(op_label(p)), us(p.kernel_us),
                      _num(p.tflops_per_s, ",.1f") if p.flops else "-", _num(p.gbps, ",.0f"),
                      _num(p.intensity, ",.0f") if p.flops else "-", p.bound or "-")
        console.print(t)
