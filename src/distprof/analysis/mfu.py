"""Achieved TFLOP/s and MFU per role, rank, step and phase, and a roofline point per op: the FLOPs of the trace's
ops (computed from their recorded shapes, :mod:`.flops`) attributed to the kernels they launched.

The formula (docs/analysis.md, "FLOPs and MFU", repeats it)::

    MFU = sum over the counted ops of a step of  FLOPs(op) / peak(device, dtype(op))   /   wall time of the step

which is FLOPs / (wall x peak) when one dtype does the work. TFLOP/s = FLOPs / wall. FLOPs are **model FLOPs**: the
innermost op of :data:`.flops.TABLE` wherever table ops nest (``aten::linear`` -> ``aten::addmm``: addmm), counted
once; a forward op that runs again inside the backward pass (activation checkpointing recomputes it: an op with an
autograd ``Sequence number`` inside an ``autograd::engine::evaluate_function:`` range of its thread) is left out of
``flops`` and reported as ``recompute_flops``. A step's wall time is breakdown's: from its ``ProfilerStep`` start to
the later of its end and the end of the device work it launched; a trace without steps is one row over all it traced.
Peaks: :mod:`.peaks` (``--peak-tflops`` overrides). A phase's figures are the FLOPs of the ops that started inside
it (its innermost annotation, on any thread: backward's thread runs inside the main thread's ``backward`` phase) over
the time it was open in that step.

Attribution: each device event launched (same correlation id) by a runtime call made inside a counted op, on the
op's thread, is that op's; ``kernel_us`` is their device time. Counted ops never nest, so each launch has at most
one. A bytes-only op (elementwise, normalisation) is counted when it holds no table op and is not inside a counted
FLOP op (whose kernels are its own).

When the trace has no shapes (``record_shapes`` off), there is nothing to compute: the rank's row carries
``reason``; a run none of whose traces has shapes has no ``flops`` key at all (``summary --json`` as before), and
:func:`missing_reason` says why.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from distprof.analysis import flops as flops_mod
from distprof.analysis.peaks import lookup
from distprof.analysis.records_flops import FlopsPhase, FlopsRow, RooflinePoint
from distprof.trace.columns import shape_of
from distprof.trace.ranks import group
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind
from distprof.util import intervals as iv

__all__ = ["BACKWARD_RANGE", "NEEDS_SHAPES", "combine", "extract", "flop_op_names", "missing_reason"]

BACKWARD_RANGE = "autograd::engine::evaluate_function:"
NEEDS_SHAPES = ("record_shapes is needed: this trace's ops carry no input shapes (ProfilerConfig torch="
                "{'record_shapes': True}), so their FLOPs cannot be computed")
_FLOP_NAMES = frozenset(n for n, f in flops_mod.TABLE.items() if f.flops is not None)
TOP_OPS = 20


def flop_op_names() -> frozenset[str]:
    """The ops whose FLOPs the table computes (matrix products, convolutions, attention)."""
    return _FLOP_NAMES


def _no_shapes(tb: TraceTable) -> dict[str, Any]:
    ops = tb.kind == Kind.CPU_OP
    flop_name = np.array([nm in _FLOP_NAMES for nm in tb.names] or [False], dtype=bool)
    n = int(flop_name[tb.name[ops & tb.scope]].sum()) if ops.any() else 0
    return {"shapes": False, "flop_ops": n, "devices": tb.devices}


def extract(tb: TraceTable) -> dict[str, Any]:
    """Per file: FLOPs, bytes and kernel time of the counted ops by step, phase and dtype; top ops by shape."""
    pos = np.flatnonzero((tb.kind[tb.shape_ev] == Kind.CPU_OP) & tb.scope[tb.shape_ev])
    if not pos.size:
        return _no_shapes(tb)
    ops = _costed(tb, tb.shape_ev[pos], tb.shape_key[pos], tb.shape_seq[pos])
    if ops is None:
        return _no_shapes(tb)
    ev, kind, seq, costs = ops
    fl_k, by_k, isf_k = (np.array([c[i] for c in costs]) for i in (1, 2, 3))
    counted = _counted(tb, ev, isf_k[kind].astype(bool))
    ev, kind, seq = ev[counted], kind[counted], seq[counted]
    fl, by, is_flop = fl_k[kind], by_k[kind], isf_k[kind].astype(bool)
    recompute = _recomputed(tb, ev, seq)
    kernel_us = _kernel_time(tb, ev)
    phase = _phase_ids(tb, ev)
    steps, step_of = _step_walls(tb), tb.step[ev]
    # Sums in event order (as one loop over the ops would add them): bincount and sum() over lists, not numpy's
    # pairwise sums, so the figures do not depend on how the ops are grouped.
    keys: dict[tuple, int] = {}
    top_of = np.array([keys.setdefault(c[0], len(keys)) for c in costs], dtype=np.int64)[kind]
    per = [np.bincount(top_of, weights=w, minlength=len(keys)).tolist() for w in (fl, by, kernel_us)]
    counts = np.bincount(top_of, minlength=len(keys)).tolist()
    named = list(keys)
    seen_at = np.unique(top_of, return_index=True)  # each counted key, in order of its first op (ties keep it)
    top = {named[t]: [counts[t], per[0][t], per[1][t], per[2][t]]
           for t in seen_at[0][np.argsort(seen_at[1], kind="stable")].tolist()}
    dt = np.array([c[4] for c in costs], dtype=np.int64)[kind]  # dtype code by op
    by_num: dict[Any, list] = {}
    for s_idx, (num, wall, lo, hi) in steps.items():  # (a step number seen twice: one row, the last one's wall)
        mine = (step_of == s_idx) if tb.steps.shape[0] else np.ones(ev.size, dtype=bool)
        prev = by_num.get(num)
        by_num[num] = [wall, lo, hi, mine if prev is None else prev[3] | mine]
    rows: dict[Any, dict[str, Any]] = {}
    for num, (wall, lo, hi, mine) in by_num.items():
        work = mine & ~recompute & is_flop
        flops_by: dict[str, float] = {}
        phases: dict[str, dict[str, float]] = {}
        js = np.flatnonzero(work)
        for f, code, p in zip(fl[js].tolist(), dt[js].tolist(), phase[js].tolist(), strict=True):
            d = _DTYPES[code] or ""
            flops_by[d] = flops_by.get(d, 0.0) + f
            if p >= 0 and tb.names[p]:
                ph = phases.setdefault(tb.names[p], {})
                ph[d] = ph.get(d, 0.0) + f
        rows[num] = {"wall_us": wall, "flops": flops_by, "recompute_flops": sum(fl[mine & recompute].tolist(), 0.0),
                     "bytes": sum(by[mine].tolist(), 0.0), "kernel_us": sum(kernel_us[work].tolist(), 0.0),
                     "phases": phases, "phase_wall": {p: _phase_wall(tb, p, lo, hi) for p in phases}}
    return {"shapes": True, "steps": rows, "top": top, "devices": tb.devices}


# Each op shape's cost, (name, shape key) -> (cost, has a FLOP formula, shape signature) or None, kept across the
# files a process reads: a step repeats its ops' shapes, and every rank of a job runs the same ones. Bounded.
_KNOWN: dict[tuple[str, bytes], tuple[tuple[float, float, str | None], bool, str] | None] = {}
_KNOWN_MAX = 1 << 16
_DTYPES: list[str | None] = []  # the dtypes costs name, by code (the codes, process-wide, only group events)
_DTYPE_CODE: dict[str | None, int] = {}


def _costed(tb: TraceTable, ev: np.ndarray, key: np.ndarray, seq: np.ndarray) -> tuple | None:
    """The ops ``ev`` (shape ids ``key``, Sequence numbers ``seq``) whose shapes fit their formula: (events, kind
    of op by event, Sequence numbers, kinds), a kind being one (name, shape) costed once: ((name, dtype,
    signature), FLOPs, bytes, has a FLOP formula, dtype code)."""
    known = _KNOWN
    if len(known) > _KNOWN_MAX:
        known.clear()
    pair = tb.name[ev].astype(np.int64) * max(1, len(tb.shape_keys)) + key
    uniq, inv = np.unique(pair, return_inverse=True)
    costs, fits = [], np.zeros(uniq.size, dtype=bool)
    for u, p in enumerate(uniq.tolist()):
        name, k = tb.names[p // max(1, len(tb.shape_keys))], tb.shape_keys[p % max(1, len(tb.shape_keys))]
        got = known[(name, k)] if (name, k) in known else known.setdefault((name, k), _cost(name, k))
        if got is not None:
            (c_fl, c_by, dtype), is_flop, sig = got
            code = _DTYPE_CODE.setdefault(dtype, len(_DTYPE_CODE))
            if code == len(_DTYPES):
                _DTYPES.append(dtype)
            costs.append(((name, dtype, sig), c_fl, c_by, is_flop, code))
            fits[u] = True
    if not costs:
        return None
    renum = np.cumsum(fits) - 1
    m = fits[inv]
    return ev[m], renum[inv[m]], seq[m], costs


def _cost(name: str, key: bytes) -> tuple[tuple[float, float, str | None], bool, str] | None:
    """(cost, has a FLOP formula, shape signature) of op ``name`` with the shapes of ``key``; None when they do not
    fit its formula."""
    shape = shape_of(key)
    if shape is None:
        return None
    dims, types, concrete = shape
    if dims is None:
        return None
    c = flops_mod.cost(name, dims, types, concrete)
    return None if c is None else (c, flops_mod.TABLE[name].flops is not None,
                                   "x".join(str(d).replace(" ", "") for d in dims if isinstance(d, list) and d))


def _counted(tb: TraceTable, ev: np.ndarray, is_flop: np.ndarray) -> np.ndarray:
    """Which of the table ops ``ev`` are counted: a FLOP op holding no other FLOP op (the innermost); a bytes-only op
    holding no table op and not inside a counted FLOP op. Nesting is judged per thread."""
    n = ev.size
    order = np.lexsort((-tb.dur[ev], tb.ts[ev], tb.track[ev]))
    ts, end, tr, isf = tb.ts[ev][order], tb.end[ev][order], tb.track[ev][order], is_flop[order]
    nxt = np.arange(1, n + 1)
    has_next = nxt < n
    nx = np.minimum(nxt, n - 1)
    holds_any = has_next & (tr[nx] == tr) & (ts[nx] < end)
    fpos = np.flatnonzero(isf)
    holds_flop = np.zeros(n, dtype=bool)
    if fpos.size:
        k = np.searchsorted(fpos, np.arange(n), side="right")
        ok = k < fpos.size
        f = fpos[np.minimum(k, fpos.size - 1)]
        holds_flop = ok & (tr[f] == tr) & (ts[f] < end)
    counted_flop = isf & ~holds_flop
    cf = np.flatnonzero(counted_flop)
    inside = np.zeros(n, dtype=bool)
    if cf.size:
        k = np.searchsorted(cf, np.arange(n), side="right") - 1
        ok = k >= 0
        c = cf[np.maximum(k, 0)]
        inside = ok & (c != np.arange(n)) & (tr[c] == tr) & (end[c] >= end)
    out = np.zeros(n, dtype=bool)
    out[order] = counted_flop | (~isf & ~holds_any & ~inside)
    return out


def _recomputed(tb: TraceTable, ev: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """Forward ops run again in backward: an autograd Sequence number, inside a backward range of their thread."""
    out = np.zeros(ev.size, dtype=bool)
    cand = np.flatnonzero(seq >= 0)
    if not cand.size:
        return out
    bw_name = np.array([nm.startswith(BACKWARD_RANGE) for nm in tb.names] or [False], dtype=bool)
    bw = np.flatnonzero((tb.kind == Kind.CPU_OP) & bw_name[tb.name])
    if not bw.size:
        return out
    for track in np.unique(tb.track[ev[cand]]).tolist():
        rng = bw[tb.track[bw] == track]
        if not rng.size:
            continue
        rng = rng[np.argsort(tb.ts[rng], kind="stable")]
        reach = np.maximum.accumulate(tb.end[rng])  # the furthest end of the ranges begun so far
        mine = cand[tb.track[ev[cand]] == track]
        k = np.searchsorted(tb.ts[rng], tb.ts[ev[mine]], side="right") - 1
        ok = k >= 0
        out[mine[ok]] = reach[k[ok]] >= tb.end[ev[mine[ok]]]
    return out


def _kernel_time(tb: TraceTable, ev: np.ndarray) -> np.ndarray:
    """Per counted op: the device time of the device events launched from inside it (its thread)."""
    out = np.zeros(ev.size)
    launcher = tb.launcher()
    dev = np.flatnonzero(((tb.kind == Kind.KERNEL) | (tb.kind == Kind.MEMCPY) | (tb.kind == Kind.MEMSET))
                         & (launcher >= 0))
    if not dev.size:
        return out
    rt = launcher[dev]
    for track in np.unique(tb.track[ev]).tolist():
        mine = np.flatnonzero(tb.track[ev] == track)
        mine = mine[np.argsort(tb.ts[ev[mine]], kind="stable")]
        here = tb.track[rt] == track
        if not here.any():
            continue
        at = tb.ts[rt[here]]
        k = np.searchsorted(tb.ts[ev[mine]], at, side="right") - 1
        ok = k >= 0
        ok[ok] &= at[ok] < tb.end[ev[mine[k[ok]]]]
        out += np.bincount(mine[k[ok]], weights=tb.dur[dev[here][ok]], minlength=ev.size)
    return out


def _phase_ids(tb: TraceTable, ev: np.ndarray) -> np.ndarray:
    """Per op: the name id of its innermost annotation (phase) by start time, on any thread; -1 outside every phase."""
    ann = np.flatnonzero((tb.kind == Kind.ANNOTATION) & ~tb.comm)
    code = np.full(ev.size, -1, dtype=np.int64)
    if not ann.size:
        return code
    order = np.argsort(tb.ts[ev], kind="stable")
    starts = tb.ts[ev][order]
    for a in ann[np.argsort(-tb.dur[ann], kind="stable")].tolist():  # longest first: inner ones overwrite
        lo, hi = np.searchsorted(starts, [tb.ts[a], tb.end[a]], side="left")
        code[order[lo:hi]] = tb.name[a]
    return code


def _phase_wall(tb: TraceTable, phase: str, lo: float, hi: float) -> float:
    """How long ``phase`` was open between ``lo`` and ``hi`` (its ranges on any thread counted once)."""
    nid = tb.names.index(phase)
    m = (tb.kind == Kind.ANNOTATION) & (tb.name == nid)
    return iv.length(iv.intersect(iv.merge(tb.ts[m], tb.end[m]), (np.array([lo]), np.array([hi]))))


def _step_walls(tb: TraceTable) -> dict[int, tuple[int | None, float, float, float]]:
    """Step index -> (step number, wall µs, start, end); a trace without steps: {-1: (None, its traced time, ...)}."""
    out: dict[int, tuple[int | None, float, float, float]] = {}
    for i, num in enumerate(tb.steps[:, 2].tolist()):
        if len(tb.step_index().get(i, ())):
            lo, hi = float(tb.steps[i, 0]), float(tb.steps[i, 1])
            span = tb.sets(i).device_span
            if span[0].size:
                hi = max(hi, float(span[1][-1]))
            out[i] = (int(num), hi - lo, lo, hi)
    if not out and not tb.steps.shape[0]:
        s = tb.sets()
        ends = [x for x in (s.host_span, s.device_span) if x[0].size]
        if ends:
            lo = min(float(x[0][0]) for x in ends)
            hi = max(float(x[1][-1]) for x in ends)
            out[-1] = (None, hi - lo, lo, hi)
    return out


# ---- the driver -------------------------------------------------------------------------------------------
def missing_reason(parts: Iterable[dict[str, Any]]) -> str | None:
    """Why a run has no FLOPs: :data:`NEEDS_SHAPES` when some trace has matrix or attention ops without shapes;
    None when a trace has shapes or none has such ops."""
    parts = list(parts)
    if any(p.get("shapes") for p in parts):
        return None
    return NEEDS_SHAPES if any(p.get("flop_ops") for p in parts) else None


def _mfu(flops: dict[str, float], wall_us: float, device: str | None, user: float | None
         ) -> tuple[float | None, float | None, float | None, str | None, str]:
    """(TFLOP/s, MFU, peak TFLOP/s of the main dtype, main dtype, device name) of FLOPs by dtype over ``wall_us``."""
    total = sum(flops.values())
    dtype = max(flops, key=lambda d: flops[d]) if flops else None
    main = lookup(device, dtype, user)
    name = main.device if main is not None else (device or "unknown")
    peak = main.tflops if main is not None else None
    if wall_us <= 0:
        return None, None, peak, dtype or None, name
    at_peak: float | None = 0.0  # seconds the FLOPs would take at the peaks (None: a dtype without a peak)
    for d, f in flops.items():
        p = lookup(device, d, user)
        if not f:
            continue
        if p is None or not p.tflops or at_peak is None:
            at_peak = None
            break
        at_peak += f / (p.tflops * 1e12)
    mfu = None if at_peak is None else at_peak / (wall_us * 1e-6)
    return total / wall_us * 1e-6, mfu, peak, dtype or None, name


def combine(files: Iterable[tuple[Any, dict[str, Any]]], peak_tflops: float | None = None,
            top: int = TOP_OPS) -> tuple[list[FlopsRow], list[RooflinePoint]]:
    """Per role, rank and step: FLOPs, TFLOP/s and MFU; over all ranks: the top ops (by kernel time) as roofline
    points. ``peak_tflops``: the user's peak, for every device and dtype."""
    rows: list[FlopsRow] = []
    top_ops: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    first_device = None
    for info, parts in group(files):
        device = next((p["devices"][0] for p in parts if p.get("devices")), None)
        first_device = first_device or device
        with_shapes = [p for p in parts if p.get("shapes")]
        if not with_shapes:
            if any(p.get("flop_ops") for p in parts):
                rows.append(FlopsRow(role=info.role, rank=info.rank, step=None, flops=None, tflops_per_s=None,
                                     mfu=None, peak_tflops=None, dtype=None, device=device, reason=NEEDS_SHAPES))
            continue
        for p in with_shapes if top else ():  # (top=0: the rows alone)
            for key, v in p["top"].items():
                acc = top_ops[key]
                for j, x in enumerate(v):
                    acc[j] += x
        steps: dict[Any, dict[str, Any]] = {}
        for p in with_shapes:
            steps.update(p["steps"])  # a rank's files hold different steps
        for num in sorted(steps, key=lambda s: (s is None, s if s is not None else 0)):
            rows.append(_row(info, num, steps[num], device, peak_tflops))
    return rows, _roofline(top_ops, first_device, peak_tflops, top)


def _row(info: Any, num: int | None, s: dict[str, Any], device: str | None, user: float | None) -> FlopsRow:
    tflops, mfu, peak, dtype, name = _mfu(s["flops"], s["wall_us"], device, user)
    phases = {}
    for ph, by_dtype in sorted(s["phases"].items()):
        wall = s["phase_wall"].get(ph, 0.0)
        t, m = _mfu(by_dtype, wall, device, user)[:2]
        phases[ph] = FlopsPhase(flops=sum(by_dtype.values()), wall_us=wall, tflops_per_s=t, mfu=m)
    return FlopsRow(role=info.role, rank=info.rank, step=num, flops=sum(s["flops"].values()), tflops_per_s=tflops,
                    mfu=mfu, peak_tflops=peak, dtype=dtype, wall_us=s["wall_us"], kernel_us=s["kernel_us"],
                    recompute_flops=s["recompute_flops"], bytes=s["bytes"], device=name,
                    peak_source=None if peak is None else ("user" if user is not None else "table"), phases=phases)


def _roofline(top_ops: dict[tuple, list[float]], device: str | None, user: float | None, top: int
              ) -> list[RooflinePoint]:
    out = []
    for (name, dtype, shapes), (count, fl, by, kus) in sorted(top_ops.items(), key=lambda kv: (-kv[1][3], kv[0][0])):
        p = lookup(device, dtype, user)
        peak, tbps = (p.tflops, p.tbps) if p is not None else (None, None)
        intensity = fl / by if by else None
        bound = None
        if peak and tbps and intensity is not None:
            bound = "compute" if intensity >= peak * 1e12 / (tbps * 1e12) else "memory"
        out.append(RooflinePoint(
            name=name, dtype=dtype, shapes=shapes, count=int(count), flops=fl, bytes=by, kernel_us=kus,
            tflops_per_s=fl / kus * 1e-6 if kus else None, gbps=by / kus * 1e-3 if kus else None,
            intensity=intensity, device=p.device if p is not None else device, peak_tflops=peak, peak_tbps=tbps,
            bound=bound))
        if len(out) >= top:
            break
    return out
