"""Time by GPU kernel and by CPU op, per rank and overall; device busy time with overlap counted once."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

from ..intervals import union_length
from .reader import Event, RankTrace

__all__ = ["summarize_trace", "summarize_ranks", "category", "is_communication"]

KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
DEVICE_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS
OP_CATS = {"cpu_op", "Operator"}
_COMM_MARKERS = ("nccl", "rccl", "c10d::", "gloo:", "record_param_comms", "allreduce", "all_reduce", "allgather",
                 "reducescatter", "reduce_scatter", "alltoall", "all_to_all", "broadcast", "sendrecv")


def is_communication(name: str) -> bool:
    low = name.lower()
    return any(m in low for m in _COMM_MARKERS)


def category(e: Event) -> str:
    """compute | communication | memcpy | memset | other, for device events."""
    if e.cat in MEMCPY_CATS:
        return "memcpy"
    if e.cat in MEMSET_CATS:
        return "memset"
    if e.cat in KERNEL_CATS:
        return "communication" if is_communication(e.name) else "compute"
    return "other"


def _self_times(ops: list[Event]) -> dict[int, float]:
    """Self time of each op (by index): its duration minus that of the ops nested directly inside it."""
    self_t: dict[int, float] = {}
    by_thread: dict[tuple[Any, Any], list[int]] = defaultdict(list)
    for i, e in enumerate(ops):
        by_thread[(e.pid, e.tid)].append(i)
    for idx in by_thread.values():
        idx.sort(key=lambda i: (ops[i].ts, -ops[i].dur))
        stack: list[int] = []
        for i in idx:
            e = ops[i]
            while stack and ops[stack[-1]].ts + ops[stack[-1]].dur <= e.ts:
                stack.pop()
            self_t[i] = e.dur
            if stack:
                self_t[stack[-1]] -= e.dur
            stack.append(i)
    return self_t


def summarize_trace(t: RankTrace) -> dict[str, Any]:
    """A compact, picklable summary of one rank (what a worker process sends back)."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    categories: dict[str, float] = defaultdict(float)
    device_spans: list[tuple[float, float]] = []
    ops: list[Event] = []
    first = last = None
    for e in t.events:
        if e.ph != "X":
            continue
        end = e.ts + e.dur
        first = e.ts if first is None or e.ts < first else first
        last = end if last is None or end > last else last
        if e.cat in DEVICE_CATS:
            k = kernels[e.name]
            k[0] += 1
            k[1] += e.dur
            categories[category(e)] += e.dur
            device_spans.append((e.ts, end))
        elif e.cat in OP_CATS:
            ops.append(e)
    self_t = _self_times(ops)
    op_rows: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for i, e in enumerate(ops):
        r = op_rows[e.name]
        r[0] += 1
        r[1] += e.dur
        r[2] += self_t[i]
    busy = union_length(device_spans)
    dev_first = min((s for s, _ in device_spans), default=None)
    dev_last = max((e for _, e in device_spans), default=None)
    dev_span = (dev_last - dev_first) if device_spans else 0.0
    return {
        "path": t.path, "rank": t.rank, "rank_source": t.rank_source, "role": t.role,
        "kernels": {n: (int(c), tot) for n, (c, tot) in kernels.items()},
        "ops": {n: (int(c), tot, s) for n, (c, tot, s) in op_rows.items()},
        "categories": dict(categories),
        "device_busy_us": busy,
        "device_span_us": dev_span,
        "idle_share": (1.0 - busy / dev_span) if dev_span > 0 else None,
        "trace_span_us": (last - first) if first is not None else 0.0,
        "start_us": (first or 0.0) + t.offset_us,
        "events": len(t.events),
        "salvaged": t.salvaged,
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
    """Merge per-rank summaries: the fixed --json keys ``kernels`` and ``ops`` (over all ranks) and ``ranks``."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    categories: dict[str, float] = defaultdict(float)
    ranks = []
    for s in per_rank:
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
        "categories": dict(categories),
        "ranks": ranks,
        "device_busy_us": sum(r["device_busy_us"] for r in ranks),
    }
