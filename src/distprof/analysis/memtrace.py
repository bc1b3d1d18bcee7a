"""Memory answers from a ``profile_memory`` trace: its ``[memory]`` instant events (``Total Allocated``, ``Total
Reserved``, ``Bytes``, ``Addr``, ``Device Type``, ``Device Id``; the table keeps them, :mod:`distprof.trace.table`).
The formulas are :mod:`.memory`'s. Per file (:func:`extract`, in a worker) the answers are computed whole: they need
only this file, and what goes back to the driver is small (the top groups, the step values, a thinned curve).

The device: the CUDA device (``Device Type`` 1) with the most events, else the host (0: CPU allocations, all a
CPU-only trace has; its ``Total Reserved`` is 0). With a step selection (``--steps``, ``--steps-only``) only the
events inside the chosen steps count. A step is a ``ProfilerStep#N`` range; a phase the innermost other annotation
(``distprof.annotate``, ``record_function``) open at the moment, on any thread. Blocks live at the peak are grouped
by the phase open when each was allocated (a trace has no stacks).
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from distprof.analysis import memory
from distprof.analysis.records import to_json
from distprof.analysis.records_mem import MemoryAt, MemoryRow
from distprof.trace.ranks import group
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind

__all__ = ["combine", "extract"]

CUDA, CPU = 1, 0
_DEVICE_TYPE = {CUDA: "cuda", CPU: "cpu"}


def phases_at(tb: TraceTable, times: np.ndarray) -> list[str | None]:
    """For each of the ascending ``times``, the innermost (latest-starting) annotation open then (steps are not
    annotations here), on any thread: one sweep, O(events + annotations). A range popped for having ended before
    one moment is ended for every later one, so the stack's top, once ended ranges are popped, is the latest-starting
    open range."""
    idx = np.flatnonzero(tb.kind == Kind.ANNOTATION)
    idx = idx[np.argsort(tb.ts[idx], kind="stable")]
    starts, ends = tb.ts[idx].tolist(), tb.end[idx].tolist()
    names = [tb.names[n] for n in tb.name[idx].tolist()]
    out: list[str | None] = []
    stack: list[int] = []
    i, m = 0, len(starts)
    for t in times.tolist():
        while i < m and starts[i] <= t:
            stack.append(i)
            i += 1
        while stack and ends[stack[-1]] < t:
            stack.pop()
        out.append(names[stack[-1]] if stack else None)
    return out


def _step_at(tb: TraceTable, t: float) -> int | None:
    for start, end, num in tb.steps.tolist():
        if start <= t <= end:
            return int(num)
    return None


def _device(mem: np.ndarray) -> tuple[int, int] | None:
    """(Device Type, Device Id) answered for: the CUDA device with the most events, else the host."""
    if mem.shape[0] == 0:
        return None
    keys, counts = np.unique(mem[:, 4:6], axis=0, return_counts=True)
    cuda = [(int(c), int(k[0]), int(k[1])) for k, c in zip(keys, counts, strict=True) if k[0] == CUDA]
    if cuda:
        _, dt, di = max(cuda)
        return dt, di
    host = [(int(c), int(k[0]), int(k[1])) for k, c in zip(keys, counts, strict=True) if k[0] == CPU]
    return (host and (max(host)[1], max(host)[2])) or None


def extract(tb: TraceTable) -> dict[str, Any] | None:
    """One file's memory answers (the fields of a :class:`~.records_mem.MemoryRow`, as JSON), or None when it has
    no ``[memory]`` events."""
    dev = _device(tb.mem)
    if dev is None:
        return None
    sel = (tb.mem[:, 4] == dev[0]) & (tb.mem[:, 5] == dev[1])
    steps = tb.steps
    if tb.by_step:  # the selection counts only the chosen steps: the events inside them
        chosen = np.unique(tb.step[tb.scope & (tb.step >= 0)])
        steps = tb.steps[chosen]
        inside = np.zeros(sel.size, dtype=bool)
        for start, end in steps[:, :2].tolist():
            inside |= (tb.mem_ts >= start) & (tb.mem_ts <= end)
        sel &= inside
        if not sel.any():
            return None
    times, m = tb.mem_ts[sel], tb.mem[sel]
    order = np.argsort(times, kind="stable")
    times, m = times[order], m[order]
    alloc, res, nbytes, addr = m[:, 0], m[:, 1], m[:, 2], m[:, 3]
    initial = int(alloc[0] - nbytes[0])  # before the first event
    i_peak = int(np.argmax(alloc))
    phase = phases_at(tb, times[:i_peak + 1])
    live: dict[int, tuple[int, str | None, str | None]] = {}
    for i, (b, a) in enumerate(zip(nbytes[:i_peak + 1].tolist(), addr[:i_peak + 1].tolist(), strict=True)):
        if b > 0:
            live[a] = (b, None, phase[i])
        elif b < 0:
            live.pop(a, None)
    t_peak = float(times[i_peak])
    starts = [(int(num), float(start)) for start, _end, num in steps.tolist()]
    row = {"peak_allocated_bytes": int(alloc[i_peak]), "peak_reserved_bytes": int(res.max()),
           "at": MemoryAt(step=_step_at(tb, t_peak), phase=phase[i_peak], time_us=round(t_peak, 3)),
           "top": memory.group_live(live.values(), int(alloc[i_peak])), "device": dev[1],
           "device_type": _DEVICE_TYPE.get(dev[0], str(dev[0])),
           "steps": memory.step_values(times, alloc, initial, sorted(starts, key=lambda s: s[1])),
           "series": memory.series_points(times, alloc, res)}
    return to_json(row)


def combine(pairs: list[tuple[Any, dict[str, Any] | None]]) -> list[MemoryRow]:
    """The files' answers as rows, one per rank: the file with its highest peak answers, the step values of all its
    files together (several windows)."""
    out = []
    for info, parts in group((info, p) for info, p in pairs if p):
        best = max(parts, key=lambda p: p["peak_allocated_bytes"])
        steps = {s["step"]: s for p in parts for s in p["steps"]}
        out.append(msgspec.convert({**best, "steps": [steps[k] for k in sorted(steps)], "role": info.role,
                                    "rank": info.rank, "path": info.path, "source": "trace"}, MemoryRow))
    return out
