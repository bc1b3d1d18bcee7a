"""Which rank does everyone wait for? Collectives matched across ranks, last arrivals, waits.

Each rank's collectives are taken in time order: NCCL/RCCL kernels on the GPU when the trace has
them, else gloo's ``c10d::*`` ops on the CPU. They are grouped by process group (the kernel's
``Process Group Name`` when the trace records it, else the default group) and by kind (the
``Collective name`` when recorded, else from the kernel or op name), and the k-th collective of a
group on one rank is matched with the k-th on every other rank of the same role: each role of a
run (actor, rollout, ...) is its own torch.distributed world, whose group names can repeat in
another role, so collectives are never matched across roles. A rank
*arrives* when its collective starts (its kernel is launched onto the stream, or its c10d op is
called); the collective cannot finish before the last rank arrives, so every other rank waits
``last_arrival - its_arrival``: that time is the wait the last rank *caused*.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from typing import Any, Iterable

import msgspec

from .reader import RankTrace, TraceStream
from .summary import KERNEL_CATS, OP_CATS, profiler_step

__all__ = ["extract_collectives", "match_stragglers"]

_GPU_COLL = re.compile(r"(nccl|rccl)", re.I)
_KIND = re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)|c10d::([a-z_]+?)_*$|(?:nccl|rccl):([a-z_]+)", re.I)


class _CollArgs(msgspec.Struct):
    pg: str | None = msgspec.field(default=None, name="Process Group Name")
    collective: str | None = msgspec.field(default=None, name="Collective name")
    external_id: int | None = msgspec.field(default=None, name="External id")


_args_decoder = msgspec.json.Decoder(_CollArgs)


def _args(e) -> _CollArgs:
    if not e.args:
        return _CollArgs()
    try:
        return _args_decoder.decode(e.args)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return _CollArgs()


def _kind(name: str, collective: str | None = None) -> str:
    if collective:
        return collective.lower().replace("_", "")
    m = _KIND.search(name)
    if not m:
        return name.split("(")[0]
    return next(g for g in m.groups() if g).lower().replace("_", "")


def _step_of(steps: list[tuple[float, float, int]], ts: float) -> int | None:
    for s, e, n in steps:
        if s <= ts < e:
            return n
    return None


def extract_collectives(t: RankTrace | TraceStream) -> dict[str, Any]:
    """Compact, picklable: this rank's collectives in order, with absolute start times (µs).

    The process group and collective come from the kernel's own args when the trace records them
    there, else from the ``record_param_comms`` op that launched it (same ``External id``) or, for
    gloo's ``c10d::*`` ops on the CPU, the one nested inside the op on the same thread.
    """
    gpu, cpu, steps = [], [], []
    comms_by_ext: dict[int, _CollArgs] = {}
    comms_by_thread: dict[tuple[Any, Any], list[tuple[float, _CollArgs]]] = defaultdict(list)
    for batch in t.batches():
        for e in batch:
            if e.ph != "X":
                continue
            if e.cat in KERNEL_CATS and _GPU_COLL.search(e.name):
                gpu.append((_args(e), e.name, e.ts, e.dur))
            elif e.cat in OP_CATS and e.name.startswith("c10d::"):
                cpu.append((e.pid, e.tid, e.name, e.ts, e.dur))
            elif e.name == "record_param_comms":
                a = _args(e)
                if a.pg is not None or a.collective is not None:
                    if a.external_id is not None:
                        comms_by_ext[a.external_id] = a
                    comms_by_thread[(e.pid, e.tid)].append((e.ts, a))
            elif e.name.startswith("ProfilerStep#") and (n := profiler_step(e)) is not None:
                steps.append((e.ts, e.ts + e.dur, n))
    off = t.offset_us  # known once the stream is read (Kineto writes it after the events)
    colls = []
    if gpu:
        source = "gpu"
        for a, name, ts, dur in gpu:
            meta = a if a.pg is not None else comms_by_ext.get(a.external_id, a)
            colls.append((meta.pg or "default", _kind(name, meta.collective or a.collective), ts, dur))
    else:
        source = "cpu"
        for th in comms_by_thread.values():
            th.sort(key=lambda x: x[0])
        for pid, tid, name, ts, dur in cpu:
            inner = comms_by_thread.get((pid, tid), [])
            i = bisect.bisect_left(inner, ts, key=lambda x: x[0])
            meta = inner[i][1] if i < len(inner) and inner[i][0] < ts + dur else _CollArgs()
            colls.append((meta.pg or "default", _kind(name), ts, dur))
    colls.sort(key=lambda c: c[2])
    steps = [(s + off, e + off, n) for s, e, n in steps]
    return {"rank": t.rank, "role": t.role, "path": t.path, "source": source,
            "collectives": [(g, k, ts + off, d, _step_of(steps, ts + off)) for g, k, ts, d in colls]}


def match_stragglers(per_rank: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Match collectives across ranks; per rank the wait it caused, its late arrivals and its own waiting."""
    ranks = [r for r in per_rank if r["rank"] is not None]
    by_rank = {(r["role"], r["rank"]): r for r in ranks}
    stats = {key: {"rank": key[1], "role": key[0], "wait_caused_us": 0.0, "late_arrivals": 0, "waited_us": 0.0,
                   "collectives": 0} for key in by_rank}
    per_step: dict[Any, dict[str, Any]] = defaultdict(lambda: {"wait_us": 0.0, "collectives": 0, "late": defaultdict(float)})
    mismatched = []
    matched = 0
    worst = []
    roles = sorted({r["role"] or "" for r in ranks})
    for role in roles:
        members = {k: v for k, v in by_rank.items() if (k[0] or "") == role}
        if len(members) < 2:
            continue
        queues: dict[tuple[str, str], dict[Any, list]] = defaultdict(dict)
        for key, r in members.items():
            for c in r["collectives"]:
                queues[(c[0], c[1])].setdefault(key, []).append(c)
        for (pg, kind), lists in sorted(queues.items()):
            counts = {k: len(v) for k, v in lists.items()}
            if len(lists) < len(members) or len(set(counts.values())) > 1:
                mismatched.append({"role": role or None, "group": pg, "kind": kind,
                                   "counts": {str(k[1]): n for k, n in sorted(counts.items(), key=lambda kv: kv[0][1])}})
            n = min(counts.values()) if len(lists) == len(members) else 0
            for i in range(n):
                arrivals = {k: lists[k][i][2] for k in lists}
                last_key = max(arrivals, key=lambda k: (arrivals[k], k[1]))
                last = arrivals[last_key]
                waits = {k: last - a for k, a in arrivals.items()}
                caused = sum(waits.values())
                matched += 1
                step = lists[last_key][i][4]
                for k, w in waits.items():
                    stats[k]["waited_us"] += w
                    stats[k]["collectives"] += 1
                if caused > 0:
                    stats[last_key]["wait_caused_us"] += caused
                    stats[last_key]["late_arrivals"] += 1
                s = per_step[(role or None, step)]
                s["wait_us"] += caused
                s["collectives"] += 1
                s["late"][last_key[1]] += caused
                worst.append({"role": role or None, "group": pg, "kind": kind, "index": i, "step": step,
                              "last_rank": last_key[1], "wait_caused_us": caused,
                              "max_wait_us": max(waits.values())})
    rank_rows = sorted(stats.values(), key=lambda r: (-r["wait_caused_us"], r["role"] or "", r["rank"]))
    steps = []
    for (role, step), s in sorted(per_step.items(), key=lambda kv: (kv[0][0] or "", -1 if kv[0][1] is None else kv[0][1])):
        slowest = max(s["late"].items(), key=lambda kv: kv[1])[0] if s["late"] else None
        steps.append({"role": role, "step": step, "collectives": s["collectives"], "wait_us": s["wait_us"],
                      "slowest_rank": slowest})
    worst.sort(key=lambda w: -w["wait_caused_us"])
    return {"ranks": rank_rows, "matched": matched, "mismatched": mismatched, "steps": steps, "worst": worst[:20],
            "sources": sorted({r["source"] for r in ranks}), "unranked": [r["path"] for r in per_rank if r["rank"] is None]}
