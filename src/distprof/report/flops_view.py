"""The terminal view of FLOPs and MFU (``distprof summary`` on traces written with ``record_shapes``): one row per
role, rank and step (wall time, model TFLOP, achieved TFLOP/s, MFU, the peak used), then the top ops as roofline
points (their kernels' time, TFLOP/s, GB/s, FLOPs per byte, which side of the device's ridge). A run whose traces
have matrix ops but no shapes gets one line saying ``record_shapes`` is needed. Laid out by :mod:`.termfit` (fits
80 columns). The figures are :mod:`distprof.analysis.mfu`'s.
"""

from __future__ import annotations

from msgspec import UNSET
from rich.console import Console
from rich.text import Text

from distprof.analysis.mfu import NEEDS_SHAPES, flop_op_names
from distprof.analysis.records import SummaryResult
from distprof.report.termfit import Col, FitTable, say
from distprof.report.units import share, us
from distprof.util.safetext import visible as plain

__all__ = ["flops"]

TOP = 8



def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


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
        t = FitTable(Text("Top ops by kernel time, as roofline points (all ranks; FLOP/B: per byte)"),
                     [Col("name", "name"), Col("kernel"), Col("TFLOP/s"), Col("GB/s"), Col("FLOP/B"),
                      Col("bound", "fixed")])
        for p in s.flops_ops[:top]:
            t.add_row(Text(plain(p.name)), us(p.kernel_us),
                      _num(p.tflops_per_s, ",.1f") if p.flops else "-", _num(p.gbps, ",.0f"),
                      _num(p.intensity, ",.0f") if p.flops else "-", p.bound or "-")
        console.print(t)
