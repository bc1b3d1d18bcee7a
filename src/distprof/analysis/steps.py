"""Per step and per rank: duration, time by phase (user annotations such as actor/update) and by category.

Steps are the ``ProfilerStep#N`` ranges torch records on the CPU (global step numbers under distprof).
A trace without them that a distprof run directory lists in its manifest becomes one row for its
capture window (``steps: [first, last]``, the window's wall time as its duration). An annotation or
device event belongs to the step in which it starts (device work is launched from the CPU inside the
step; a kernel still running past the step's end is counted where it started).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from typing import Any, Iterable

import numpy as np

from .reader import RankTrace, TraceStream
from .summary import ANNOTATION_CATS, DEVICE_CATS, category, profiler_step

__all__ = ["extract_steps", "combine_steps"]

_CATEGORIES = ("compute", "communication", "memcpy", "memset", "other")


def _sum_by_step(starts: np.ndarray, ends: np.ndarray, ts: array, dur: array, key: array, keys: int) -> np.ndarray:
    """``out[i, k]``: total ``dur`` of the events with key ``k`` that start inside step ``i``."""
    t = np.frombuffer(ts, dtype="d")
    idx = np.searchsorted(starts, t, side="right") - 1
    inside = idx >= 0
    inside[inside] &= t[inside] < ends[idx[inside]]
    flat = idx[inside] * keys + np.frombuffer(key, dtype=key.typecode)[inside]
    weights = np.frombuffer(dur, dtype="d")[inside]
    return np.bincount(flat, weights=weights, minlength=len(starts) * keys).reshape(len(starts), keys)


def extract_steps(t: RankTrace | TraceStream) -> dict[str, Any]:
    """Compact, picklable: this rank's steps, each with its duration, phases and categories (µs)."""
    marks: list[tuple[float, float, int]] = []
    names: dict[str, int] = {}
    ann_ts, ann_dur, ann_id = array("d"), array("d"), array("q")
    dev_ts, dev_dur, dev_cat = array("d"), array("d"), array("b")
    cat_code = {c: i for i, c in enumerate(_CATEGORIES)}
    first = last = None
    for batch in t.batches():
        for e in batch:
            if e.ph != "X":
                continue
            if first is None or e.ts < first:
                first = e.ts
            if last is None or e.ts + e.dur > last:
                last = e.ts + e.dur
            if e.name.startswith("ProfilerStep#"):
                n = profiler_step(e)
                if n is not None:
                    marks.append((e.ts, e.ts + e.dur, n))
            elif e.cat in ANNOTATION_CATS:
                ann_ts.append(e.ts)
                ann_dur.append(e.dur)
                ann_id.append(names.setdefault(e.name, len(names)))
            elif e.cat in DEVICE_CATS:
                dev_ts.append(e.ts)
                dev_dur.append(e.dur)
                dev_cat.append(cat_code[category(e)])
    source = "ProfilerStep"
    window_steps = None
    if not marks and t.window and first is not None:
        # No step markers: the manifest's window is the unit (it may span several steps).
        a, b = t.window["steps"]
        marks, source, window_steps = [(first, last, a)], "manifest", [a, b]
    marks.sort()
    starts = np.array([m[0] for m in marks], dtype="d")
    ends = np.array([m[1] for m in marks], dtype="d")
    phases = _sum_by_step(starts, ends, ann_ts, ann_dur, ann_id, max(len(names), 1))
    cats = _sum_by_step(starts, ends, dev_ts, dev_dur, dev_cat, len(_CATEGORIES))
    id_names = list(names)
    out = []
    for i, (start, end, n) in enumerate(marks):
        dur = end - start
        if window_steps is not None and t.window.get("end_time") and t.window.get("start_time"):
            dur = (t.window["end_time"] - t.window["start_time"]) * 1e6  # the window's wall time, as the profiler measured it
        row = {"step": n, "dur_us": dur, "source": source,
               "phases": {id_names[k]: float(v) for k, v in enumerate(phases[i]) if v and k < len(id_names)},
               "categories": {_CATEGORIES[k]: float(v) for k, v in enumerate(cats[i]) if v}}
        if window_steps is not None:
            row["steps"] = window_steps
        out.append(row)
    return {"rank": t.rank, "role": t.role, "path": t.path, "steps": out}


def combine_steps(per_rank: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One row per (role, step): every rank's duration and breakdown, and the slowest rank."""
    table: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in per_rank:
        for s in r["steps"]:
            table[(r["role"] or "", s["step"])].append(
                {"rank": r["rank"], **{k: s[k] for k in ("dur_us", "phases", "categories", "source", "steps") if k in s}})
    rows = []
    for (role, step), ranks in sorted(table.items()):
        ranks.sort(key=lambda x: (-1 if x["rank"] is None else x["rank"]))
        slowest = max(ranks, key=lambda x: x["dur_us"])
        phases: dict[str, float] = defaultdict(float)
        for x in ranks:
            for k, v in x["phases"].items():
                phases[k] += v / len(ranks)
        rows.append({"role": role or None, "step": step, "window": slowest.get("steps"), "ranks": ranks,
                     "slowest_rank": slowest["rank"],
                     "max_us": slowest["dur_us"], "min_us": min(x["dur_us"] for x in ranks),
                     "mean_phases": dict(sorted(phases.items(), key=lambda kv: -kv[1]))})
    return {"steps": rows}
