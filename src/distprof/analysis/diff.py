"""What got slower or faster between two runs, two steps or two ranks: per kernel, op, phase and category.

Both sides are summaries (:func:`distprof.analysis.summary.extract` per file). Kernels compare their
total time, ops their self time (nested ops are not counted twice), phases their wall time (the time
the phase was open), categories their device time. Rows are sorted by the absolute change.
"""

from __future__ import annotations

from typing import Any, Iterable

__all__ = ["compare"]


def _totals(parts: Iterable[dict[str, Any]]) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}

    def put(key, count, us):
        e = out.setdefault(key, [0, 0.0])
        e[0] += count
        e[1] += us

    for s in parts:
        for name, (c, tot) in s["kernels"].items():
            put(("kernel", name), c, tot)
        for name, (c, _tot, self_us) in s["ops"].items():
            put(("op", name), c, self_us)
        for name, (c, _tot, wall, _self) in s["phases"].items():
            put(("phase", name), c, wall)
        for cat, tot in s["categories"].items():
            put(("category", cat), 0, tot)
    return out


def compare(a: Iterable[dict[str, Any]], b: Iterable[dict[str, Any]], top: int | None = None) -> dict[str, Any]:
    """Rows ``{"kind", "name", "a_us", "b_us", "change_us", "ratio", "a_count", "b_count"}`` by |change| descending."""
    ta, tb = _totals(a), _totals(b)
    rows = []
    for key in ta.keys() | tb.keys():
        (ca, ua), (cb, ub) = ta.get(key, (0, 0.0)), tb.get(key, (0, 0.0))
        rows.append({"kind": key[0], "name": key[1], "a_us": ua, "b_us": ub, "change_us": ub - ua,
                     "ratio": (ub / ua) if ua else None, "a_count": int(ca), "b_count": int(cb)})
    rows.sort(key=lambda r: (-abs(r["change_us"]), r["kind"], r["name"]))
    total_a = sum(v[1] for k, v in ta.items() if k[0] == "kernel")
    total_b = sum(v[1] for k, v in tb.items() if k[0] == "kernel")
    return {"rows": rows[:top] if top else rows, "kernel_total_a_us": total_a, "kernel_total_b_us": total_b,
            "only_in_a": sorted(k[1] for k in ta.keys() - tb.keys() if k[0] != "category"),
            "only_in_b": sorted(k[1] for k in tb.keys() - ta.keys() if k[0] != "category")}
