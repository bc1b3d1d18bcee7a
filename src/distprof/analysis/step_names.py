"""Per-name device and host time inside the steps, per file (what ``diagnose`` divides by a rank's steps).

``summary``'s per-name tables cover the whole file, which holds more than the steps: the profiler's own
start and stop, a final ``cudaDeviceSynchronize`` after the last step, set-up before the first. Per-step
figures made from those would blame a step for time it never held (a sync 76 us after the last step, seen
as 18 ms "per step"). This extract keeps only events inside a ``ProfilerStep`` (kernels by the step of the
launch that queued them, as the table assigns them). Traces without steps give ``None``: their one unit
is the whole trace, and the summary's totals are exactly that.
"""

from __future__ import annotations

from typing import Any

from distprof.analysis.summary import _by_track, _table
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind

__all__ = ["extract"]


def extract(tb: TraceTable) -> dict[str, Any] | None:
    if not tb.steps.shape[0]:
        return None
    k, inside = tb.kind, tb.scope & (tb.step >= 0)
    dev = ((k == Kind.KERNEL) | (k == Kind.MEMCPY) | (k == Kind.MEMSET)) & inside
    ops_m = (k == Kind.CPU_OP) & inside
    rt_m = (k == Kind.RUNTIME) & inside
    return {"kernels": _table(tb.names, tb.name[dev], tb.dur[dev]),
            "ops": _table(tb.names, tb.name[ops_m], tb.dur[ops_m], _by_track(tb, ops_m)),
            "runtime": _table(tb.names, tb.name[rt_m], tb.dur[rt_m])}
