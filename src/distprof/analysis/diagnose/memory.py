"""The memory rules, on ``summary``'s ``memory`` rows (:mod:`distprof.analysis.memory`): ``memory_leak`` and
``oom``. See :mod:`distprof.analysis.diagnose`. Neither costs step time (``cost_us`` 0: memory is not time); they are
reported whenever they fire, after the findings that cost time.

- ``memory_leak`` (one finding per rank, source and device, over all its files' step values): a rank's allocated
  memory at step boundaries (each step's start) grows across at least
  :data:`LEAK_MIN_STEPS` boundaries, never falling from one boundary to the next, by at least
  :data:`LEAK_MIN_BYTES` in all and at least :data:`LEAK_MIN_SHARE` of what was allocated at the first boundary.
  A job whose memory settles (optimizer state made at the first step, then flat) does not fire: only a rise at every
  boundary does. The claim gives the growth per step and where the live blocks at the peak came from.
- ``oom``: a snapshot holds an out-of-memory (the allocator's ``oom`` entry; the ``cuda_memory`` backend writes one
  at an OOM): the claim is the explanation (:func:`distprof.analysis.memory.oom_lines`): allocated and reserved at
  that moment and in which phase, the request, what the device had free, the largest live blocks by frame.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from distprof.analysis.diagnose.common import Finding, Job, Plot
from distprof.analysis.memory import BEFORE, fmt_bytes
from distprof.analysis.records_diag import FindingEvidence
from distprof.analysis.records_mem import MemoryRow

__all__ = ["LEAK_MIN_BYTES", "LEAK_MIN_SHARE", "LEAK_MIN_STEPS", "MEMORY_THRESHOLDS", "memory_leak", "oom"]

LEAK_MIN_STEPS = 3  # step boundaries (allocated at each step's start) the growth must span
LEAK_MIN_BYTES = 16 << 20  # 16 MiB grown in all (first boundary to last)
LEAK_MIN_SHARE = 0.05  # and at least 5% of what was allocated at the first boundary
MEMORY_THRESHOLDS = {"memory_leak": {"min_step_boundaries": LEAK_MIN_STEPS, "min_growth_bytes": LEAK_MIN_BYTES,
                                     "min_growth_share_of_first": LEAK_MIN_SHARE},
                     "oom": {}}


def _rows(job: Job) -> list[MemoryRow]:
    rows = job.inv.summary.memory
    return list(rows) if isinstance(rows, list) else []


def _who(r: MemoryRow) -> str:
    who = f"rank {r.rank}" if r.rank is not None else r.path
    return f"{r.role + ' ' if r.role else ''}{who} ({r.source}{', ' + r.device_type if r.device_type else ''})"


def _names(r: MemoryRow) -> list[str]:
    return [t.frame or t.phase or "" for t in r.top if t.frame != BEFORE and (t.frame or t.phase)][:3]


def _per_rank(rows: list[MemoryRow]) -> list[tuple[MemoryRow, list[tuple[int, int]]]]:
    """One entry per rank, source and device: the row with the highest peak, and the step values of all its rows
    (several windows' snapshots of one rank overlap; a later file's value for a step wins)."""
    groups: dict[tuple, list[MemoryRow]] = {}
    for r in rows:
        groups.setdefault((r.role, r.rank if r.rank is not None else r.path, r.source, r.device), []).append(r)
    out = []
    for rs in groups.values():
        steps = {s.step: s.allocated_bytes for r in rs for s in r.steps}
        out.append((max(rs, key=lambda r: r.peak_allocated_bytes), sorted(steps.items())))
    return out


def memory_leak(job: Job) -> list[Finding]:
    out = []
    for r, pts in _per_rank(_rows(job)):
        if len(pts) < LEAK_MIN_STEPS:
            continue
        vals = [v for _, v in pts]
        grown = vals[-1] - vals[0]
        if any(b < a for a, b in pairwise(vals)) or grown < LEAK_MIN_BYTES or grown < LEAK_MIN_SHARE * vals[0]:
            continue
        span = pts[-1][0] - pts[0][0]
        per_step = grown / span if span > 0 else float(grown)
        tops = [t for t in r.top if t.frame != BEFORE][:2]
        where = "; ".join(f"{fmt_bytes(t.bytes)} from {t.frame or t.phase}"
                          f"{' in ' + t.phase if t.frame and t.phase else ''}" for t in tops)
        claim = (f"{_who(r)}: allocated memory at the start of each step grows {fmt_bytes(per_step)} per step over "
                 f"steps {pts[0][0]}-{pts[-1][0]} ({fmt_bytes(vals[0])} -> {fmt_bytes(vals[-1])}), at every step: "
                 f"something keeps tensors across steps" + (f"; live at the peak: {where}" if where else ""))
        figures: dict[str, Any] = {"per_step_bytes": per_step, "grown_bytes": grown, "first_bytes": vals[0],
                                   "last_bytes": vals[-1], "boundaries": len(pts), "source": r.source,
                                   "path": r.path}
        out.append(Finding(id="memory_leak", claim=claim, cost_us=0.0, cost_share=None,
                           evidence=FindingEvidence(role=r.role, ranks=[r.rank] if r.rank is not None else [r.path],
                                                    steps=[p[0] for p in pts], names=_names(r), figures=figures),
                           fix="find what holds references from one step to the next: a list of losses or outputs "
                               "kept without .item() / .detach(), a cache or hook that grows, a retained graph "
                               "(retain_graph=True); the live blocks at the peak name the frames that allocated them "
                               "(a cuda_memory snapshot gives the Python stacks; open it at pytorch.org/memory_viz)",
                           plot=Plot.MEMORY))
    return out


def oom(job: Job) -> list[Finding]:
    out = []
    for r in _rows(job):
        o = r.oom
        if o is None:
            continue
        figures = {"allocated_bytes": o.allocated_bytes, "reserved_bytes": o.reserved_bytes,
                   "request_bytes": o.request_bytes, "device_free_bytes": o.device_free_bytes,
                   "by_phase": o.by_phase, "path": r.path}
        huge = o.request_bytes > o.allocated_bytes + (o.device_free_bytes or 0) and o.allocated_bytes > 0
        fix = ("the request is larger than the whole device: check the shape that asked for it (the frame named), "
               "a sequence length or batch size computed wrongly, a dtype upcast" if huge else
               "cut what the phase holding the most keeps live: smaller micro-batches, activation checkpointing, "
               "optimizer state sharded (FSDP / ZeRO), or, when reserved far exceeds allocated, "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation")
        out.append(Finding(id="oom", claim=f"{_who(r)}: " + ". ".join(o.lines), cost_us=0.0, cost_share=None,
                           evidence=FindingEvidence(role=r.role, ranks=[r.rank] if r.rank is not None else [r.path],
                                                    steps=[o.at.step] if o.at.step is not None else [],
                                                    names=[n for n in [o.frame, *o.by_phase] if n][:4],
                                                    figures=figures),
                           fix=fix, plot=Plot.MEMORY))
    return out
