"""Per step and per rank: duration, time by phase (user annotations such as actor/update) and by category.

Steps are the ``ProfilerStep#N`` ranges torch records on the CPU (global step numbers under distprof).
An annotation or device event belongs to the step in which it starts (device work is launched from
the CPU inside the step; a kernel still running past the step's end is counted where it started).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Iterable

from .reader import RankTrace
from .summary import DEVICE_CATS, category

__all__ = ["extract_steps", "combine_steps"]

_ANNOTATION_CATS = {"user_annotation"}


def extract_steps(t: RankTrace) -> dict[str, Any]:
    marks = sorted((e.ts, e.ts + e.dur, int(e.name.split("#", 1)[1])) for e in t.events
                   if e.ph == "X" and e.name.startswith("ProfilerStep#") and e.cat in _ANNOTATION_CATS | {"cpu_op", ""}
                   and e.name.split("#", 1)[1].isdigit())
    starts = [m[0] for m in marks]
    steps = {n: {"step": n, "dur_us": end - start, "phases": defaultdict(float), "categories": defaultdict(float)}
             for start, end, n in marks}

    def step_at(ts: float):
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts < marks[i][1]:
            return steps[marks[i][2]]
        return None

    for e in t.events:
        if e.ph != "X" or e.name.startswith("ProfilerStep#"):
            continue
        if e.cat in _ANNOTATION_CATS:
            s = step_at(e.ts)
            if s is not None:
                s["phases"][e.name] += e.dur
        elif e.cat in DEVICE_CATS:
            s = step_at(e.ts)
            if s is not None:
                s["categories"][category(e)] += e.dur
    out = []
    for s in sorted(steps.values(), key=lambda s: s["step"]):
        out.append({**s, "phases": dict(s["phases"]), "categories": dict(s["categories"])})
    return {"rank": t.rank, "role": t.role, "path": t.path, "steps": out}


def combine_steps(per_rank: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One row per (role, step): every rank's duration and breakdown, and the slowest rank."""
    table: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in per_rank:
        for s in r["steps"]:
            table[(r["role"] or "", s["step"])].append({"rank": r["rank"], **{k: s[k] for k in ("dur_us", "phases", "categories")}})
    rows = []
    for (role, step), ranks in sorted(table.items()):
        ranks.sort(key=lambda x: (-1 if x["rank"] is None else x["rank"]))
        slowest = max(ranks, key=lambda x: x["dur_us"])
        phases: dict[str, float] = defaultdict(float)
        for x in ranks:
            for k, v in x["phases"].items():
                phases[k] += v / len(ranks)
        rows.append({"role": role or None, "step": step, "ranks": ranks, "slowest_rank": slowest["rank"],
                     "max_us": slowest["dur_us"], "min_us": min(x["dur_us"] for x in ranks),
                     "mean_phases": dict(sorted(phases.items(), key=lambda kv: -kv[1]))})
    return {"steps": rows}
