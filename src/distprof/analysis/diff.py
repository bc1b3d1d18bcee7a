"""What got slower or faster between two runs, two steps or two ranks: per kernel, op, phase and category.

Both sides are summaries (:func:`distprof.analysis.summary.extract` per file). Kernels compare their
total time, ops their self time (nested ops are not counted twice), phases their wall time (the time
the phase was open), categories their device time.

Rows compare **per-step means**: a side's time divided by its rank-steps (each rank's steps, summed over
its ranks), so the same job profiled for 5 steps and for 3 steps compares equal, and a job on 4 ranks
compares with one on 2 rank for rank. ``ratio`` is ``b_per_step_us / a_per_step_us``; the totals stay as
``a_us`` and ``b_us``. When a side has files without steps (no ``ProfilerStep#N`` ranges, and no manifest
window saying which steps they hold: traces from elsewhere), there is nothing to divide by: the rows compare
totals (``compares: "totals"``, ``ratio = b_us / a_us``, the per-step keys null) and a warning says so.
Rows are sorted by the absolute change of what they compare.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from distprof.analysis.records_diag import AB, DiffResult, DiffRow, DiffStepTime

__all__ = ["compare", "step_facts"]


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


def step_facts(files: Iterable[tuple[Any, dict[str, Any] | None]]) -> dict[str, Any]:
    """One side's steps, from ``(FileInfo, steps.extract(...))`` pairs: ``steps`` (the step numbers held),
    ``rank_steps`` (steps summed over files: what per-step means divide by), ``ranks`` (``(role, rank)`` held),
    ``without_steps`` (files holding no step: their time cannot be put per step) and ``durations`` (role ->
    the ``ProfilerStep`` durations of all its ranks, for the median step)."""
    steps: set[int] = set()
    rank_steps = 0
    ranks: set[tuple[str, Any]] = set()
    without: list[str] = []
    durations: dict[str, list[float]] = {}
    for info, part in files:
        ranks.add((info.role or "", info.rank if info.rank is not None else f"? ({info.path})"))
        rows = (part or {}).get("steps") or []
        held: set[int] = set()
        for r in rows:
            if "window" in r:  # a manifest window without step markers: the steps it says it holds
                a, b = r["window"]
                held.update(range(int(a), int(b) + 1))
            else:
                held.add(int(r["step"]))
                durations.setdefault(info.role or "", []).append(float(r["dur_us"]))
        if not held:
            without.append(info.path)
        steps |= held
        rank_steps += len(held)
    return {"steps": sorted(steps), "rank_steps": rank_steps, "ranks": sorted(ranks, key=str),
            "without_steps": without, "durations": durations}


def _span(nums: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``3-5,9`` (at most six runs shown)."""
    runs: list[list[int]] = []
    for n in nums:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ",".join(f"{a}-{b}" if b > a else str(a) for a, b in runs[:6])
    return text + (",..." if len(runs) > 6 else "")


def _ranks_text(ranks: list[tuple[str, Any]]) -> str:
    by_role: dict[str, list] = {}
    for role, rank in ranks:
        by_role.setdefault(role, []).append(rank)
    parts = []
    for role, rs in sorted(by_role.items()):
        nums = sorted(r for r in rs if isinstance(r, int))
        text = ", ".join(x for x in (_span(nums) if nums else "", f"{len(rs) - len(nums)} unknown"
                                     if len(rs) > len(nums) else "") if x)
        parts.append(f"{role + ' ' if role else ''}{text}")
    return "; ".join(parts)


def _notes(fa: dict[str, Any], fb: dict[str, Any], per_step: bool, chosen: tuple[bool, bool]) -> list[str]:
    """Why the two sides may not compare like for like (``chosen``: the user picked the steps, the ranks)."""
    out = []
    if not per_step:
        for label, f in (("A", fa), ("B", fb)):
            if f["without_steps"]:
                n = len(f["without_steps"])
                out.append(f"side {label}: {n} file{'s' if n != 1 else ''} without steps (no ProfilerStep#N ranges, "
                           f"no manifest window), e.g. {f['without_steps'][0]}: rows compare totals, not means per "
                           "step (ratio = b_us / a_us)")
        return out
    if fa["steps"] != fb["steps"] and not chosen[0]:
        out.append(f"the step sets differ: A holds {len(fa['steps'])} step{'s' if len(fa['steps']) != 1 else ''} "
                   f"({_span(fa['steps'])}), B {len(fb['steps'])} ({_span(fb['steps'])}); rows compare the mean per "
                   "step and rank")
    if fa["ranks"] != fb["ranks"] and not chosen[1]:
        out.append(f"the rank sets differ: A has {_ranks_text(fa['ranks'])}, B has {_ranks_text(fb['ranks'])}; "
                   "rows compare the mean per step and rank, so they compare one rank's share of the work")
    return out


def _step_time(fa: dict[str, Any], fb: dict[str, Any]) -> list[DiffStepTime]:
    """Per role: the median step (over its ranks and steps) on each side."""
    rows = []
    for role in sorted(fa["durations"].keys() | fb["durations"].keys()):
        da, db = fa["durations"].get(role, []), fb["durations"].get(role, [])
        ma = statistics.median(da) if da else None
        mb = statistics.median(db) if db else None
        rows.append(DiffStepTime(role=role or None, a_median_us=ma, b_median_us=mb, a_steps=len(da), b_steps=len(db),
                                 ratio=(mb / ma) if ma and mb is not None else None))
    return rows


def compare(a: Iterable[dict[str, Any]], b: Iterable[dict[str, Any]], top: int | None = None,
            steps_a: dict[str, Any] | None = None, steps_b: dict[str, Any] | None = None,
            chosen: tuple[bool, bool] = (False, False)) -> DiffResult:
    """Rows (:class:`~.records_diag.DiffRow`: ``kind``, ``name``, ``a_us``, ``b_us``, ``change_us``, ``ratio``,
    ``a_count``, ``b_count``, ``a_per_step_us``, ``b_per_step_us``, ``change_per_step_us``), by the absolute change of
    what they compare, descending.

    ``steps_a`` / ``steps_b`` are :func:`step_facts` of each side; without them (or when a side has a file
    without steps) rows compare totals. ``chosen`` says whether the user picked each side's steps and ranks
    (``--step-a/-b``, ``--rank-a/-b``): sets that differ by choice are not warned about."""
    ta, tb = _totals(a), _totals(b)
    per = _per_step(steps_a, steps_b)
    rows = _rows(ta, tb, per)
    total_a, total_b = _kernel_total(ta), _kernel_total(tb)
    fa = steps_a or step_facts(())
    fb = steps_b or step_facts(())
    return DiffResult(rows=rows[:top] if top else rows, compares="per_step" if per else "totals",
                      steps=AB(a=len(fa["steps"]), b=len(fb["steps"])),
                      rank_steps=AB(a=fa["rank_steps"], b=fb["rank_steps"]),
                      step_time=_step_time(fa, fb), kernel_total_a_us=total_a, kernel_total_b_us=total_b,
                      kernel_per_step_a_us=total_a / per[0] if per else None,
                      kernel_per_step_b_us=total_b / per[1] if per else None,
                      only_in_a=_only_in(ta, tb), only_in_b=_only_in(tb, ta),
                      warnings=(_notes(fa, fb, per is not None, chosen) if steps_a is not None and steps_b is not None
                                else []))


def _per_step(steps_a: dict[str, Any] | None, steps_b: dict[str, Any] | None) -> tuple[int, int] | None:
    """Each side's rank-steps (what means per step divide by) when rows compare means per step: both sides hold
    steps, in every file. None: rows compare totals."""
    if not (steps_a and steps_b and steps_a["rank_steps"] and steps_b["rank_steps"]
            and not steps_a["without_steps"] and not steps_b["without_steps"]):
        return None
    return steps_a["rank_steps"], steps_b["rank_steps"]


def _rows(ta: dict[tuple[str, str], list[float]], tb: dict[tuple[str, str], list[float]],
          per: tuple[int, int] | None) -> list[DiffRow]:
    """A row per key of either side, by the absolute change of what they compare, descending."""
    rows = [_row(key, ta.get(key, (0, 0.0)), tb.get(key, (0, 0.0)), per) for key in ta.keys() | tb.keys()]
    rows.sort(key=lambda r: (-abs(r.change_per_step_us if per and r.change_per_step_us is not None else r.change_us),
                             r.kind, r.name))
    return rows


def _row(key: tuple[str, str], a: Sequence[float], b: Sequence[float],
         per: tuple[int, int] | None) -> DiffRow:
    """One key's figures: ``a`` / ``b`` are each side's (count, microseconds)."""
    (ca, ua), (cb, ub) = a, b
    pa: float | None = None
    pb: float | None = None
    change: float | None = None
    base, new = ua, ub
    if per:
        pa, pb = ua / per[0], ub / per[1]
        base, new, change = pa, pb, pb - pa
    return DiffRow(kind=key[0], name=key[1], a_us=ua, b_us=ub, change_us=ub - ua, ratio=(new / base) if base else None,
                   a_count=int(ca), b_count=int(cb), a_per_step_us=pa, b_per_step_us=pb, change_per_step_us=change)


def _kernel_total(t: dict[tuple[str, str], list[float]]) -> float:
    return sum(v[1] for k, v in t.items() if k[0] == "kernel")


def _only_in(t: dict[tuple[str, str], list[float]], other: dict[tuple[str, str], list[float]]) -> list[str]:
    """Names (not categories) that ``t`` holds and ``other`` does not."""
    return sorted(k[1] for k in t.keys() - other.keys() if k[0] != "category")
