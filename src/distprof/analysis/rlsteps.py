"""The RL step view: per global step of a job with several roles (rollout, ref, actor, ``rollout/engine``,
the driver ...), where the step's time goes across roles, which chain of roles bounds it, and what making
one role as fast as its median step would save.

**Inputs.** ``steps``' combined rows (one per role and step, each rank's ``start_us`` and ``dur_us``), each
file's :func:`extract` (its traced work as merged intervals: CPU ops, annotations, runtime calls, device
work; its annotations as phases; for an engine role its iterations and prefill/decode time) and its
``stragglers`` extract (its collectives: the time a rank waits inside one for a late peer is not work).
Optionally ``tasks``: busy intervals from outside the traces (Ray's task timeline: dicts ``{"role",
"rank", "name", "start_us", "dur_us"}``, same clock as the rows), so a role with no trace still has
busy and idle time.

**One RL step** (global step N) spans the rows of step N of every role that steps (``ProfilerStep#N``, or
a capture window of that one step): ``duration_us`` runs from the first rank's start to the last rank's
end. A rank's work in it is its file's traced work inside its own step N range, less its waits for peers.
Engine traces (role ``<role>/engine``: their ``ProfilerStep`` numbers count engine iterations, not global
steps) and ``tasks`` carry no global step: each interval goes to the step whose row of its role (for an
engine, of the role it serves) holds its midpoint, else to the latest step whose span holds it, and
stretches that step's span if it ends later.

Per role: ``busy_us`` is the union of its ranks' work in the step; ``idle_us = duration_us - busy_us``
(waiting for another role); ``overlapped_us`` is its busy time during which another role is busy too,
whatever step that role works on (asynchronous RL: rollout of step N+1 while step N trains);
``on_path_us`` its busy time on the critical path.

**Segments and the critical path.** Each role's busy time in the step is cut into segments: its work with
pauses shorter than :data:`BRIDGE_SHARE` of the step's duration bridged (a role that pauses that briefly is
not waiting for another). The critical path is walked back from the step's end: the segment that ends last,
then the segment (of any role) that ends last before that one starts, and so on. ``critical_path`` lists
the roles of that chain in time order (consecutive repeats once), so it passes through whatever ran in
between (weight sync, the reference pass ...).

**What-if** (``what_if``, per role ``saves_us``): "if this role's work in the step took its median step's
busy time, the step would be this much shorter". Each segment waits for the segment that ended last before
it started (as on the path), keeping its original gap after it (a hand-off's latency), and for the end of
its role's own previous segment (a role does its work in order); the role's segments are shrunk by
``median / busy`` (never stretched) and the step is replayed in time order: a segment starts when the later of
its predecessors (moved) plus its gap allows. The saving is the old last end less the new one, so when another
chain then bounds the step, the saving stops there (``then_path``: the new critical path), never the plain
difference of busy times.

Engine roles also get ``engine``: per engine role its iterations in the step (``engine_iterations``: its
``ProfilerStep`` ranges or iteration annotations, :func:`.vocab.is_engine_iteration`) and its ``prefill_us``
and ``decode_us`` (annotations or SGLang stage files that say so, :func:`.vocab.engine_stage`), as the engine
rank with the most iterations saw them (tensor-parallel ranks run every iteration together: never summed).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from distprof.analysis import records
from distprof.analysis.records import Record
from distprof.analysis.stragglers import blocked_until, queues
from distprof.rundir.layout import DRIVER_ROLE
from distprof.trace.ranks import role_of, runs
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind, engine_parent, engine_stage, is_engine_iteration, is_engine_role
from distprof.util import intervals as iv

logger = logging.getLogger(__name__)

__all__ = [
    "BRIDGE_SHARE",
    "MAX_SPANS",
    "EngineTime",
    "RLStep",
    "RoleTime",
    "Segment",
    "WhatIf",
    "combine",
    "critical_path",
    "extract",
    "to_json",
    "what_if",
]

BRIDGE_SHARE = 0.01  # pauses shorter than this share of the step's duration do not split a role's segment
MAX_SPANS = 4096  # per file: busy intervals kept (beyond it the shortest gaps are bridged)
MAX_PHASES = 400  # per file: phase intervals kept (the longest)
LANE_SPANS = 200  # per lane in the JSON: busy spans kept for the report's timeline (the shortest gaps bridged)
LANE_PHASES = 60


def _bounded(s: np.ndarray, e: np.ndarray, n: int) -> iv.IntervalSet:
    """At most ``n`` intervals: the shortest gaps bridged."""
    if s.size <= n:
        return s, e
    gaps = s[1:] - e[:-1]
    cut = np.sort(gaps)[s.size - n]  # keep the n-1 widest gaps
    keep = np.flatnonzero(gaps >= cut)[-(n - 1):] if n > 1 else np.empty(0, dtype=np.int64)
    starts = np.concatenate([s[:1], s[keep + 1]])
    ends = np.concatenate([e[keep], e[-1:]])
    return starts, ends


def extract(tb: TraceTable) -> dict[str, Any]:
    """This file's traced work (absolute µs), phases, and for an engine role its iterations and stages."""
    off = tb.info.offset_us
    s = tb.sets()
    if tb.info.role == DRIVER_ROLE:
        # The driver's phases are its waits on the other roles (distprof.integrations.ray.driver): its work is
        # what it runs itself (ops, python), never its annotations.
        m = ((tb.kind == Kind.CPU_OP) | (tb.kind == Kind.PYTHON)) & tb.scope & ~tb.comm
        own = iv.merge(tb.ts[m], tb.end[m])
        busy = iv.union(s.compute, s.memory, s.comm, s.runtime, s.dataloader, own)
    else:
        busy = iv.union(s.compute, s.memory, s.comm, s.host_comm, s.runtime, s.dataloader, s.host_ops)
    bs, be = _bounded(busy[0] + off, busy[1] + off, MAX_SPANS)
    k = tb.kind
    ann = np.flatnonzero((k == Kind.ANNOTATION) & ~tb.comm & tb.scope)
    if ann.size > MAX_PHASES:
        ann = ann[np.argsort(-tb.dur[ann], kind="stable")[:MAX_PHASES]]
    phases = [(tb.names[tb.name[j]], float(tb.ts[j] + off), float(tb.end[j] + off)) for j in sorted(ann.tolist())]
    out: dict[str, Any] = {"busy": (bs.tolist(), be.tolist()), "phases": phases}
    if is_engine_role(tb.info.role):
        its = [(float(a + off), float(b + off)) for a, b in tb.steps[:, :2].tolist()]
        if not its:
            its = [(a, b) for name, a, b in phases if is_engine_iteration(name)]
        stages: dict[str, list] = {"prefill": [], "decode": []}
        whole = engine_stage(tb.info.path.rsplit("/", 1)[-1])  # SGLang profile_by_stage: one file per stage
        if whole:
            stages[whole] = list(zip(bs.tolist(), be.tolist(), strict=True))
        else:
            for name, a, b in phases:
                st = engine_stage(name)
                if st:
                    stages[st].append((a, b))
        out["iterations"] = its
        out["stages"] = stages
    return out


# ---- results ----------------------------------------------------------------------------------------------
class RoleTime(Record):
    role: str
    busy_us: float
    idle_us: float
    on_path_us: float
    overlapped_us: float
    ranks: list[Any] = msgspec.field(default_factory=list)


class WhatIf(Record):
    role: str
    saves_us: float
    busy_us: float
    median_busy_us: float
    then_path: list[str] = msgspec.field(default_factory=list)


class EngineTime(Record):
    role: str
    engine_iterations: int
    prefill_us: float
    decode_us: float


class RLStep(Record):
    step: Any
    start_us: float
    duration_us: float
    critical_path: list[str]
    roles: list[RoleTime]
    what_if: list[WhatIf]
    # the path's segments: {"role", "start_us", "end_us"}
    path: list[dict[str, Any]] = msgspec.field(default_factory=list)
    engine: list[EngineTime] = msgspec.field(default_factory=list)
    lanes: list[dict[str, Any]] = msgspec.field(default_factory=list)  # per role and rank: busy spans, phases, waits


def to_json(steps: Iterable[RLStep]) -> list[dict[str, Any]]:
    return [records.to_json(s) for s in steps]


@dataclass
class Segment:
    role: str
    start: float
    end: float
    busy: float  # traced work inside (the segment bridges short pauses)


# ---- the path model ----------------------------------------------------------------------------------------
def _segments(busy: dict[str, iv.IntervalSet], bridge: float) -> list[Segment]:
    segs = []
    for role, (s, e) in busy.items():
        if not s.size:
            continue
        split = np.flatnonzero(s[1:] - e[:-1] >= bridge) + 1
        for lo, hi in zip(np.concatenate([[0], split]), np.concatenate([split, [s.size]]), strict=True):
            segs.append(Segment(role, float(s[lo]), float(e[hi - 1]), float((e[lo:hi] - s[lo:hi]).sum())))
    segs.sort(key=lambda g: (g.start, g.end, g.role))
    return segs


def _before(segs: list[Segment], g: Segment, ends: list[float] | None = None) -> int | None:
    """The segment ending last at or before ``g`` starts (ties: ``g``'s own role, then the later start)."""
    ends = ends or [x.end for x in segs]
    best = None
    for j, x in enumerate(segs):
        if x is g or ends[j] > g.start + 1e-9:
            continue
        key = (ends[j], x.role == g.role, x.start)
        if best is None or key > best[0]:
            best = (key, j)
    return None if best is None else best[1]


def critical_path(segs: list[Segment], ends: list[float] | None = None, starts: list[float] | None = None) -> list[int]:
    """Indices of the path's segments in time order (see the module docstring); ``ends``/``starts`` replace
    the segments' own times (a replayed schedule)."""
    if not segs:
        return []
    ends = ends or [g.end for g in segs]
    starts = starts or [g.start for g in segs]
    moved = [Segment(g.role, starts[j], ends[j], g.busy) for j, g in enumerate(segs)]
    cur = max(range(len(moved)), key=lambda j: (ends[j], -starts[j]))
    path = [cur]
    while True:
        j = _before(moved, moved[cur], ends)
        if j is None or j in path:
            break
        path.append(j)
        cur = j
    return path[::-1]


def _roles_of(segs: list[Segment], path: list[int]) -> list[str]:
    out: list[str] = []
    for j in path:
        if not out or out[-1] != segs[j].role:
            out.append(segs[j].role)
    return out


def what_if(segs: list[Segment], role: str, factor: float) -> tuple[float, list[str]]:
    """How much earlier the step ends when ``role``'s segments take ``factor`` of their time (replayed as the
    module docstring says); and the critical path then."""
    if not segs or factor >= 1.0:
        return 0.0, _roles_of(segs, critical_path(segs))
    preds = []  # per segment: [(predecessor, gap kept)]
    for j, g in enumerate(segs):
        p = []
        k = _before(segs, g)
        if k is not None:
            p.append((k, g.start - segs[k].end))
        own = [i for i, x in enumerate(segs) if x.role == g.role and i != j and x.end <= g.start + 1e-9]
        if own:
            p.append((max(own, key=lambda i: segs[i].end), 0.0))
        preds.append(p)
    new_s, new_e = [0.0] * len(segs), [0.0] * len(segs)
    for j in sorted(range(len(segs)), key=lambda j: (segs[j].start, segs[j].end)):
        g = segs[j]
        start = g.start if not preds[j] else max(new_e[p] + gap for p, gap in preds[j])
        new_s[j] = min(start, g.start)
        new_e[j] = new_s[j] + (g.end - g.start) * (factor if g.role == role else 1.0)
    saves = max(g.end for g in segs) - max(new_e)
    return max(saves, 0.0), _roles_of(segs, critical_path(segs, new_e, new_s))


# ---- combine ------------------------------------------------------------------------------------------------
def _blocked(files: list[tuple[Any, dict[str, Any]]]) -> dict[tuple[str, Any], iv.IntervalSet]:
    """(role, rank) -> the time it waited inside collectives for a late peer (as ``stragglers`` matches them)."""
    labels, _ = runs(info for info, _ in files)
    members: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for info, parts in files:
        p = parts.get("stragglers")
        if info.rank is not None and p:
            members[role_of(labels, info) or ""][info.rank].extend(p["collectives"])
    spans: dict[tuple[str, Any], list] = defaultdict(list)
    for role, ranks in members.items():
        if len(ranks) < 2:
            continue
        for colls in ranks.values():
            colls.sort(key=lambda c: c[2])
        for _, lists in queues(ranks):
            if len(lists) < len(ranks):
                continue
            for i in range(min(len(v) for v in lists.values())):
                last = max(v[i][2] for v in lists.values())
                for r, v in lists.items():
                    stop = blocked_until(v[i], last)
                    if stop > v[i][2]:
                        spans[(role, r)].append((v[i][2], stop))
    return {k: iv.merge([a for a, _ in v], [b for _, b in v]) for k, v in spans.items()}


def _key(row: Any) -> Any:
    w = row.window
    if w and w[0] != w[1]:
        return None  # a capture window of several steps: its work goes by time
    return row.step


Span = tuple[str, Any, float, float]  # (role, rank, start_us, end_us)


def _keyed(rows: list[Any]) -> tuple[dict[Any, list[tuple[str, Any, float, float, str | None]]], set[str]]:
    """Each global step's rows as spans (role, rank, start, end, path), and the files they come from."""
    spans: dict[Any, list[tuple[str, Any, float, float, str | None]]] = defaultdict(list)
    keyed_paths: set[str] = set()
    for row in rows:
        role = row.role or ""
        key = _key(row)
        if key is None or is_engine_role(role):
            continue
        for x in row.ranks:
            spans[key].append((role, x.rank, x.start_us, x.start_us + x.dur_us, x.path))
            keyed_paths.add(x.path)
    return spans, keyed_paths


def _unkeyed(files: list[tuple[Any, dict[str, Any]]], keyed_paths: set[str], tasks: Iterable[dict[str, Any]] | None
             ) -> tuple[list[Span], list[tuple[str, Any, str, float, float]], list[tuple[str, dict[str, Any]]]]:
    """Work with no global step (engine files, multi-step windows, ``tasks``): busy spans, phases, engine parts."""
    labels, _ = runs(info for info, _ in files)
    unkeyed: list[Span] = []
    extra_phases: list[tuple[str, Any, str, float, float]] = []
    engine_parts: list[tuple[str, dict[str, Any]]] = []
    for info, parts in files:
        p = parts.get("rlsteps")
        if p is None or info.path in keyed_paths:
            continue
        role = role_of(labels, info) or ""
        unkeyed += [(role, info.rank, a, b) for a, b in zip(*p["busy"], strict=False)]
        extra_phases += [(role, info.rank, n, a, b) for n, a, b in p["phases"]]
        if "iterations" in p:
            engine_parts.append((role, p))
    for t in tasks or ():
        try:
            a, d = float(t["start_us"]), float(t["dur_us"])
            if math.isfinite(a) and math.isfinite(d) and d > 0:
                unkeyed.append((str(t["role"]), t.get("rank"), a, a + d))
                extra_phases.append((str(t["role"]), t.get("rank"), str(t.get("name") or "task"), a, a + d))
        except (KeyError, TypeError, ValueError):
            logger.warning("distprof rlsteps: a task interval without role, start_us or dur_us skipped: %.200r", t)
    return unkeyed, extra_phases, engine_parts


class _Assigner:
    """The step an unkeyed interval belongs to: the row of its role (for an engine, of the role it serves) holding
    its midpoint, else the latest step whose span holds it."""

    def __init__(self, spans: dict[Any, list], window: dict[Any, tuple[float, float]]) -> None:
        self.window = window
        self.by_role_row: dict[str, list[tuple[float, float, Any]]] = defaultdict(list)
        for k, sp in spans.items():
            for role, _, lo, hi, _ in sp:
                self.by_role_row[role].append((lo, hi, k))

    def __call__(self, role: str, a: float, b: float) -> Any:
        mid = (a + b) / 2
        for r in (role, engine_parent(role)):
            hits = [(lo, k) for lo, hi, k in self.by_role_row.get(r, ()) if lo <= mid <= hi]
            if hits:
                return max(hits, key=lambda h: h[0])[1]
        hits = [(lo, k) for k, (lo, hi) in self.window.items() if lo <= mid <= hi]
        return max(hits, key=lambda h: h[0])[1] if hits else None


def _per_role(work: dict[Any, dict[tuple[str, Any], list[iv.IntervalSet]]]
              ) -> tuple[dict[Any, dict[str, iv.IntervalSet]], dict[str, iv.IntervalSet], dict[str, float]]:
    """Per step each role's busy time; each role's busy time over the whole job (any step: what another role's
    work overlaps); each role's median busy time per step."""
    per_step_role: dict[Any, dict[str, iv.IntervalSet]] = {}
    everywhere: dict[str, list[iv.IntervalSet]] = defaultdict(list)
    for k, lanes in work.items():
        by_role: dict[str, list[iv.IntervalSet]] = defaultdict(list)
        for (role, _), sets in lanes.items():
            by_role[role] += sets
        per_step_role[k] = {r: iv.union(*sets) for r, sets in by_role.items()}
        for r, s in per_step_role[k].items():
            everywhere[r].append(s)
    whole = {r: iv.union(*sets) for r, sets in everywhere.items()}
    busy_of: dict[str, list[float]] = defaultdict(list)
    for k in per_step_role:
        for r, s in per_step_role[k].items():
            busy_of[r].append(iv.length(s))
    median = {r: float(np.median(v)) for r, v in busy_of.items()}
    return per_step_role, whole, median


def combine(rows: list[Any], files: Iterable[tuple[Any, dict[str, Any]]],
            tasks: Iterable[dict[str, Any]] | None = None) -> list[RLStep]:
    """The RL steps of a job with more than one role (``[]`` for one role). ``rows``: ``steps.combine``'s
    ``steps`` (:class:`~.records.StepRow`); ``files``: (FileInfo, parts) with ``parts["rlsteps"]`` (:func:`extract`)
    and, when present, ``parts["stragglers"]``; ``tasks``: busy intervals from outside the traces (see the module
    docstring)."""
    files = list(files)
    own = {info.path: parts.get("rlsteps") for info, parts in files}
    # Keyed work: each (step, role, rank)'s rows. Unkeyed: engine files, multi-step windows, tasks.
    spans, keyed_paths = _keyed(rows)
    unkeyed, extra_phases, engine_parts = _unkeyed(files, keyed_paths, tasks)
    roles_all = {r for sp in spans.values() for r, *_ in sp} | {r for r, *_ in unkeyed}
    if len(roles_all) < 2 or not spans:
        return []
    blocked = _blocked(files)  # (after the one-role exit: it matches every collective again)
    window = {k: (min(s[2] for s in sp), max(s[3] for s in sp)) for k, sp in spans.items()}
    assign = _Assigner(spans, window)
    work: dict[Any, dict[tuple[str, Any], list[iv.IntervalSet]]] = defaultdict(lambda: defaultdict(list))
    phases: dict[Any, dict[tuple[str, Any], list]] = defaultdict(lambda: defaultdict(list))
    for k, sp in spans.items():
        for role, rank, lo, hi, path in sp:
            p = own.get(path) if path is not None else None
            mine = iv.clip(iv.merge(*p["busy"]), lo, hi) if p else (np.array([lo]), np.array([hi]))
            mine = iv.subtract(mine, blocked.get((role, rank), iv.empty()))
            work[k][(role, rank)].append(mine)
            if p:
                phases[k][(role, rank)] += [(n, max(a, lo), min(b, hi)) for n, a, b in p["phases"] if b > lo and a < hi]
    for role, rank, a, b in unkeyed:
        k = assign(role, a, b)
        if k is not None:
            work[k][(role, rank)].append((np.array([a]), np.array([b])))
            window[k] = (min(window[k][0], a), max(window[k][1], b))
    for role, rank, n, a, b in extra_phases:
        k = assign(role, a, b)
        if k is not None:
            phases[k][(role, rank)].append((n, a, b))
    per_step_role, whole, median = _per_role(work)
    return [_one_step(k, window[k], per_step_role[k], whole, median, work[k], phases[k], list(engine_parts))
            for k in sorted(per_step_role, key=lambda k: (window[k][0], str(k)))]


def _one_step(k: Any, span: tuple[float, float], busy: dict[str, iv.IntervalSet], whole: dict[str, iv.IntervalSet],
              median: dict[str, float], lanes: dict[tuple[str, Any], list[iv.IntervalSet]],
              phases: dict[tuple[str, Any], list], engines: list[tuple[str, dict[str, Any]]]) -> RLStep:
    t0, t1 = span
    dur = t1 - t0
    segs = _segments(busy, BRIDGE_SHARE * dur)
    path = critical_path(segs)
    on_path: dict[str, float] = defaultdict(float)
    for j in path:
        on_path[segs[j].role] += segs[j].busy
    roles = []
    for r in sorted(busy):
        b = iv.length(busy[r])
        others = iv.union(*[s for o, s in whole.items() if o != r]) if len(whole) > 1 else iv.empty()
        ranks = sorted({rank for (role, rank) in lanes if role == r}, key=lambda x: (x is None, str(x)))
        roles.append(RoleTime(r, b, max(dur - b, 0.0), on_path.get(r, 0.0),
                              iv.length(iv.intersect(busy[r], others)), ranks))
    ifs = []
    for r in sorted(busy):
        b = iv.length(busy[r])
        factor = median[r] / b if b > 0 else 1.0
        saves, then = what_if(segs, r, factor)
        ifs.append(WhatIf(r, saves, b, median[r], then))
    ifs.sort(key=lambda w: (-w.saves_us, w.role))
    return RLStep(step=list(k) if isinstance(k, tuple) else k, start_us=t0, duration_us=dur,
                  critical_path=_roles_of(segs, path), roles=roles, what_if=ifs,
                  path=[{"role": segs[j].role, "start_us": segs[j].start, "end_us": segs[j].end} for j in path],
                  engine=_engine_times(span, busy, engines), lanes=_lanes(dur, lanes, phases))


def _engine_times(span: tuple[float, float], busy: dict[str, iv.IntervalSet],
                  engines: list[tuple[str, dict[str, Any]]]) -> list[EngineTime]:
    t0, t1 = span
    eng = []
    for role in sorted({r for r, _ in engines}):
        # Per engine rank (TP ranks run every iteration in lockstep, so a sum would count each once per rank);
        # the rank with the most iterations (then the most stage time) speaks for the engine.
        per_rank = []
        win = (np.array([t0]), np.array([t1]))
        mine = busy.get(role, iv.empty())
        for r, p in engines:
            if r != role:
                continue
            n = sum(1 for a, b in p["iterations"] if iv.length(iv.intersect(mine, (np.array([a]), np.array([b])))) > 0
                    or (not mine[0].size and t0 <= (a + b) / 2 <= t1))
            pre, dec = (iv.length(iv.intersect(iv.merge([a for a, _ in p["stages"][name]],
                                                         [b for _, b in p["stages"][name]]),
                                                mine if mine[0].size else win)) for name in ("prefill", "decode"))
            per_rank.append((n, pre + dec, pre, dec))
        n, _, pre, dec = max(per_rank, default=(0, 0.0, 0.0, 0.0))
        if role in busy:
            eng.append(EngineTime(role, n, pre, dec))
    return eng


def _lanes(dur: float, lanes: dict[tuple[str, Any], list[iv.IntervalSet]], phases: dict[tuple[str, Any], list]
           ) -> list[dict[str, Any]]:
    """Per role and rank: its busy spans (short pauses bridged, at most LANE_SPANS) and its longest phases."""
    lane_rows = []
    bridge = dur / (LANE_SPANS * 4) if dur > 0 else 0.0
    for (role, rank), sets in sorted(lanes.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        s, e = iv.union(*sets)
        if bridge > 0 and s.size > 1:
            keep = np.flatnonzero(s[1:] - e[:-1] >= bridge)
            s, e = np.concatenate([s[:1], s[keep + 1]]), np.concatenate([e[keep], e[-1:]])
        s, e = _bounded(s, e, LANE_SPANS)
        ph = sorted(phases.get((role, rank), []), key=lambda t: -(t[2] - t[1]))[:LANE_PHASES]
        lane_rows.append({"role": role, "rank": rank,
                          "busy": [[a, b] for a, b in zip(s.tolist(), e.tolist(), strict=True)],
                          "phases": [[n, a, b] for n, a, b in sorted(ph, key=lambda t: t[1])]})
    return lane_rows
