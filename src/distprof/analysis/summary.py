"""Time by GPU kernel and by CPU op, per rank and overall; device busy time with overlap counted once."""

from __future__ import annotations

from array import array
from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from ..intervals import covered_length
from .reader import Event, RankTrace, TraceStream

__all__ = ["summarize_trace", "summarize_ranks", "category", "is_communication", "profiler_step", "step_range"]

KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
DEVICE_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS
OP_CATS = {"cpu_op", "Operator"}
ANNOTATION_CATS = {"user_annotation"}  # record_function / distprof.annotate ranges on the CPU (phases)
_COMM_MARKERS = ("nccl", "rccl", "c10d::", "gloo:", "record_param_comms", "allreduce", "all_reduce", "allgather",
                 "reducescatter", "reduce_scatter", "alltoall", "all_to_all", "broadcast", "sendrecv")


def is_communication(name: str) -> bool:
    low = name.lower()
    return any(m in low for m in _COMM_MARKERS)


_STEP_CATS = {"user_annotation", "cpu_op", "Operator", ""}
_STEP_PREFIX = "ProfilerStep#"


def profiler_step(e: Event) -> int | None:
    """N for torch's ``ProfilerStep#N`` range (a global step under distprof), else None."""
    if not e.name.startswith(_STEP_PREFIX) or e.cat not in _STEP_CATS or e.ph != "X":
        return None
    n = e.name[len(_STEP_PREFIX):]
    return int(n) if n.isdigit() else None


def step_range(t: RankTrace | TraceStream, step: int) -> tuple[float, float] | None:
    """Start and end of ``ProfilerStep#step`` in ``t`` (a pass over the trace), or None."""
    for batch in t.batches():
        for e in batch:
            if e.name.startswith(_STEP_PREFIX) and profiler_step(e) == step:
                return e.ts, e.ts + e.dur
    return None


def category(e: Event) -> str:
    """compute | communication | memcpy | memset | other, for device events."""
    if e.cat in MEMCPY_CATS:
        return "memcpy"
    if e.cat in MEMSET_CATS:
        return "memset"
    if e.cat in KERNEL_CATS:
        return "communication" if is_communication(e.name) else "compute"
    return "other"


def _self_times(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Self time of each op of one thread: its duration minus that of the ops nested directly inside it."""
    order = np.lexsort((-dur, ts))  # by start, the enclosing (longer) op first
    self_t = dur.copy()
    starts, durs = ts[order].tolist(), dur[order].tolist()
    stack: list[int] = []  # positions in sorted order whose op is still open
    ends: list[float] = []
    parent = np.full(len(order), -1, dtype=np.int64)
    for k, (s, d) in enumerate(zip(starts, durs)):
        while ends and ends[-1] <= s:
            stack.pop()
            ends.pop()
        if stack:
            parent[k] = stack[-1]
        stack.append(k)
        ends.append(s + d)
    has = parent >= 0
    # subtract each child's duration from its parent (bincount sums children of the same parent)
    children = np.bincount(parent[has], weights=dur[order][has], minlength=len(order))
    self_t[order] -= children
    return self_t


class _Ops:
    """CPU ops kept as compact columns per thread until self times can be computed."""

    def __init__(self) -> None:
        self.names: dict[str, int] = {}
        self.threads: dict[tuple[Any, Any], tuple[array, array, array]] = {}

    def add(self, e: Event) -> None:
        cols = self.threads.get((e.pid, e.tid))
        if cols is None:
            cols = self.threads[(e.pid, e.tid)] = (array("d"), array("d"), array("q"))
        cols[0].append(e.ts)
        cols[1].append(e.dur)
        cols[2].append(self.names.setdefault(e.name, len(self.names)))

    def rows(self) -> dict[str, tuple[int, float, float]]:
        n = len(self.names)
        count, total, self_total = np.zeros(n), np.zeros(n), np.zeros(n)
        for ts, dur, ids in self.threads.values():
            t, d, i = (np.frombuffer(c, dtype=c.typecode) for c in (ts, dur, ids))
            count += np.bincount(i, minlength=n)
            total += np.bincount(i, weights=d, minlength=n)
            self_total += np.bincount(i, weights=_self_times(t, d), minlength=n)
        return {name: (int(count[k]), float(total[k]), float(self_total[k])) for name, k in self.names.items()}


def summarize_trace(t: RankTrace | TraceStream, step: int | None = None) -> dict[str, Any]:
    """A compact, picklable summary of one rank (what a worker process sends back).

    The trace is reduced batch by batch: kernels and categories are summed as they pass, device
    spans and CPU ops are kept as numeric columns (a few bytes per event, not the events). With
    ``step``, only events that start inside ``ProfilerStep#step`` count (one more pass finds it);
    a trace without that step summarizes to nothing (``"step_found": False``).
    """
    window = step_range(t, step) if step is not None else None
    lo, hi = window if window else (float("-inf"), float("inf"))
    if step is not None and window is None:
        lo = hi = 0.0  # nothing is inside a step this trace does not have
    kernels: dict[str, list[float]] = {}
    phases: dict[str, list[float]] = {}
    categories: dict[str, float] = defaultdict(float)
    dev_start, dev_end = array("d"), array("d")
    ops = _Ops()
    first = last = None
    n_events = 0
    for batch in t.batches():
        n_events += len(batch)
        for e in batch:
            if e.ph != "X":
                continue
            ts, end = e.ts, e.ts + e.dur
            if not lo <= ts < hi:
                continue
            if first is None or ts < first:
                first = ts
            if last is None or end > last:
                last = end
            cat = e.cat
            if cat in DEVICE_CATS:
                k = kernels.get(e.name)
                if k is None:
                    k = kernels[e.name] = [0, 0.0]
                k[0] += 1
                k[1] += e.dur
                categories[category(e)] += e.dur
                dev_start.append(ts)
                dev_end.append(end)
            elif cat in OP_CATS:
                ops.add(e)
            elif cat in ANNOTATION_CATS and not e.name.startswith(_STEP_PREFIX):
                p = phases.get(e.name)
                if p is None:
                    p = phases[e.name] = [0, 0.0]
                p[0] += 1
                p[1] += e.dur
    busy = covered_length(dev_start, dev_end)
    dev_span = (max(dev_end) - min(dev_start)) if dev_start else 0.0
    return {
        "path": t.path, "rank": t.rank, "rank_source": t.rank_source, "role": t.role,
        "kernels": {n: (int(c), tot) for n, (c, tot) in kernels.items()},
        "ops": ops.rows(),
        "phases": {n: (int(c), tot) for n, (c, tot) in phases.items()},
        "categories": dict(categories),
        "device_busy_us": busy,
        "device_span_us": dev_span,
        "idle_share": (1.0 - busy / dev_span) if dev_span > 0 else None,
        "trace_span_us": (last - first) if first is not None else 0.0,
        "start_us": (first or 0.0) + t.offset_us,
        "events": n_events,
        "salvaged": t.salvaged,
        "step": step,
        "step_found": step is None or window is not None,
    }


def _rows(table: dict[str, list[float]], top: int | None, total: float, with_self: bool = False) -> list[dict[str, Any]]:
    rows = []
    for name, v in table.items():
        row = {"name": name, "count": int(v[0]), "total_us": v[1], "share": (v[1] / total) if total else 0.0}
        if with_self:  # ops nest: their shares are of total self time, which adds up to 1
            row["self_us"] = v[2]
            row["share"] = (v[2] / total) if total else 0.0
        rows.append(row)
    rows.sort(key=lambda r: (-r["total_us"], r["name"]))
    return rows[:top] if top else rows


def summarize_ranks(per_rank: Iterable[dict[str, Any]], top: int | None = None) -> dict[str, Any]:
    """Merge per-rank summaries: the fixed --json keys ``kernels`` and ``ops`` (over all ranks) and ``ranks``,
    plus ``phases`` (user annotations) and ``categories``."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    phases: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    categories: dict[str, float] = defaultdict(float)
    ranks = []
    span_total = 0.0
    for s in per_rank:
        span_total += s["trace_span_us"]
        for n, (c, tot) in s.get("phases", {}).items():
            phases[n][0] += c
            phases[n][1] += tot
        for n, (c, tot) in s["kernels"].items():
            kernels[n][0] += c
            kernels[n][1] += tot
        for n, (c, tot, self_us) in s["ops"].items():
            o = ops[n]
            o[0] += c
            o[1] += tot
            o[2] += self_us
        for k, v in s["categories"].items():
            categories[k] += v
        kern_total = sum(t for _, t in s["kernels"].values())
        ranks.append({
            "rank": s["rank"], "role": s["role"], "path": s["path"], "rank_source": s["rank_source"],
            "device_busy_us": s["device_busy_us"], "device_span_us": s["device_span_us"], "idle_share": s["idle_share"],
            "categories": s["categories"], "kernel_total_us": kern_total,
            "top_kernels": _rows({n: list(v) for n, v in s["kernels"].items()}, 5, kern_total),
        })
    ranks.sort(key=lambda r: (r["role"] or "", -1 if r["rank"] is None else r["rank"], r["path"]))
    kern_total = sum(v[1] for v in kernels.values())
    op_total = sum(v[2] for v in ops.values())
    return {
        "kernels": _rows(kernels, top, kern_total),
        "ops": _rows(ops, top, op_total, with_self=True),
        # phases nest (rollout/generate holds its own annotations), so their share is of the traced wall time
        "phases": _rows(phases, top, span_total),
        "categories": dict(categories),
        "ranks": ranks,
        "device_busy_us": sum(r["device_busy_us"] for r in ranks),
    }
