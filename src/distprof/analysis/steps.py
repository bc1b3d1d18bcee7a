"""Per step and per rank: duration, time waiting for peers, phases, device categories; the rank that holds
the others back.

Steps are torch's ``ProfilerStep#N`` ranges (global step numbers under distprof). A trace without them
that a distprof run directory lists in its manifest is one row for its capture window (``window:
[first, last]``, the window's wall time as its duration). An annotation belongs to the step it starts
in (cut at the step's end); device work to the step that launched it.

In a synchronous job every rank's step lasts about as long: the ranks that are ahead wait inside
collectives for the one behind, so the longest step is often a rank that waited. ``slowest_rank`` is
the rank that holds the others back: the one whose late arrivals at that step's collectives cost the
others the most waiting (``wait_caused_us``, as ``stragglers`` charges it, each blocked instant once).
A rank can be late because its step started late (its previous step ran long), so this, not the time
inside the step, is the measure. Each rank's row also has ``waited_us`` (its own blocked time in the
step: the union of its waits), ``busy_us = dur_us - waited_us`` (its time outside waiting for
peers) and ``sync_waiting_us`` (of its waiting, the time its host sat in a sync call: ``stragglers``). When no
rank waited in a step (one rank, no collectives), the rank with the most busy time, that is the longest step, is
the slowest. Where the trace has shapes, each rank's row also has the step's model ``flops``, ``tflops_per_s``,
``mfu`` and ``peak_tflops`` (:mod:`.mfu`'s figures for that rank and step: the same wall time as ``summary``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np
from msgspec import UNSET

from distprof.analysis import breakdown, idle, launch, overlap, temporal
from distprof.analysis.records import LaunchStep, RankStep, StepRow, StepsResult, Wait
from distprof.analysis.records_flops import FlopsRow
from distprof.analysis.summary import CATEGORIES, profiling_cost, window_cost
from distprof.trace.ranks import role_of, runs
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind, is_engine_role
from distprof.util import intervals as iv

__all__ = ["combine", "extract"]


def extract(tb: TraceTable) -> dict[str, Any]:
    off = tb.info.offset_us
    k = tb.kind
    rows = []
    index = tb.step_index()
    ann = (k == Kind.ANNOTATION) & ~tb.comm
    dev_kind = {Kind.KERNEL: None, Kind.MEMCPY: "memcpy", Kind.MEMSET: "memset"}
    # An engine's ProfilerSteps are its iterations, not global steps: its window is its row (see rlsteps).
    for i, (start, end, num) in enumerate([] if is_engine_role(tb.info.role) else tb.steps.tolist()):
        idx = index.get(i)
        if idx is None or not idx.size:
            continue  # a step outside the selection
        phases: dict[str, float] = {}
        a = idx[ann[idx]]
        if a.size:
            ids = tb.name[a]
            order = np.argsort(ids, kind="stable")
            for part in np.split(order, np.flatnonzero(np.diff(ids[order])) + 1):
                sel = a[part]
                phases[tb.names[tb.name[sel[0]]]] = iv.length(iv.merge(tb.ts[sel], np.minimum(tb.end[sel], end)))
        cats: dict[str, float] = defaultdict(float)
        for kind, cat in dev_kind.items():
            m = idx[k[idx] == kind]
            if kind == Kind.KERNEL:
                cats["communication"] += float(tb.dur[m[tb.comm[m]]].sum())
                cats["compute"] += float(tb.dur[m[~tb.comm[m]]].sum())
            elif cat is not None:  # always: only kernels map to None
                cats[cat] += float(tb.dur[m].sum())
        rows.append({"step": int(num), "start_us": start + off, "end_us": end + off, "dur_us": end - start,
                     "source": "ProfilerStep",
                     "phases": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
                     "categories": {c: v for c in CATEGORIES if (v := cats.get(c, 0.0))}})
    window = tb.info.window
    if not rows and window and tb.info.start_us is not None and tb.info.end_us is not None and not tb.by_step:
        # No step markers: the manifest's window is the unit (it may span several steps).
        w = getattr(tb, "window_record", None)
        dur = tb.info.end_us - tb.info.start_us
        if w is not None and w.end_time and w.start_time:
            dur = (w.end_time - w.start_time) * 1e6  # the window's wall time, as the profiler measured it
        ph_m = ann & tb.scope
        phases = {}
        if ph_m.any():
            ids = tb.name[ph_m]
            sel_all = np.flatnonzero(ph_m)
            order = np.argsort(ids, kind="stable")
            for part in np.split(order, np.flatnonzero(np.diff(ids[order])) + 1):
                sel = sel_all[part]
                phases[tb.names[tb.name[sel[0]]]] = iv.length(iv.merge(tb.ts[sel], tb.end[sel]))
        rows.append({"step": window[0], "window": list(window), "start_us": tb.info.start_us, "end_us": tb.info.end_us,
                     "dur_us": dur, "source": "manifest",
                     "phases": dict(sorted(phases.items(), key=lambda kv: -kv[1])), "categories": {}})
    return {"steps": rows, "profiling_cost": window_cost(tb)}


def _rank_row(info: Any, role: str, s: dict[str, Any], parts: dict[str, Any],
              waited: dict[tuple, tuple[float, float, float]], flops: dict[tuple, FlopsRow] | None = None) -> RankStep:
    """One rank's figures in one of its steps ``s`` (an :func:`extract` row), with its waits and the per-step
    figures of the other analyses its file has (breakdown, temporal, overlap, idle, launch)."""
    whole = "window" in s
    key = s["step"] if not whole else tuple(s["window"])
    w, caused, synced = waited.get((role, info.rank, key), (0.0, 0.0, 0.0))
    x = RankStep(rank=info.rank, path=info.path, dur_us=s["dur_us"], waited_us=w, busy_us=max(s["dur_us"] - w, 0.0),
                 wait_caused_us=caused, sync_waiting_us=synced, phases=s["phases"], categories=s["categories"],
                 source=s["source"], start_us=s["start_us"])
    if whole:
        x.window = s["window"]
    if not whole:
        if "breakdown" in parts and (b := breakdown.step_figure(parts["breakdown"], s["step"])) is not None:
            x.breakdown = b
        if "temporal" in parts and (t := temporal.step_figure(parts["temporal"], s["step"])) is not None:
            x.temporal = t
        if "overlap" in parts and (o := overlap.step_figure(parts["overlap"], s["step"])) is not None:
            x.overlap = o
    # Device idle by cause and launch figures for the step.
    if "idle" in parts:
        x.idle = idle.step_figure(parts["idle"], s["step"], whole)
    if "launch" in parts:
        x.launch = launch.step_figure(parts["launch"], s["step"], whole)
    # Model FLOPs, TFLOP/s and MFU (analysis.mfu: a trace without steps is its one row, step None)
    f = (flops or {}).get((info.role or "", info.rank, None if whole else s["step"]))
    if f is not None and f.flops is not None:
        x.flops, x.tflops_per_s, x.mfu, x.peak_tflops = f.flops, f.tflops_per_s, f.mfu, f.peak_tflops
        x.flops_wall_us = f.wall_us
    return x


def _step_row(role: str, step: Any, ranks: list[RankStep]) -> StepRow:
    ranks.sort(key=lambda x: (-1 if x.rank is None else x.rank, x.path))
    if any(x.wait_caused_us > 0 for x in ranks):
        slowest = max(ranks, key=lambda x: (x.wait_caused_us, -(x.rank or 0)))
    else:
        slowest = max(ranks, key=lambda x: (x.busy_us, -(x.rank or 0)))
    longest = max(ranks, key=lambda x: (x.dur_us, -(x.rank or 0)))
    phases: dict[str, float] = defaultdict(float)
    for x in ranks:
        for name, v in x.phases.items():
            phases[name] += v / len(ranks)
    return StepRow(role=role or None, step=step, window=ranks[0].window or None, ranks=ranks,
                   slowest_rank=slowest.rank, longest_rank=longest.rank, max_us=longest.dur_us,
                   min_us=min(x.dur_us for x in ranks), waited_us=sum(x.waited_us for x in ranks),
                   mean_phases=dict(sorted(phases.items(), key=lambda kv: -kv[1])),
                   launch_bound_ranks=[x.rank for x in ranks
                                       if isinstance(x.launch, LaunchStep) and x.launch.launch_bound])


def combine(files: Iterable[tuple[Any, dict[str, Any]]], waits: Iterable[Wait] = (),
            flops: Iterable[FlopsRow] = ()) -> StepsResult:
    """One row per (role, step): every rank's figures, the rank holding the others back (``slowest_rank``),
    the rank with the longest step (``longest_rank``) and the ranks whose step is launch-bound.

    ``files`` are (FileInfo, parts) with ``parts["steps"]`` from :func:`extract` and, when present,
    ``parts["breakdown"]``, ``parts["temporal"]``, ``parts["overlap"]``, ``parts["idle"]``, ``parts["launch"]``
    (their per-step figures are attached to each rank's row); ``waits`` are ``stragglers.combine(...).waits``;
    ``flops`` are ``mfu.combine(...)``'s rows (each rank's step gets its FLOPs, TFLOP/s and MFU).
    """
    by_step = {(f.role or "", f.rank, f.step): f for f in flops if f.reason is UNSET}
    waited = {(w.role or "", w.rank, w.step if not isinstance(w.step, list) else tuple(w.step)):
              (w.waited_us, w.wait_caused_us, w.sync_waiting_us) for w in waits}
    files = list(files)
    labels, run_warnings = runs(info for info, _ in files)  # ranks of different runs never share a row
    table: dict[tuple[str, int], list[RankStep]] = defaultdict(list)
    for info, parts in files:
        role = role_of(labels, info) or ""
        for s in parts["steps"]["steps"]:
            table[(role, s["step"])].append(_rank_row(info, role, s, parts, waited, by_step))
    rows = [_step_row(role, step, ranks) for (role, step), ranks in sorted(table.items())]
    cost = profiling_cost((info, parts["steps"].get("profiling_cost")) for info, parts in files)
    return StepsResult(steps=rows, warnings=run_warnings, profiling_cost=cost)
