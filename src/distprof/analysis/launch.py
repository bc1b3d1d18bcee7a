"""Kernel launch statistics, HolisticTraceAnalysis's ``get_cuda_kernel_launch_stats``: every rank, every step.

A *launch* is a runtime or driver call (``cudaLaunchKernel``, ``cuLaunchKernel``, ``hipLaunchKernel``,
``hipExtModuleLaunchKernel``, ``cudaMemcpyAsync``, ``cudaMemsetAsync``, ...: any runtime event) whose
correlation id a device event (kernel, memcpy, memset) shares; its device work is those events. Per
launch:

- ``delay``: the start of its first device event minus the end of the call, 0 when the device started
  before the call returned (HTA's ``launch_delay``, clipped at 0 as HTA does);
- ``cpu``: the call's duration; ``device``: its device events' durations summed (one event, except for
  graph launches);
- *short*: device time below the call's own duration, for a call of at most :data:`RUNTIME_CUTOFF_US`
  (50 µs): the device finishes the work faster than the CPU can launch it (HTA's "short GPU kernels");
- *runtime outlier*: a call longer than :data:`RUNTIME_CUTOFF_US`; *delay outlier*: a delay above
  :data:`LAUNCH_DELAY_CUTOFF_US` (100 µs) (HTA's defaults for ``runtime_cutoff`` and ``launch_delay_cutoff``).

Per rank: counts, the delay's mean, p50, p95 and max (percentiles by linear interpolation between
order statistics, numpy's and pandas' default), CPU and device time totals and means, and the calls
by name. Per step: the launches that step made, compactly, and a ``launch_bound`` flag.

A step is **launch-bound** (HTA has no per-step rule; this one is distprof's) when all of these hold:
its device idle time (``idle``'s figure for the step: gaps in the device work it launched, over its
device span) is at least :data:`LAUNCH_BOUND_IDLE_SHARE` (20%) of that span; at least
:data:`LAUNCH_BOUND_HOST_WAIT_SHARE` (half) of that idle time is host wait; and the host spends at least
:data:`LAUNCH_BOUND_LAUNCH_SHARE` (half) of that host wait issuing work (``idle``'s ``host_wait.launch_us``:
launch calls, the ops that make them, and the Python between them). The device is then often idle for
want of work the CPU is still launching: fewer, larger kernels (fusion, ``torch.compile``, CUDA graphs)
are the remedy, not faster kernels. A device that waits while the host sleeps, loads data in a phase, or
runs a host collective (gloo) has host wait too, but not launch-bound host wait: ``idle`` names those.
(An earlier rule asked for half the launches to be short instead, a proxy for the same thing that
missed early steps whose kernels outlast their calls although the host spends 99% of the wait
launching, and fired on a gloo job whose host sat in an 80 ms sleep and in all-reduces.)

Where this differs from HTA 0.5.0: HTA joins only ``cudaLaunchKernel``, ``cudaLaunchKernelExC``,
``cudaMemcpyAsync``, ``cudaMemsetAsync`` (and MTIA's ``runFunction``), so it finds no launch on ROCm or
driver-API (``cuLaunchKernel``) traces; rank 0 only by default; one row per (call, device event) pair;
nanosecond traces rounded to whole µs; the last ProfilerStep dropped by default.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

import numpy as np

from distprof.analysis import idle as idle_mod
from distprof.analysis.records import (
    UNSET,
    DelayStats,
    LaunchBoundRule,
    LaunchFigure,
    LaunchStep,
    LaunchThresholds,
    NotApplicable,
    Ranked,
    TimeStats,
)
from distprof.trace.ranks import group
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind

__all__ = [
    "LAUNCH_BOUND_HOST_WAIT_SHARE",
    "LAUNCH_BOUND_IDLE_SHARE",
    "LAUNCH_BOUND_LAUNCH_SHARE",
    "LAUNCH_DELAY_CUTOFF_US",
    "RUNTIME_CUTOFF_US",
    "THRESHOLDS",
    "combine",
    "extract",
    "launch_bound",
    "percentiles",
    "step_figure",
]

RUNTIME_CUTOFF_US = 50.0  # HTA's runtime_cutoff default
LAUNCH_DELAY_CUTOFF_US = 100.0  # HTA's launch_delay_cutoff default
LAUNCH_BOUND_IDLE_SHARE = 0.2
LAUNCH_BOUND_HOST_WAIT_SHARE = 0.5
LAUNCH_BOUND_LAUNCH_SHARE = 0.5  # of the host wait, the host issuing work

_NO_LAUNCHES = "no launch calls linked to device events"


def percentiles(groups: np.ndarray, values: np.ndarray, qs: tuple[float, ...]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per distinct group, the ``qs`` quantiles of its values (numpy's linear rule), vectorised over groups.

    Returns (group ids, one array per quantile)."""
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    first = np.ones(g.size, dtype=bool)
    first[1:] = g[1:] != g[:-1]
    starts = np.flatnonzero(first)
    counts = np.diff(np.append(starts, g.size))
    out = []
    for q in qs:
        pos = q * (counts - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, counts - 1)
        frac = pos - lo
        a, b = v[starts + lo], v[starts + hi]
        out.append(a + (b - a) * frac)
    return g[first], out


def _delay_stats(delays: np.ndarray) -> DelayStats:
    _, (p50, p95) = percentiles(np.zeros(delays.size, dtype=np.int64), delays, (0.5, 0.95))
    return DelayStats(mean=float(delays.mean()), p50=float(p50[0]), p95=float(p95[0]), max=float(delays.max()))


def launch_bound(idle_fig: dict[str, Any] | None, launches: int) -> bool:
    """The launch-bound rule of the module docstring, on one step's (or file's) idle figure."""
    if not idle_fig or not launches or idle_fig["span_us"] <= 0 or idle_fig["idle_us"] <= 0:
        return False
    host = idle_fig["host_wait_us"]
    return (idle_fig["idle_us"] / idle_fig["span_us"] >= LAUNCH_BOUND_IDLE_SHARE
            and host / idle_fig["idle_us"] >= LAUNCH_BOUND_HOST_WAIT_SHARE
            and host > 0
            and (idle_fig.get("host_wait") or {}).get("launch_us", 0.0) / host >= LAUNCH_BOUND_LAUNCH_SHARE)


def extract(tb: TraceTable) -> dict[str, Any]:
    k = tb.kind
    work = ((k == Kind.KERNEL) | (k == Kind.MEMCPY) | (k == Kind.MEMSET)) & tb.scope
    if not work.any():
        return {"device_events": 0}
    launcher = tb.launcher()
    idx = np.flatnonzero(work)
    linked = launcher[idx] >= 0
    d, r = idx[linked], launcher[idx[linked]]
    part: dict[str, Any] = {"device_events": int(idx.size), "unlinked_device_events": int((~linked).sum()),
                            "delays": np.empty(0), "launches": 0, "short": 0, "runtime_outliers": 0,
                            "delay_outliers": 0, "cpu_us": 0.0, "device_us": 0.0, "calls": {}, "steps": {},
                            "launch_bound_steps": []}
    if d.size == 0:
        return part
    # One row per launch call: its device events grouped (a graph launch has many).
    order = np.argsort(r, kind="stable")
    r, d = r[order], d[order]
    first = np.ones(r.size, dtype=bool)
    first[1:] = r[1:] != r[:-1]
    at = np.flatnonzero(first)
    calls = r[first]
    dev_start = np.minimum.reduceat(tb.ts[d], at)
    dev_dur = np.add.reduceat(tb.dur[d], at)
    cpu = tb.dur[calls]
    delay = np.maximum(dev_start - tb.end[calls], 0.0)
    short = (dev_dur < cpu) & (cpu <= RUNTIME_CUTOFF_US)
    names = Counter(tb.name[calls].tolist())
    part.update({"delays": delay, "launches": int(calls.size), "short": int(short.sum()),
                 "runtime_outliers": int((cpu > RUNTIME_CUTOFF_US).sum()),
                 "delay_outliers": int((delay > LAUNCH_DELAY_CUTOFF_US).sum()),
                 "cpu_us": float(cpu.sum()), "device_us": float(dev_dur.sum()),
                 "calls": {tb.names[n]: c for n, c in names.most_common()},
                 # for a capture window without steps, which is then its one unit
                 "whole_launch_bound": launch_bound(idle_mod.analyse(tb)["device"], int(calls.size))})
    # Per step (the step of the call, which is the step of its device work).
    step = tb.step[calls].astype(np.int64)
    inside = step >= 0
    if inside.any():
        st, dl, sh = step[inside], delay[inside], short[inside]
        gids, (p95,) = percentiles(st, dl, (0.95,))
        count = np.bincount(st, minlength=tb.steps.shape[0])
        total = np.bincount(st, weights=dl, minlength=tb.steps.shape[0])
        n_short = np.bincount(st, weights=sh, minlength=tb.steps.shape[0])
        outliers = np.bincount(st, weights=dl > LAUNCH_DELAY_CUTOFF_US, minlength=tb.steps.shape[0])
        peak = np.full(tb.steps.shape[0], -np.inf)
        np.maximum.at(peak, st, dl)
        idle_steps = idle_mod.analyse(tb)["steps"]
        for j, g in enumerate(gids.tolist()):
            num = int(tb.steps[g, 2])
            c, s = int(count[g]), int(n_short[g])
            fig = idle_steps.get(num)
            bound = launch_bound(fig["device"] if fig else None, c)
            part["steps"][num] = {"applicable": True, "launches": c, "delay_mean_us": float(total[g] / c),
                                  "delay_p95_us": float(p95[j]), "delay_max_us": float(peak[g]),
                                  "short": s, "short_share": s / c, "delay_outliers": int(outliers[g]),
                                  "launch_bound": bound}
            if bound:
                part["launch_bound_steps"].append(num)
    return part


def _present(p: dict[str, Any]) -> LaunchFigure | NotApplicable:
    """A (rank's or all ranks') summed part as the JSON shows it."""
    if not p.get("device_events"):
        return idle_mod.not_applicable()
    n = p["launches"]
    if not n:
        return NotApplicable(reason=_NO_LAUNCHES, device_events=p["device_events"])
    return LaunchFigure(
        launches=n, device_events=p["device_events"], unlinked_device_events=p["unlinked_device_events"],
        delay_us=_delay_stats(p["delays"]), cpu_us=TimeStats(total=p["cpu_us"], mean=p["cpu_us"] / n),
        device_us=TimeStats(total=p["device_us"], mean=p["device_us"] / n), short=p["short"],
        short_share=p["short"] / n, runtime_outliers=p["runtime_outliers"], delay_outliers=p["delay_outliers"],
        calls=dict(sorted(p["calls"].items(), key=lambda kv: -kv[1])),
        launch_bound_steps=sorted(p["launch_bound_steps"]))


def _sum(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"device_events": 0, "unlinked_device_events": 0, "launches": 0, "short": 0,
                           "runtime_outliers": 0, "delay_outliers": 0, "cpu_us": 0.0, "device_us": 0.0,
                           "calls": Counter(), "launch_bound_steps": []}
    delays = []
    for p in parts:
        for key in ("device_events", "unlinked_device_events", "launches", "short", "runtime_outliers",
                    "delay_outliers", "cpu_us", "device_us"):
            out[key] += p.get(key, 0)
        out["calls"].update(p.get("calls", {}))
        out["launch_bound_steps"] += p.get("launch_bound_steps", [])
        if p.get("delays") is not None:
            delays.append(p["delays"])
    out["delays"] = np.concatenate(delays) if delays else np.empty(0)
    return out


THRESHOLDS = LaunchThresholds(runtime_cutoff_us=RUNTIME_CUTOFF_US, launch_delay_cutoff_us=LAUNCH_DELAY_CUTOFF_US,
                              launch_bound=LaunchBoundRule(idle_share=LAUNCH_BOUND_IDLE_SHARE,
                                                           host_wait_share=LAUNCH_BOUND_HOST_WAIT_SHARE,
                                                           launch_share=LAUNCH_BOUND_LAUNCH_SHARE))


def combine(files: Iterable[tuple[Any, dict[str, Any]]]) -> tuple[list[Ranked[LaunchFigure | NotApplicable]],
                                                                 LaunchFigure | NotApplicable]:
    """Per rank (its files together) and over all ranks (every launch of every rank)."""
    ranks: list[Ranked[LaunchFigure | NotApplicable]] = []
    summed = []
    for info, parts in group(files):
        s = _sum(parts)
        summed.append(s)
        ranks.append(Ranked(info.role, info.rank, info.path, _present(s)))
    overall = _present(_sum(summed))
    if isinstance(overall, LaunchFigure):
        overall.launch_bound_steps = UNSET  # step numbers mean nothing without their rank
        overall.ranks = sum(1 for r in ranks if r.figure.applicable)
        overall.launch_bound_ranks = [r.rank for r in ranks
                                      if isinstance(r.figure, LaunchFigure) and r.figure.launch_bound_steps]
        overall.thresholds = THRESHOLDS
    return ranks, overall


def step_figure(part: dict[str, Any], step: int, whole: bool = False) -> LaunchStep | NotApplicable:
    """One rank's compact figure for one step (``whole``: the file's, for a capture window without steps)."""
    if not part.get("device_events"):
        return idle_mod.not_applicable()
    if whole:
        p = _present(part)
        if not isinstance(p, LaunchFigure):
            return p
        return LaunchStep(launches=p.launches, delay_mean_us=p.delay_us.mean, delay_p95_us=p.delay_us.p95,
                          delay_max_us=p.delay_us.max, short=p.short, short_share=p.short_share,
                          delay_outliers=p.delay_outliers, launch_bound=bool(part.get("whole_launch_bound")))
    fig = part.get("steps", {}).get(step)
    if fig is None:
        return idle_mod.not_applicable("no launches in this step" if part.get("launches") else _NO_LAUNCHES)
    return LaunchStep(**fig)
