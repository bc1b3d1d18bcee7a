"""One Perfetto / chrome://tracing trace from many ranks and roles, written as it is read.

Each input file becomes its own process track(s), named ``{role} rank {R}``; timestamps are moved
onto one clock (absolute time, relative to the earliest file's start); flow ids are renumbered per
file so arrows never join events of different ranks. Inputs are streamed twice (once for clocks,
names and overlaps, once to write) and only one batch of events is in memory at a time.

What Perfetto's JSON importer needs, and real Kineto traces do not always give it:

- Flow ids must be numbers (a string id is parsed as hex, and ``"3:17"`` is dropped as invalid), so
  ids (flow, async and object ids, and ``bind_id``) are renumbered into ``file_index * FLOW_STRIDE + id``;
  ``id2.global`` gets a ``file_index:`` prefix. Ranks then never share an arrow or an async track.
- A selection of steps (``--steps``) keeps, per file, the events that overlap the chosen ``ProfilerStep#N``
  ranges, and every metadata event (names of processes and threads).
- Browsers cap what a page may hold: Perfetto's docs put the limit at about 2 GB of runtime memory, a trace's
  runtime form being larger than its file, and a 900 MB JSON trace is reported to crash ui.perfetto.dev
  (google/perfetto#99; chrome://tracing stopped at 256 MB). An output holding more than
  :data:`VIEWER_LIMIT_BYTES` of JSON is written, with a warning saying how to make it smaller.
- Complete (``X``) events on one thread must nest. Kineto traces have partial overlaps (ns rounding,
  overlapping kernels), which Perfetto drops or hides; those events are moved to extra *lane*
  threads of the same process (named ``... (overlaps, lane K)``) so every event is shown.
"""

from __future__ import annotations

import gzip
import logging
import posixpath
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec
import numpy as np

from .listing import TraceFile, find_traces
from .writing import atomic_output, check_output
from .reader import Event, TraceError, open_trace
from .selection import Selection
from .vocab import profiler_step

logger = logging.getLogger(__name__)

__all__ = ["merge_traces", "PID_STRIDE", "FLOW_STRIDE", "VIEWER_LIMIT_BYTES"]

_enc = msgspec.json.Encoder()
_TIMED = ("X", "i", "I", "s", "f", "t", "B", "E", "b", "e", "n", "C")
_FLOW = ("s", "t", "f")
_PASSTHROUGH = ("bp", "s", "scope", "cname", "sf", "esf", "flow_in", "flow_out")
PID_STRIDE = 1000  # output pid = file index * PID_STRIDE + the file's own pid index
FLOW_STRIDE = 10**10  # output flow id = file index * FLOW_STRIDE + id (stays below 2**53 for JS viewers)
VIEWER_LIMIT_BYTES = 500 * 10**6  # JSON a browser viewer can be expected to load (see the module docstring)


class _MetaArgs(msgspec.Struct):
    name: str | None = None


@dataclass
class _Scan:
    """What pass 1 learns about one file."""
    file: TraceFile
    role: str | None
    rank: int | None
    offset_us: float
    first: float  # the file's earliest timestamp, in its own time base
    first_us: float  # the same, absolute
    named: set = field(default_factory=set)  # pids that have a process_name
    thread_names: dict = field(default_factory=dict)  # (pid, tid) -> name
    lanes: dict = field(default_factory=dict)  # event index -> lane (> 0) for X events moved off their thread
    flow_lanes: dict = field(default_factory=dict)  # (pid, tid, ts) of a moved X event -> its lane
    max_tid: int = 0
    salvaged: dict | None = None  # what was wrong with a file that could still be read
    step_ranges: list = field(default_factory=list)  # (start, end) of the selected ProfilerSteps, own time base


def _label(role: str | None, rank: int | None, path: str) -> str:
    who = f"rank {rank}" if rank is not None else path.rsplit("/", 1)[-1]
    return f"{role} {who}" if role else who


def overlap_lanes(ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Lane of each complete event of one thread so that events on one lane nest (0 = stays put).

    ``ts`` must be small (relative to the file's first event: epoch µs times 1000 exceed float64's
    exact integers). Times are compared in integer ns, as Perfetto stores them, and the merged file's
    timestamps are written as exactly those ns plus a whole-ns shift, so the nesting seen here is the
    nesting a viewer sees. Events are taken by start (the
    longer first on ties); each goes to the first lane where it fits inside the innermost open event
    or where nothing is open.
    """
    start = np.round(ts * 1000.0).astype(np.int64)
    end = start + np.round(dur * 1000.0).astype(np.int64)
    order = np.lexsort((start - end, start))
    lane_of = np.zeros(len(ts), dtype=np.int64)
    stacks: list[list[int]] = []  # per lane: ends of the open events, innermost last
    s_list, e_list = start.tolist(), end.tolist()
    for k in order.tolist():
        s, e = s_list[k], e_list[k]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                stack.append(e)
                break
        else:
            lane = len(stacks)
            stacks.append([e])
        lane_of[k] = lane
    return lane_of


def _scan(f: TraceFile, selection: Selection | None = None) -> _Scan:
    t = open_trace(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window)
    first = None
    named: set = set()
    thread_names: dict = {}
    cols: dict[tuple[Any, Any], tuple[array, array, array]] = {}
    max_tid = 0
    index = 0
    steps: list[tuple[float, float]] = []
    pick = selection is not None and selection.steps is not None
    for batch in t.batches():
        for e in batch:
            if isinstance(e.tid, int) and e.tid > max_tid:
                max_tid = e.tid
            if e.ph == "X":
                if pick and (n := profiler_step(e.name)) is not None and selection.step_ok(n):
                    steps.append((e.ts, e.ts + e.dur))
                c = cols.get((e.pid, e.tid))
                if c is None:
                    c = cols[(e.pid, e.tid)] = (array("d"), array("d"), array("q"))
                c[0].append(e.ts)
                c[1].append(e.dur)
                c[2].append(index)
            if e.ph in _TIMED and (first is None or e.ts < first):
                first = e.ts
            elif e.ph == "M" and e.name == "process_name":
                named.add(e.pid)
            elif e.ph == "M" and e.name == "thread_name":
                thread_names[(e.pid, e.tid)] = _meta_name(e)
            index += 1
    first = first or 0.0
    scan = _Scan(f, t.role, t.rank, t.offset_us, first, first + t.offset_us, named, thread_names, max_tid=max_tid,
                 step_ranges=steps)
    if t.report.salvaged:
        scan.salvaged = t.report.to_dict()
    for (pid, tid), (ts, dur, idx) in cols.items():
        lanes = overlap_lanes(np.frombuffer(ts, dtype="d") - first, np.frombuffer(dur, dtype="d"))
        for k in np.nonzero(lanes)[0].tolist():
            scan.lanes[idx[k]] = int(lanes[k])
            scan.flow_lanes[(pid, tid, ts[k])] = int(lanes[k])
    if scan.lanes:
        logger.info("%s: %d complete events overlap others on their thread; moved to lane threads",
                    f.path, len(scan.lanes))
    return scan


def _meta_name(e: Event) -> str | None:
    try:
        return msgspec.json.decode(e.args, type=_MetaArgs).name if e.args else None
    except (msgspec.DecodeError, RecursionError):  # args of another shape, or nested deeper than msgspec goes
        return None


class _FileWriter:
    """Encodes one file's events for the merged output."""

    def __init__(self, scan: _Scan, file_index: int, base_us: float, label: str):
        self.scan = scan
        self.i = file_index
        # Output ts = whole ns since the clock base: (ts - first) rounded to ns, plus this file's start in
        # whole ns. Rounding each event relative to `first` keeps nesting exactly as overlap_lanes saw it.
        self.first = scan.first
        self.start_ns = round((scan.first_us - base_us) * 1000.0)
        self.label = label
        self.pids: dict[Any, int] = {}
        self.lane_tids: dict[tuple[Any, Any, int], Any] = {}
        self.other_ids: dict[Any, int] = {}

    def pid(self, orig: Any) -> int:
        pid = self.pids.get(orig)
        if pid is None:
            pid = self.pids[orig] = self.i * PID_STRIDE + len(self.pids)
        return pid

    def lane_tid(self, pid: Any, tid: Any, lane: int) -> Any:
        key = (pid, tid, lane)
        new = self.lane_tids.get(key)
        if new is None:
            new = self.lane_tids[key] = (self.scan.max_tid + 1 + len(self.lane_tids)) if isinstance(tid, int) \
                else f"{tid} lane {lane}"
        return new

    def id2(self, raw: msgspec.Raw) -> Any:
        """``{"global": x}`` is scoped to this file; ``{"local": x}`` already is (its process is this file's)."""
        try:
            v = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            return raw
        if isinstance(v, dict) and "global" in v:
            v = {**v, "global": f"{self.i}:{v['global']}"}
        return v

    def scoped_id(self, orig: Any) -> int:
        """This file's id as a number no other file uses (string ids are read as hex first, as Perfetto does)."""
        if isinstance(orig, str):
            try:
                orig = int(orig, 16)
            except ValueError:
                pass
        if isinstance(orig, int) and 0 <= orig < FLOW_STRIDE // 2:
            return self.i * FLOW_STRIDE + orig
        # Other ids (non-hex strings, huge or negative numbers) get numbers of their own in the upper half.
        k = self.other_ids.setdefault(orig, len(self.other_ids))
        return self.i * FLOW_STRIDE + FLOW_STRIDE // 2 + k

    def encode(self, e: Event, index: int) -> bytes:
        tid = e.tid
        if e.ph == "X":
            lane = self.scan.lanes.get(index)
            if lane:
                tid = self.lane_tid(e.pid, e.tid, lane)
        elif e.ph in _FLOW and self.scan.flow_lanes:
            lane = self.scan.flow_lanes.get((e.pid, e.tid, e.ts))
            if lane:  # the flow binds to the slice that moved
                tid = self.lane_tid(e.pid, e.tid, lane)
        d: dict[str, Any] = {"ph": e.ph, "name": e.name, "pid": self.pid(e.pid), "tid": tid}
        if e.cat:
            d["cat"] = e.cat
        if e.ph != "M":
            d["ts"] = (self.start_ns + round((e.ts - self.first) * 1000.0)) / 1000.0
        if e.ph == "X" or e.dur:
            d["dur"] = round(e.dur * 1000.0) / 1000.0
        if e.id is not None:  # flow, async and object ids: renumbered so ranks never share one
            d["id"] = self.scoped_id(e.id)
        if e.bind_id is not None:
            d["bind_id"] = self.scoped_id(e.bind_id)
        if e.id2:
            d["id2"] = self.id2(e.id2)
        for key in _PASSTHROUGH:
            v = getattr(e, key)
            if v is not None:
                d[key] = v
        for key in ("tts", "tdur"):
            v = getattr(e, key)
            if v is not None:
                d[key] = v
        for key in ("stack", "estack"):
            v = getattr(e, key)
            if v:
                d[key] = v
        if e.ph == "M" and e.name == "process_name":
            orig = _meta_name(e)
            d["args"] = {"name": f"{self.label} / {orig}" if orig else self.label}
        elif e.args:
            d["args"] = e.args
        return _enc.encode(d)

    def trailer(self) -> list[bytes]:
        """Names and order for every track of this file, and names for its lane threads."""
        out = []
        for orig, pid in self.pids.items():
            out.append(_enc.encode({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                                    "args": {"sort_index": pid}}))
            if orig not in self.scan.named:
                name = f"{self.label} ({orig})" if orig not in ("", None) else self.label
                out.append(_enc.encode({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                                        "args": {"name": name}}))
        for (pid, tid, lane), new in self.lane_tids.items():
            base = self.scan.thread_names.get((pid, tid)) or f"thread {tid}"
            out.append(_enc.encode({"ph": "M", "name": "thread_name", "pid": self.pid(pid), "tid": new,
                                    "args": {"name": f"{base} (overlaps, lane {lane})"}}))
        return out


def merge_traces(path: str, out: str, selection: Selection | None = None,
                 progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Merge every trace under ``path`` (the ``selection``'s ranks and roles) into ``out`` (``.json`` or ``.json.gz``).

    The output is written to a hidden temporary file beside ``out`` and renamed when complete, so ``out``
    is never a torn file. Returns ``{"out", "files", "events", "base_time_us", "moved_to_lanes", "errors",
    "salvaged", "files_read"}``; raises TraceError when no file could be read or ``out`` cannot be written.
    """
    selection = selection or Selection()
    problems: list[tuple[str, str]] = []
    found = find_traces(path, problems)
    check_output(out, [f.path for f in found], "merge", "merged.json.gz")
    files = [f for f in found
             if (f.manifest_rank is None or selection.rank_ok(f.manifest_rank)) and (f.role is None or selection.role_ok(f.role))
             and selection.window_ok(f.window.steps if f.window is not None else None)]
    by_step = selection.steps is not None
    # Pass 1 (streamed, a few numbers per file kept): rank, role, clock offset, first timestamp, track
    # names and overlapping events. It orders the tracks by role then rank and fixes the clock base.
    scans, errors = [], [{"path": p, "message": f"{p}: {m}"} for p, m in problems]
    skipped = len(found) - len(files)  # files the selection leaves out
    for k, f in enumerate(files, 1):
        try:
            scan = _scan(f, selection)
            if selection.rank_ok(scan.rank) and selection.role_ok(scan.role) and (scan.step_ranges or not by_step):
                scans.append(scan)
            else:
                skipped += 1
        except TraceError as e:  # one unreadable rank is reported, the others are still merged
            errors.append({"path": f.path, "message": str(e)})
        if progress:
            progress(k, 2 * len(files))
    scans.sort(key=lambda s: (s.role or "", -1 if s.rank is None else s.rank, s.file.path))
    if not scans:
        why = "; ".join(e["message"] for e in errors) or ("no trace matches the selection" if files else "no trace files found")
        raise TraceError(f"{path}: no readable trace ({why})")
    base = min(s.first_us for s in scans)
    labels = _labels(scans, path)
    # Pass 2: stream every file into a temporary output, one batch at a time; rename it when complete.
    opener = gzip.open if out.endswith(".gz") else open
    events_out = moved = json_bytes = 0
    with atomic_output(out) as tmp:
        with opener(tmp, "wb") as w:
            w.write(b'{"displayTimeUnit":"ms","distprofMerge":' + _enc.encode(
                {"base_time_us": base, "files": [s.file.path for s in scans]}) + b',"traceEvents":[')
            sep = b""
            for i, scan in enumerate(scans):
                writer = _FileWriter(scan, i, base, labels[i])
                f = scan.file
                index = 0
                keep = _in_steps(scan.step_ranges) if by_step else None
                for batch in open_trace(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window).batches():
                    chunk = []
                    for e in batch:
                        if keep is None or keep(e):
                            chunk.append(writer.encode(e, index))
                        index += 1  # every event counts: lanes were found by position in pass 1
                    if chunk:
                        data = sep + b",".join(chunk)
                        w.write(data)
                        sep, events_out, json_bytes = b",", events_out + len(chunk), json_bytes + len(data)
                chunk = writer.trailer()
                if chunk:
                    data = sep + b",".join(chunk)
                    w.write(data)
                    sep, events_out, json_bytes = b",", events_out + len(chunk), json_bytes + len(data)
                moved += len(scan.lanes)
                if progress:
                    progress(len(scans) + i + 1, 2 * len(scans))
            w.write(b"]}")
    return {"out": out, "files": len(scans), "events": events_out, "base_time_us": base, "moved_to_lanes": moved,
            "errors": errors, "salvaged": [{"path": s.file.path, **s.salvaged} for s in scans if s.salvaged],
            "files_read": len(scans), "skipped": skipped, "scope": selection.to_dict(), "json_bytes": json_bytes,
            "warnings": _size_warning(out, json_bytes), "conflicts": []}


def _in_steps(ranges: list[tuple[float, float]]) -> Callable[[Event], bool]:
    """Whether an event overlaps one of the selected steps (metadata and untimed events always do)."""
    def keep(e: Event) -> bool:
        if e.ph not in _TIMED:
            return True
        end = e.ts + (e.dur or 0.0)
        return any(e.ts <= hi and end >= lo for lo, hi in ranges)
    return keep


def _size_warning(out: str, json_bytes: int) -> list[str]:
    if json_bytes <= VIEWER_LIMIT_BYTES:
        return []
    return [f"{out} holds {json_bytes / 1e6:,.0f} MB of JSON, more than a browser viewer can be expected to load "
            f"(about {VIEWER_LIMIT_BYTES / 1e6:.0f} MB: Perfetto's UI is bounded by the browser's memory, about 2 GB); "
            "merge fewer --ranks, --roles or --steps, or open it through trace_processor --httpd "
            "(https://perfetto.dev/docs/visualization/large-traces)"]


def _labels(scans: list[_Scan], root: str) -> list[str]:
    """Track labels, unique across files: two files of one rank (or two unranked files) get their path under
    ``root`` added (two copies of a run in sibling folders share file names)."""
    base = [_label(s.role, s.rank, s.file.path) for s in scans]
    seen: dict[str, int] = {}
    for b in base:
        seen[b] = seen.get(b, 0) + 1
    top = root.removeprefix("file://").rstrip("/")

    def where(p: str) -> str:
        p = p.removeprefix("file://")
        return posixpath.relpath(p, top) if p.startswith(top + "/") else posixpath.basename(p)

    return [f"{b} ({where(s.file.path)})" if seen[b] > 1 else b for b, s in zip(base, scans)]
