"""Interval arithmetic shared by capture summaries and trace analysis."""

from __future__ import annotations

from typing import Iterable

__all__ = ["union_length", "merge"]


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, disjoint union of half-open intervals ``(start, end)``; empty ones are dropped."""
    out: list[list[float]] = []
    for s, e in sorted(iv for iv in intervals if iv[1] > iv[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by the intervals, overlaps counted once."""
    return sum(e - s for s, e in merge(intervals))
