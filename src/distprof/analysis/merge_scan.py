"""merge's pass 1 (:mod:`.merge`): what one file's events say before any of them is written: the clock (its
earliest timestamp), the names of its processes and threads, the selected steps, its largest thread id, and the
complete events that overlap others on their thread (moved to lanes in pass 2).

It decodes, per phase, only what it uses; with the native decoder the runs in the middle of the events list are
read by its scanner, which reports where merge's decoding of an event could differ from the verbs' (a timed
event's ``ts`` or any event's ``tid`` of the wrong type, an empty ``ph``) so that such a run is decoded here.
tests/unit/analysis/test_merge_native.py holds the two ways to one answer.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Union, cast

import msgspec
import numpy as np

from distprof.analysis.lanes import overlap_lanes
from distprof.trace import native
from distprof.trace.listing import TraceFile
from distprof.trace.reader import Duration, Event, Int64, Time, TraceStream
from distprof.trace.runs import Tail, decode_run, run_bytes
from distprof.trace.selection import Selection
from distprof.trace.vocab import profiler_step

logger = logging.getLogger(__name__)

__all__: list[str] = []

_TIMED = ("X", "i", "I", "s", "f", "t", "B", "E", "b", "e", "n", "C")


# ---- what the two passes decode ---------------------------------------------------------------------------
# Pass 1 reads, per phase, only what it uses (complete events' spans, metadata names, every timed event's
# time and every event's thread); the other fields are skipped, not built. Fields are in Kineto's order
# (msgspec matches keys fastest in the order they come).
class _Seen(msgspec.Struct, gc=False, tag_field="ph"):
    pass


class _SeenX(_Seen, tag="X"):
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: Time = 0.0
    dur: Duration = 0.0


class _SeenXNamed(_Seen, tag="X"):  # with --steps: the ProfilerStep#N events are found by name
    name: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: Time = 0.0
    dur: Duration = 0.0


class _SeenM(_Seen, tag="M"):
    name: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    args: msgspec.Raw = msgspec.Raw(b"")


_SEEN_TIMED = tuple(msgspec.defstruct(f"_SeenT{ord(p)}", [("tid", Int64 | str, 0), ("ts", Time, 0.0)],
                                      bases=(_Seen,), tag=p) for p in _TIMED if p != "X")
_SEEN_OTHER = tuple(msgspec.defstruct(f"_SeenO{ord(p)}", [("tid", Int64 | str, 0)], bases=(_Seen,), tag=p)
                    for p in "PONDRcSTpFVv()")


def _seen_decoders(x: type) -> tuple[msgspec.json.Decoder, msgspec.json.Decoder]:
    members = (x, _SeenM, *_SEEN_TIMED, *_SEEN_OTHER)
    union = Union[members]  # type: ignore[valid-type]  # noqa: UP007 (a union built at run time)
    return msgspec.json.Decoder(list[union]), msgspec.json.Decoder(union)


_SEEN_DECODERS = {False: _seen_decoders(_SeenX), True: _seen_decoders(_SeenXNamed)}  # by: names wanted
_TIMED_SEEN = frozenset((_SeenX, _SeenXNamed, *_SEEN_TIMED))


def _stream(f: TraceFile, on_read: Callable[[int], None] | None, lean: bool, decoders: tuple) -> TraceStream:
    """The reader's stream over ``f`` (its checks, salvage and bounded memory), decoding events as ``decoders``
    say; ``lean`` picks how an element that does not fit is told from a broken one (see TraceStream._event)."""
    return TraceStream(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window, on_read=on_read, lean=lean,
                       decoders=decoders)


class _MetaArgs(msgspec.Struct):
    name: str | None = None


@dataclass
class _Scan:
    """What pass 1 learns about one file (and, set by the driver, where pass 2 puts it)."""
    file: TraceFile
    role: str | None
    rank: int | None
    offset_us: float
    first: float  # the file's earliest timestamp, in its own time base
    first_us: float  # the same, absolute
    named: dict = field(default_factory=dict)  # pid -> its process_name (pids that have one)
    thread_names: dict = field(default_factory=dict)  # (pid, tid) -> name
    lanes: dict = field(default_factory=dict)  # (pid, tid, ts, dur) of X events moved off their thread -> lane (> 0)
    flow_lanes: dict = field(default_factory=dict)  # (pid, tid, ts) of a moved X event -> its lane
    moved: int = 0  # X events moved to lanes
    max_tid: int = 0
    step_ranges: list = field(default_factory=list)  # (start, end) of the selected ProfilerSteps, own time base
    index: int = 0  # pass 2: the file's place in the output
    label: str = ""

    @property
    def path(self) -> str:  # map_files reads .path (sizes, errors)
        return self.file.path


def _scan(f: TraceFile, on_read: Callable[[int], None] | None = None, selection: Selection | None = None) -> _Scan:
    """Pass 1 over one file (in a worker): clocks, names, steps, and the complete events to move to lanes. With the
    native decoder, the runs in the middle of the events list are read by its scanner (:func:`native.merge_run`),
    the rest decoded here; a run it declines is decoded here, and one that does not decode whole makes the file
    be read again on the path that salvages element by element (the reader's rule for every verb)."""
    if native.available():
        scan = _read(f, on_read, selection, runs=True)
        if scan is not None:
            return scan
        logger.info("%s: read again in one process (a run of events needs the salvaging reader)", f.path)
    return cast(_Scan, _read(f, on_read, selection, runs=False))


def _read(f: TraceFile, on_read: Callable[[int], None] | None, selection: Selection | None, runs: bool
          ) -> _Scan | None:
    pick = selection is not None and selection.steps is not None
    t = _stream(f, on_read, True, _SEEN_DECODERS[pick])
    seen = _Seen1(selection if pick else None)
    for batch in t.batches(defer=runs):
        if isinstance(batch, list):
            seen.batch(batch)
            continue
        whole = run_bytes(batch.data if isinstance(batch, Tail) else batch)
        got = native.merge_run(whole) if whole is not None else None
        if got is not None:
            seen.run(got)
            continue
        events = decode_run(whole, _SEEN_DECODERS[pick][0]) if whole is not None else None
        if events is None:
            return None
        seen.batch(events)
    if runs and t.needs_whole_read:
        return None
    first = seen.first or 0.0
    scan = _Scan(f, t.role, t.rank, t.offset_us, first, first + t.offset_us, seen.named, seen.thread_names,
                 max_tid=seen.max_tid, step_ranges=seen.steps)
    if seen.xt:
        _move_to_lanes(scan, list(seen.threads), seen.xt, seen.xs, seen.xd)
    if scan.moved:
        logger.info("%s: %d complete events overlap others on their thread; moved to lane threads",
                    f.path, scan.moved)
    return scan


class _Seen1:
    """What pass 1 gathers of one file, batch by batch (events decoded here) and run by run (the native scanner's)."""

    def __init__(self, selection: Selection | None) -> None:
        self.selection = selection  # given with --steps: the ProfilerStep#N ranges are kept
        self.first: float | None = None
        self.named: dict = {}  # pid -> its process_name (the last one written)
        self.thread_names: dict = {}
        self.threads: dict[tuple[Any, Any], int] = {}  # (pid, tid) of complete events -> thread number
        self.xt, self.xs, self.xd = array("q"), array("d"), array("d")  # per complete event: thread number, ts, dur
        self.max_tid = 0
        self.steps: list[tuple[float, float]] = []

    def _low(self, low: float | None) -> None:
        if low is not None and (self.first is None or low < self.first):
            self.first = low

    def batch(self, batch: list) -> None:
        threads, sel = self.threads, self.selection
        self.max_tid = max([self.max_tid, *(x for x in _tids(batch) if type(x) is int)])  # a few distinct tids
        x_type: type = _SeenXNamed if sel is not None else _SeenX
        xe: list[Any] = [e for e in batch if type(e) is x_type]
        self.xt.extend([threads.setdefault((e.pid, e.tid), len(threads)) for e in xe])
        self.xs.extend([e.ts for e in xe])
        self.xd.extend([e.dur for e in xe])
        self._low(min([e.ts for e in batch if type(e) in _TIMED_SEEN], default=None))
        if sel is not None:
            self.steps += [(e.ts, e.ts + e.dur) for e in xe if _selected_step(e.name, sel)]
        for e in [e for e in batch if type(e) is _SeenM]:
            self._name(e.name, e.pid, e.tid, e.args)

    def run(self, r: native.MergeRun) -> None:
        self.max_tid = max(self.max_tid, r.max_tid)
        self._low(r.first)
        if len(r.ts):
            nums = np.array([self.threads.setdefault(k, len(self.threads)) for k in r.threads], dtype=np.int64)
            self.xt.frombytes(nums[r.thread].tobytes())
            self.xs.frombytes(r.ts.tobytes())
            self.xd.frombytes(r.dur.tobytes())
            if self.selection is not None:
                sel = self.selection
                picked = np.array([_selected_step(n, sel) for n in r.names], dtype=bool)
                rows = np.flatnonzero(picked[r.name])
                self.steps += list(zip(r.ts[rows].tolist(), (r.ts[rows] + r.dur[rows]).tolist(), strict=True))
        for pid, args in r.process_names:
            self._name("process_name", pid, 0, args)
        for pid, tid, args in r.thread_names:
            self._name("thread_name", pid, tid, args)

    def _name(self, what: str, pid: Any, tid: Any, args: Any) -> None:
        """A metadata event's name of a process or a thread (the last one written wins)."""
        if what == "process_name":
            self.named[pid] = _meta_name(args)
        elif what == "thread_name":
            self.thread_names[(pid, tid)] = _meta_name(args)


def _selected_step(name: str, selection: Selection) -> bool:
    """Whether a complete event is a selected step's ``ProfilerStep#N``."""
    return (n := profiler_step(name)) is not None and selection.step_ok(n)


def _tids(batch: list[Event]) -> set:
    try:
        return set([e.tid for e in batch])
    except AttributeError:  # the reader's placeholder for an event of a phase merge does not read
        return set([e.tid for e in batch if isinstance(e, _Seen)])


def _move_to_lanes(scan: _Scan, keys: list[tuple[Any, Any]], xt: array, xs: array, xd: array) -> None:
    """Per thread (``xt``: each complete event's thread, ``keys[n]``: thread n's (pid, tid)), the complete events
    that overlap others there, moved to lane threads (``scan.lanes``, ``scan.flow_lanes``, ``scan.moved``)."""
    tn = np.frombuffer(xt, dtype=np.int64)
    ts = np.frombuffer(xs, dtype="d")
    dur = np.frombuffer(xd, dtype="d")
    order = np.argsort(tn, kind="stable")
    cuts = np.flatnonzero(np.diff(tn[order])) + 1
    for idx in np.split(order, cuts):
        lanes = overlap_lanes(ts[idx] - scan.first, dur[idx])
        moved = np.flatnonzero(lanes)
        if not len(moved):
            continue
        pid, tid = keys[tn[idx[0]]]
        for k, lane in zip(idx[moved].tolist(), lanes[moved].tolist(), strict=False):
            scan.lanes[(pid, tid, xs[k], xd[k])] = lane
            scan.flow_lanes[(pid, tid, xs[k])] = lane
        scan.moved += len(moved)


def _meta_name(args: Any) -> str | None:
    """The ``name`` a metadata event's raw args give (None when they give none)."""
    try:
        return msgspec.json.decode(args, type=_MetaArgs).name if args else None
    except (msgspec.DecodeError, RecursionError):  # args of another shape, or nested deeper than msgspec goes
        return None
