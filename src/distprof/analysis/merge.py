"""One Perfetto / chrome://tracing trace from many ranks and roles, written as it is read.

Each input file becomes its own process track(s), named ``{role} rank {R}``; timestamps are moved
onto one clock (absolute time, relative to the earliest file's start); flow ids are renumbered per
file so arrows never join events of different ranks. Inputs are streamed twice (once for clocks,
names and overlaps, once to write) and only one batch of events is in memory at a time.

Both passes run per file over a pool of workers (``workers``; :func:`~distprof.analysis.parallel.map_files`):
pass 1 returns a few numbers per file, and with them and the clock base pass 2 writes each file's part of the
output to a hidden folder beside it; the driver joins the parts in file order (:mod:`.fragments`: one gzip
member, compressed by the workers with ISA-L). Pass 1 decodes only the fields it uses; pass 2 decodes the
fields of the Trace Event Format with the reader's checks (an event every verb skips, merge skips and counts)
into structs it changes in place and encodes back, ``args`` kept as the raw JSON read. The output is the same
for any number of workers. A file that cannot be read in pass 2 (changed since pass 1) is an error of its own;
the others are merged.

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

import functools
import logging
import os
import posixpath
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import msgspec

from distprof.analysis.analyze import nothing_read
from distprof.analysis.fragments import Joiner, Part, PartWriter
from distprof.analysis.merge_scan import _TIMED, _meta_name, _Scan, _scan, _stream
from distprof.analysis.parallel import Progress, map_files
from distprof.analysis.writing import atomic_output, check_output
from distprof.trace import native
from distprof.trace.listing import TraceFile, find_traces
from distprof.trace.reader import Duration, Int64, Time
from distprof.trace.runs import Tail, decode_run, run_bytes
from distprof.trace.selection import Selection
from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = ["FLOW_STRIDE", "PID_STRIDE", "VIEWER_LIMIT_BYTES", "merge_traces"]

_enc = msgspec.json.Encoder()
_FLOW = ("s", "t", "f")
PID_STRIDE = 1000  # output pid = file index * PID_STRIDE + the file's own pid index
FLOW_STRIDE = 10**10  # output flow id = file index * FLOW_STRIDE + id (stays below 2**53 for JS viewers)
VIEWER_LIMIT_BYTES = 500 * 10**6  # JSON a browser viewer can be expected to load (see the module docstring)


_NO_ID = -(2**63) - 1  # pass 2's "absent" pid / tid: no Int64 equals it, so it never stands for a value read
_NO_TIME = float("inf")  # pass 2's "absent" ts / dur (a time read is at most 9e15)
_RAW = msgspec.Raw(b"")


class _Out(msgspec.Struct, gc=False, omit_defaults=True):
    """Pass 2: an event as read and, changed in place, as written: the fields and checks of
    :class:`~distprof.trace.reader.Event` (so merge keeps and skips exactly the events every verb reads), in
    Kineto's key order. Defaults are what is left out of the output; ``args``, ``id2`` and the stacks stay
    raw JSON, written back as read."""
    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Int64 | str = _NO_ID
    tid: Int64 | str = _NO_ID
    ts: Time = _NO_TIME
    dur: Duration = _NO_TIME
    args: msgspec.Raw = _RAW
    id: Int64 | str | None = None
    bp: str | None = None
    s: str | None = None
    tts: float | None = None
    tdur: float | None = None
    id2: msgspec.Raw = _RAW
    scope: str | None = None
    cname: str | None = None
    sf: Int64 | str | None = None
    esf: Int64 | str | None = None
    stack: msgspec.Raw = _RAW
    estack: msgspec.Raw = _RAW
    bind_id: Int64 | str | None = None
    flow_in: bool | None = None
    flow_out: bool | None = None


_OUT_DECODERS = (msgspec.json.Decoder(list[_Out]), msgspec.json.Decoder(_Out))


def _label(role: str | None, rank: int | None, path: str) -> str:
    who = f"rank {rank}" if rank is not None else path.rsplit("/", 1)[-1]
    return f"{role} {who}" if role else who


class _FileWriter:
    """Changes one file's events, in place, into the merged output's."""

    def __init__(self, scan: _Scan, base_us: float):
        self.scan = scan
        self.i = scan.index
        # Output ts = whole ns since the clock base: (ts - first) rounded to ns, plus this file's start in
        # whole ns. Rounding each event relative to `first` keeps nesting exactly as overlap_lanes saw it.
        self.first = scan.first
        self.start_ns = round((scan.first_us - base_us) * 1000.0)
        self.label = scan.label
        self.shared = {n for n, pids in Counter(n for n in scan.named.values() if n).items() if pids > 1}  # 2+ pids
        self.pids: dict[Any, int] = {}
        self.lane_tids: dict[tuple[Any, Any, int], Any] = {}
        self.other_ids: dict[Any, int] = {}
        self.ids: dict[Any, int] = {}
        self.alias: dict[Any, int] = {}  # pid read (the absent pid too) -> output pid

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

    def id2(self, raw: msgspec.Raw) -> msgspec.Raw:
        """``{"global": x}`` is scoped to this file; ``{"local": x}`` already is (its process is this file's)."""
        try:
            v = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            return raw
        if isinstance(v, dict) and "global" in v:
            return msgspec.Raw(_enc.encode({**v, "global": f"{self.i}:{v['global']}"}))
        return raw

    def scoped_id(self, orig: Any) -> int:
        """This file's id as a number no other file uses (string ids are read as hex first, as Perfetto does)."""
        got = self.ids.get(orig)
        if got is not None:
            return got
        n = orig
        if isinstance(n, str):
            try:
                n = int(n, 16)
            except ValueError:
                pass
        if isinstance(n, int) and 0 <= n < FLOW_STRIDE // 2:
            got = self.i * FLOW_STRIDE + n
        else:  # other ids (non-hex strings, huge or negative numbers) get numbers of their own in the upper half
            k = self.other_ids.setdefault(n, len(self.other_ids))
            got = self.i * FLOW_STRIDE + FLOW_STRIDE // 2 + k
        if len(self.ids) < 1 << 20:  # a cache, bounded whatever the file holds
            self.ids[orig] = got
        return got

    def events(self, batch: Any, keep: Callable[[_Out], bool] | None) -> tuple[bytes | memoryview, int] | None:
        """A batch of decoded events, or a run of them (``batches(defer=True)``), as the output's JSON (without the
        list's brackets) and how many; None for a run that does not decode whole."""
        if not isinstance(batch, list):
            whole = run_bytes(batch.data if isinstance(batch, Tail) else batch)
            if whole is None:
                return None
            got = native.merge_rewrite(whole, self.first, self.start_ns, self.i, self.pids_of, self.process_names)
            if got is not None:
                return got
            batch = decode_run(whole, _OUT_DECODERS[0])
            if batch is None:
                return None
        if keep is not None:
            batch = [e for e in batch if keep(e)]
        if not batch:
            return b"", 0
        self.fix(batch)
        return memoryview(_enc.encode(batch))[1:-1], len(batch)  # without the list's brackets (not copied)

    def pids_of(self, pids: list[Any]) -> list[int]:
        """The output pids of a natively rewritten run's pids (None: absent), first seen first, as :meth:`fix`
        numbers them."""
        out = []
        for pid in pids:
            pid = _NO_ID if pid is None else pid
            new = self.alias.get(pid)
            if new is None:
                new = self.alias[pid] = self.pid(0 if pid == _NO_ID else pid)
            out.append(new)
        return out

    def process_names(self, rows: list[tuple[Any, Any]]) -> list[bytes]:
        """The new args of a natively rewritten run's process_name events ((pid or None, raw args)), as :meth:`fix`
        writes them."""
        return [_enc.encode({"name": self.process_name(_NO_ID if pid is None else pid, _meta_name(args))})
                for pid, args in rows]

    def fix(self, batch: list[_Out]) -> None:
        """Every event of ``batch`` as it is written: this file's pids, lanes, one clock, scoped ids."""
        alias, lanes, flow_lanes = self.alias, self.scan.lanes, self.scan.flow_lanes
        first, start_ns = self.first, self.start_ns
        for e in batch:
            ph, pid, tid = e.ph, e.pid, e.tid
            new = alias.get(pid)
            if new is None:  # an absent pid is pid 0, as the reader reads it
                new = alias[pid] = self.pid(0 if pid == _NO_ID else pid)
            e.pid = new
            if tid == _NO_ID:
                e.tid = tid = 0
            if ph == "M":
                e.ts = _NO_TIME
                if e.name == "process_name":
                    e.args = msgspec.Raw(_enc.encode({"name": self.process_name(pid, _meta_name(e.args))}))
                if e.dur != _NO_TIME:
                    e.dur = round(e.dur * 1000.0) / 1000.0 if e.dur else _NO_TIME
            else:
                ts, dur = e.ts, e.dur
                if ts == _NO_TIME:
                    ts = 0.0
                e.ts = (start_ns + round((ts - first) * 1000.0)) / 1000.0
                if ph == "X":
                    if dur == _NO_TIME:
                        dur = 0.0
                    e.dur = round(dur * 1000.0) / 1000.0
                    if lanes:
                        p0 = 0 if pid == _NO_ID else pid
                        lane = lanes.get((p0, tid, ts, dur))
                        if lane:
                            e.tid = self.lane_tid(p0, tid, lane)
                else:
                    if dur != _NO_TIME:
                        e.dur = round(dur * 1000.0) / 1000.0 if dur else _NO_TIME
                    if flow_lanes and ph in _FLOW:
                        p0 = 0 if pid == _NO_ID else pid
                        lane = flow_lanes.get((p0, tid, ts))
                        if lane:  # the flow binds to the slice that moved
                            e.tid = self.lane_tid(p0, tid, lane)
            if e.id is not None or e.bind_id is not None or e.id2:
                self.scope_ids(e)

    def process_name(self, pid: Any, orig: str | None) -> str:
        """A process's track name, unique: ``{label} / {name}``, plus its pid when another process has that name."""
        pid = 0 if pid == _NO_ID else pid
        if not orig:
            return f"{self.label} ({pid})" if pid else self.label
        return f"{self.label} / {orig}" + (f" (pid {pid})" if orig in self.shared else "")

    def scope_ids(self, e: _Out) -> None:
        """Flow, async and object ids renumbered so ranks never share one."""
        if e.id is not None:
            e.id = self.scoped_id(e.id)
        if e.bind_id is not None:
            e.bind_id = self.scoped_id(e.bind_id)
        if e.id2:
            e.id2 = self.id2(e.id2)

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


@dataclass
class _Written:
    """Pass 2's result for one file: its part of the output and what is in it."""
    part: Part
    events: int
    salvaged: dict | None  # what was wrong with the file, as this pass read it (what the output lacks)


def _write(scan: _Scan, on_read: Callable[[int], None] | None, base_us: float, folder: str, gz: bool,
           by_step: bool) -> _Written:
    """Pass 2 over one file (in a worker): its events, changed for the merged output, as one part file. With the
    native decoder, the runs in the middle of the events list are rewritten by it (:func:`native.merge_rewrite`:
    the same bytes, tests/unit/analysis/test_merge_native.py), the rest here; a run it declines is decoded here,
    and one that does not decode whole makes the file be written again on the path that salvages element by
    element. Not with ``--steps`` or where pass 1 moved events to lanes (rare): then every event is decoded here."""
    if native.available() and not by_step and not scan.lanes and not scan.flow_lanes:
        got = _write_part(scan, on_read, base_us, folder, gz, None, runs=True)
        if got is not None:
            return got
        logger.info("%s: written again in one process (a run of events needs the salvaging reader)", scan.path)
    keep = _in_steps(scan.step_ranges) if by_step else None
    return cast(_Written, _write_part(scan, on_read, base_us, folder, gz, keep, runs=False))


def _write_part(scan: _Scan, on_read: Callable[[int], None] | None, base_us: float, folder: str, gz: bool,
                keep: Callable[[_Out], bool] | None, runs: bool) -> _Written | None:
    writer = _FileWriter(scan, base_us)
    part = PartWriter(os.path.join(folder, f"{scan.index:06d}.part"), gz)
    events, sep = 0, b""
    stream = _stream(scan.file, on_read, False, _OUT_DECODERS)
    try:
        for batch in stream.batches(defer=runs):
            got = writer.events(batch, keep)
            if got is None:
                return None  # (the part is written again from the start)
            data, n = got
            if n:
                if sep:
                    part.write(sep)
                part.write(data)
                sep, events = b",", events + n
        if runs and stream.needs_whole_read:
            return None
        tail = writer.trailer()
        if tail:
            part.write(sep + b",".join(tail))
            events += len(tail)
    finally:
        done = part.close()
    return _Written(done, events, stream.report.to_dict() if stream.report.salvaged else None)


def merge_traces(path: str, out: str, selection: Selection | None = None,
                 progress: Callable[[int, int], None] | None = None, workers: int | None = None) -> dict[str, Any]:
    """Merge every trace under ``path`` (the ``selection``'s ranks and roles) into ``out`` (``.json`` or ``.json.gz``).

    Both passes run per file over ``workers`` processes (default: the CPU count); each file's part of the
    output is written by its worker to a hidden folder beside ``out`` and joined in order. The output is
    written to a hidden temporary file beside ``out`` and renamed when complete, so ``out``
    is never a torn file. Returns ``{"out", "files", "events", "base_time_us", "moved_to_lanes", "errors",
    "salvaged", "files_read"}``; raises TraceError when no file could be read or ``out`` cannot be written.
    """
    selection = selection or Selection()
    errors: list[Problem] = []  # entries that are not readable traces, then files that cannot be read
    found = find_traces(path, errors)
    check_output(out, [f.path for f in found], "merge", "merged.json.gz")
    files = _selected(found, selection)
    by_step = selection.steps is not None
    total = 2 * len(files)

    def report(offset: int) -> Callable[[Progress], None] | None:
        return (lambda p: progress(offset + p.files_done, total)) if progress else None

    # Pass 1 (a few numbers per file kept): rank, role, clock offset, first timestamp, track names and
    # overlapping events. It orders the tracks by role then rank and fixes the clock base.
    scans, skipped = _first_pass(files, selection, workers, report(0), errors)
    skipped += len(found) - len(files)  # files the selection leaves out
    if not scans:
        why = "; ".join(map(str, errors)) or ("no trace matches the selection" if files else
                                                          "no trace files found")
        raise nothing_read(f"{path}: no readable trace ({why})", errors)
    base = min(s.first_us for s in scans)
    for i, (scan, label) in enumerate(zip(scans, _labels(scans, path), strict=False)):
        scan.index, scan.label = i, label
    # Pass 2: every file's events into its own part (beside the output), joined in file order; the output is
    # renamed into place when complete.
    gz = out.endswith(".gz")
    with atomic_output(out) as f:
        with tempfile.TemporaryDirectory(prefix=f".{os.path.basename(out)}.parts-",
                                         dir=os.path.dirname(os.path.abspath(out))) as folder:
            parts = map_files(functools.partial(_write, base_us=base, folder=folder, gz=gz, by_step=by_step),
                              scans, workers, report(len(files)))  # type: ignore[arg-type]  # map_files reads .path
            events_out, json_bytes, written, salvaged = _join(f, gz, base, scans, parts, errors)
    return {"out": out, "files": len(written), "events": events_out, "base_time_us": base,
            "moved_to_lanes": sum(s.moved for s in written),
            "errors": [e.file_dict() for e in errors], "salvaged": [s for s in salvaged if s],
            "files_read": len(written), "skipped": skipped, "scope": selection.to_dict(), "json_bytes": json_bytes,
            "warnings": _size_warning(out, json_bytes), "conflicts": []}


def _selected(found: list[TraceFile], selection: Selection) -> list[TraceFile]:
    """The files the selection keeps by what their manifest says (rank, role, window), before reading them."""
    return [f for f in found
            if (f.manifest_rank is None or selection.rank_ok(f.manifest_rank))
            and (f.role is None or selection.role_ok(f.role))
            and selection.window_ok(f.window.steps if f.window is not None else None)]


def _first_pass(files: list[TraceFile], selection: Selection, workers: int | None,
                report: Callable[[Progress], None] | None, errors: list[Problem]) -> tuple[list[_Scan], int]:
    """Pass 1 over the files: the scans of those the selection keeps, in track order (role, then rank), and how
    many it leaves out once read; a file that cannot be read is an error in ``errors``."""
    scans, skipped = [], 0
    by_step = selection.steps is not None
    for got in map_files(functools.partial(_scan, selection=selection), files, workers, report):
        if isinstance(got, Problem):  # one unreadable rank is reported, the others are still merged
            errors.append(got)
        elif selection.rank_ok(got.rank) and selection.role_ok(got.role) and (got.step_ranges or not by_step):
            scans.append(got)
        else:
            skipped += 1
    scans.sort(key=lambda s: (s.role or "", -1 if s.rank is None else s.rank, s.file.path))
    return scans, skipped


def _join(f: Any, gz: bool, base: float, scans: list[_Scan], parts: Any, errors: list[Problem]
          ) -> tuple[int, int, list[_Scan], list[dict | None]]:
    """The output around the files' parts, in file order: events written, bytes of JSON events, the scans
    written and what each lacks (salvage); a part that failed (its file changed or gone since pass 1) is an error."""
    events_out = 0
    written: list[_Scan] = []
    salvaged: list[dict | None] = []
    w = Joiner(f, gz)
    w.add(b'{"displayTimeUnit":"ms","distprofMerge":' + _enc.encode(
        {"base_time_us": base, "files": [s.file.path for s in scans]}) + b',"traceEvents":[')
    head = w.length
    for scan, got in zip(scans, parts, strict=False):
        if isinstance(got, Problem):  # changed or gone since pass 1
            errors.append(got)
            continue
        if got.part.length:
            if events_out:
                w.add(b",")
            w.add_part(got.part)
            events_out += got.events
        written.append(scan)
        salvaged.append({"path": scan.file.path, **got.salvaged} if got.salvaged else None)
    json_bytes = w.length - head
    w.add(b"]}")
    w.close()
    return events_out, json_bytes, written, salvaged


def _in_steps(ranges: list[tuple[float, float]]) -> Callable[[_Out], bool]:
    """Whether an event overlaps one of the selected steps (metadata and untimed events always do)."""
    def keep(e: _Out) -> bool:
        if e.ph not in _TIMED:
            return True
        ts = 0.0 if e.ts == _NO_TIME else e.ts
        end = ts + (0.0 if e.dur == _NO_TIME else e.dur)
        return any(ts <= hi and end >= lo for lo, hi in ranges)
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

    return [f"{b} ({where(s.file.path)})" if seen[b] > 1 else b for b, s in zip(base, scans, strict=False)]
