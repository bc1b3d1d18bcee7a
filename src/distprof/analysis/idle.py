"""Device idle time by cause, HolisticTraceAnalysis's idle time breakdown: every rank, every stream, every step.

Device work is kernels, memcpy and memset (HTA's kernel categories: ``cuda_sync`` waits and
``gpu_user_annotation`` ranges are not work). On a stream, idle time is the gaps between its work, from
the start of its first event to the end of its last: events in start order (ties: the one launched
first), the gap before an event runs from the latest end of the events before it to its start. Each gap
goes to one cause, judged by the event that ends it:

- ``host_wait``: that event's launch call (the runtime event with its correlation id) began after the
  gap began: the stream had run out of work and waited for the CPU to enqueue more (HTA: ``ts_runtime >
  prev_end``);
- ``kernel_wait``: otherwise, a gap shorter than :data:`KERNEL_WAIT_BELOW_US` (30 µs, below it and not
  equal): the cost of starting one queued kernel after another;
- ``other``: the rest: the work was queued in time but the stream waited for something else (an event
  recorded on another stream, a collective peer, a synchronisation).

Device work whose launch call is not in the trace is never host wait.

Levels: ``streams`` (per stream, HTA's figure); the rank's ``device`` figure, the same rule on the union
of all its streams (the gaps in which no stream runs anything, between its first device start and last
device end: its ``idle_us`` is ``temporal``'s device ``idle_us``); per step, the device work the step
launched (as ``temporal`` counts it: the step's device span), on the union and per stream. Every figure
has ``span_us = busy_us + idle_us`` and ``idle_us = host_wait_us + kernel_wait_us + other_us``: they are
sums of the same gaps.

Where this differs from HTA 0.5.0 ``get_idle_time_breakdown``:

- every rank, not rank 0 only; a figure for the whole device and per step besides per stream;
- the threshold: HTA documents ``consecutive_kernel_delay=30`` as nanoseconds but compares it with gaps
  in the trace's unit, µs, so its effective default is 30 µs; 30 µs here reproduces its figures;
- a gap is measured from the latest end of the earlier events on the stream (HTA: the end of the one
  that started just before). The same unless work on one stream overlaps, where HTA adds a negative gap
  to kernel wait;
- nanosecond-resolution traces are used as written (HTA rounds starts up and ends down to whole µs);
- HTA drops device work launched from the last ProfilerStep on, and work with no launch call, when a
  trace has two steps or more; here the whole trace counts (or the ``--steps`` selection).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from .ranks import add, summed
from .table import TraceTable
from .vocab import Kind

__all__ = ["extract", "combine", "analyse", "present", "step_figure", "KERNEL_WAIT_BELOW_US", "CAUSES",
           "not_applicable"]

KERNEL_WAIT_BELOW_US = 30.0  # HTA's consecutive_kernel_delay default, in the µs it is really compared in
CAUSES = ("host_wait_us", "kernel_wait_us", "other_us")


def not_applicable(reason: str = "no device events") -> dict[str, Any]:
    """The one shape both this analysis and kernel launch statistics give where they mean nothing."""
    return {"applicable": False, "reason": reason}


class _Work:
    """One trace's device work, sorted once: every grouping (stream, step, step and stream) reuses the order
    by start and the ranks of the ends."""

    def __init__(self, ts: np.ndarray, end: np.ndarray, launched: np.ndarray) -> None:
        self.ts, self.end, self.launched = ts, end, launched
        self.by_start = np.lexsort((launched, ts))  # ties: the one launched first closes the gap
        self.by_end = np.argsort(end, kind="stable")
        self.end_rank = np.empty(ts.size, dtype=np.int64)
        self.end_rank[self.by_end] = np.arange(ts.size)

    def figures(self, group_ids: np.ndarray) -> tuple[np.ndarray, list[dict[str, float]]]:
        """Per distinct group id (ascending): span, busy, idle and its causes. Returns (group ids, figures)."""
        n = self.ts.size
        if n == 0:
            return np.empty(0, dtype=np.int64), []
        g_sorted = group_ids[self.by_start]
        # A stable sort by group keeps the start order within each group (radix sort for small ids).
        small = g_sorted.astype(np.uint16) if int(group_ids.max()) < 2**16 else g_sorted
        order = self.by_start[np.argsort(small, kind="stable")]
        g, s = group_ids[order], self.ts[order]
        first = np.ones(n, dtype=bool)
        first[1:] = g[1:] != g[:-1]
        # The latest end before each event, within its group, exactly: ends stand in as their ranks
        # (integers), each group shifted above every earlier one, so no group's reach leaks into the next
        # and no float is rounded on the way.
        gi = np.cumsum(first) - 1
        reach = np.maximum.accumulate(gi * n + self.end_rank[order])
        prev_rank = np.zeros(n, dtype=np.int64)
        prev_rank[1:] = reach[:-1] - gi[1:] * n
        prev_rank[first] = 0
        ends_sorted = self.end[self.by_end]
        prev_end = ends_sorted[prev_rank]
        gap = np.where(first, 0.0, np.maximum(s - prev_end, 0.0))
        host = ~first & (self.launched[order] > prev_end)
        kernel = ~first & ~host & (gap < KERNEL_WAIT_BELOW_US)
        other = ~first & ~host & ~kernel
        m = int(gi[-1]) + 1
        parts = [np.bincount(gi, weights=np.where(mask, gap, 0.0), minlength=m).tolist()
                 for mask in (host, kernel, other)]
        last = np.append(np.flatnonzero(first)[1:] - 1, n - 1)
        lo = s[first].tolist()
        hi = ends_sorted[reach[last] - np.arange(m) * n].tolist()
        out = []
        for j in range(m):
            h, k, o = parts[0][j], parts[1][j], parts[2][j]
            idle = h + k + o
            span = hi[j] - lo[j]
            out.append({"span_us": span, "busy_us": span - idle, "idle_us": idle,
                        "host_wait_us": h, "kernel_wait_us": k, "other_us": o})
        return g[first], out


def analyse(tb: TraceTable) -> dict[str, Any]:
    """The breakdowns of one trace (computed once per table: kernel launch statistics reuse the per-step
    figures for their launch-bound rule). ``device`` is None without device work in scope."""
    cached = tb._cache.get("idle")  # the table's per-table cache: launch statistics ask again
    if cached is not None:
        return cached
    k = tb.kind
    idx = np.flatnonzero(((k == Kind.KERNEL) | (k == Kind.MEMCPY) | (k == Kind.MEMSET)) & tb.scope)
    result: dict[str, Any] = {"device": None, "streams": {}, "steps": {}}
    if idx.size:
        launcher = tb.launcher()[idx]
        # Work whose launch call is not in the trace: never host wait.
        work = _Work(tb.ts[idx], tb.end[idx], np.where(launcher >= 0, tb.ts[np.maximum(launcher, 0)], -np.inf))
        stream_ids, stream_of = np.unique(tb.stream[idx], return_inverse=True)
        stream_of = stream_of.reshape(-1).astype(np.int64)
        _, (result["device"],) = work.figures(np.zeros(idx.size, dtype=np.int64))
        gids, figs = work.figures(stream_of)
        result["streams"] = {int(stream_ids[g]): f for g, f in zip(gids.tolist(), figs)}
        step = tb.step[idx].astype(np.int64)
        if (step >= 0).any():
            # Work outside every step goes to one more group, dropped: the sorts above are reused as they are.
            n_steps, n_streams = tb.steps.shape[0], stream_ids.size
            st = np.where(step >= 0, step, n_steps)
            nums = tb.steps[:, 2].astype(np.int64)
            sgids, sfigs = work.figures(st)
            steps = {int(nums[g]): {"device": f, "streams": {}} for g, f in zip(sgids.tolist(), sfigs) if g < n_steps}
            pgids, pfigs = work.figures(st * n_streams + stream_of)
            for g, f in zip(pgids.tolist(), pfigs):
                if g // n_streams < n_steps:
                    steps[int(nums[g // n_streams])]["streams"][int(stream_ids[g % n_streams])] = f
            result["steps"] = steps
    tb._cache["idle"] = result
    return result


def extract(tb: TraceTable) -> dict[str, Any]:
    return analyse(tb)


def shares(fig: dict[str, float]) -> dict[str, Any]:
    """A figure with its shares: ``idle_share`` of the span, each cause's share of the idle time."""
    idle, span = fig["idle_us"], fig["span_us"]
    out: dict[str, Any] = {"applicable": True, **fig, "idle_share": idle / span if span else 0.0}
    for key in CAUSES:
        out[key.replace("_us", "_share")] = fig[key] / idle if idle else 0.0
    return out


def present(part: dict[str, Any]) -> dict[str, Any]:
    """One level (device and streams) as the JSON shows it: shares added, streams a list by stream id."""
    if part.get("device") is None:
        return not_applicable()
    return {**shares(part["device"]),
            "streams": [{"stream": sid, **shares(f)} for sid, f in sorted(part["streams"].items())]}


def combine(files: Iterable[tuple[Any, dict[str, Any]]]) -> dict[str, Any]:
    """Per rank (its files summed, streams by id) and over all ranks (the ranks' device figures summed)."""
    ranks, total, applicable = [], None, 0
    for info, s in summed(files, ("device", "streams")):
        dev = s["device"]
        row = present({"device": dev, "streams": s["streams"] or {}})
        if dev is not None:
            applicable += 1
            total = add(total, dev)
        ranks.append({"role": info.role, "rank": info.rank, "path": info.path, "idle": row})
    overall = not_applicable() if total is None else \
        {**shares(total), "ranks": applicable, "kernel_wait_below_us": KERNEL_WAIT_BELOW_US}
    return {"ranks": ranks, "overall": overall}


def step_figure(part: dict[str, Any], step: int, whole: bool = False) -> dict[str, Any]:
    """One rank's figure for one step (``whole``: the file's, for a capture window without steps)."""
    if part.get("device") is None:
        return not_applicable()
    fig = part if whole else part["steps"].get(step)
    if fig is None:
        return not_applicable("no device work launched in this step")
    return present(fig)
