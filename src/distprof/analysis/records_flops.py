"""Typed rows of ``summary``'s FLOPs figures (:mod:`.mfu`): ``flops`` (:class:`FlopsRow`, per role, rank and step)
and ``flops_ops`` (:class:`RooflinePoint`, per op and shape). See :mod:`.records` for how records encode (these
are records as its ``Record`` is, declared here, below it, so that :mod:`.records` can name them)."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["FlopsPhase", "FlopsRow", "RooflinePoint"]


class Record(msgspec.Struct, kw_only=True):
    """A typed result row (as :class:`distprof.analysis.records.Record`)."""


class FlopsPhase(Record, kw_only=True):
    """One phase (annotation) of one step: the FLOPs of the ops that ran in it, over the time it was open."""
    flops: float
    wall_us: float
    tflops_per_s: float | None
    mfu: float | None


class FlopsRow(Record, kw_only=True):
    """One (role, rank, step): model FLOPs from the trace's ops, the step's wall time, achieved TFLOP/s and MFU
    (:mod:`.mfu` states the formula). A rank whose trace has no shapes has a row with ``reason`` and no figures."""
    role: str | None
    rank: int | None
    step: int | None
    flops: float | None
    tflops_per_s: float | None
    mfu: float | None
    peak_tflops: float | None
    dtype: str | None
    wall_us: float | None = None
    kernel_us: float | None = None  # device time of the kernels the counted FLOP ops launched
    recompute_flops: float = 0.0  # forward ops run again in backward (activation checkpointing): not in flops
    bytes: float = 0.0
    device: str | None = None
    peak_source: str | None = None  # "table" or "user"
    phases: dict[str, FlopsPhase] | UnsetType = UNSET
    reason: str | UnsetType = UNSET


class RooflinePoint(Record, kw_only=True):
    """One op at one set of input shapes, over all ranks: its FLOPs and bytes against its kernels' device time."""
    name: str
    dtype: str | None
    shapes: str
    count: int
    flops: float
    bytes: float
    kernel_us: float
    tflops_per_s: float | None  # FLOPs / kernel time
    gbps: float | None  # bytes / kernel time (GB/s)
    intensity: float | None  # FLOPs / byte (None for an op that moves no bytes)
    device: str | None
    peak_tflops: float | None
    peak_tbps: float | None
    bound: str | None  # "compute" or "memory": which side of the device's ridge (peak FLOP/s / peak bytes/s)
