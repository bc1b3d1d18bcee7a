"""Device idle time by cause, HolisticTraceAnalysis's idle time breakdown: every rank, every stream, every step.

Device work is kernels, memcpy and memset (HTA's kernel categories: ``cuda_sync`` waits and
``gpu_user_annotation`` ranges are not work). On a stream, idle time is the gaps between its work, from
the start of its first event to the end of its last: events in start order (ties: the one launched
first), the gap before an event runs from the latest end of the events before it to its start. Each gap
goes to one cause, judged by the event that ends it:

- ``host_wait``: that event's launch call (the runtime event with its correlation id) began after the
  gap began: the stream had run out of work and waited for the CPU to enqueue more (HTA: ``ts_runtime >
  prev_end``);
- ``kernel_wait``: otherwise, a gap shorter than :data:`KERNEL_WAIT_BELOW_US` (30 µs, below it and not
  equal): the cost of starting one queued kernel after another;
- ``other``: the rest: the work was queued in time but the stream waited for something else (an event
  recorded on another stream, a collective peer, a synchronisation).

Device work whose launch call is not in the trace is never host wait.

**What the host does while the device waits for it.** Host wait says the device ran out of work, not why
the host did not give it more. At the rank's level and per step, ``host_wait`` splits each instant of the
host-wait gaps by what the host runs then, the first of these that holds (``HOST_CAUSES``):

- ``collective_us``: a host-side collective is in flight (a ``gloo:`` range, a c10d op), on a rank whose
  collectives run on the host (:func:`.vocab.collective_source`: gloo, also with CUDA tensors);
- ``sync_us``: a host thread sits in a call that waits for the device (:func:`.vocab.is_sync`);
- ``launch_us``: the host is issuing work: in a runtime call, in a CPU op that launches device work (an op
  whose External id a launch call carries), between a launch call and the start of its work, or in a gap
  between these shorter than :data:`HOST_HOLE_US` (1 ms: the Python and the CPU-only ops between
  launches). This is the launch overhead that fewer, larger kernels remove;
- ``phase_us``: the host runs no launch for :data:`HOST_HOLE_US` or longer, inside an annotated phase or a
  DataLoader ``__next__`` (``phases``: µs per innermost phase name): it is doing something that is not
  issuing device work (loading data, a sleep, logging, CPU-only computation);
- ``untraced_us``: the same outside every phase: host code nothing in the trace names.

They add up to ``host_wait_us``. A launch-bound step (:mod:`.launch`) needs ``launch_us`` to dominate.

Levels: ``streams`` (per stream, HTA's figure); the rank's ``device`` figure, the same rule on the union
of all its streams (the gaps in which no stream runs anything, between its first device start and last
device end: its ``idle_us`` is ``temporal``'s device ``idle_us``); per step, the device work the step
launched (as ``temporal`` counts it: the step's device span), on the union and per stream. Every figure
has ``span_us = busy_us + idle_us`` and ``idle_us = host_wait_us + kernel_wait_us + other_us``: they are
sums of the same gaps.

Where this differs from HTA 0.5.0 ``get_idle_time_breakdown``:

- every rank, not rank 0 only; a figure for the whole device and per step besides per stream;
- the threshold: HTA documents ``consecutive_kernel_delay=30`` as nanoseconds but compares it with gaps
  in the trace's unit, µs, so its effective default is 30 µs; 30 µs here reproduces its figures;
- a gap is measured from the latest end of the earlier events on the stream (HTA: the end of the one
  that started just before). The same unless work on one stream overlaps, where HTA adds a negative gap
  to kernel wait;
- nanosecond-resolution traces are used as written (HTA rounds starts up and ends down to whole µs);
- HTA drops device work launched from the last ProfilerStep on, and work with no launch call, when a
  trace has two steps or more; here the whole trace counts (or the ``--steps`` selection).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from distprof.analysis.records import UNSET, HostWait, IdleFigure, NotApplicable, Ranked, StreamIdle
from distprof.trace.ranks import add, summed
from distprof.trace.table import TraceTable
from distprof.trace.vocab import ON_HOST, Kind, ThreadKind, collective_source, is_dataloader, is_sync
from distprof.util import intervals as iv

__all__ = [
    "CAUSES",
    "HOST_CAUSES",
    "HOST_HOLE_US",
    "KERNEL_WAIT_BELOW_US",
    "analyse",
    "combine",
    "extract",
    "not_applicable",
    "present",
    "step_figure",
]

KERNEL_WAIT_BELOW_US = 30.0  # HTA's consecutive_kernel_delay default, in the µs it is really compared in
CAUSES = ("host_wait_us", "kernel_wait_us", "other_us")
HOST_CAUSES = ("launch_us", "collective_us", "sync_us", "phase_us", "untraced_us")
HOST_HOLE_US = 1000.0  # the host issues nothing for this long: not the Python between launches


def not_applicable(reason: str = "no device events") -> NotApplicable:
    """The one shape both this analysis and kernel launch statistics give where they mean nothing."""
    return NotApplicable(reason=reason)


class _Work:
    """One trace's device work, sorted once: every grouping (stream, step, step and stream) reuses the order
    by start and the ranks of the ends."""

    def __init__(self, ts: np.ndarray, end: np.ndarray, launched: np.ndarray) -> None:
        self.ts, self.end, self.launched = ts, end, launched
        self.by_start = np.lexsort((launched, ts))  # ties: the one launched first closes the gap
        self.by_end = np.argsort(end, kind="stable")
        self.end_rank = np.empty(ts.size, dtype=np.int64)
        self.end_rank[self.by_end] = np.arange(ts.size)

    def figures(self, group_ids: np.ndarray, doing: _Host | None = None) -> tuple[np.ndarray, list[dict[str, Any]]]:
        """Per distinct group id (ascending): span, busy, idle and its causes; with ``doing``, what the host does
        during each group's host-wait gaps (``host_wait``). Returns (group ids, figures)."""
        n = self.ts.size
        if n == 0:
            return np.empty(0, dtype=np.int64), []
        g_sorted = group_ids[self.by_start]
        # A stable sort by group keeps the start order within each group (radix sort for small ids).
        small = g_sorted.astype(np.uint16) if int(group_ids.max()) < 2**16 else g_sorted
        order = self.by_start[np.argsort(small, kind="stable")]
        g, s = group_ids[order], self.ts[order]
        first = np.ones(n, dtype=bool)
        first[1:] = g[1:] != g[:-1]
        # The latest end before each event, within its group, exactly: ends stand in as their ranks
        # (integers), each group shifted above every earlier one, so no group's reach leaks into the next
        # and no float is rounded on the way.
        gi = np.cumsum(first) - 1
        reach = np.maximum.accumulate(gi * n + self.end_rank[order])
        prev_rank = np.zeros(n, dtype=np.int64)
        prev_rank[1:] = reach[:-1] - gi[1:] * n
        prev_rank[first] = 0
        ends_sorted = self.end[self.by_end]
        prev_end = ends_sorted[prev_rank]
        gap = np.where(first, 0.0, np.maximum(s - prev_end, 0.0))
        host = ~first & (self.launched[order] > prev_end)
        kernel = ~first & ~host & (gap < KERNEL_WAIT_BELOW_US)
        other = ~first & ~host & ~kernel
        m = int(gi[-1]) + 1
        parts = [np.bincount(gi, weights=np.where(mask, gap, 0.0), minlength=m).tolist()
                 for mask in (host, kernel, other)]
        last = np.append(np.flatnonzero(first)[1:] - 1, n - 1)
        lo = s[first].tolist()
        hi = ends_sorted[reach[last] - np.arange(m) * n].tolist()
        out = []
        bounds = np.append(np.flatnonzero(first), n)
        for j in range(m):
            h, k, o = parts[0][j], parts[1][j], parts[2][j]
            idle = h + k + o
            span = hi[j] - lo[j]
            fig: dict[str, Any] = {"span_us": span, "busy_us": span - idle, "idle_us": idle,
                                   "host_wait_us": h, "kernel_wait_us": k, "other_us": o}
            if doing is not None:
                a, b = bounds[j], bounds[j + 1]
                waits = host[a:b]  # this group's host-wait gaps: [latest end before, start)
                fig["host_wait"] = doing.attribute(iv.merge(prev_end[a:b][waits], s[a:b][waits]))
            out.append(fig)
        return g[first], out


def _bridge(a: iv.IntervalSet, below: float) -> iv.IntervalSet:
    """``a`` with every hole shorter than ``below`` filled."""
    s, e = a
    if s.size < 2:
        return a
    keep = np.ones(s.size, dtype=bool)
    keep[1:] = s[1:] - e[:-1] >= below
    first = np.flatnonzero(keep)
    return s[first], e[np.append(first[1:] - 1, s.size - 1)]


class _Host:
    """What one trace's host does, as interval sets, to split host-wait gaps by cause (module docstring)."""

    def __init__(self, tb: TraceTable) -> None:
        k, ts, end = tb.kind, tb.ts, tb.end
        names = tb.names
        n_names = len(names)
        sync_name = np.array([is_sync(nm) for nm in names], dtype=bool) if n_names else np.empty(0, dtype=bool)
        dl_name = np.array([is_dataloader(nm) for nm in names], dtype=bool) if n_names else np.empty(0, dtype=bool)
        op, rt, ann = k == Kind.CPU_OP, k == Kind.RUNTIME, k == Kind.ANNOTATION
        sync = (op | rt) & sync_name[tb.name] if ts.size else np.zeros(0, dtype=bool)
        comm_thread = tb.thread_kind_of_event() == ThreadKind.ALL.index(ThreadKind.COMMUNICATION)
        on_host = collective_source(((k == Kind.KERNEL) & tb.comm & tb.scope).any()) == ON_HOST
        self.collective = iv.merge(ts[(op | ann) & tb.comm], end[(op | ann) & tb.comm]) if on_host else iv.empty()
        self.sync = iv.merge(ts[sync], end[sync])
        # Ops that launch device work: an op whose External id a launch call (a runtime call with device
        # work) carries. With the runtime calls and the short holes between them: the host issuing work.
        launcher = tb.launcher()
        calls = np.unique(launcher[launcher >= 0])
        ext = tb.ext[calls]
        launching = op & ~comm_thread & np.isin(tb.ext, ext[ext >= 0]) if calls.size else np.zeros(ts.size, dtype=bool)
        busy = (rt & ~sync) | launching
        work = np.flatnonzero(launcher >= 0)  # and each launch's latency: from its call to its work's start
        self.launch = _bridge(iv.merge(np.concatenate([ts[busy], ts[launcher[work]]]),
                                       np.concatenate([end[busy], ts[work]])), HOST_HOLE_US)
        # Phases: annotations (not collectives, not on communication threads) and DataLoader __next__ ops.
        ph = ((ann & ~tb.comm) | (op & dl_name[tb.name])) & ~comm_thread
        self.ph_idx = np.flatnonzero(ph)
        self.names = names
        self.tb = tb

    def attribute(self, gaps: iv.IntervalSet) -> dict[str, Any]:
        """Split ``gaps`` (host-wait time) by what the host does then: ``HOST_CAUSES`` and ``phases``."""
        out: dict[str, Any] = dict.fromkeys(HOST_CAUSES, 0.0)
        out["phases"] = {}
        if not gaps[0].size:
            return out
        lo, hi = float(gaps[0][0]), float(gaps[1][-1])
        rest = gaps
        for key, part in (("collective_us", self.collective), ("sync_us", self.sync), ("launch_us", self.launch)):
            part = iv.clip(part, lo, hi)
            out[key] = iv.length(iv.intersect(rest, part))
            rest = iv.subtract(rest, part)
        if not rest[0].size:
            return out
        # The innermost phase over each piece of what is left: pieces split at the phases' edges, each piece
        # labelled by the shortest phase covering it (phases nest).
        tb, idx = self.tb, self.ph_idx
        rs, re = rest
        s, e = tb.ts[idx], tb.end[idx]
        i = np.searchsorted(re, s, side="right")  # the first piece of rest ending after the phase starts
        near = (i < rs.size) & (rs[np.minimum(i, rs.size - 1)] < e) if rs.size else np.zeros(idx.size, dtype=bool)
        idx, s, e = idx[near], s[near], e[near]
        pts = np.unique(np.concatenate([rs, re, np.clip(s, lo, hi), np.clip(e, lo, hi)]))
        mids = (pts[:-1] + pts[1:]) / 2
        j = np.searchsorted(rs, mids, side="right") - 1
        inside = (j >= 0) & (mids < re[np.maximum(j, 0)])
        a, b, mids = pts[:-1][inside], pts[1:][inside], mids[inside]
        label = np.full(mids.size, -1, dtype=np.int64)
        for q in np.argsort(-(e - s), kind="stable"):  # longest first: shorter (inner) phases overwrite
            label[np.searchsorted(mids, s[q]):np.searchsorted(mids, e[q])] = tb.name[idx[q]]
        lengths = b - a
        named = label >= 0
        out["untraced_us"] = float(lengths[~named].sum())
        if named.any():
            ids, inv = np.unique(label[named], return_inverse=True)
            per = np.bincount(inv, weights=lengths[named])
            phases = {self.names[int(n)]: float(v) for n, v in zip(ids.tolist(), per.tolist(), strict=True)}
            out["phases"] = dict(sorted(phases.items(), key=lambda kv: -kv[1]))
            out["phase_us"] = float(per.sum())
        return out


def analyse(tb: TraceTable) -> dict[str, Any]:
    """The breakdowns of one trace (computed once per table: kernel launch statistics reuse the per-step
    figures for their launch-bound rule). ``device`` is None without device work in scope."""
    cached = tb._cache.get("idle")  # the table's per-table cache: launch statistics ask again
    if cached is not None:
        return cached
    k = tb.kind
    idx = np.flatnonzero(((k == Kind.KERNEL) | (k == Kind.MEMCPY) | (k == Kind.MEMSET)) & tb.scope)
    result: dict[str, Any] = {"device": None, "streams": {}, "steps": {}}
    if idx.size:
        launcher = tb.launcher()[idx]
        # Work whose launch call is not in the trace: never host wait.
        work = _Work(tb.ts[idx], tb.end[idx], np.where(launcher >= 0, tb.ts[np.maximum(launcher, 0)], -np.inf))
        stream_ids, stream_of = np.unique(tb.stream[idx], return_inverse=True)
        stream_of = stream_of.reshape(-1).astype(np.int64)
        doing = _Host(tb)
        _, (result["device"],) = work.figures(np.zeros(idx.size, dtype=np.int64), doing)
        gids, figs = work.figures(stream_of)
        result["streams"] = {int(stream_ids[g]): f for g, f in zip(gids.tolist(), figs, strict=True)}
        step = tb.step[idx].astype(np.int64)
        if (step >= 0).any():
            # Work outside every step goes to one more group, dropped: the sorts above are reused as they are.
            n_steps, n_streams = tb.steps.shape[0], stream_ids.size
            st = np.where(step >= 0, step, n_steps)
            nums = tb.steps[:, 2].astype(np.int64)
            sgids, sfigs = work.figures(st, doing)
            steps: dict[int, dict[str, Any]] = {
                int(nums[g]): {"device": f, "streams": {}}
                for g, f in zip(sgids.tolist(), sfigs, strict=True) if g < n_steps}
            pgids, pfigs = work.figures(st * n_streams + stream_of)
            for g, f in zip(pgids.tolist(), pfigs, strict=True):
                if g // n_streams < n_steps:
                    steps[int(nums[g // n_streams])]["streams"][int(stream_ids[g % n_streams])] = f
            result["steps"] = steps
    tb._cache["idle"] = result
    return result


def extract(tb: TraceTable) -> dict[str, Any]:
    return analyse(tb)


def _shares(fig: dict[str, Any]) -> dict[str, Any]:
    """A figure's own keys with its shares: ``idle_share`` of the span, each cause's share of the idle time."""
    idle, span = fig["idle_us"], fig["span_us"]
    out = {k: fig[k] for k in ("span_us", "busy_us", "idle_us", *CAUSES)}
    out["idle_share"] = idle / span if span else 0.0
    for key in CAUSES:
        out[key.replace("_us", "_share")] = fig[key] / idle if idle else 0.0
    return out


def _figure(fig: dict[str, Any], **more: Any) -> IdleFigure:
    """One level's figure (an :meth:`_Work.figures` entry, or their sum) as its record."""
    hw = fig.get("host_wait")
    return IdleFigure(**_shares(fig), host_wait=UNSET if hw is None else HostWait(**hw), **more)


def present(part: dict[str, Any]) -> IdleFigure | NotApplicable:
    """One level (device and streams) as the JSON shows it: shares added, streams a list by stream id."""
    if part.get("device") is None:
        return not_applicable()
    return _figure(part["device"], streams=[StreamIdle(stream=sid, **_shares(f))
                                            for sid, f in sorted(part["streams"].items())])


def combine(files: Iterable[tuple[Any, dict[str, Any]]]) -> tuple[list[Ranked[IdleFigure | NotApplicable]],
                                                                 IdleFigure | NotApplicable]:
    """Per rank (its files summed, streams by id) and over all ranks (the ranks' device figures summed)."""
    ranks: list[Ranked[IdleFigure | NotApplicable]] = []
    total, applicable = None, 0
    for info, s in summed(files, ("device", "streams")):
        dev = s["device"]
        row = present({"device": dev, "streams": s["streams"] or {}})
        if dev is not None:
            applicable += 1
            total = add(total, dev)
        ranks.append(Ranked(info.role, info.rank, info.path, row))
    overall = not_applicable() if total is None else \
        _figure(total, ranks=applicable, kernel_wait_below_us=KERNEL_WAIT_BELOW_US)
    return ranks, overall


def step_figure(part: dict[str, Any], step: int, whole: bool = False) -> IdleFigure | NotApplicable:
    """One rank's figure for one step (``whole``: the file's, for a capture window without steps)."""
    if part.get("device") is None:
        return not_applicable()
    fig = part if whole else part["steps"].get(step)
    if fig is None:
        return not_applicable("no device work launched in this step")
    return present(fig)
