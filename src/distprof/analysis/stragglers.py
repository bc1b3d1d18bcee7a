"""Which rank does everyone wait for? Collectives matched across ranks, last arrivals, waits.

Each rank's collectives are taken in time order: collective kernels on the device when the trace has
them, else c10d collective ops on the host (gloo, CPU-only jobs). They are grouped by process group
(recorded ``Process Group Name``, else the default group), kind (recorded ``Collective name``, else
from the name) and step (``ProfilerStep#N``, else the manifest's capture window), and the k-th
collective of a group in a step on one rank is matched with the k-th on every other rank of the
same role. Roles (actor, rollout, ...) are separate torch.distributed worlds whose group names
repeat, so collectives are never matched across roles; matching within a step lets a rank that has
several files (several windows, a resumed run) count every one of them.

A rank *arrives* when its collective starts (its kernel starts on the device, or its c10d op is
called). The collective cannot finish before the last rank arrives, so every other rank is blocked
from its own arrival until that last arrival (on the device, until its kernel ends, if sooner).

Collectives overlap in time (DDP's gradient buckets, async ops), so a rank is often blocked in
several at once. Its **waited** time is the union of its blocked intervals: the time it actually spent
blocked, never more than its traced time. Each instant of it is charged to one rank, the last arrival
of the *oldest* collective blocking it then (a stream runs its collectives in order, so the oldest one
is what holds it); a rank's **wait caused** is the sum of what is charged to it, so the waits caused
by all ranks add up to the time all ranks waited, and no interval is counted twice. ``wait_matrix``
splits the same time by pair: how long each rank waited for each other rank.

Where the collectives are kernels, a rank's host often waits too, in a call that waits for the device
(``cudaStreamSynchronize`` behind a collective, ``.item()``: :func:`.vocab.is_sync`): the device waits for a
peer and the host waits for the device. ``sync_waiting_us`` (per rank, per rank and step in ``waits``, per
pair in ``wait_matrix`` as ``sync_us``) is the part of a rank's blocked time during which its host sat in
such a call: host-sync time that is waiting for a peer, charged like the wait itself. With host
collectives (gloo) a device sync never waits for a peer (the waiting happens in gloo's host code), so it
is 0 there.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from distprof.analysis.records import (
    Collective,
    Mismatch,
    StragglerRank,
    StragglersResult,
    StragglerStep,
    Wait,
    WaitPair,
)
from distprof.trace.ranks import role_of, runs
from distprof.trace.table import TraceTable
from distprof.trace.vocab import ON_DEVICE, Kind, collective_source, is_collective_op, is_sync
from distprof.util import intervals as iv

__all__ = ["blocked_until", "combine", "extract", "last_arrival", "matched_count", "queues"]


def extract(tb: TraceTable) -> dict[str, Any]:
    """This rank's collectives in time order: ``(group, kind, start_us, end_us, step, j)``, absolute µs; ``j`` is the
    index in ``tb`` of the event whose recorded metadata describes it (the kernel; on the host the
    ``record_param_comms`` op inside the c10d op, else the c10d op), for :mod:`.collectives`.

    ``end_us`` is NaN for host-side c10d ops, whose duration is the call, not the collective (gloo
    runs it on another thread), so it bounds nothing.
    """
    off = tb.info.offset_us
    k = tb.kind
    steps = tb.steps[:, 2]
    window = tuple(tb.info.window) if tb.info.window else None

    def step_of(j: int) -> Any:
        s = int(tb.step[j])
        return int(steps[s]) if s >= 0 else (list(window) if window else None)

    gpu = np.flatnonzero((k == Kind.KERNEL) & tb.comm & tb.scope)
    out, syncs = [], []
    if collective_source(gpu.size > 0) == ON_DEVICE:
        source = "gpu"
        sync_name = np.array([is_sync(nm) for nm in tb.names], dtype=bool)
        m = ((k == Kind.RUNTIME) | (k == Kind.CPU_OP)) & tb.scope & sync_name[tb.name]
        a, b = iv.merge(tb.ts[m], tb.end[m])
        syncs = list(zip((a + off).tolist(), (b + off).tolist(), strict=True))
        for j in gpu[np.argsort(tb.ts[gpu], kind="stable")].tolist():
            g, kind = tb.collective_label(j)
            out.append((g, kind, float(tb.ts[j]) + off, float(tb.end[j]) + off, step_of(j), j))
    else:
        source = "cpu"
        ops = np.flatnonzero((k == Kind.CPU_OP) & tb.scope)
        coll = [j for j in ops.tolist() if is_collective_op(tb.names[tb.name[j]])]
        # Metadata for a c10d op: the record_param_comms op nested inside it on the same thread.
        rpc: dict[int, list[tuple[float, int]]] = defaultdict(list)
        for j in tb.meta:
            if k[j] == Kind.CPU_OP:
                rpc[int(tb.track[j])].append((float(tb.ts[j]), j))
        for v in rpc.values():
            v.sort()
        for j in sorted(coll, key=lambda j: tb.ts[j]):
            inner = rpc.get(int(tb.track[j]), [])
            p = bisect.bisect_left(inner, (float(tb.ts[j]), -1))
            at = j
            if p < len(inner) and inner[p][0] < tb.end[j]:
                at = inner[p][1]
                group, c = tb.meta[at]
                _, kind = tb.collective_label(j)
                kind = c.lower().replace("_", "") if c else kind
                g = group if group is not None else "default"
            else:
                g, kind = tb.collective_label(j)
            out.append((g, kind, float(tb.ts[j]) + off, math.nan, step_of(j), at))
    return {"source": source, "collectives": out, "syncs": syncs}


def _covered(spans: tuple[list[float], list[float]], lo: float, hi: float) -> float:
    """How much of ``[lo, hi)`` the sorted, disjoint ``spans`` (starts, ends) cover."""
    starts, ends = spans
    i = max(bisect.bisect_right(ends, lo), 0)
    total = 0.0
    while i < len(starts) and starts[i] < hi:
        total += max(min(ends[i], hi) - max(starts[i], lo), 0.0)
        i += 1
    return total


def _key(step: Any) -> Any:
    return tuple(step) if isinstance(step, list) else step


def queues(ranks: dict[int, list]) -> list[tuple[tuple, dict[int, list]]]:
    """One role's collectives (rank -> its :func:`extract` rows, in time order) as they are matched:
    per (step, group, kind), each rank's list; the k-th of every rank's list is one collective."""
    out: dict[tuple, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    for r, colls in ranks.items():
        for c in colls:
            out[(_key(c[4]), c[0], c[1])][r].append(c)
    return sorted(out.items(), key=lambda kv: repr(kv[0]))


def matched_count(lists: dict[int, list], n_ranks: int) -> int:
    """How many of one (step, group, kind) queue's collectives are matched (:func:`queues`): the first k of every
    rank's list, k the shortest list's length; none when one of the role's ``n_ranks`` ranks has none."""
    return min(len(v) for v in lists.values()) if len(lists) == n_ranks else 0


def last_arrival(rows: dict[int, tuple]) -> int:
    """The rank that arrives last at one matched collective (rank -> its :func:`extract` row); a tie: the highest."""
    return max(rows, key=lambda r: (rows[r][2], r))


def blocked_until(c: tuple, last: float) -> float:
    """Until when a rank that arrived at collective ``c`` (an :func:`extract` row) is blocked, the last rank arriving at
    ``last``: until that arrival, or until its kernel ends if sooner (a host c10d op's end bounds nothing)."""
    end = c[3]
    return min(last, end) if not math.isnan(end) else last


def _step_json(step: Any) -> Any:
    return list(step) if isinstance(step, tuple) else step


@dataclass
class _Gathered:
    """Every role's ranks' collectives (rank -> its :func:`extract` rows), their files' ends and host syncs."""
    members: dict[str, dict[int, list]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(list)))
    ends: dict[tuple[str, int], float] = field(default_factory=dict)
    sources: set[str] = field(default_factory=set)
    unranked: list[str] = field(default_factory=list)
    sync_spans: dict[tuple[str, int], list] = field(default_factory=lambda: defaultdict(list))


def _gather(files: list[tuple[Any, dict[str, Any]]], labels: Any) -> _Gathered:
    g = _Gathered()
    for info, p in files:
        if info.rank is None:
            g.unranked.append(info.path)
            continue
        role = role_of(labels, info) or ""
        g.members[role][info.rank].extend(p["collectives"])
        g.sync_spans[(role, info.rank)].extend(p.get("syncs", ()))
        g.sources.add(p["source"])
        if info.end_us is not None:
            g.ends[(role, info.rank)] = max(g.ends.get((role, info.rank), -math.inf), info.end_us)
    return g


@dataclass
class _Matched:
    """The collectives matched across ranks: per rank its figures, its blocked spans, each instance."""
    stats: dict[tuple[str, int], StragglerRank] = field(default_factory=dict)
    blocked: dict[tuple[str, int], list] = field(default_factory=lambda: defaultdict(list))  # [(start, end, k, step)]
    instances: list[Collective] = field(default_factory=list)
    late: set[int] = field(default_factory=set)  # indices of the instances someone waited for
    mismatched: list[Mismatch] = field(default_factory=list)


def _match_role(m: _Matched, role: str, ranks: dict[int, list], ends: dict[tuple[str, int], float]) -> None:
    for (step, group, kind), lists in queues(ranks):
        counts = {r: len(v) for r, v in lists.items()}
        if len(lists) < len(ranks) or len(set(counts.values())) > 1:
            m.mismatched.append(Mismatch(role=role or None, step=_step_json(step), group=group, kind=kind,
                                         counts={str(r): n for r, n in sorted(counts.items())}))
        for i in range(matched_count(lists, len(ranks))):
            arrivals = {r: lists[r][i][2] for r in lists}
            last_rank = last_arrival({r: lists[r][i] for r in lists})
            last = arrivals[last_rank]
            inst = Collective(role=role or None, group=group, kind=kind, index=i, step=_step_json(step),
                              last_rank=last_rank)
            k = len(m.instances)
            m.instances.append(inst)
            for r, a in arrivals.items():
                m.stats[(role, r)].collectives += 1
                stop = blocked_until(lists[r][i], last)
                stop = min(stop, ends.get((role, r), stop))
                if stop > a:
                    m.blocked[(role, r)].append((a, stop, k, lists[r][i][4]))
                    inst.max_wait_us = max(inst.max_wait_us, stop - a)


def _match(g: _Gathered) -> _Matched:
    m = _Matched()
    for role in sorted(g.members):
        ranks = g.members[role]
        for r, colls in ranks.items():
            colls.sort(key=lambda c: c[2])
            m.stats[(role, r)] = StragglerRank(role=role or None, rank=r)
        if len(ranks) >= 2:
            _match_role(m, role, ranks, g.ends)
    return m


@dataclass
class _StepWaits:
    wait_us: float = 0.0
    by: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    collectives: set[int] = field(default_factory=set)


@dataclass
class _Charged:
    per_step: dict[tuple, _StepWaits] = field(default_factory=lambda: defaultdict(_StepWaits))
    waited_at: dict[tuple, float] = field(default_factory=dict)
    synced_at: dict[tuple, float] = field(default_factory=lambda: defaultdict(float))
    # (role, waiter, the rank it waited for) -> µs; and of that, the waiter's host in a sync
    pair: dict[tuple[str, int, int], float] = field(default_factory=lambda: defaultdict(float))
    pair_sync: dict[tuple[str, int, int], float] = field(default_factory=lambda: defaultdict(float))


def _charge_rank(c: _Charged, m: _Matched, role: str, r: int, spans: list, sync_spans: list) -> None:
    """Charge one rank's blocked time, instant by instant, to the oldest collective blocking it."""
    spans.sort()
    reach = -math.inf
    by_step: dict[Any, float] = defaultdict(float)
    ss, se = iv.merge([a for a, _ in sync_spans], [b for _, b in sync_spans])
    syncs = (ss.tolist(), se.tolist())
    me = m.stats[(role, r)]
    for a, b, k, step in spans:
        lo = max(a, reach)
        if b > lo:
            part = b - lo
            inst = m.instances[k]
            inst.wait_caused_us += part
            m.late.add(k)
            m.stats[(role, inst.last_rank)].wait_caused_us += part
            me.waited_us += part
            s = c.per_step[(role, _key(step))]
            s.wait_us += part
            s.by[inst.last_rank] += part
            by_step[_key(step)] += part
            c.pair[(role, r, inst.last_rank)] += part
            if syncs[0]:
                sync = _covered(syncs, lo, b)
                me.sync_waiting_us += sync
                c.synced_at[(role, r, _key(step))] += sync
                c.pair_sync[(role, r, inst.last_rank)] += sync
        reach = max(reach, b)
    for step, us in by_step.items():
        c.waited_at[(role, r, step)] = us


def _waits(c: _Charged) -> list[Wait]:
    """Per rank and step: the time it waited, and the waiting of others it caused (what ``steps`` ranks by)."""
    cells = set(c.waited_at)
    for (role, step), s in c.per_step.items():
        cells.update((role, r, step) for r in s.by)
    return [Wait(role=role or None, rank=r, step=_step_json(step), waited_us=c.waited_at.get((role, r, step), 0.0),
                 wait_caused_us=c.per_step[(role, step)].by.get(r, 0.0) if (role, step) in c.per_step else 0.0,
                 sync_waiting_us=c.synced_at.get((role, r, step), 0.0))
            for role, r, step in sorted(cells, key=lambda c: (c[0], repr(c[2]), c[1]))]


def combine(files: Iterable[tuple[Any, dict[str, Any]]], top: int | None = 10) -> StragglersResult:
    """Match collectives across the ranks of each role; waits per rank and step (see the module docstring).

    ``files`` are (FileInfo, extract result) pairs, several per rank allowed (their collectives are
    matched step by step). Files without a rank are listed in ``unranked``.
    """
    files = list(files)
    labels, run_warnings = runs(info for info, _ in files)  # ranks of different runs are never matched
    g = _gather(files, labels)
    m = _match(g)
    c = _Charged()
    for (role, r), spans in m.blocked.items():
        _charge_rank(c, m, role, r, spans, g.sync_spans.get((role, r), []))
    for k, inst in enumerate(m.instances):
        if k in m.late:
            m.stats[(inst.role or "", inst.last_rank)].late_arrivals += 1
        c.per_step[(inst.role or "", _key(inst.step))].collectives.add(k)
    rank_rows = sorted(m.stats.values(), key=lambda r: (-r.wait_caused_us, r.role or "", r.rank))
    steps = []
    for (role, step), s in sorted(c.per_step.items(), key=lambda kv: (kv[0][0], repr(kv[0][1]))):
        slowest = max(sorted(s.by.items()), key=lambda kv: kv[1])[0] if s.by else None
        steps.append(StragglerStep(role=role or None, step=_step_json(step), collectives=len(s.collectives),
                                   wait_us=s.wait_us, slowest_rank=slowest))
    worst = sorted((msgspec.structs.replace(i) for k, i in enumerate(m.instances) if k in m.late),
                   key=lambda w: (-w.wait_caused_us, w.index))
    return StragglersResult(
        ranks=rank_rows, matched=len(m.instances), mismatched=m.mismatched, steps=steps,
        worst=worst[:top] if top else worst, waits=_waits(c), sources=sorted(g.sources), unranked=g.unranked,
        warnings=run_warnings,
        wait_matrix=[WaitPair(role=role or None, waiter=w, culprit=cu, wait_us=us,
                              sync_us=c.pair_sync.get((role, w, cu), 0.0))
                     for (role, w, cu), us in sorted(c.pair.items())])
