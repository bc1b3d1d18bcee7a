"""Interval arithmetic shared by capture summaries and trace analysis (numpy: traces hold millions of spans)."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

__all__ = ["union_length", "covered_length"]


def covered_length(starts: Sequence[float], ends: Sequence[float]) -> float:
    """Total length covered by half-open intervals ``[starts[i], ends[i])``, overlaps counted once.

    Sorted by start, the covered stretch runs from the first start to the running maximum of the
    ends; every start beyond the running maximum so far opens a gap, which is subtracted.
    """
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s  # empty and inverted intervals cover nothing
    s, e = s[keep], e[keep]
    if s.size == 0:
        return 0.0
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    gaps = np.maximum(s[1:] - reach[:-1], 0.0).sum()
    return float(reach[-1] - s[0] - gaps)


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by ``(start, end)`` pairs, overlaps counted once."""
    pairs = np.asarray(list(intervals), dtype=np.float64).reshape(-1, 2)
    return covered_length(pairs[:, 0], pairs[:, 1])
