"""Memory answers per rank, from CUDA allocator snapshots (:mod:`.memsnap`) and from ``profile_memory`` traces
(:mod:`.memtrace`): ``summary``'s ``memory`` rows (:class:`~.records_mem.MemoryRow`).

The formulas (docs/analysis.md, "Memory", repeats them):

- **allocated over time**. A trace carries it: each ``[memory]`` event's ``Total Allocated`` (``Total Reserved``),
  the allocator's figure after that event. A snapshot's history is replayed: ``alloc`` adds its size, ``free_completed``
  takes it away (``free_requested`` changes nothing: the block is in use until the free completes, as torch's
  ``allocated_bytes`` counts it); ``segment_alloc`` / ``segment_map`` add to reserved, ``segment_free`` /
  ``segment_unmap`` take away. The history is a ring buffer that may start mid-run, so it starts from
  ``allocated at the end - the history's net change``: the end state is the snapshot's live blocks
  (``active_allocated`` and pending-free) and its segments' ``total_size``.
- **the peak** is the largest value of that curve (the first moment it is reached), and reserved's its own largest
  value (``peak_reserved_bytes``, at its own moment). **Its moment**: the step is the ``ProfilerStep#N`` range holding
  it (a trace's steps; a snapshot's ``ProfilerStep#N`` annotations), else the snapshot's window when it holds one
  step; the phase is the innermost other annotation open then (``distprof.annotate`` ranges, ``record_function``).
- **the largest live blocks at the peak**: the history replayed up to the peak moment, the blocks still live grouped
  by the first Python frame that is not torch's own (a snapshot; ``file:line function``) and the phase open when each
  was allocated (a trace has no stacks: by phase). What was allocated before the history began is one group of its
  own, ``(before the recorded history)``: the peak less the blocks the history accounts for.
- **growth across steps**: allocated at each step boundary (the last value before the step's start).
- **an OOM** (a snapshot's ``oom`` entry): allocated and reserved at that moment, the live blocks grouped as at the
  peak, the request (the entry's ``size``) and what the device still had free (``device_free``); :func:`oom_lines`
  says it in a few lines.
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from distprof.analysis import memsnap
from distprof.analysis.memsnap import ALLOC, FREE, OOM, SEG_ALLOC, SEG_FREE, DeviceHistory, SnapshotError
from distprof.analysis.parallel import map_files
from distprof.analysis.records_mem import MemoryAt, MemoryOom, MemoryRow, MemoryStep, MemoryTop
from distprof.rundir.layout import MANIFEST, is_url, rank_of_dir
from distprof.rundir.manifest import MANIFEST_LIMIT, read_manifest
from distprof.rundir.manifest import OOM as OOM_STOP
from distprof.rundir.walk import Entry, walk
from distprof.trace.listing import rank_from_name
from distprof.trace.selection import Selection
from distprof.trace.source import TraceError, open_local
from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = ["BEFORE", "TOP", "SnapshotFile", "find_snapshots", "fmt_bytes", "from_snapshot", "group_live",
           "oom_lines", "rows", "series_points"]

TOP = 8  # live-block groups kept per row
SERIES_POINTS = 240  # points of the memory-over-time curve kept per row (the report's plot)
BEFORE = "(before the recorded history)"
NO_STACK = "(no stack)"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_TORCH_FILE = re.compile(r"(^|/)(torch|torch_npu|triton)/|^<|^\?\?$|\.(cpp|cc|h|cu|cuh)$")


def fmt_bytes(n: float | None) -> str:
    """``61.2 GB``-style (powers of 1000, as torch's memory viewer and the issue's examples)."""
    if n is None:
        return "?"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def frame_of(frames: Any) -> str:
    """The allocating frame: the first (innermost) frame that is not torch's own code, ``dir/file.py:line fn``."""
    if not isinstance(frames, list) or not frames:
        return NO_STACK
    chosen = None
    for f in frames:
        if isinstance(f, dict) and isinstance(f.get("filename"), str) and not _TORCH_FILE.search(f["filename"]):
            chosen = f
            break
    if chosen is None:
        chosen = next((f for f in frames if isinstance(f, dict)), None)
    if chosen is None:
        return NO_STACK
    fn = str(chosen.get("filename", "?"))
    short = "/".join(fn.replace("\\", "/").split("/")[-2:])
    return f"{short}:{chosen.get('line', '?')} {chosen.get('name', '?')}"[:200]


def group_live(live: Iterable[tuple[int, str | None, str | None]], total: int, top: int = TOP) -> list[MemoryTop]:
    """Live blocks ``(size, frame, phase)`` grouped by (frame, phase), largest first, ``top`` of them; the part of
    ``total`` no block accounts for is the group :data:`BEFORE`."""
    groups: dict[tuple[str | None, str | None], list[int]] = defaultdict(lambda: [0, 0])
    seen = 0
    for size, frame, phase in live:
        g = groups[(frame, phase)]
        g[0] += size
        g[1] += 1
        seen += size
    if total - seen > 0:
        groups[(BEFORE, None)] = [total - seen, 0]
    ordered = sorted(groups.items(), key=lambda kv: (-kv[1][0], str(kv[0])))
    return [MemoryTop(frame=f, phase=p, bytes=int(b), blocks=n) for (f, p), (b, n) in ordered[:top]]


def by_phase(live: Iterable[tuple[int, str | None, str | None]]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for size, _frame, phase in live:
        out[phase or "(no phase)"] += size
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def series_points(times: np.ndarray, alloc: np.ndarray, reserved: np.ndarray, n: int = SERIES_POINTS
                  ) -> dict[str, list[float]]:
    """At most ``n`` points of the curves: per bucket of events, its last values and the bucket's largest allocated
    (so the peak survives the thinning)."""
    if times.size <= n:
        idx = np.arange(times.size)
    else:
        edges = np.linspace(0, times.size, n + 1).astype(np.int64)
        idx = np.array([lo + int(np.argmax(alloc[lo:hi])) for lo, hi in pairwise(edges)
                        if hi > lo], dtype=np.int64)
    return {"time_us": [round(float(t), 3) for t in times[idx]], "allocated": [int(v) for v in alloc[idx]],
            "reserved": [int(v) for v in reserved[idx]]}


def step_values(times: np.ndarray, alloc: np.ndarray, initial: int, starts: Sequence[tuple[int, float]]
                ) -> list[MemoryStep]:
    """Allocated at each step's start ``(step, time)``: the value after the last event before it (``initial`` when
    none was)."""
    out = []
    for step, t in starts:
        i = int(np.searchsorted(times, t, side="left")) - 1
        out.append(MemoryStep(step=step, allocated_bytes=int(alloc[i]) if i >= 0 else int(initial)))
    return out


# ---- snapshots ----------------------------------------------------------------------------------------------
class _Context:
    """The annotations of a snapshot swept in time order: the step and innermost phase open at a moment."""

    def __init__(self, annotations: list[tuple[float, str, str]]) -> None:
        self.notes = annotations
        self.i = 0
        self.open: list[str] = []
        self.step: int | None = None
        self.starts: list[tuple[int, float]] = []

    def advance(self, t: float) -> None:
        """Apply every annotation at or before ``t``."""
        notes = self.notes
        while self.i < len(notes) and notes[self.i][0] <= t:
            _, stage, name = notes[self.i]
            self.i += 1
            m = _STEP.match(name)
            if m:
                if stage == "START":
                    self.step = int(m.group(1))
                    self.starts.append((self.step, notes[self.i - 1][0]))
                continue
            if stage == "START":
                self.open.append(name)
            elif name in self.open:
                del self.open[len(self.open) - 1 - self.open[::-1].index(name)]

    @property
    def phase(self) -> str | None:
        return self.open[-1] if self.open else None


def from_snapshot(h: DeviceHistory, steps: list[int] | None = None, oom_file: bool = False,
                  top: int = TOP) -> dict[str, Any]:
    """One device's answers from its snapshot history: the fields of a :class:`MemoryRow` (``steps``: the manifest
    window's first and last step; ``oom_file``: the snapshot was written at an OOM, whose step is the window's
    last)."""
    ents = h.entries
    n = len(ents)
    act = np.fromiter((e.action for e in ents), dtype=np.int8, count=n)
    size = np.fromiter((e.size for e in ents), dtype=np.int64, count=n)
    times = np.fromiter((e.time_us for e in ents), dtype=np.float64, count=n)
    d_alloc = np.where(act == ALLOC, size, np.where(act == FREE, -size, 0))
    d_res = np.where(act == SEG_ALLOC, size, np.where(act == SEG_FREE, -size, 0))
    init_alloc = max(0, h.allocated_end - int(d_alloc.sum()))
    init_res = max(0, h.reserved_end - int(d_res.sum()))
    alloc = init_alloc + np.cumsum(d_alloc)
    res = init_res + np.cumsum(d_res)
    res = np.maximum(res, alloc)  # (what is allocated is reserved: a history starting mid-run cannot say less)
    # The peak: the first largest value (the starting value when the history only goes down).
    i_peak = int(np.argmax(alloc)) if n and int(alloc.max()) > init_alloc else -1
    peak = int(alloc[i_peak]) if i_peak >= 0 else init_alloc
    peak_res = max(int(res.max()) if n else 0, init_res, h.reserved_end)
    i_oom = next((i for i, e in enumerate(ents) if e.action == OOM), None)
    ctx = _Context(h.annotations)
    single = steps[0] if steps and steps[0] == steps[-1] else None
    at_peak, peak_ctx, oom = _replay(ents, i_peak, i_oom, ctx, alloc, res, steps[-1] if oom_file and steps else single,
                                     top)
    if i_peak < 0:  # the peak is the history's start: the blocks live at the end are the best account of it
        start = _Context(h.annotations)
        if n:
            start.advance(float(times[0]))
        peak_ctx = (start.step, start.phase)
        at_peak = [(b.size, frame_of(b.frames), None) for b in h.blocks]
    step = peak_ctx[0] if peak_ctx[0] is not None else single
    out = {"peak_allocated_bytes": peak, "peak_reserved_bytes": peak_res,
           "at": MemoryAt(step=step, phase=peak_ctx[1], time_us=float(times[i_peak]) if i_peak >= 0 else None),
           "top": group_live(at_peak, peak, top), "device": h.device, "device_type": "cuda",
           "steps": step_values(times, alloc, init_alloc, ctx.starts), "oom": oom,
           "series": series_points(times, alloc, res) if n else None, "skipped_entries": h.skipped}
    return out


def _replay(ents: list, i_peak: int, i_oom: int | None, ctx: _Context, alloc: np.ndarray, res: np.ndarray,
            oom_step: int | None, top: int) -> tuple[list, tuple[int | None, str | None], MemoryOom | None]:
    """The history replayed once: the live blocks and the context at the peak, the OOM's answer."""
    live: dict[int, tuple[int, str, str | None]] = {}
    at_peak: list[tuple[int, str | None, str | None]] = []
    peak_ctx: tuple[int | None, str | None] = (None, None)
    oom: MemoryOom | None = None
    for i, e in enumerate(ents):
        ctx.advance(e.time_us)
        if e.action == ALLOC:
            live[e.addr] = (e.size, frame_of(e.frames), ctx.phase)
        elif e.action == FREE:
            live.pop(e.addr, None)
        if i == i_peak:
            at_peak = list(live.values())
            peak_ctx = (ctx.step, ctx.phase)
        if i == i_oom:
            oom = _oom(e, live, int(alloc[i]), int(res[i]), ctx, oom_step, top)
    ctx.advance(float("inf"))
    return at_peak, peak_ctx, oom


def _oom(e: Any, live: dict[int, tuple[int, str, str | None]], allocated: int, reserved: int, ctx: _Context,
         fallback_step: int | None, top: int) -> MemoryOom:
    blocks = list(live.values())
    step = ctx.step if ctx.step is not None else fallback_step
    out = MemoryOom(allocated_bytes=allocated, reserved_bytes=reserved, request_bytes=int(e.size),
                    device_free_bytes=e.device_free, at=MemoryAt(step=step, phase=ctx.phase, time_us=e.time_us),
                    top=group_live(blocks, allocated, top), by_phase=by_phase(blocks), frame=frame_of(e.frames),
                    lines=[])
    out.lines = oom_lines(out)
    return out


def oom_lines(o: MemoryOom) -> list[str]:
    """The few lines that explain an OOM: what was allocated and where, what was asked for, what was free."""
    where = [f"step {o.at.step}" if o.at.step is not None else "", f"in {o.at.phase}" if o.at.phase else ""]
    first = (f"at the OOM{' (' + ', '.join(w for w in where if w) + ')' if any(where) else ''}, "
             f"{fmt_bytes(o.allocated_bytes)} allocated ({fmt_bytes(o.reserved_bytes)} reserved)")
    phases = [(p, b) for p, b in o.by_phase.items() if p != "(no phase)"]
    if phases:
        p, b = phases[0]
        first += f", {fmt_bytes(b)} of it in {p}"
    req = f"the request was {fmt_bytes(o.request_bytes)}"
    if o.frame and o.frame != NO_STACK:
        req += f" (from {o.frame})"
    if o.device_free_bytes is not None:
        req += f"; the device had {fmt_bytes(o.device_free_bytes)} free"
    lines = [first + "; " + req]
    tops = [t for t in o.top if t.frame != BEFORE][:3]
    if tops:
        lines.append("largest live: " + "; ".join(
            f"{fmt_bytes(t.bytes)} from {t.frame}{' in ' + t.phase if t.phase else ''} ({t.blocks} blocks)"
            for t in tops))
    if o.request_bytes > o.allocated_bytes + (o.device_free_bytes or 0) and o.allocated_bytes:
        lines.append(f"the request alone is {o.request_bytes / max(o.allocated_bytes, 1):.1f}x all that was "
                     f"allocated: a size computed wrongly (a shape, a dtype, a sequence length) rather than "
                     f"memory pressure")
    return lines


# ---- finding snapshot files -------------------------------------------------------------------------------
class SnapshotFile:
    """A snapshot found under a path, with what its run directory says about it."""
    __slots__ = ("oom", "path", "rank", "role", "steps")

    def __init__(self, path: str, rank: int | None, role: str | None, steps: list[int] | None, oom: bool) -> None:
        self.path, self.rank, self.role, self.steps, self.oom = path, rank, role, steps, oom


_WINDOW = re.compile(r"^step(\d+)-(\d+)")


def find_snapshots(path: str, selection: Selection | None = None, problems: list[Problem] | None = None
                   ) -> list[SnapshotFile]:
    """``*.memory.pickle`` files under a local ``path`` (a file or a folder; a URL: none), each with its rank, role,
    window steps and whether an OOM wrote it (the manifest's ``stopped_by: oom``, or an ``oom-`` name)."""
    sel = selection or Selection()
    if is_url(path):
        return []
    root = path.removeprefix("file://")
    if os.path.isfile(root):
        found = [SnapshotFile(root, rank_from_name(root), None, None, os.path.basename(root).startswith("oom-"))] \
            if root.endswith(memsnap.SUFFIX) else []
    elif os.path.isdir(root):
        found = _in_folders(root, problems)
    else:
        return []
    return [f for f in sorted(found, key=lambda f: f.path)
            if (f.rank is None or sel.rank_ok(f.rank)) and (f.role is None or sel.role_ok(f.role))
            and sel.window_ok(f.steps)]


def _in_folders(root: str, problems: list[Problem] | None) -> list[SnapshotFile]:
    found = []
    for folder in walk(root, links="skip", skip=lambda n: n.startswith(".")):
        files = [e for e in folder.entries if e.kind == "file" and e.name.endswith(memsnap.SUFFIX)]
        if not files:
            continue
        manifest = next((e for e in folder.entries if e.name == MANIFEST), None)
        windows = _windows(manifest, problems)
        rank = rank_of_dir(folder.path) if MANIFEST in folder.names else None
        for ent in files:
            rec = windows.get(ent.name)
            m = _WINDOW.match(ent.name)
            steps = list(rec.steps) if rec is not None else ([int(m.group(1)), int(m.group(2))] if m else None)
            if rec is not None:
                found.append(SnapshotFile(ent.path, rec.rank, rec.role, steps, rec.stopped_by == OOM_STOP
                                          or ent.name.startswith("oom-")))
            else:
                found.append(SnapshotFile(ent.path, rank if rank is not None else rank_from_name(ent.path), None,
                                          steps, ent.name.startswith("oom-")))
    return found


def _windows(manifest: Entry | None, problems: list[Problem] | None) -> dict[str, Any]:
    """The folder's manifest's window records by file name; a manifest that is a link (never followed: it may point
    outside the run), a FIFO or a device (never waited on) is a problem, not read."""
    if manifest is None:
        return {}
    try:
        if manifest.kind != "file":
            raise OSError(f"{'a symbolic link' if manifest.link else 'not a regular file'}; not read")
        with open_local(manifest.path) as f:
            recs = read_manifest(f.read(MANIFEST_LIMIT)).records
    except (OSError, TraceError) as e:
        if problems is not None:
            problems.append(Problem.at(manifest.path, f"cannot be read ({getattr(e, 'strerror', None) or e})"))
        return {}
    return {entry.path.rsplit("/", 1)[-1]: rec for rec in recs for entry in rec.files}


def file_rows(f: SnapshotFile, on_read: Any = None) -> list[MemoryRow]:
    """One snapshot file's rows (one per device with a history or live blocks); a file that cannot be read raises
    a TraceError of its one line (runs in a worker: :func:`~.parallel.map_files` makes it the file's problem)."""
    try:
        devices = memsnap.read(f.path)
    except SnapshotError as e:
        raise TraceError(str(e)) from None
    out = []
    for h in devices:
        if not h.entries and not h.blocks:
            continue
        fields = from_snapshot(h, f.steps, f.oom)
        skipped = fields.pop("skipped_entries")
        if skipped:
            logger.warning("%s: %d allocator trace entries of the wrong shape skipped", f.path, skipped)
        out.append(MemoryRow(role=f.role, rank=f.rank, path=f.path, source="snapshot", window=f.steps, **fields))
    return out


def snapshot_rows(files: list[SnapshotFile], problems: list[Problem], workers: int | None = None) -> list[MemoryRow]:
    """The rows of every snapshot file, read in parallel (``workers`` processes; each holds about 8x its file at
    peak); files that cannot be read are appended to ``problems``."""
    out: list[MemoryRow] = []
    for r in map_files(file_rows, files, workers=workers):  # type: ignore[arg-type]  # (any object with .path)
        if isinstance(r, Problem):
            problems.append(r)
        else:
            out += r
    return out


def rows(trace_rows: list[MemoryRow], files: list[SnapshotFile], problems: list[Problem],
         workers: int | None = None) -> list[MemoryRow]:
    """``summary``'s ``memory``: the traces' rows and the snapshots', by role, rank and path."""
    out = trace_rows + snapshot_rows(files, problems, workers)
    out.sort(key=lambda r: (str(r.role or ""), r.rank if r.rank is not None else -1, r.source, r.path))
    return out
