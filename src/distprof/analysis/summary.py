"""Where the time goes, by name: device kernels, CPU ops (total and self time) and phases (user
annotations), per rank and over all ranks.

Definitions (docs/analysis.md repeats them):

- **kernels**: device events (kernels, memcpy, memset) by name: count and the sum of their durations.
  Share: of all device event time over the ranks shown.
- **ops**: CPU ops by name: count, total and self time (total minus the ops nested directly inside,
  on the same thread). Share: of all ops' self time, which adds up to 1.
- **phases**: user annotations (``record_function`` / ``distprof.annotate`` ranges, not the
  ``ProfilerStep`` markers, and not the ``nccl:`` / ``gloo:`` ranges collectives record: those are
  communication). ``total_us`` sums durations; ``wall_us`` is the time the phase was open on the rank
  (overlapping ranges of one name, on any thread, counted once); ``self_us`` is the time it was the
  innermost annotation of its thread. Share: ``wall_us`` over the ranks' traced time, so each is at
  most 1; phases nest, so shares of different phases do not add up.
- **categories**: device time by category: compute, communication (collective kernels), memcpy, memset.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any, TypeVar

import numpy as np

from distprof.analysis.cost import profiling_cost, window_cost
from distprof.analysis.records import KernelRow, OpRow, PhaseRow, SummaryRank, SummaryResult
from distprof.trace.ranks import group
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind
from distprof.util import intervals as iv

__all__ = ["CATEGORIES", "combine", "extract", "profiling_cost", "self_times", "window_cost"]

CATEGORIES = ("compute", "communication", "memcpy", "memset")
R = TypeVar("R", KernelRow, OpRow, PhaseRow)


def self_times(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Self time of each range of one thread: its duration minus that of the ranges nested directly in it.

    Ranges of a thread nest (a stack). Sorted by start (the longer first on ties), a range's depth is the
    number of ranges begun before it minus those ended by its start; its parent is the last range before
    it one level up. Vectorised per depth level (a few dozen), not per range. A range that only partly
    overlaps the one before it (ns rounding) is nobody's child.
    """
    n = ts.size
    out = dur.astype(np.float64, copy=True)
    if n < 2:
        return out
    order = np.lexsort((-dur, ts))
    s, d = ts[order], dur[order]
    e = s + d
    # Ranges ended by s[i] among those before i: every end <= s[i] except those of zero-length ranges at
    # s[i] from i on (i itself included; zero-length ranges sort last among equal starts).
    is_zero = d == 0
    zero = np.cumsum(is_zero)
    group_end = np.searchsorted(s, s, side="right") - 1
    zero_after = zero[group_end] - zero + is_zero
    depth = np.arange(n) - (np.searchsorted(np.sort(e), s, side="right") - zero_after)
    parent = np.full(n, -1, dtype=np.int64)
    pos = np.arange(n)
    for level in range(1, int(depth.max()) + 1 if n else 1):
        kids = pos[depth == level]
        ups = pos[depth == level - 1]
        if kids.size == 0 or ups.size == 0:
            continue
        k = np.searchsorted(ups, kids) - 1
        ok = k >= 0
        parent[kids[ok]] = ups[k[ok]]
    has = parent >= 0
    has[has] &= e[parent[has]] >= e[has] - 1e-9 * np.maximum(np.abs(e[has]), 1.0)  # must contain the child
    children = np.bincount(parent[has], weights=d[has], minlength=n)
    out[order] -= children
    return out


def _self_times_stack(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """The same with an explicit stack (reference for tests)."""
    n = ts.size
    order = np.lexsort((-dur, ts))
    starts, durs = ts[order].tolist(), dur[order].tolist()
    stack: list[int] = []
    ends: list[float] = []
    parent = np.full(n, -1, dtype=np.int64)
    for k, (s, d) in enumerate(zip(starts, durs, strict=True)):
        while ends and ends[-1] <= s:
            stack.pop()
            ends.pop()
        if stack:
            parent[k] = stack[-1]
        stack.append(k)
        ends.append(s + d)
    has = parent >= 0
    children = np.bincount(parent[has], weights=dur[order][has], minlength=n)
    out = dur.astype(np.float64, copy=True)
    out[order] -= children
    return out


def _by_track(tb: TraceTable, m: np.ndarray) -> np.ndarray:
    """Self times of the events in mask ``m`` (nesting judged per thread), aligned with ``np.flatnonzero(m)``."""
    idx = np.flatnonzero(m)
    out = np.zeros(idx.size)
    if idx.size == 0:
        return out
    tracks = tb.track[idx]
    order = np.argsort(tracks, kind="stable")
    bounds = np.flatnonzero(np.diff(tracks[order])) + 1
    for part in np.split(order, bounds):
        sel = idx[part]
        out[part] = self_times(tb.ts[sel], tb.dur[sel])
    return out


def _table(names: list[str], ids: np.ndarray, *weights: np.ndarray) -> dict[str, tuple]:
    """name -> (count, sum of each weight), over the events whose name ids are ``ids``."""
    if ids.size == 0:
        return {}
    uniq, inv = np.unique(ids, return_inverse=True)
    count = np.bincount(inv)
    sums = [np.bincount(inv, weights=w) for w in weights]
    return {names[u]: (int(count[j]), *(float(s[j]) for s in sums)) for j, u in enumerate(uniq.tolist())}


def extract(tb: TraceTable) -> dict[str, Any]:
    """Per file: kernels, ops, phases and device categories in scope (compact: one row per name)."""
    k, scope = tb.kind, tb.scope
    dev = ((k == Kind.KERNEL) | (k == Kind.MEMCPY) | (k == Kind.MEMSET)) & scope
    kernels = _table(tb.names, tb.name[dev], tb.dur[dev])
    ops_m = (k == Kind.CPU_OP) & scope
    ops = _table(tb.names, tb.name[ops_m], tb.dur[ops_m], _by_track(tb, ops_m))
    rt_m = (k == Kind.RUNTIME) & scope
    runtime = _table(tb.names, tb.name[rt_m], tb.dur[rt_m])  # runtime / driver calls by name (syncs among them)
    ph_m = (k == Kind.ANNOTATION) & ~tb.comm & scope
    phases = _table(tb.names, tb.name[ph_m], tb.dur[ph_m], _by_track(tb, ph_m))
    s = tb.sets()
    traced_set = s.host_span if s.host_span[0].size else s.device_span
    wall = {}
    if ph_m.any():
        idx = np.flatnonzero(ph_m)
        ids = tb.name[idx]
        order = np.argsort(ids, kind="stable")
        bounds = np.flatnonzero(np.diff(ids[order])) + 1
        for part in np.split(order, bounds):
            sel = idx[part]
            # Cut to the traced time, so a phase's share of it is at most 1 whatever its ranges do.
            wall[tb.names[tb.name[sel[0]]]] = iv.length(iv.intersect(iv.merge(tb.ts[sel], tb.end[sel]), traced_set))
    phases = {n: (c, tot, wall.get(n, 0.0), self_us) for n, (c, tot, self_us) in phases.items()}
    cats = {"compute": float(tb.dur[dev & (k == Kind.KERNEL) & ~tb.comm].sum()),
            "communication": float(tb.dur[dev & (k == Kind.KERNEL) & tb.comm].sum()),
            "memcpy": float(tb.dur[dev & (k == Kind.MEMCPY)].sum()),
            "memset": float(tb.dur[dev & (k == Kind.MEMSET)].sum())}
    busy = iv.length(iv.union(s.compute, s.comm, s.memory))
    dev_span = iv.length(s.device_span)
    traced = iv.length(traced_set)
    # Outside the steps: what a whole-trace figure holds that a --steps-only one would not.
    outside = {}
    if not tb.scope.all() or tb.steps.shape[0]:
        out_dev = ((k == Kind.KERNEL) | (k == Kind.MEMCPY) | (k == Kind.MEMSET)) & (tb.step < 0) & scope
        out_ops = (k == Kind.CPU_OP) & (tb.step < 0) & scope
        outside = {"device_us": float(tb.dur[out_dev].sum()), "op_us": float(tb.dur[out_ops].sum())}
    return {
        "kernels": kernels, "ops": ops, "phases": phases, "runtime": runtime,
        "categories": {c: v for c, v in cats.items() if v},
        "device_busy_us": busy, "device_span_us": dev_span,
        "idle_share": (1.0 - busy / dev_span) if dev_span > 0 else None,
        "traced_us": traced, "outside_steps": outside, "profiling_cost": window_cost(tb),
    }


def _rows(table: dict[str, list[float]], top: int | None, total: float, row: type[R], share_of: int = 1) -> list[R]:
    """One ``row`` record per name (``KernelRow``: count, total; ``OpRow``: and self; ``PhaseRow``: and wall, self),
    by total_us descending."""
    extra = {KernelRow: (), OpRow: ("self_us",), PhaseRow: ("wall_us", "self_us")}[row]
    rows = [row(name=name, count=int(v[0]), total_us=v[1], share=(v[share_of] / total) if total else 0.0,
                **{key: v[j] for j, key in enumerate(extra, start=2)}) for name, v in table.items()]
    rows.sort(key=lambda r: (-r.total_us, r.name))
    return rows[:top] if top else rows


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One rank's files as one: names and figures summed (its windows are different steps)."""
    if len(parts) == 1:
        return parts[0]
    out: dict[str, Any] = {"kernels": defaultdict(lambda: [0, 0.0]), "ops": defaultdict(lambda: [0, 0.0, 0.0]),
           "phases": defaultdict(lambda: [0, 0.0, 0.0, 0.0]), "categories": defaultdict(float),
           "outside_steps": defaultdict(float), "device_busy_us": 0.0, "device_span_us": 0.0, "traced_us": 0.0}
    for p in parts:
        for key in ("kernels", "ops", "phases"):
            for n, vals in p[key].items():
                acc = out[key][n]
                for j, v in enumerate(vals):
                    acc[j] += v
        for key in ("categories", "outside_steps"):
            for n, v in p[key].items():
                out[key][n] += v
        for key in ("device_busy_us", "device_span_us", "traced_us"):
            out[key] += p[key]
    span = out["device_span_us"]
    out["idle_share"] = (1.0 - out["device_busy_us"] / span) if span > 0 else None
    return {k: (dict(v) if isinstance(v, defaultdict) else v) for k, v in out.items()}


def combine(files: Iterable[tuple[Any, dict[str, Any]]], top: int | None = None) -> SummaryResult:
    """Over all ranks: ``kernels`` and ``ops`` (the fixed --json keys, by total_us descending),
    ``phases``, ``categories``, and per rank its own figures (``ranks``; a rank's files are summed)."""
    kernels: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ops: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    phases: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    categories: dict[str, float] = defaultdict(float)
    outside: dict[str, float] = defaultdict(float)
    ranks = []
    traced = 0.0
    files = list(files)
    cost = profiling_cost((info, p.get("profiling_cost")) for info, p in files)
    for info, parts in group(files):
        s = _merge(parts)
        traced += s["traced_us"]
        for n, (c, tot) in s["kernels"].items():
            kernels[n][0] += c
            kernels[n][1] += tot
        for n, (c, tot, self_us) in s["ops"].items():
            o = ops[n]
            o[0] += c
            o[1] += tot
            o[2] += self_us
        for n, (c, tot, wall, self_us) in s["phases"].items():
            p = phases[n]
            p[0] += c
            p[1] += tot
            p[2] += wall
            p[3] += self_us
        for key, v in s["categories"].items():
            categories[key] += v
        for key, v in s["outside_steps"].items():
            outside[key] += v
        kern_total = sum(t for _, t in s["kernels"].values())
        ranks.append(SummaryRank(
            rank=info.rank, role=info.role, path=info.path, files=len(parts), rank_source=info.rank_source,
            device_busy_us=s["device_busy_us"], device_span_us=s["device_span_us"], idle_share=s["idle_share"],
            traced_us=s["traced_us"], categories=s["categories"], kernel_total_us=kern_total,
            top_kernels=_rows({n: list(v) for n, v in s["kernels"].items()}, 5, kern_total, KernelRow),
        ))
    kern_total = sum(v[1] for v in kernels.values())
    op_self = sum(v[2] for v in ops.values())
    return SummaryResult(
        kernels=_rows(kernels, top, kern_total, KernelRow),
        ops=_rows(ops, top, op_self, OpRow, share_of=2),
        phases=_rows(phases, top, traced, PhaseRow, share_of=2),
        categories=dict(categories),
        ranks=ranks,
        device_busy_us=sum(r.device_busy_us for r in ranks),
        traced_us=traced,
        outside_steps=dict(outside),
        profiling_cost=cost,
    )
