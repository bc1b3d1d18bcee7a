"""Temporal breakdown: where a rank's time goes, on the device and on the host, per rank and per step.

Device (a rank with GPU/accelerator events), over its device span (first device event start to last
device event end; for a step, of the device work that step launched):

- ``compute_us``: time some compute kernel runs (kernels that are not collectives), overlaps counted once;
- ``communication_us``: time one of the rank's collectives runs and no compute kernel does (communication
  not hidden). The collectives are where :func:`.vocab.collective_source` says they run: collective
  kernels, or, on a rank without any (gloo, with CUDA tensors too), its host-side collectives, during
  which the device waits for the result as an NCCL kernel would spin;
- ``memory_us``: time a memcpy/memset runs and neither of the above does;
- ``idle_us``: the rest of the span: the device runs nothing and no collective is in flight.

They add up to ``span_us``. This is HolisticTraceAnalysis's temporal breakdown (where communication or
memory overlapping compute counts as compute), with the memory part reported on its own. On ranks with
collective kernels ``idle_us`` is :mod:`.idle`'s device idle time; on a gloo rank :mod:`.idle` counts the
time under host collectives as idle (the device runs nothing) and names the collective as its cause.

Host (every rank; the only one on CPU-only jobs), over the traced host time (the selected steps'
ranges, or the first to the last host event; for a step, its range):

- ``compute_us``: time some CPU op that is not communication runs on a thread that is not a
  communication thread (gloo's run loop);
- ``communication_us``: time a collective runs on the host (c10d ops, ``gloo:``/``nccl:`` ranges,
  ``record_param_comms``) and no compute does;
- ``idle_us``: the rest: no op runs (the main thread blocked in a wait, Python between ops, sleeping);
- ``in_phases_us``: the part of ``idle_us`` inside an annotated phase (a ``record_function`` /
  ``distprof.annotate`` range on a thread that is not a communication thread): the rank is busy in user
  code that runs no traced op (Python, a C extension, a sleep, I/O), not idle. Always at most ``idle_us``;
- ``threads``: CPU-op busy time per thread kind (main, autograd, communication, other).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from distprof.analysis.records import DeviceTime, HostTime, Ranked, Temporal
from distprof.trace.ranks import summed
from distprof.trace.table import Sets, TraceTable
from distprof.trace.vocab import Kind, ThreadKind
from distprof.util import intervals as iv

__all__ = ["combine", "device_figures", "extract", "figure", "host_figures", "phase_set", "step_figure"]


def device_figures(s: Sets) -> dict[str, float] | None:
    span = iv.length(s.device_span)
    if span <= 0 and not s.device_span[0].size:
        return None
    coll = iv.intersect(s.collectives, s.device_span)
    busy = iv.union(s.compute, coll, s.memory)
    comm = iv.subtract(coll, s.compute)
    mem = iv.subtract(iv.subtract(s.memory, s.compute), coll)
    return {"span_us": span, "compute_us": iv.length(s.compute), "communication_us": iv.length(comm),
            "memory_us": iv.length(mem), "idle_us": max(span - iv.length(busy), 0.0)}


def phase_set(tb: TraceTable, step: int | None = None) -> iv.IntervalSet:
    """The time some annotated phase is open (user annotations that are not collectives, on threads that are not
    communication threads), in the scope :meth:`TraceTable.sets` uses (a step: its events, cut at its end)."""
    k = tb.kind
    m = (k == Kind.ANNOTATION) & ~tb.comm
    m &= tb.thread_kind_of_event() != ThreadKind.ALL.index(ThreadKind.COMMUNICATION)
    if step is None:
        m &= tb.scope
        return iv.merge(tb.ts[m], tb.end[m])
    idx = tb.step_index().get(step, np.empty(0, dtype=np.int64))
    idx = idx[m[idx]]
    return iv.merge(tb.ts[idx], np.minimum(tb.end[idx], tb.steps[step, 1]))


def host_figures(s: Sets, phases: iv.IntervalSet | None = None) -> dict[str, Any] | None:
    """The host breakdown of ``s`` (see the module docstring); ``phases``: :func:`phase_set` of the same scope."""
    t = s.host_span
    span = iv.length(t)
    if span <= 0:
        return None
    compute = iv.intersect(s.host_compute, t)
    comm = iv.subtract(iv.intersect(s.host_comm, t), compute)
    busy = iv.union(compute, comm)
    idle = max(span - iv.length(busy), 0.0)
    in_phases = iv.length(iv.subtract(iv.intersect(phases, t), busy)) if phases is not None and phases[0].size else 0.0
    return {"span_us": span, "compute_us": iv.length(compute), "communication_us": iv.length(comm),
            "idle_us": idle, "in_phases_us": min(in_phases, idle),
            "threads": {k: iv.length(iv.intersect(v, t)) for k, v in s.threads.items() if v[0].size}}


def extract(tb: TraceTable) -> dict[str, Any]:
    s = tb.sets()
    steps = {}
    for i, num in enumerate(tb.steps[:, 2].tolist()):
        if not tb.step_index().get(i, ()).__len__():
            continue  # a step outside the selection
        si = tb.sets(i)
        steps[int(num)] = {"device": device_figures(si), "host": host_figures(si, phase_set(tb, i))}
    return {"device": device_figures(s), "host": host_figures(s, phase_set(tb)), "steps": steps}


def _shares(fig: dict[str, Any]) -> dict[str, Any]:
    span = fig["span_us"]
    out = dict(fig)
    for key in ("compute_us", "communication_us", "memory_us", "idle_us", "in_phases_us"):
        if key in fig:
            out[key.replace("_us", "_share")] = fig[key] / span if span else 0.0
    return out


def figure(part: dict[str, Any], shares: bool = False) -> Temporal:
    """A part's (or a step's) ``{"device", "host"}`` as its record; ``shares``: with the shares of the span (a
    rank's figure; a step's has none)."""
    dev, host = part["device"], part["host"]
    if shares:
        dev, host = dev and _shares(dev), host and _shares(host)
    return Temporal(device=None if dev is None else DeviceTime(**dev), host=None if host is None else HostTime(**host))


def combine(files: Iterable[tuple[Any, dict[str, Any]]]) -> list[Ranked[Temporal]]:
    """Per rank (its files summed): device and host breakdowns with their shares of the span."""
    return [Ranked(info.role, info.rank, info.path, figure(s, shares=True))
            for info, s in summed(files, ("device", "host"))]


def step_figure(part: dict[str, Any], step: int) -> Temporal | None:
    """One rank's figure for one step (without shares), None for a step its file does not have."""
    fig = part.get("steps", {}).get(step)
    return None if fig is None else figure(fig)
