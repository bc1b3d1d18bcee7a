"""Typed rows of ``summary``'s memory answers (:mod:`.memory`): ``memory`` (:class:`MemoryRow`, per role, rank and
source). See :mod:`.records` for how records encode (declared here, below it, so that :mod:`.records` can name
them). DESIGN.md fixes ``role``, ``rank``, ``peak_allocated_bytes``, ``peak_reserved_bytes``, ``at.{step, phase}``
and ``top``."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["MemoryAt", "MemoryOom", "MemoryRow", "MemoryStep", "MemoryTop"]


class Record(msgspec.Struct, kw_only=True):
    """A typed result row (as :class:`distprof.analysis.records.Record`)."""


class MemoryAt(Record, kw_only=True):
    """A moment: the step (``ProfilerStep#N`` holding it, or the window's one step) and the innermost phase open;
    ``time_us``: the trace's time (µs from its first event) or the snapshot's clock."""
    step: int | None
    phase: str | None
    time_us: float | None = None


class MemoryTop(Record, kw_only=True):
    """Live blocks of one origin: the allocating Python frame (snapshots; None in traces, which have no stacks) and
    the phase open when they were allocated; ``frame`` ``(before the recorded history)``: what the history does not
    account for."""
    frame: str | None
    phase: str | None
    bytes: int
    blocks: int


class MemoryStep(Record, kw_only=True):
    """Allocated at a step's start (the growth rule's input)."""
    step: int
    allocated_bytes: int


class MemoryOom(Record, kw_only=True):
    """An out-of-memory: what was allocated and reserved then, the live blocks by origin and by phase, the request
    and what the device still had free; ``lines``: the explanation in words."""
    allocated_bytes: int
    reserved_bytes: int
    request_bytes: int
    device_free_bytes: int | None
    at: MemoryAt
    top: list[MemoryTop]
    by_phase: dict[str, int]
    frame: str | None
    lines: list[str]


class MemoryRow(Record, kw_only=True):
    """One rank's memory answers from one source (``snapshot``: an allocator snapshot file; ``trace``: a
    ``profile_memory`` trace's ``[memory]`` events), for one device."""
    role: str | None
    rank: int | None
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    at: MemoryAt
    top: list[MemoryTop]
    source: str
    path: str
    device: int | None = None
    device_type: str | None = None  # "cuda" or "cpu"
    window: list[int] | None = None  # the snapshot's manifest steps
    steps: list[MemoryStep] = msgspec.field(default_factory=list)
    oom: MemoryOom | None = None
    series: dict[str, list[Any]] | None = None  # at most 240 points: time_us, allocated, reserved (the report's plot)
