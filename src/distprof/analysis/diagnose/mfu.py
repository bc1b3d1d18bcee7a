"""The ``low_mfu`` rule: a rank's model FLOPs utilisation (``summary``'s ``flops``, :mod:`distprof.analysis.mfu`)
below :data:`LOW_MFU` over its recorded steps, with the cause the other analyses show. See
:mod:`distprof.analysis.diagnose`.

A rank's MFU over its steps is each step's MFU weighted by its wall time (the FLOPs over the steps' time at the
peaks). A rank is judged only when the kernels of its counted FLOP ops (matrix products, convolutions, attention)
take at least :data:`LOW_MFU_FLOP_KERNEL_SHARE` of its device compute time: MFU measures matrix work, and a job
whose device time goes mostly elsewhere (the DLRM set: its matrix products run 204 of 1,034 µs of kernels, the
rest embedding lookups and elementwise work) is not judged by it. A trace without shapes has no figures and no
finding (``summary`` says ``record_shapes`` is needed).

The cause, the first of these that holds (all that hold are in ``figures.causes``):

1. ``launch_bound``: at least :data:`LAUNCH_BOUND_RANK_STEPS` of the low ranks' steps are launch-bound by
   :mod:`.launch`'s rule (the ``launch_bound`` finding's figures: the device waits while the host issues work);
2. ``exposed_communication``: communication not overlapped with compute, less waiting for late peers
   (``temporal``), is at least :data:`EXPOSED_COMM_SHARE` of the low ranks' step time;
3. ``memory_bound``: of the top ops' kernel time (``summary``'s ``flops_ops``, over all ranks), at least
   :data:`LOW_MFU_MEMORY_SHARE` is in ops below the device's ridge point (arithmetic intensity under peak TFLOP/s
   over peak TB/s; elementwise and normalisation ops, which do no matrix FLOPs, among them);
4. ``small_gemms``: of the top matrix products' kernel time, at least :data:`LOW_MFU_SMALL_GEMM_SHARE` is in
   products whose FLOPs per call would take under :data:`LOW_MFU_SMALL_GEMM_US` µs at the device's peak (launch and
   tail effects then dominate: batch them, fuse them, make them larger).

No cause holding, the claim says so. The cost is the step time lost against the same work at :data:`LOW_MFU`:
per rank and step ``wall x (1 - mfu / LOW_MFU)`` (the step would take ``wall x mfu / LOW_MFU`` at the threshold
MFU), taken on the step's path across ranks. It overlaps the cause's own finding (``launch_bound`` costs the launch
wait alone), which is why both are listed.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from distprof.analysis.diagnose.common import (
    EXPOSED_COMM_SHARE,
    LAUNCH_BOUND_RANK_STEPS,
    LOW_MFU,
    LOW_MFU_FLOP_KERNEL_SHARE,
    LOW_MFU_MEMORY_SHARE,
    LOW_MFU_SMALL_GEMM_SHARE,
    LOW_MFU_SMALL_GEMM_US,
    Finding,
    Job,
    Plot,
    by_rank,
    fmt_dur,
    fmt_pct,
    make_finding,
    name_text,
    path_what_if,
    ranks_text,
)
from distprof.analysis.records import HostWait, IdleFigure, LaunchStep, RankStep, StepRow
from distprof.analysis.records_flops import FlopsRow, RooflinePoint

__all__ = ["CAUSES", "GEMM_OPS", "low_mfu"]

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"})
CAUSES = ("launch_bound", "exposed_communication", "memory_bound", "small_gemms")

_FIX = {
    "launch_bound": "The device waits while the host launches work: launch fewer, larger kernels (CUDA graphs, "
                    "torch.compile), larger batches per step, no host work between launches.",
    "exposed_communication": "Communication the compute does not hide stalls the device: overlap it (DDP "
                             "bucket_cap_mb, FSDP prefetch) and check the collectives' bandwidth.",
    "memory_bound": "Most kernel time is in memory-bound ops (elementwise, normalisation, softmax): fuse them "
                    "(torch.compile, fused kernels: fused LayerNorm/GELU, fused optimizers), so the matrix "
                    "products take the step.",
    "small_gemms": "The matrix products are too small to fill the device: larger batches or micro-batches, batched "
                   "or grouped GEMMs, fused projections (one QKV matmul).",
    None: "No launch, communication, memory-bound or small-GEMM cause shows: look at the top kernels' achieved "
          "TFLOP/s (summary's flops_ops) and the dtype (fp32 matmuls without TF32 run far below the tensor-core "
          "peak: torch.backends.cuda.matmul.allow_tf32, or bf16 autocast).",
}


def _rank_figures(rows: list[FlopsRow]) -> dict[str, Any] | None:
    """A rank's figures over its steps with an MFU: FLOPs, wall, kernel time, MFU weighted by wall, peak, dtype."""
    ok = [r for r in rows if r.mfu is not None and r.wall_us and r.flops]
    if not ok:
        return None
    wall = sum(float(r.wall_us or 0.0) for r in ok)
    flops = sum(float(r.flops or 0.0) for r in ok)
    main = max(ok, key=lambda r: float(r.flops or 0.0))
    return {"mfu": sum(float(r.mfu or 0.0) * float(r.wall_us or 0.0) for r in ok) / wall,
            "tflops_per_s": flops / wall * 1e-6, "flops": flops, "wall_us": wall,
            "kernel_us": sum(float(r.kernel_us or 0.0) for r in ok), "peak_tflops": main.peak_tflops,
            "dtype": main.dtype, "device": main.device, "steps": {r.step: r for r in ok}}


def _compute_us(job: Job, role: Any, rank: Any) -> float | None:
    """The rank's device compute time over its steps (``temporal``), None without device figures."""
    xs = [x for _, _, x in job.of_rank.get((role, rank), [])]
    dev = [x.temporal.device for x in xs if x.temporal and x.temporal.device]
    return sum(d.compute_us for d in dev) if dev else None


def _launch_cause(xs: list[RankStep]) -> dict[str, Any] | None:
    steps = [x.launch for x in xs if isinstance(x.launch, LaunchStep)]
    bound = [x for x in xs if isinstance(x.launch, LaunchStep) and x.launch.launch_bound]
    if not steps or len(bound) < LAUNCH_BOUND_RANK_STEPS * len(steps):
        return None
    issuing = sum(x.idle.host_wait.launch_us for x in bound
                  if isinstance(x.idle, IdleFigure) and isinstance(x.idle.host_wait, HostWait))
    return {"launch_bound_rank_steps": len(bound), "rank_steps": len(steps),
            "host_issuing_us_per_rank_step": issuing / len(bound),
            "text": f"launch-bound: in {len(bound)} of {len(steps)} rank-steps the device waits "
                    f"{fmt_dur(issuing / len(bound))} per step while the host issues work"}


def _comm_cause(xs: list[RankStep]) -> dict[str, Any] | None:
    dev = [(x, x.temporal.device) for x in xs if x.temporal and x.temporal.device]
    exposed = sum(max(d.communication_us - x.waited_us, 0.0) for x, d in dev)
    dur = sum(x.dur_us for x, _ in dev)
    if not dev or dur <= 0 or exposed < EXPOSED_COMM_SHARE * dur:
        return None
    return {"exposed_us_per_rank_step": exposed / len(dev), "share_of_step": exposed / dur,
            "text": f"exposed communication: {fmt_dur(exposed / len(dev))} per rank and step not hidden by compute"}


def _memory_cause(points: list[RooflinePoint]) -> dict[str, Any] | None:
    judged = [p for p in points if p.bound is not None and p.kernel_us > 0]
    total = sum(p.kernel_us for p in judged)
    mem = sorted((p for p in judged if p.bound == "memory"), key=lambda p: -p.kernel_us)
    share = sum(p.kernel_us for p in mem) / total if total else 0.0
    if not mem or share < LOW_MFU_MEMORY_SHARE:
        return None
    names = list(dict.fromkeys(p.name for p in mem))[:3]
    ridge = next((p.peak_tflops / p.peak_tbps for p in judged if p.peak_tflops and p.peak_tbps), None)
    return {"share_of_top_kernel_us": share, "ridge_flops_per_byte": ridge, "names": names,
            "text": f"memory-bound ops take {fmt_pct(share)} of the top ops' kernel time (arithmetic intensity "
                    f"below the ridge{f' of {ridge:.0f} FLOP/byte' if ridge else ''}: "
                    f"{', '.join(name_text(n, 40) for n in names)})"}


def _small_gemm_cause(points: list[RooflinePoint]) -> dict[str, Any] | None:
    gemms = [p for p in points if p.name in GEMM_OPS and p.kernel_us > 0 and p.count and p.peak_tflops]
    total = sum(p.kernel_us for p in gemms)
    small = [p for p in gemms if p.flops / p.count / (float(p.peak_tflops or 0.0) * 1e12) * 1e6
             < LOW_MFU_SMALL_GEMM_US]
    share = sum(p.kernel_us for p in small) / total if total else 0.0
    if not small or share < LOW_MFU_SMALL_GEMM_SHARE:
        return None
    per_call = sum(p.flops for p in small) / sum(p.count for p in small)
    return {"share_of_gemm_kernel_us": share, "flops_per_call": per_call,
            "names": list(dict.fromkeys(p.name for p in small))[:3],
            "text": f"small matrix products: {fmt_pct(share)} of the matrix products' kernel time is in products "
                    f"of {per_call / 1e9:.3g} GFLOP per call on average (under {LOW_MFU_SMALL_GEMM_US:g} µs at "
                    "the peak)"}


def _causes(xs: list[RankStep], points: list[RooflinePoint]) -> dict[str, dict[str, Any]]:
    found = {"launch_bound": _launch_cause(xs), "exposed_communication": _comm_cause(xs),
             "memory_bound": _memory_cause(points), "small_gemms": _small_gemm_cause(points)}
    return {k: v for k in CAUSES if (v := found[k]) is not None}


def _low_ranks(job: Job, role: Any, flops_rows: list[FlopsRow]) -> dict[Any, dict[str, Any]]:
    per: dict[Any, list[FlopsRow]] = defaultdict(list)
    for r in flops_rows:
        if r.role == role:
            per[r.rank].append(r)
    low = {}
    for rank, rows in per.items():
        fig = _rank_figures(rows)
        compute = _compute_us(job, role, rank)
        if fig is None or fig["mfu"] >= LOW_MFU:
            continue
        if compute is not None and compute > 0 and fig["kernel_us"] < LOW_MFU_FLOP_KERNEL_SHARE * compute:
            continue  # the matrix work is a small part of the device's: MFU does not measure this job
        low[rank] = fig
    return low


def _cuts(rows: list[StepRow], low: dict[Any, dict[str, Any]]) -> tuple[list[dict[int, float]], dict[Any, float]]:
    cuts: list[dict[int, float]] = []
    per_rank: defaultdict[Any, float] = defaultdict(float)
    for row in rows:
        cut = {}
        for i, x in enumerate(row.ranks):
            fr = low.get(x.rank, {}).get("steps", {}).get(row.step)
            if fr is None:
                continue
            v = min(float(fr.wall_us or 0.0) * (1.0 - float(fr.mfu or 0.0) / LOW_MFU), x.busy_us)
            cut[i] = max(v, 0.0)
            per_rank[x.rank] += cut[i]
        cuts.append(cut)
    return cuts, dict(per_rank)


def low_mfu(job: Job) -> list[Finding]:
    """Ranks whose MFU over their steps is below :data:`LOW_MFU`, with the first cause that holds (module doc)."""
    flops_rows = list(job.inv.summary.flops or [])
    points = list(job.inv.summary.flops_ops or [])
    out = []
    for role, rows in job.by_role.items():
        low = _low_ranks(job, role, flops_rows)
        if not low:
            continue
        xs = [x for row in rows for x in row.ranks if x.rank in low]
        causes = _causes(xs, points)
        cause = next(iter(causes), None)
        cuts, per_rank = _cuts(rows, low)
        wall = sum(f["wall_us"] for f in low.values())
        flops = sum(f["flops"] for f in low.values())
        mfu = sum(f["mfu"] * f["wall_us"] for f in low.values()) / wall
        first = min(low.values(), key=lambda f: f["mfu"])
        wi = path_what_if(rows, cuts, f"the same FLOPs ran at {fmt_pct(LOW_MFU)} MFU")
        because = causes[cause]["text"] if cause else "no launch, communication, memory-bound or small-GEMM cause shows"
        also = [causes[c]["text"] for c in list(causes)[1:]]
        claim = (f"MFU is {fmt_pct(mfu)} on {ranks_text(sorted(low, key=str))} ({flops / wall * 1e-6:.3g} TFLOP/s "
                 f"achieved against a peak of {first['peak_tflops']:g} TFLOP/s for {first['dtype']} on "
                 f"{first['device']}), below {fmt_pct(LOW_MFU)}; cause: {because}"
                 + (f"; also {'; '.join(also)}" if also else "")
                 + f". At {fmt_pct(LOW_MFU)} MFU the same work would save {fmt_dur(wi.saves_per_step_us)} per step.")
        names = list(dict.fromkeys(n for c in causes.values() for n in c.get("names", [])))  # the first cause's first
        figures = {"mfu": mfu, "tflops_per_s": flops / wall * 1e-6, "peak_tflops": first["peak_tflops"],
                   "dtype": first["dtype"], "device": first["device"], "cause": cause,
                   "causes": {k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in causes.items()},
                   "per_rank_mfu": by_rank({r: f["mfu"] for r, f in low.items()})}
        out.append(make_finding(job, "low_mfu", role, rows, cuts, per_rank, claim, wi, _FIX[cause], names, figures,
                                Plot.KERNELS))
    return out
