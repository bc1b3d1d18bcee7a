"""Device copy rules: ``memcpy`` (copies with nothing else on the device) and ``pageable_memcpy`` (copies from
or to host memory that is not pinned). See :mod:`distprof.analysis.diagnose`."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from distprof.analysis.diagnose.common import (
    MEMCPY_SHARE,
    PAGEABLE_SHARE,
    Finding,
    Job,
    Plot,
    breakdown_figure,
    by_rank,
    fmt_dur,
    make_finding,
    name_text,
    path_what_if,
    ranks_of,
    share_rule,
    step_key,
    steps_text,
)
from distprof.trace.vocab import memcpy_endpoints

__all__ = ["memcpy", "pageable_memcpy"]


def memcpy(job: Job) -> list[Finding]:
    """Copies with nothing else on the device (:data:`MEMCPY_SHARE` of the step)."""
    out = []
    copies = breakdown_figure(lambda b: b.memcpy)
    for role, rows, cuts, share, per_rank in share_rule(job, "memcpy", copies, MEMCPY_SHARE, True):
        kinds: dict[str, float] = defaultdict(float)
        for r in per_rank:
            for k, v in job.kernel_names(role, r, lambda n: memcpy_endpoints(n) is not None).items():
                kinds[k] += v
        wi = path_what_if(rows, cuts, "every copy overlapped with compute", upper_bound=True)
        rank_steps = sum(len(c) for c in cuts)
        claim = (f"memory copies with no kernel running take {fmt_dur(sum(per_rank.values()) / rank_steps)} per rank "
                 f"and step in {steps_text([step_key(r) for r in rows])}; hiding them behind compute would save up to "
                 f"{fmt_dur(wi.saves_per_step_us)} per step.")
        out.append(make_finding(job, "memcpy", role, rows, cuts, per_rank, claim, wi,
                                "Copy less and earlier: keep tensors on the device, copy with non_blocking=True from "
                                "pinned memory on a side stream ahead of use, avoid .to()/.cpu() round trips inside "
                                "the step.",
                                [k for k, _ in sorted(kinds.items(), key=lambda kv: -kv[1])[:3]],
                                {"share_of_step": share}, Plot.TEMPORAL))
    return out


def pageable_memcpy(job: Job) -> list[Finding]:
    """Copies to or from pageable host memory (:data:`PAGEABLE_SHARE` of the step)."""
    out = []
    for role, rows in job.by_role.items():
        per_step = {r: job.kernel_names(role, r, lambda n: "Pageable" in (memcpy_endpoints(n) or ()))
                    for r in ranks_of(rows)}
        cuts: list[dict[int, float]] = []
        per_rank: defaultdict[Any, float] = defaultdict(float)
        part, dur, rank_steps = 0.0, 0.0, 0
        for row in rows:
            cut = {}
            for i, x in enumerate(row.ranks):
                v = sum(per_step.get(x.rank, {}).values())
                dur += x.dur_us
                rank_steps += 1
                if v > 0:
                    cut[i] = min(v, x.busy_us)
                    per_rank[x.rank] += v
                    part += v
            cuts.append(cut)
        if not part or dur <= 0 or part < PAGEABLE_SHARE * dur:
            continue
        names: dict[str, float] = defaultdict(float)
        for ks in per_step.values():
            for k, v in ks.items():
                names[k] += v
        wi = path_what_if(rows, cuts, "copies from pinned memory, asynchronous to the host", upper_bound=True)
        claim = (f"copies to or from pageable (not pinned) host memory take {fmt_dur(part / rank_steps)} per rank and "
                 f"step in {steps_text([step_key(r) for r in rows])} "
                 f"({', '.join(name_text(k) for k in sorted(names))}); "
                 f"pinned memory would save up to {fmt_dur(wi.saves_per_step_us)} per step.")
        out.append(make_finding(job, "pageable_memcpy", role, rows, cuts, per_rank, claim, wi,
                                "Pin the host buffers: DataLoader(pin_memory=True) or tensor.pin_memory(), then "
                                ".to(device, non_blocking=True); for device-to-host reads, copy into a pinned buffer.",
                                [k for k, _ in sorted(names.items(), key=lambda kv: -kv[1])],
                                {"share_of_step": part / dur, "per_rank_us": by_rank(per_rank)}, Plot.KERNELS))
    return out
