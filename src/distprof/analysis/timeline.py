"""Per rank and step, a compact timeline of what the rank did: the view one otherwise opens Perfetto for.

:func:`extract` (per file) keeps, for each step in the selection (a ``ProfilerStep#N``; for a file without
step markers that a run directory's manifest lists, its capture window, keyed by its first step as
:mod:`.steps` keys it), three lanes of intervals:

- ``phase``: the top-level annotated phases (``record_function`` / ``distprof.annotate`` ranges not nested in
  another on their thread), on the main thread when it has any, else on every thread that is not a
  communication thread; cut at the step's end;
- ``compute``: compute kernels on the device when the trace has device work (by the step that launched them),
  else CPU ops off communication threads (as :mod:`.temporal` counts them);
- ``collective``: collective kernels on the device, else host collectives (c10d ops, ``gloo:`` ranges), by
  kind (allreduce, broadcast, ...).

Each lane is coarsened so that a step costs at most :data:`CAP` intervals per rank whatever the trace holds:
intervals of one name closer than the step's duration / :data:`RESOLUTION` are merged, and the resolution is
doubled until the lanes fit. Times are float32 µs from the step's start (sub-µs precision up to minutes), so
1,024 ranks of many steps stay a few MB on the driver.

:func:`combine` (on the driver) builds one step of one role for the ranks asked: each rank's lanes in absolute
µs, plus ``waiting``, the time it was blocked in a collective for a later peer, matched across every rank of
the role as :mod:`.stragglers` matches them (from its per-file extract), each interval naming the rank it
waited for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distprof.analysis.stragglers import blocked_until, queues
from distprof.trace.ranks import role_of, runs
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind, ThreadKind

__all__ = ["CAP", "RESOLUTION", "RankTimeline", "StepTimeline", "combine", "extract"]

RESOLUTION = 2000
"""A step is kept at most this fine: gaps shorter than its duration / RESOLUTION are merged."""
CAP = 256
"""Intervals per rank and step kept by :func:`extract` (over its three lanes; waiting adds at most
:data:`WAIT_CAP` on the driver)."""
LANE_CAP = {"phase": 64, "compute": 96, "collective": 96}
WAIT_CAP = 96


def _merge_gaps(s: np.ndarray, e: np.ndarray, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Intervals with overlaps and gaps of at most ``gap`` merged away (sorted by start)."""
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1] + gap
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, s.size - 1)
    return s[first], reach[last]


def coarse(s: np.ndarray, e: np.ndarray, ids: np.ndarray | None, cap: int, res: float
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Intervals merged per id (gaps below ``res`` closed, ``res`` doubled until at most ``cap`` remain).
    Returns (starts, ends, ids), ids all 0 when ``ids`` is None."""
    ids = np.zeros(s.size, dtype=np.int32) if ids is None else ids.astype(np.int32)
    keep = e > s
    s, e, ids = s[keep], e[keep], ids[keep]
    if s.size == 0:
        return s, e, ids
    groups = [(k, s[ids == k], e[ids == k]) for k in np.unique(ids).tolist()]
    res, whole = max(res, 1e-3), float(e.max() - s.min())
    while True:
        parts = [(k, *_merge_gaps(gs, ge, res)) for k, gs, ge in groups]
        if sum(p[1].size for p in parts) <= cap or res > whole:
            break
        res *= 2
    s, e = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    ids = np.concatenate([np.full(p[1].size, p[0], dtype=np.int32) for p in parts])
    if s.size > cap:  # more distinct names than the cap, each merged whole: the longest are kept
        keep = np.sort(np.argsort(s - e, kind="stable")[:cap])
        s, e, ids = s[keep], e[keep], ids[keep]
    return s, e, ids


def _top_level(tb: TraceTable, idx: np.ndarray) -> np.ndarray:
    """Of the annotation events ``idx``, those not nested in another on their thread."""
    if idx.size == 0:
        return idx
    keep = []
    tracks = tb.track[idx]
    for t in np.unique(tracks).tolist():
        j = idx[tracks == t]
        j = j[np.lexsort((-tb.end[j], tb.ts[j]))]  # by start, the longer first
        reach = np.maximum.accumulate(tb.end[j])
        top = np.ones(j.size, dtype=bool)
        top[1:] = tb.ts[j][1:] >= reach[:-1]
        keep.append(j[top])
    return np.sort(np.concatenate(keep))


def _row(tb: TraceTable, idx: np.ndarray, step: int | None, lo: float, hi: float, off: float,
         names: dict[str, int]) -> dict[str, Any]:
    k = tb.kind
    res = (hi - lo) / RESOLUTION
    tk = tb.thread_kind_of_event()[idx]
    comm_thread = tk == ThreadKind.ALL.index(ThreadKind.COMMUNICATION)
    ann = idx[(k[idx] == Kind.ANNOTATION) & ~tb.comm[idx] & ~comm_thread]
    main = ann[tb.thread_kind_of_event()[ann] == ThreadKind.ALL.index(ThreadKind.MAIN)]
    top = _top_level(tb, main if main.size else ann)
    pid = np.array([names.setdefault(tb.names[n], len(names)) for n in tb.name[top].tolist()], dtype=np.int32)
    ps, pe, pid = coarse(tb.ts[top], np.minimum(tb.end[top], hi), pid, LANE_CAP["phase"], res)

    sets = tb.sets(step)
    comp = sets.compute if sets.device_span[0].size else sets.host_compute
    cs, ce, _ = coarse(comp[0], comp[1], None, LANE_CAP["compute"], res)

    dev = idx[(k[idx] == Kind.KERNEL) & tb.comm[idx]]
    coll = dev if dev.size else idx[((k[idx] == Kind.CPU_OP) | (k[idx] == Kind.ANNOTATION)) & tb.comm[idx]]
    kid = np.array([names.setdefault(tb.collective_label(j)[1], len(names)) for j in coll.tolist()], dtype=np.int32)
    ends = tb.end[coll] if dev.size else np.minimum(tb.end[coll], hi)
    ks, ke, kid = coarse(tb.ts[coll], ends, kid, LANE_CAP["collective"], res)

    def rel(a: np.ndarray) -> np.ndarray:
        return (a - lo).astype(np.float32)

    return {"start_us": lo + off, "end_us": hi + off, "phase": (rel(ps), rel(pe), pid), "compute": (rel(cs), rel(ce)),
            "collective": (rel(ks), rel(ke), kid)}


def extract(tb: TraceTable) -> dict[str, Any]:
    """``{"names": [...], "steps": {step: {"start_us", "end_us" (absolute), "phase": (starts, ends, name ids),
    "compute": (starts, ends), "collective": (starts, ends, name ids)}}}``, times in µs from the step's start."""
    names: dict[str, int] = {}
    off = tb.info.offset_us
    out: dict[int, dict[str, Any]] = {}
    index = tb.step_index()
    for i, (start, end, num) in enumerate(tb.steps.tolist()):
        idx = index.get(i)
        if idx is None or not idx.size:
            continue  # a step outside the selection
        out[int(num)] = _row(tb, idx, i, start, end, off, names)
    window = tb.info.window
    if not out and window and tb.info.start_us is not None and not tb.by_step and tb.ts.size:
        # No step markers: the manifest's window is the unit (as steps.extract makes it).
        idx = np.flatnonzero(tb.scope)
        out[int(window[0])] = _row(tb, idx, None, float(tb.ts.min()), float(tb.end.max()), off, names)
    return {"names": list(names), "steps": out}


@dataclass
class RankTimeline:
    """One rank's step: lanes of (name, start, end) in absolute µs; ``waiting``: (the rank waited for, start, end)."""
    rank: int | None
    path: str
    start_us: float
    end_us: float
    phases: list[tuple[str, float, float]] = field(default_factory=list)
    compute: list[tuple[float, float]] = field(default_factory=list)
    collectives: list[tuple[str, float, float]] = field(default_factory=list)
    waiting: list[tuple[int, float, float]] = field(default_factory=list)


@dataclass
class StepTimeline:
    """One step of one role, the ranks asked for in the order asked (those with no trace of it left out)."""
    role: str | None
    step: Any
    ranks: list[RankTimeline]

    @property
    def start_us(self) -> float:
        return min(r.start_us for r in self.ranks)

    @property
    def end_us(self) -> float:
        return max(max([r.end_us] + [e for _, _, e in r.waiting]) for r in self.ranks)


def _key(step: Any) -> Any:
    return tuple(step) if isinstance(step, list) else step


def _waiting(members: dict[int, list], step: Any, shown: set[int]) -> dict[int, list[tuple[int, float, float]]]:
    """Blocked intervals of the ``shown`` ranks in ``step``: each collective matched across every rank of the role
    (:func:`.stragglers.queues`), a rank blocked from its arrival until the last arrival
    (:func:`.stragglers.blocked_until`)."""
    out: dict[int, list] = {r: [] for r in shown}
    in_step = {r: [c for c in colls if _key(c[4]) == _key(step)] for r, colls in members.items()}
    for _, lists in queues(in_step):
        if len(lists) < len(members):
            continue  # a collective some rank of the role does not have: not matched (stragglers reports it)
        for i in range(min(len(v) for v in lists.values())):
            arrivals = {r: lists[r][i][2] for r in lists}
            last_rank = max(arrivals, key=lambda r: (arrivals[r], r))
            for r in shown & arrivals.keys():
                stop = blocked_until(lists[r][i], arrivals[last_rank])
                if stop > arrivals[r]:
                    out[r].append((last_rank, arrivals[r], stop))
    return out


def combine(files: Iterable[tuple[Any, dict[str, Any]]], role: str | None, step: Any, ranks: list[int]
            ) -> StepTimeline | None:
    """``step`` of ``role`` (a role label as :mod:`.steps` reports it, ``"actor (run 2)"`` included) for ``ranks``.

    ``files``: (FileInfo, parts) with ``parts["timeline"]`` from :func:`extract` and ``parts["stragglers"]`` (its
    collectives give the waiting). None when no asked rank has a timeline of that step.
    """
    files = [(info, parts) for info, parts in files if info.rank is not None]
    labels, _ = runs(info for info, _ in files)
    mine = [(info, parts) for info, parts in files if (role_of(labels, info) or None) == (role or None)]
    want = list(dict.fromkeys(ranks))
    rows = _rank_rows(mine, step, want)
    if not rows:
        return None
    members = _collectives_by_rank(mine)
    if len(members) > 1:
        _add_waiting(rows, members, step)
    return StepTimeline(role, step, [rows[r] for r in want if r in rows])


def _rank_rows(mine: list[tuple[Any, dict[str, Any]]], step: Any, want: list[int]) -> dict[int, RankTimeline]:
    """Each asked rank's lanes of ``step`` in absolute µs, from the first of its files that has a timeline of it."""
    rows: dict[int, RankTimeline] = {}
    for info, parts in mine:
        tl = parts.get("timeline")
        if info.rank not in want or tl is None:
            continue
        row = tl["steps"].get(step if not isinstance(step, list) else step[0])
        if row is None or info.rank in rows:
            continue
        names, t0 = tl["names"], row["start_us"]
        rows[info.rank] = RankTimeline(info.rank, info.path, row["start_us"], row["end_us"],
                                       _spans(row["phase"], names, t0), _bounds(row["compute"], t0),
                                       _spans(row["collective"], names, t0))
    return rows


def _bounds(lane: tuple, t0: float) -> list:
    """A lane's (start, end) in absolute µs (``t0``: the step's start)."""
    s, e = lane[0].astype(np.float64) + t0, lane[1].astype(np.float64) + t0
    return list(zip(s.tolist(), e.tolist(), strict=False))


def _spans(lane: tuple, names: list[str], t0: float) -> list:
    """A named lane's (name, start, end) in absolute µs (``t0``: the step's start)."""
    return [(names[k], a, b) for k, (a, b) in zip(lane[2].tolist(), _bounds(lane, t0), strict=False)]


def _collectives_by_rank(mine: list[tuple[Any, dict[str, Any]]]) -> dict[int, list]:
    """Each rank's collectives (from its stragglers extract), over its files."""
    members: dict[int, list] = {}
    for info, parts in mine:
        coll = (parts.get("stragglers") or {}).get("collectives")
        if coll is not None:
            members.setdefault(info.rank, []).extend(coll)
    return members


def _add_waiting(rows: dict[int, RankTimeline], members: dict[int, list], step: Any) -> None:
    """Set each shown rank's ``waiting``: its blocked intervals, coarsened like the other lanes."""
    for r, waits in _waiting(members, step, set(rows)).items():
        if waits:
            t0, t1 = rows[r].start_us, rows[r].end_us
            culprit = np.array([w[0] for w in waits])
            s, e, c = coarse(np.array([w[1] for w in waits]) - t0, np.array([w[2] for w in waits]) - t0, culprit,
                             WAIT_CAP, (t1 - t0) / RESOLUTION)
            rows[r].waiting = sorted(zip(c.tolist(), (s + t0).tolist(), (e + t0).tolist(), strict=True),
                                     key=lambda w: w[1])
