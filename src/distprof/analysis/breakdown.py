"""Step time breakdown as the PyTorch TensorBoard plugin's overview showed it.

Every instant of a step goes to exactly one category, the first of these that is running then:
kernel (compute kernels), memcpy, memset, communication (collective kernels and host-side collective
ranges), runtime (CUDA/HIP runtime and driver calls), data loader (the DataLoader iterator's
``__next__``), CPU exec (any other CPU op, annotation or Python function), other (nothing traced runs).
The categories add up to the step's time.

A step's time runs from its ``ProfilerStep`` start to the later of its end and the end of the last
device work it launched (device work trails the host; the plugin extends steps the same way). A trace
without steps is one row (``step: null``) over everything it traced. CPU-only traces have no kernel,
memcpy, memset or runtime time: those are 0, not missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from distprof.analysis.records import Ranked, StepBreakdown
from distprof.trace.ranks import group
from distprof.trace.table import Sets, TraceTable
from distprof.util import intervals as iv

__all__ = ["CATEGORIES", "average", "combine", "extract", "figures", "step_figure"]

CATEGORIES = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec", "other")


def figures(s: Sets, lo: float, hi: float) -> dict[str, float]:
    if s.device_span[0].size:
        hi = max(hi, float(s.device_span[1][-1]))
    window = (np.array([lo]), np.array([hi]))
    taken = iv.empty()
    out: dict[str, float] = {"dur_us": hi - lo}
    ordered = (("kernel", s.compute), ("memcpy", s.memcpy), ("memset", s.memset),
               ("communication", iv.union(s.comm, s.host_comm)), ("runtime", s.runtime),
               ("dataloader", s.dataloader), ("cpu_exec", s.host_ops))
    for name, part in ordered:
        mine = iv.subtract(iv.intersect(part, window), taken)
        out[name] = iv.length(mine)
        taken = iv.union(taken, mine)
    out["other"] = max((hi - lo) - iv.length(taken), 0.0)
    return out


def extract(tb: TraceTable) -> dict[str, Any]:
    rows = {}
    for i, num in enumerate(tb.steps[:, 2].tolist()):
        if len(tb.step_index().get(i, ())):
            rows[int(num)] = figures(tb.sets(i), float(tb.steps[i, 0]), float(tb.steps[i, 1]))
    whole = None
    if not rows:
        s = tb.sets()
        ends = [x for x in (s.host_span, s.device_span) if x[0].size]
        if ends:
            lo = min(float(x[0][0]) for x in ends)
            hi = max(float(x[1][-1]) for x in ends)
            whole = figures(s, lo, hi)
    return {"steps": rows, "whole": whole}


def average(rows: Iterable[dict[str, float]]) -> StepBreakdown | None:
    rows = list(rows)
    if not rows:
        return None
    return StepBreakdown(**{k: sum(r[k] for r in rows) / len(rows) for k in ("dur_us", *CATEGORIES)})


def step_figure(part: dict[str, Any], step: int) -> StepBreakdown | None:
    """One rank's breakdown of one step, None for a step its file does not have."""
    fig = part.get("steps", {}).get(step)
    return None if fig is None else StepBreakdown(**fig)


def combine(files: Iterable[tuple[Any, dict[str, Any]]]) -> tuple[list[Ranked[StepBreakdown | None]],
                                                                 StepBreakdown | None]:
    """Per rank (its files together): its average step; over all ranks: the average step."""
    ranks: list[Ranked[StepBreakdown | None]] = []
    every: list[dict[str, float]] = []
    for info, parts in group(files):
        rows = []
        for p in parts:
            rows += list(p["steps"].values()) or ([p["whole"]] if p["whole"] else [])
        every += rows
        ranks.append(Ranked(info.role, info.rank, info.path, average(rows)))
    return ranks, average(every)
