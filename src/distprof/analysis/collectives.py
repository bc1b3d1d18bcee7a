"""The collective report: per process group and collective, how many, how big, how fast, who arrives last.

Collectives are taken and matched across ranks exactly as :mod:`.stragglers` does it (its :func:`~.stragglers.extract`
rows, :func:`~.stragglers.queues`, :func:`~.stragglers.matched_count`, :func:`~.stragglers.last_arrival`): the k-th
collective of a (step, group, kind) on one rank is the k-th on every other rank of the role. Per matched instance:

- **size S** (bytes): the recorded message elements times the dtype's size (:data:`DTYPE_BYTES`); which message,
  ``In msg nelems`` or ``Out msg nelems``, is the one nccl-tests calls the collective's size (:data:`FORMULAS`);
- **transfer time**: the shortest duration among the ranks that took part (every other rank's kernel also spins
  while it waits for the last one: TraceLens's "comm latency");
- **start skew**: the latest start minus the earliest (the waiting; TraceLens's "skew in start time");
- **algbw** = S / transfer time, in GB/s (1e9 bytes per second, as nccl-tests prints it); **busbw** = algbw times
  the collective's factor in :data:`FORMULAS` (nccl-tests, doc/PERFORMANCE.md and src/*.cu);
- the rank that **arrives last** (starts last; a tie goes to the highest rank, as in :mod:`.stragglers`).

A (role, group, name) row sums S and the transfer times over its instances (so ``algbw_gbps`` = ``bytes`` /
``min_dur_us``, each instance weighted by its time), takes the median skew, and names the rank that arrived last
most often with its share. A role with one traced rank (HTA's NCCL trace is rank 0 of 2) has no skew or last rank;
each of its collectives is an instance on its own. Host-side collectives (gloo c10d ops) have no transfer time (the
op's duration is its call, not the transfer) and so no bandwidth. Traces without recorded sizes (older torch
versions write none; the DLRM set) have no bytes or bandwidth: the row's ``note`` says so, never a zero.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distprof.analysis import stragglers
from distprof.analysis.records_comm import CollectiveRow
from distprof.trace.commargs import CommArgs
from distprof.trace.ranks import role_of, runs
from distprof.trace.table import TraceTable

__all__ = ["DTYPE_BYTES", "FORMULAS", "Formula", "bus_factor", "combine", "extract", "family", "size_bytes"]

# Bytes per element of the ``dtype`` torch records (c10::ScalarType names, c10/core/ScalarType.h).
DTYPE_BYTES: dict[str, int] = {
    "Byte": 1, "Char": 1, "Bool": 1, "QInt8": 1, "QUInt8": 1, "QUInt4x2": 1, "QUInt2x4": 1,
    "Float8_e5m2": 1, "Float8_e4m3fn": 1, "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Float8_e8m0fnu": 1,
    "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2, "ComplexHalf": 4,
    "Int": 4, "Float": 4, "QInt32": 4, "UInt32": 4,
    "Long": 8, "Double": 8, "ComplexFloat": 8, "UInt64": 8,
    "ComplexDouble": 16,
}


@dataclass(frozen=True)
class Formula:
    """How one collective's size and bus bandwidth are computed: ``message`` is the recorded message that is the
    collective's size S (``in``, ``out``, or ``max`` of the two), ``factor`` busbw / algbw for a group of n."""
    message: str
    factor: Callable[[int], float]
    text: str
    source: str


_NCCL_DOC = "nccl-tests doc/PERFORMANCE.md"
# One table, each row with its source. S as nccl-tests counts it: the whole buffer (allgather: the gathered output,
# n x each rank's input; reducescatter: the whole input, n x each rank's output; alltoall: a rank's whole send buffer).
FORMULAS: dict[str, Formula] = {
    "allreduce": Formula("in", lambda n: 2 * (n - 1) / n, "2(n-1)/n", _NCCL_DOC + " (AllReduce); src/all_reduce.cu"),
    "reducescatter": Formula("in", lambda n: (n - 1) / n, "(n-1)/n",
                             _NCCL_DOC + " (ReduceScatter); src/reduce_scatter.cu"),
    "allgather": Formula("out", lambda n: (n - 1) / n, "(n-1)/n", _NCCL_DOC + " (AllGather); src/all_gather.cu"),
    "alltoall": Formula("in", lambda n: (n - 1) / n, "(n-1)/n", "nccl-tests src/alltoall.cu (AlltoAllGetBw)"),
    "broadcast": Formula("in", lambda n: 1.0, "1", _NCCL_DOC + " (Broadcast); src/broadcast.cu"),
    "reduce": Formula("in", lambda n: 1.0, "1", _NCCL_DOC + " (Reduce); src/reduce.cu"),
    "sendrecv": Formula("in", lambda n: 1.0, "1", "nccl-tests src/sendrecv.cu (SendRecvGetBw)"),
    "gather": Formula("max", lambda n: (n - 1) / n, "(n-1)/n", "nccl-tests src/gather.cu (GatherGetBw)"),
    "scatter": Formula("max", lambda n: (n - 1) / n, "(n-1)/n", "nccl-tests src/scatter.cu (ScatterGetBw)"),
}

# Kinds (vocab.collective_kind: recorded ``Collective name`` or the kernel's family, lower case, no "_") by family.
_FAMILIES = (("allreduce", "allreduce"), ("reducescatter", "reducescatter"), ("allgather", "allgather"),
             ("alltoallv", "alltoallv"), ("alltoall", "alltoall"), ("broadcast", "broadcast"),
             ("sendrecv", "sendrecv"), ("send", "sendrecv"), ("recv", "sendrecv"), ("gather", "gather"),
             ("scatter", "scatter"), ("reduce", "reduce"))


def family(kind: str) -> str | None:
    """The collective a kind is (``allgatherintotensorcoalesced`` -> ``allgather``); None for barrier and unknowns.
    ``alltoallv`` is its own family: each rank sends a different amount, so it has no busbw."""
    for prefix, fam in _FAMILIES:
        if kind.startswith(prefix):
            return fam
    return None


def size_bytes(kind: str, args: CommArgs | None) -> int | None:
    """A collective's size S in bytes from its recorded metadata (None when the trace does not say)."""
    if args is None or args.dtype not in DTYPE_BYTES:
        return None
    fam = family(kind)
    msg = FORMULAS[fam].message if fam in FORMULAS else "in"
    if msg == "max":
        vals = [v for v in (args.in_nelems, args.out_nelems) if v is not None]
        n = max(vals) if vals else None
    else:
        n = args.in_nelems if msg == "in" else args.out_nelems
    return None if n is None else n * DTYPE_BYTES[args.dtype]


def bus_factor(kind: str, n: int | None) -> float | None:
    """busbw / algbw for collective ``kind`` in a group of ``n`` ranks (None: no formula, or n unknown)."""
    f = FORMULAS.get(family(kind) or "")
    return f.factor(n) if f is not None and n else None


def _group_size(args: CommArgs | None) -> int | None:
    if args is None:
        return None
    return args.group_size or (len(args.group_ranks) if args.group_ranks else None)


def extract(tb: TraceTable) -> dict[str, Any]:
    """This rank's collectives (:func:`.stragglers.extract`'s rows) with their recorded metadata in place of the
    event index, and their duration: ``(group, kind, start_us, end_us, step, CommArgs | None, dur_us)``. The
    duration is the event's own (NaN on the host, as ``end_us``): ``end_us - start_us`` in epoch µs (~1.7e15) keeps
    only a quarter µs, and nanosecond traces have durations of a few µs."""
    part = stragglers.extract(tb)
    ranged = _ranged_args(tb)
    rows = [(g, k, a, b, s, tb.comm_args.get(j) or ranged(j), float(tb.dur[j]) if not math.isnan(b) else math.nan)
            for g, k, a, b, s, j in part["collectives"]]
    return {"source": part["source"], "collectives": rows}


def _ranged_args(tb: TraceTable) -> Callable[[int], CommArgs | None]:
    """Older traces' sizes (:func:`distprof.trace.commargs.from_input_dims`): a collective event's own ``nccl:*``
    range, or for a kernel the innermost such range its launch call ran in (same thread)."""
    ranges = getattr(tb, "range_comm_args", None) or {}
    if not ranges:
        return lambda j: None
    launcher = tb.launcher()
    idx = np.array(sorted(ranges, key=lambda r: tb.ts[r]), dtype=np.int64)

    def find(j: int) -> CommArgs | None:
        at_j = j if j in ranges else int(launcher[j]) if j < launcher.size else -1
        if at_j < 0:
            return None
        at = tb.ts[at_j]
        mine = idx[(tb.track[idx] == tb.track[at_j]) & (tb.ts[idx] <= at) & (tb.end[idx] > at)]
        found = [ranges[int(r)] for r in mine[::-1]]  # innermost first: its figures win, the outer fill gaps
        if not found:
            return None
        return CommArgs(*(next((v for v in vals if v is not None), None) for vals in zip(*found, strict=True)))
    return find


@dataclass
class _Acc:
    """One (role, group, name)'s instances as they are added."""
    source: str
    count: int = 0
    ranks: set[int] = field(default_factory=set)
    sizes: list[int] = field(default_factory=list)  # S of the instances that have both S and a transfer time
    timed: list[float] = field(default_factory=list)  # their transfer times
    bus: list[float] = field(default_factory=list)  # their S x busbw factor
    all_sizes: list[int] = field(default_factory=list)
    durs: list[float] = field(default_factory=list)
    skews: list[float] = field(default_factory=list)
    last: Counter = field(default_factory=Counter)
    args: CommArgs | None = None
    size_known: bool = False
    imbalance: list[float] = field(default_factory=list)  # per instance: max / mean of the ranks' in-messages
    split_imbalance: list[float] = field(default_factory=list)  # per instance: max / mean of the split entries


def _add(acc: _Acc, kind: str, rows: dict[int, tuple]) -> None:
    """One matched instance (rank -> its row)."""
    acc.count += 1
    acc.ranks.update(rows)
    ends = [c[6] for c in rows.values() if not math.isnan(c[6])]
    dur = min(ends) if ends else None
    if len(rows) > 1:
        starts = [c[2] for c in rows.values()]
        acc.skews.append(max(starts) - min(starts))
        acc.last[stragglers.last_arrival(rows)] += 1
    args = next((rows[r][5] for r in sorted(rows) if rows[r][5] is not None), None)
    acc.args = acc.args or args
    _imbalance(acc, kind, [c[5] for c in rows.values() if c[5] is not None])
    s = size_bytes(kind, args)
    if dur is not None:
        acc.durs.append(dur)
    if s is None:
        return
    acc.size_known = True
    acc.all_sizes.append(s)
    if dur is not None and dur > 0:
        acc.sizes.append(s)
        acc.timed.append(dur)
        f = bus_factor(kind, _group_size(args))
        if f is not None:
            acc.bus.append(s * f)


IMBALANCED = ("alltoall", "alltoallv", "sendrecv")  # families whose ranks' sizes may differ (DLRM: SendRecv kernels)


def _ratio(values: list[int]) -> float | None:
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean > 0 else None


def _imbalance(acc: _Acc, kind: str, args: list[CommArgs]) -> None:
    """An instance's size imbalance (TraceLens's ``size_imbalance``: the largest rank's in-message over the mean;
    here the larger of that and the same of the out-messages: an all-to-all-v may send alike and receive unlike),
    where two or more ranks recorded theirs; and from the ``In/Out split size`` entries of all ranks."""
    splits = [n for a in args for sp in (a.in_splits, a.out_splits) if sp for n in sp]
    if splits and (r := _ratio(splits)) is not None:
        acc.split_imbalance.append(r)
    if family(kind) not in IMBALANCED and not splits:
        return
    worst = None
    for sizes in ([a.in_nelems for a in args if a.in_nelems is not None],
                  [a.out_nelems for a in args if a.out_nelems is not None]):
        if len(sizes) >= 2 and (r := _ratio(sizes)) is not None:
            worst = r if worst is None else max(worst, r)
    if worst is not None:
        acc.imbalance.append(worst)


def _note(acc: _Acc, kind: str) -> str | None:
    """Why a figure is missing (None when every figure is there)."""
    why = []
    if acc.source == "cpu":
        why.append("host-side collectives: no transfer time, so no bandwidth")
    elif not acc.size_known:
        why.append("no collective metadata in the trace (message sizes, dtype): no bytes or bandwidth")
    elif acc.sizes and len(acc.bus) < len(acc.sizes):
        why.append("no busbw: " + ("per-rank sizes differ" if family(kind) == "alltoallv" else
                                   "no NCCL formula for this collective" if bus_factor(kind, 2) is None
                                   else "group size not recorded"))
    if len(acc.ranks) < 2:
        why.append("one rank traced: no skew or last arrival")
    return "; ".join(why) or None


def _row(role: str, group: str, kind: str, acc: _Acc) -> CollectiveRow:
    timed = sum(acc.timed)
    algbw = sum(acc.sizes) / timed / 1e3 if acc.sizes and timed > 0 else None  # bytes/µs -> GB/s
    busbw = sum(acc.bus) / timed / 1e3 if acc.bus and len(acc.bus) == len(acc.sizes) and timed > 0 else None
    last, share = None, None
    if acc.last:
        last, n = max(acc.last.items(), key=lambda kv: (kv[1], -kv[0]))
        share = n / sum(acc.last.values())
    a = acc.args
    row = CollectiveRow(
        role=role or None, group=group, name=kind, count=acc.count,
        bytes=sum(acc.all_sizes) if acc.size_known else None,
        min_dur_us=sum(acc.durs) if acc.durs else None,
        skew_us=statistics.median(acc.skews) if acc.skews else None,
        algbw_gbps=algbw, busbw_gbps=busbw, last_rank=last, last_share=share,
        group_desc=a.group_desc if a else None, group_size=_group_size(a), ranks=len(acc.ranks),
        dtype=a.dtype if a else None,
        bytes_per_call=int(statistics.median_low(acc.all_sizes)) if acc.all_sizes else None,
        dur_median_us=statistics.median(acc.durs) if acc.durs else None,
        skew_mean_us=statistics.fmean(acc.skews) if acc.skews else None,
        skew_max_us=max(acc.skews) if acc.skews else None,
        last_arrivals={str(r): n for r, n in sorted(acc.last.items())},
        source="host" if acc.source == "cpu" else "device", note=_note(acc, kind))
    if acc.imbalance:
        row.imbalance, row.imbalance_mean = max(acc.imbalance), statistics.fmean(acc.imbalance)
    if acc.split_imbalance:
        row.split_imbalance = max(acc.split_imbalance)
    return row


def combine(files: Iterable[tuple[Any, dict[str, Any]]]) -> list[CollectiveRow]:
    """The collective report over ``files`` ((FileInfo, :func:`extract` result) pairs): one row per (role, process
    group, collective), the most transfer time first (rows without one after, by count). Files without a rank
    and ranks of different runs are kept apart as :mod:`.stragglers` keeps them."""
    files = [(info, p) for info, p in files if info.rank is not None]
    labels, _ = runs(info for info, _ in files)
    members: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    source: dict[str, str] = {}
    for info, p in files:
        role = role_of(labels, info) or ""
        members[role][info.rank].extend(p["collectives"])
        source[role] = "cpu" if p["source"] == "cpu" or source.get(role) == "cpu" else "gpu"
    accs: dict[tuple[str, str, str], _Acc] = {}
    for role, ranks in members.items():
        for colls in ranks.values():
            colls.sort(key=lambda c: c[2])
        for (_, group, kind), lists in stragglers.queues(ranks):
            acc = accs.setdefault((role, group, kind), _Acc(source[role]))
            if len(ranks) == 1:  # one traced rank: each collective is an instance on its own
                for c in next(iter(lists.values())):
                    _add(acc, kind, {next(iter(lists)): c})
                continue
            for i in range(stragglers.matched_count(lists, len(ranks))):
                _add(acc, kind, {r: v[i] for r, v in lists.items()})
    rows = [_row(role, g, k, acc) for (role, g, k), acc in accs.items() if acc.count]
    rows.sort(key=lambda r: (r.min_dur_us is None, -(r.min_dur_us or 0.0), -r.count, r.role or "", r.group, r.name))
    return rows
