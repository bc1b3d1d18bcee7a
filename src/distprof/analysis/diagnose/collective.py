"""The ``slow_collective`` rule: a collective of ``summary``'s collective report (:mod:`distprof.analysis.collectives`)
whose bus bandwidth is far below the link's, or whose ranks' start skew dominates its transfer. See
:mod:`distprof.analysis.diagnose`.

Judged per (role, process group, collective) row, only where its figures are known: device collectives (NCCL
kernels; host collectives have no transfer time), recorded sizes (``bytes``: traces without collective metadata, the
DLRM set, have none) and at least two traced ranks (a collective traced on one rank, HTA's NCCL trace, lasts as long
as that rank waits for its untraced peers: its duration is not the transfer; likewise any collective whose group,
or the job when the group's size is not recorded, has ranks that were not traced: HTA's two-rank-sampled, 2 of 128
ranks), on a device the link table
(:mod:`distprof.analysis.links`) knows. The link is assumed from the job's size (one node up to 8 ranks: NVLink or
PCIe; several nodes beyond: the InfiniBand generation of the GPU's systems, one NIC per GPU).

- *bandwidth*: ``busbw`` < :data:`SLOW_COLLECTIVE_SHARE` of the link's, and the transfer time (per instance the
  shortest among the ranks, summed) at least 1 / :data:`SLOW_COLLECTIVE_SHARE` times what the link takes:
  ``count x SLOW_COLLECTIVE_LATENCY_US + bus bytes / link bandwidth`` (bus bytes = busbw x transfer time: the bytes
  nccl-tests' bus bandwidth counts). Cost, an upper bound: the transfer time over what the link takes.
- *skew*: the median start skew is at least :data:`SLOW_COLLECTIVE_SKEW_RATIO` times the median transfer: the ranks
  arrive apart, and the time is waiting, not the link. Not reported for a role with a ``straggler`` finding (which
  costs that waiting already). Cost, an upper bound: the mean skew times the count.

Either fires only when its cost is at least :data:`SLOW_COLLECTIVE_MIN_SHARE` of the role's step time. The cost is
not placed on the step's path (the report gives no per-step split): it is the transfer or waiting time itself.
"""

from __future__ import annotations

from typing import Any

from distprof.analysis.diagnose.common import (
    SLOW_COLLECTIVE_LATENCY_US,
    SLOW_COLLECTIVE_MIN_SHARE,
    SLOW_COLLECTIVE_SHARE,
    SLOW_COLLECTIVE_SKEW_RATIO,
    Finding,
    Job,
    Plot,
    fmt_dur,
    fmt_pct,
    ranks_of,
    step_key,
    steps_text,
)
from distprof.analysis.links import reference
from distprof.analysis.records_comm import CollectiveRow
from distprof.analysis.records_diag import FindingEvidence, WhatIf

__all__ = ["slow_collective"]


def _world(job: Job, role: Any) -> int | None:
    sizes = [f.world_size for f in job.inv.files if f.world_size and (f.label == role or f.role == role)]
    return max(sizes) if sizes else None


def _bandwidth(c: CollectiveRow, device: str | None, world: int | None) -> dict[str, Any] | None:
    ref = reference(device, world)
    if ref is None or c.busbw_gbps is None or c.min_dur_us is None or not c.count:
        return None
    link, span = ref
    bus_bytes = c.busbw_gbps * 1e9 * c.min_dur_us * 1e-6
    expected = c.count * SLOW_COLLECTIVE_LATENCY_US + bus_bytes / (link.gbps * 1e9) * 1e6
    if c.busbw_gbps >= SLOW_COLLECTIVE_SHARE * link.gbps or c.min_dur_us * SLOW_COLLECTIVE_SHARE < expected:
        return None
    return {"form": "bandwidth", "cost_us": c.min_dur_us - expected, "link": link.name, "link_gbps": link.gbps,
            "assumed_span": span, "link_source": link.source, "expected_us": expected}


def _skew(c: CollectiveRow) -> dict[str, Any] | None:
    if c.skew_us is None or not c.dur_median_us or c.skew_us < SLOW_COLLECTIVE_SKEW_RATIO * c.dur_median_us:
        return None
    mean = c.skew_mean_us if c.skew_mean_us is not None else c.skew_us
    return {"form": "skew", "cost_us": mean * c.count}


def _finding(job: Job, c: CollectiveRow, fig: dict[str, Any], rows: list, cost: float) -> Finding:
    st = job.step_time(rows)
    keys = [step_key(r) for r in rows]
    per_step = cost / len(rows)
    what = f"{c.name} on group {c.group_desc or c.group}"
    size = f"{c.bytes_per_call / 1e6:.3g} MB" if c.bytes_per_call is not None else "?"
    if fig["form"] == "bandwidth":
        claim = (f"{what} reaches {c.busbw_gbps:.3g} GB/s of bus bandwidth ({c.count} calls of {size}, "
                 f"{fmt_dur(c.min_dur_us or 0.0)} of transfer in {steps_text(keys)}), under "
                 f"{fmt_pct(SLOW_COLLECTIVE_SHARE)} of the {fig['link_gbps']:g} GB/s of {fig['link']} (assumed: the "
                 f"group spans {fig['assumed_span']}); at the link's speed the transfers would take "
                 f"{fmt_dur(fig['expected_us'])}, saving up to {fmt_dur(per_step)} per step.")
        fix = ("Check the interconnect the collective takes: NCCL_DEBUG=INFO names the transport (P2P/NVLink, SHM, "
               "NET/IB or sockets: NET/Socket means no InfiniBand or RDMA), nvidia-smi topo -m the GPUs' links; "
               "NCCL_P2P_DISABLE, NCCL_IB_DISABLE or a wrong NCCL_SOCKET_IFNAME force slow paths; compute running "
               "beside the collective can also slow it (nccl-tests all_reduce_perf gives the link's figure).")
        plot = Plot.OVERLAP
    else:
        last = f"; rank {c.last_rank} arrives last in {fmt_pct(c.last_share or 0.0)} of them" \
            if c.last_rank is not None else ""
        claim = (f"{what}: the ranks start {fmt_dur(c.skew_us or 0.0)} apart (median over {c.count} calls) while the "
                 f"transfer takes {fmt_dur(c.dur_median_us or 0.0)}{last}: the time is waiting, not the link; up to "
                 f"{fmt_dur(per_step)} per step.")
        fix = ("Find what makes the late rank arrive late (distprof stragglers; uneven work or data per rank, a "
               "slower host); faster links will not help.")
        plot = Plot.WAITS
    ranks = ([c.last_rank] if c.last_rank is not None else []) + [r for r in ranks_of(rows) if r != c.last_rank]
    figures = {**fig, "busbw_gbps": c.busbw_gbps, "algbw_gbps": c.algbw_gbps, "bytes": c.bytes,
               "bytes_per_call": c.bytes_per_call, "count": c.count, "min_dur_us": c.min_dur_us,
               "skew_us": c.skew_us, "group": c.group, "group_size": c.group_size}
    change = "the transfers ran at the link's speed" if fig["form"] == "bandwidth" else "the ranks started it together"
    wi = WhatIf(change=change,
                saves_us=cost, saves_per_step_us=per_step, naive_us=cost, steps=len(rows), then_last_rank=None,
                upper_bound=True)
    return Finding(id="slow_collective", claim=claim, cost_us=cost, cost_share=cost / st if st else None,
                   evidence=FindingEvidence(role=c.role, ranks=ranks, steps=keys,
                                            names=[c.name, c.group_desc or c.group], figures=figures),
                   fix=fix, what_if=wi, plot=plot)


def slow_collective(job: Job) -> list[Finding]:
    """Collectives far below the link's bus bandwidth, or dominated by their start skew (module doc)."""
    devices = job.inv.device_names()
    device = devices[0] if devices else None
    out = []
    for c in job.inv.summary.collectives or []:
        rows = job.by_role.get(c.role)
        if not rows or c.source != "device" or c.bytes is None or c.ranks < 2:
            continue
        world = _world(job, c.role)
        if c.ranks < (c.group_size or world or 0):
            continue  # some of its ranks untraced (a sampled set): the traced ones' times include waiting for them
        fig = _bandwidth(c, device, world)
        if fig is None and c.role not in job.straggler_roles:
            fig = _skew(c)
        if fig is None:
            continue
        cost = max(float(fig.pop("cost_us")), 0.0)
        if cost < SLOW_COLLECTIVE_MIN_SHARE * job.step_time(rows):
            continue
        out.append(_finding(job, c, fig, rows, cost))
    return out
