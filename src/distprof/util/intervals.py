"""Interval arithmetic shared by capture summaries and trace analysis (numpy: traces hold millions of spans).

A *set* is a pair of float64 arrays ``(starts, ends)`` of sorted, disjoint, non-empty half-open
intervals ``[s, e)``, as :func:`merge` returns. Every other function takes and returns sets, so a
trace's busy time, its communication not hidden by compute, or what a step spends waiting are a few
vectorised passes, whatever the number of events.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

__all__ = [
    "IntervalSet",
    "clip",
    "covered_length",
    "empty",
    "intersect",
    "length",
    "merge",
    "ranges_text",
    "subtract",
    "union",
    "union_length",
]

IntervalSet = tuple[np.ndarray, np.ndarray]


def empty() -> IntervalSet:
    return np.empty(0), np.empty(0)


def merge(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> IntervalSet:
    """The union of intervals ``[starts[i], ends[i])`` as a set (overlaps and nesting merged away)."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s  # empty and inverted intervals cover nothing
    s, e = s[keep], e[keep]
    if s.size == 0:
        return empty()
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    # A new run starts where an interval begins beyond everything before it.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def length(a: IntervalSet) -> float:
    return float((a[1] - a[0]).sum()) if a[0].size else 0.0


def _sweep(a: IntervalSet, b: IntervalSet, both: bool) -> IntervalSet:
    """Where the coverage of two sets satisfies a rule: ``both`` (a and b), else (a and not b)."""
    if a[0].size == 0 or (both and b[0].size == 0):
        return empty() if (both or a[0].size == 0) else a
    pts = np.concatenate([a[0], a[1], b[0], b[1]])
    da = np.concatenate([np.ones(a[0].size), -np.ones(a[1].size), np.zeros(2 * b[0].size)])
    db = np.concatenate([np.zeros(2 * a[0].size), np.ones(b[0].size), -np.ones(b[1].size)])
    order = np.argsort(pts, kind="stable")
    pts, ca, cb = pts[order], np.cumsum(da[order]), np.cumsum(db[order])
    # Coverage holds on [pts[i], pts[i+1]); equal points give empty pieces, dropped by merge.
    inside = (ca > 0) & (cb > 0) if both else (ca > 0) & (cb <= 0)
    inside = inside[:-1]
    return merge(pts[:-1][inside], pts[1:][inside])


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    return _sweep(a, b, both=True)


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    """The parts of ``a`` not covered by ``b``."""
    if b[0].size == 0:
        return a
    return _sweep(a, b, both=False)


def union(*sets: IntervalSet) -> IntervalSet:
    return merge(np.concatenate([s[0] for s in sets] or [np.empty(0)]),
                 np.concatenate([s[1] for s in sets] or [np.empty(0)]))


def clip(a: IntervalSet, lo: float, hi: float) -> IntervalSet:
    """``a`` restricted to ``[lo, hi)`` (binary search: the set is sorted)."""
    s, e = a
    if s.size == 0 or hi <= lo:
        return empty()
    i = int(np.searchsorted(e, lo, side="right"))
    j = int(np.searchsorted(s, hi, side="left"))
    if j <= i:
        return empty()
    s2, e2 = s[i:j].copy(), e[i:j].copy()
    s2[0] = max(s2[0], lo)
    e2[-1] = min(e2[-1], hi)
    keep = e2 > s2
    return s2[keep], e2[keep]


def covered_length(starts: Sequence[float] | np.ndarray, ends: Sequence[float] | np.ndarray) -> float:
    """Total length covered by half-open intervals ``[starts[i], ends[i])``, overlaps counted once."""
    return length(merge(starts, ends))


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` pairs, overlaps counted once."""
    pairs = np.asarray(list(intervals), dtype=np.float64).reshape(-1, 2)
    return covered_length(pairs[:, 0], pairs[:, 1])


def ranges_text(nums: Iterable[int], sep: str = ", ", limit: int | None = None) -> str:
    """Whole numbers (ranks, steps) as their runs: ``3, 4, 5, 9`` -> ``"3-5, 9"``; at most ``limit`` runs, then
    ``... (N in all)``."""
    runs: list[list[int]] = []
    for v in sorted(set(nums)):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    parts = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if limit is not None and len(parts) > limit:
        return sep.join(parts[:limit]) + f" ... ({sum(b - a + 1 for a, b in runs)} in all)"
    return sep.join(parts)
