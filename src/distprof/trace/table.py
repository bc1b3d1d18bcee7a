"""One pass over a trace into compact numeric columns that every analysis reads.

Reading a trace is the expensive part of any analysis (JSON decoding is most of it), so it happens once
per file: :meth:`TraceTable.read` streams the file batch by batch and keeps, for every complete (``X``)
event, its kind, start, duration, name and thread as numpy columns (a few dozen bytes per event, a
fraction of the JSON), plus the few ``args`` the analyses need (correlation and External ids, stream,
collective metadata). Analyses are then vectorised passes over the columns; several analyses of one
verb share one read (``steps`` uses the collectives ``stragglers`` extracts, and so on).

Times in the table are µs since the file's first event; ``info.offset_us`` turns them into epoch µs
(Kineto writes ``baseTimeNanoseconds`` after the events, so absolute times are known at the end).
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from distprof.trace import native
from distprof.trace.columns import Columns, dense, final_streams
from distprof.trace.commargs import CommArgs, from_input_dims
from distprof.trace.selection import Selection
from distprof.trace.vocab import (
    ON_DEVICE,
    Kind,
    ThreadKind,
    collective_kind,
    collective_source,
    is_comm_host_event,
    is_comm_kernel,
    is_dataloader,
    is_engine_role,
    looks_like_device,
    profiler_step,
    thread_kind,
)
from distprof.util import intervals as iv

if TYPE_CHECKING:
    from distprof.trace.splitpool import SplitPool

logger = logging.getLogger(__name__)

__all__ = ["FileInfo", "Sets", "TraceTable"]


@dataclass
class FileInfo:
    """Who a trace file is and what reading it found (small: it travels with every per-file result)."""
    path: str
    rank: int | None
    rank_source: str
    role: str | None
    world_size: int | None = None
    window: list[int] | None = None  # the manifest's [first, last] capture window, when a run directory lists it
    offset_us: float = 0.0
    start_us: float | None = None  # absolute (epoch µs) start and end of the file's events
    end_us: float | None = None
    steps: list[int] = field(default_factory=list)  # ProfilerStep numbers present
    events: int = 0
    salvaged: dict[str, Any] | None = None  # what was wrong with a file that could still be read
    warnings: list[str] = field(default_factory=list)
    run: dict[str, Any] | None = None  # which job wrote the file (analyze sets it; see analysis.ranks.runs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Track:
    pid: Any
    tid: Any
    name: str | None = None  # thread name from the trace's metadata events
    kind: str = ThreadKind.OTHER  # main | autograd | communication | other | device


class TraceTable:
    """Columns of one trace's complete events (see the module docstring). Built by :meth:`read`."""

    def __init__(self) -> None:
        self.info: FileInfo
        self.names: list[str] = []
        self.tracks: list[Track] = []
        n0 = np.empty(0)
        self.kind = np.empty(0, dtype=np.int8)
        self.ts = self.dur = self.end = n0
        self.name = self.track = np.empty(0, dtype=np.int32)
        self.corr = self.ext = np.empty(0, dtype=np.int64)
        self.stream = np.empty(0, dtype=np.int64)
        self.comm = np.empty(0, dtype=bool)  # collectives: device kernels and host-side ranges
        self.step = np.empty(0, dtype=np.int32)  # index into steps, -1 outside every step
        self.scope = np.empty(0, dtype=bool)  # inside the selection's steps (all True without one)
        self.steps = np.empty((0, 3))  # rows (start, end, number), by start
        self.meta: dict[int, tuple[str | None, str | None]] = {}  # event index -> (group, collective) of comm events
        # The ops FLOPs are computed for (vocab.SHAPED_OPS) that carry shapes, when the trace has shapes, by event
        # index: their shape's id in shape_keys (trace.columns.shape_key; shape_of decodes one) and autograd
        # Sequence number (-1: none). has_shapes: None when it has none of those ops.
        self.shape_ev = self.shape_key = self.shape_seq = np.empty(0, dtype=np.int64)
        self.shape_keys: list[bytes] = []
        self.has_shapes: bool | None = None
        self.devices: list[str] = []  # deviceProperties names, by device id order ("NVIDIA H100 80GB HBM3")
        self.comm_args: dict[int, CommArgs] = {}  # event index -> recorded sizes and group (trace.commargs)
        self.range_comm_args: dict[int, CommArgs] = {}  # nccl:* range, c10d base op -> its tensors (older traces)
        self.by_step = False  # the selection counts only work inside steps
        # profile_memory's [memory] events in file order: times (relative, as ts) and, per event, the int64 row
        # (Total Allocated, Total Reserved, Bytes, Addr, Device Type, Device Id); empty without them
        self.mem_ts = np.empty(0)
        self.mem = np.empty((0, 6), dtype=np.int64)

    # ---- building ------------------------------------------------------------------------------------
    @classmethod
    def read(cls, t, sel: Selection | None = None, pool: SplitPool | None = None) -> TraceTable | None:
        """Read a lean :class:`~distprof.trace.reader.TraceStream` (``open_trace(path, lean=True)``) into columns.

        Returns None, having stopped reading, when the file's rank or role is not selected. With a ``pool``
        (one big file, several cores), runs of events are decoded and reduced in its workers while this
        process inflates and cuts the stream; a run the workers cannot take whole (malformed JSON, an
        unknown phase) makes the file be read again here, on the one path that salvages what it can.
        """
        sel = sel or Selection()
        cols = Columns()
        fast = native.available()  # the native decoder reduces the runs (in the pool's workers, or here)
        runs: Any = pool if pool is not None or not fast else native.INLINE
        ok = cols.read(t, sel, runs, native.reduce_any if fast else None) if runs is not None else cols.read(t, sel)
        if ok is None and runs is not None:
            logger.info("%s: read again in one process (a run of events needs the salvaging reader)", t.path)
            cols = Columns()
            ok = cols.read(t, sel)
        if not ok:
            return None
        if not (sel.rank_ok(t.rank) and sel.role_ok(t.role)):
            return None  # the rank was only known from the trailer (distributedInfo after the events)
        if sel.by_step and not any(n is not None and sel.step_ok(n) for n in map(profiler_step, cols.name_ids)):
            return None  # none of the selected steps is in this file: it has nothing to count
        self = cls()
        self._finish(t, sel, cols)
        return self

    def _finish(self, t, sel, cols: Columns) -> None:
        """The table from the columns read: in named steps, each setting the attributes it says."""
        n = len(cols.ts)
        self.names = list(cols.name_ids)
        step_rows = self._columns(cols, n)
        self._communication(cols.meta, cols.rpc_ext, n)
        # Recorded sizes: an event's own, else (a kernel) those of the record_param_comms op that launched it.
        self.comm_args = {**{j: cols.rpc_sizes[int(self.ext[j])] for j in self.meta
                             if self.kind[j] == Kind.KERNEL and int(self.ext[j]) in cols.rpc_sizes}, **cols.sizes}
        self.range_comm_args = {j: a for j, (d, t) in getattr(cols, "comm_dims", {}).items()
                                if (a := from_input_dims(d, t, self.names[self.name[j]])) is not None}
        self._steps(t, sel, step_rows, n)
        # Threads: names from metadata, kinds from the name or from what the thread runs.
        self.tracks = [Track(pid, tid, cols.thread_names.get((pid, tid))) for (pid, tid) in cols.track_ids]
        self._classify_tracks()
        self._identity(t, cols.unknown, n)
        self.has_shapes = cols.has_shapes
        if cols.has_shapes and len(cols.shape_ev):
            self.shape_ev, self.shape_key, self.shape_seq = (np.frombuffer(a, dtype=np.int64)
                                                             for a in (cols.shape_ev, cols.shape_key, cols.shape_seq))
            self.shape_keys = list(cols.shape_keys)
        if cols.memory:
            m = np.array(cols.memory, dtype=np.float64)
            self.mem_ts = m[:, 0] - self.t0
            self.mem = np.array([r[1:] for r in cols.memory], dtype=np.int64)
        self.devices = [str(p.get("name")) for p in getattr(t, "device_properties", None) or []
                        if isinstance(p, dict) and p.get("name")]

    def _columns(self, cols: Columns, n: int) -> list[tuple[int, int]]:
        """Times, kinds, names, threads and the args' ids as numpy columns; returns the ProfilerStep markers as
        (event index, step number) rows (their kind is now STEP)."""
        ts = np.frombuffer(cols.ts, dtype=np.float64) if n else np.empty(0)
        # Times relative to the file's first event: epoch-µs timestamps (~1e15) leave float64 no room for
        # the sub-µs parts, so ends and interval lengths are computed on small numbers.
        self.t0 = float(ts.min()) if n else 0.0
        self.ts = ts - self.t0
        self.dur = np.frombuffer(cols.dur, dtype=np.float64) if n else np.empty(0)
        self.end = self.ts + self.dur
        self.kind = np.frombuffer(cols.kind, dtype=np.int8).copy() if n else np.empty(0, dtype=np.int8)
        self.name = dense(cols.name, cols.name_ids)
        # ProfilerStep#N markers (user_annotation, or Operator in the 2021 schema) become steps, judged once
        # per distinct name.
        step_of_name = np.array([-1 if (v := profiler_step(nm)) is None else v for nm in self.names] or [-1],
                                dtype=np.int64)
        marker = ((self.kind == Kind.ANNOTATION) | (self.kind == Kind.CPU_OP)) & (step_of_name[self.name] >= 0) \
            if n else np.zeros(0, dtype=bool)
        self.kind[marker] = Kind.STEP
        step_rows = list(zip(np.flatnonzero(marker).tolist(), step_of_name[self.name[marker]].tolist(), strict=True))
        self.track = dense(cols.track, cols.track_ids)
        idx = np.frombuffer(cols.arg_i, dtype=np.int64) if len(cols.arg_i) else np.empty(0, dtype=np.int64)
        self.corr = np.full(n, -1, dtype=np.int64)
        self.ext = np.full(n, -1, dtype=np.int64)
        self.stream = np.full(n, -1, dtype=np.int64)
        if idx.size:
            self.corr[idx] = np.frombuffer(cols.arg_corr, dtype=np.int64)
            self.ext[idx] = np.frombuffer(cols.arg_ext, dtype=np.int64)
            self.stream[idx] = final_streams(np.frombuffer(cols.arg_stream, dtype=np.int64))
        return step_rows

    def _communication(self, meta: dict[int, tuple[Any, Any]], rpc_ext: dict[int, tuple[Any, Any]], n: int) -> None:
        """Communication: kernels by family name, by their own collective metadata, or by the record_param_comms op
        that launched them (same External id); host ranges by name. Sets ``comm`` and ``meta``."""
        names = self.names
        comm_name = np.array([is_comm_kernel(nm) for nm in names], dtype=bool) if names else np.empty(0, dtype=bool)
        host_comm = np.array([is_comm_host_event(nm) for nm in names], dtype=bool) if names else np.empty(0, dtype=bool)
        kernel = self.kind == Kind.KERNEL
        comm = np.zeros(n, dtype=bool)
        if n:
            comm[kernel] = comm_name[self.name[kernel]]
            host = (self.kind == Kind.CPU_OP) | (self.kind == Kind.ANNOTATION)
            comm[host] = host_comm[self.name[host]]
        for j in meta:
            if self.kind[j] == Kind.KERNEL:
                comm[j] = True
        if rpc_ext and kernel.any():
            # Kernels without metadata of their own take the launching record_param_comms op's.
            kidx = np.flatnonzero(kernel & (self.ext >= 0))
            for j in kidx.tolist():
                m = rpc_ext.get(int(self.ext[j]))
                if m is not None and j not in meta:
                    comm[j] = True
                    meta[j] = m
        self.comm = comm
        self.meta = {j: (None if g is None else str(g), c) for j, (g, c) in meta.items()}

    def _steps(self, t, sel: Selection, step_rows: list[tuple[int, int]], n: int) -> None:
        """Steps: ProfilerStep ranges by start (a step seen twice in one file keeps its first range), each event's
        step, and the selection's scope. When the manifest lists the window's steps, a ProfilerStep past them is not
        a step: a window cut short by stop() or exit holds one more range, from the last step's end to the
        profiler's teardown. An engine's ProfilerSteps number its iterations, not global steps
        (vocab.is_engine_role): all kept."""
        listed = getattr(t, "window", None)  # a WindowRecord (typed: its steps are two ints)
        last_listed = listed.last if listed is not None and not is_engine_role(getattr(t, "role", None)) else None
        rows: list[tuple[float, float, float]] = []
        seen: Counter[int] = Counter()
        for j, num in step_rows:
            if last_listed is not None and num > last_listed:
                continue
            if num not in seen:
                rows.append((self.ts[j], self.end[j], float(num)))
            seen[num] += 1
        self._repeated_steps = sorted(num for num, c in seen.items() if c > 1)
        rows.sort()
        self.steps = np.array(rows, dtype=np.float64).reshape(-1, 3)
        self.step = self._locate_steps()
        self.by_step = sel.by_step
        if sel.by_step:
            if sel.steps is None:
                self.scope = self.step >= 0
            else:
                chosen = np.array([sel.step_ok(int(s)) for s in self.steps[:, 2]], dtype=bool)
                self.scope = (self.step >= 0) & np.append(chosen, False)[self.step]
        else:
            self.scope = np.ones(n, dtype=bool)

    def _identity(self, t, unknown: Counter, n: int) -> None:
        """Identity and what reading found: ``info``, ``window_record``, and the file's warnings (logged)."""
        info = getattr(t, "distributed_info", None) or {}
        ws = info.get("world_size") if isinstance(info.get("world_size"), int) else None
        window = getattr(t, "window", None)
        self.window_record = window  # the manifest line (wall times), a WindowRecord or None
        win = list(window.steps) if window is not None else None
        warnings = self._warnings(t, info, unknown)
        for w in warnings:
            logger.info("%s: %s", t.path, w)  # in the file's `warnings`: the CLI prints each once
        salvaged = t.report.to_dict() if t.report.salvaged else None
        off = float(t.offset_us) + self.t0  # table time + off = absolute epoch µs
        self.info = FileInfo(
            path=t.path, rank=t.rank, rank_source=t.rank_source, role=t.role, world_size=ws, window=win,
            offset_us=off, start_us=float(self.ts.min()) + off if n else None,
            end_us=float(self.end.max()) + off if n else None,
            steps=[int(s) for s in self.steps[:, 2]], events=n, salvaged=salvaged, warnings=warnings)

    def _warnings(self, t, info: dict[str, Any], unknown: Counter) -> list[str]:
        """What the file's reader should know: repeated steps, an unusable distributedInfo.rank, device work of an
        unknown category."""
        warnings = []
        if self._repeated_steps:
            shown = ", ".join(f"#{n}" for n in self._repeated_steps[:5])
            warnings.append(f"ProfilerStep {shown}{' ...' if len(self._repeated_steps) > 5 else ''} appear more than "
                            "once; the first range of each is used")
        r = info.get("rank")
        if "rank" in info and not (type(r) is int and 0 <= r < 2**31):  # the reader's rule for a usable rank
            warnings.append(f"distributedInfo.rank {repr(r)[:40]} is not a rank; "
                            + (f"rank {t.rank} taken from the {t.rank_source}" if t.rank is not None
                               else "rank unknown"))
        for cat, n_cat in sorted(unknown.items()):
            if looks_like_device(cat):
                warnings.append(f"{n_cat:,} events of unknown category {cat!r} look like device work; not counted")
        return warnings

    def _locate_steps(self) -> np.ndarray:
        """Index of each event's step: host events by where they start, device work by the runtime call
        that launched it (same correlation id), falling back to where it starts."""
        n = self.ts.size
        if self.steps.shape[0] == 0 or n == 0:
            return np.full(n, -1, dtype=np.int32)
        starts, ends = self.steps[:, 0], self.steps[:, 1]
        at = self.ts.copy()
        launcher = self.launcher()
        linked = np.flatnonzero(launcher >= 0)
        at[linked] = self.ts[launcher[linked]]
        k = np.searchsorted(starts, at, side="right") - 1
        inside = k >= 0
        inside[inside] &= at[inside] < ends[k[inside]]
        # The step marker itself belongs to its own step.
        k = np.where(inside, k, -1).astype(np.int32)
        return k

    def launcher(self) -> np.ndarray:
        """Per event: the index of the runtime call that launched it (same correlation id), -1 for host
        events and for device events whose launch is not in the trace. The one join of device work to its
        launches (steps, idle causes, launch statistics). Runtime calls sharing an id: the first in the file."""
        cached = self._cache.get("launcher")
        if cached is None:
            n = self.ts.size
            cached = np.full(n, -1, dtype=np.int64)
            device = (self.kind == Kind.KERNEL) | (self.kind == Kind.MEMCPY) | (self.kind == Kind.MEMSET) | \
                (self.kind == Kind.GPU_ANNOTATION) | (self.kind == Kind.DEVICE_SYNC)
            dev = np.flatnonzero(device & (self.corr >= 0))
            ridx = np.flatnonzero((self.kind == Kind.RUNTIME) & (self.corr >= 0))
            if dev.size and ridx.size:
                ridx = ridx[np.argsort(self.corr[ridx], kind="stable")]
                rc = self.corr[ridx]
                pos = np.minimum(np.searchsorted(rc, self.corr[dev]), rc.size - 1)
                hit = rc[pos] == self.corr[dev]
                cached[dev[hit]] = ridx[pos[hit]]
            self._cache["launcher"] = cached
        return cached

    def _classify_tracks(self) -> None:
        n_tracks = len(self.tracks)
        if not n_tracks:
            return
        kinds = self.kind
        device = (kinds == Kind.KERNEL) | (kinds == Kind.MEMCPY) | (kinds == Kind.MEMSET) | \
            (kinds == Kind.GPU_ANNOTATION) | (kinds == Kind.DEVICE_SYNC)
        dev_tracks = set(np.unique(self.track[device]).tolist())
        step_tracks = set(np.unique(self.track[kinds == Kind.STEP]).tolist())
        ann = kinds == Kind.ANNOTATION
        op = kinds == Kind.CPU_OP
        # A thread whose annotations and ops are all communication (gloo's run loop) is a communication thread.
        per_track_total = np.bincount(self.track[ann | op], minlength=n_tracks)
        per_track_comm = np.bincount(self.track[(ann | op) & self.comm], minlength=n_tracks)
        host_counts = np.bincount(self.track[op], minlength=n_tracks)
        for j, tr in enumerate(self.tracks):
            if j in dev_tracks:
                tr.kind = "device"
                continue
            named = thread_kind(tr.name)
            if named is not None:
                tr.kind = named
            elif j in step_tracks:
                tr.kind = ThreadKind.MAIN
            elif per_track_total[j] and per_track_comm[j] == per_track_total[j]:
                tr.kind = ThreadKind.COMMUNICATION
        if not any(tr.kind == ThreadKind.MAIN for tr in self.tracks):
            # No step markers: the process's own thread (tid == pid), else the busiest op thread.
            cands = [j for j, tr in enumerate(self.tracks) if tr.kind == ThreadKind.OTHER and host_counts[j]]
            own = [j for j in cands if self.tracks[j].pid == self.tracks[j].tid]
            pick = own or sorted(cands, key=lambda j: -host_counts[j])[:1]
            for j in pick:
                self.tracks[j].kind = ThreadKind.MAIN

    # ---- views ---------------------------------------------------------------------------------------
    def mask(self, *kinds: int, scoped: bool = True) -> np.ndarray:
        m = np.isin(self.kind, kinds) if len(kinds) > 1 else (self.kind == kinds[0])
        return m & self.scope if scoped else m

    def track_kinds(self) -> np.ndarray:
        """Per event: its thread's kind (as an array of str)."""
        return np.array([tr.kind for tr in self.tracks], dtype=object)[self.track] if self.tracks else \
            np.empty(0, dtype=object)

    @property
    def has_device(self) -> bool:
        return bool(np.isin(self.kind, (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)).any())

    # ---- interval sets shared by the analyses (computed once per table) -----------------------------
    def sets(self, step: int | None = None) -> Sets:
        """The merged interval sets of this trace's work in scope, or of one step (index into ``steps``).

        Device work belongs to the step that launched it and is not cut at the step's end; host work
        belongs to the step it starts in and is cut at the step's end.
        """
        key = ("sets", step)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = Sets.of(self, step)
        return cached

    def step_index(self) -> dict[int, np.ndarray]:
        """Step index -> indices of its events in scope (one argsort, shared by per-step analyses)."""
        cached = self._cache.get("step_index")
        if cached is None:
            idx = np.flatnonzero((self.step >= 0) & self.scope)
            order = idx[np.argsort(self.step[idx], kind="stable")]
            bounds = np.searchsorted(self.step[order], np.arange(self.steps.shape[0] + 1))
            cached = self._cache["step_index"] = {i: order[bounds[i]:bounds[i + 1]] for i in range(self.steps.shape[0])}
        return cached

    @property
    def _cache(self) -> dict:
        c = self.__dict__.get("_cache_d")
        if c is None:
            c = self.__dict__["_cache_d"] = {}
        return c

    def thread_kind_of_event(self) -> np.ndarray:
        """Per event: the index of its thread's kind in ThreadKind.ALL (+ 'device' as len(ALL))."""
        cached = self._cache.get("tk")
        if cached is None:
            codes = {k: i for i, k in enumerate(ThreadKind.ALL)}
            per_track = np.array([codes.get(tr.kind, len(ThreadKind.ALL)) for tr in self.tracks] or [0], dtype=np.int8)
            cached = self._cache["tk"] = per_track[self.track] if self.track.size else np.empty(0, dtype=np.int8)
        return cached

    def collective_label(self, j: int) -> tuple[str, str]:
        """(process group, kind) of comm event ``j``: recorded metadata first, else from the name."""
        g, c = self.meta.get(j, (None, None))
        return (g if g is not None else "default"), collective_kind(self.names[self.name[j]], c)


@dataclass
class Sets:
    """Merged interval sets (see :mod:`distprof.util.intervals`) of one trace or one step of it.

    Device: ``compute`` (kernels that are not collectives), ``comm`` (collective kernels), ``memory``
    (memcpy and memset), ``device_span`` (first device start to last device end, as a set of one).
    Host: ``host_compute`` (CPU ops that are not communication, on every thread but communication
    threads), ``host_comm`` (c10d ops, record_param_comms, nccl:/gloo: ranges, on any thread),
    ``host_span`` (the selected steps' ranges with --steps/--steps-only, else the first to the last host
    event on any thread; for one step, its range), ``runtime``,
    ``dataloader``, ``host_other`` (other CPU ops and annotations).
    """
    compute: iv.IntervalSet
    comm: iv.IntervalSet
    memory: iv.IntervalSet
    memcpy: iv.IntervalSet
    memset: iv.IntervalSet
    device_span: iv.IntervalSet
    host_compute: iv.IntervalSet
    host_comm: iv.IntervalSet
    host_span: iv.IntervalSet
    runtime: iv.IntervalSet
    dataloader: iv.IntervalSet
    host_ops: iv.IntervalSet  # every CPU op, annotation (not steps) and python function: the TB plugin's "CpuOp"
    threads: dict[str, iv.IntervalSet]  # thread kind -> its CPU ops
    collectives: iv.IntervalSet  # comm, or host_comm on a rank without collective kernels (vocab.collective_source)

    @classmethod
    def of(cls, tb: TraceTable, step: int | None) -> Sets:
        n = tb.ts.size
        if step is None:
            sel = tb.scope
            lo, hi = -np.inf, np.inf
        else:
            sel = np.zeros(n, dtype=bool)
            sel[tb.step_index().get(step, np.empty(0, dtype=np.int64))] = True
            lo, hi = tb.steps[step, 0], tb.steps[step, 1]
        k = tb.kind
        ts, end = tb.ts, tb.end
        host_end = np.minimum(end, hi)  # host work is cut at its step's end; device work is not

        def dev(m):
            m = m & sel
            return iv.merge(ts[m], end[m])

        def host(m):
            m = m & sel
            return iv.merge(ts[m], host_end[m])

        kernel = k == Kind.KERNEL
        memcpy, memset = k == Kind.MEMCPY, k == Kind.MEMSET
        compute, comm = dev(kernel & ~tb.comm), dev(kernel & tb.comm)
        mcp, mst = dev(memcpy), dev(memset)
        devm = (kernel | memcpy | memset) & sel
        device_span = (np.array([ts[devm].min()]), np.array([end[devm].max()])) if devm.any() else iv.empty()
        tk = tb.thread_kind_of_event()
        comm_thread = tk == ThreadKind.ALL.index(ThreadKind.COMMUNICATION)
        op = k == Kind.CPU_OP
        ann = k == Kind.ANNOTATION
        host_compute = host(op & ~tb.comm & ~comm_thread)
        host_comm = host((op | ann) & tb.comm)
        # Thread busy time: CPU ops; on communication threads also their collective ranges (gloo's
        # run loop records its work as gloo:* annotations, not ops).
        threads = {name: host((op | (ann & comm_thread & tb.comm)) & (tk == i))
                   for i, name in enumerate(ThreadKind.ALL)}
        names_dl = np.array([is_dataloader(nm) for nm in tb.names], dtype=bool) if tb.names else np.empty(0, dtype=bool)
        dl = (op | ann) & (names_dl[tb.name] if n else np.zeros(0, dtype=bool))
        if step is not None:
            host_span = (np.array([lo]), np.array([hi]))
        elif tb.by_step:
            chosen = np.unique(tb.step[tb.scope & (tb.step >= 0)])
            host_span = iv.merge(tb.steps[chosen, 0], tb.steps[chosen, 1])
        else:  # the whole trace: first to last host event, on any thread
            hm = sel & (op | ann | (k == Kind.RUNTIME) | (k == Kind.PYTHON) | (k == Kind.STEP))
            host_span = (np.array([ts[hm].min()]), np.array([end[hm].max()])) if hm.any() else iv.empty()
        return cls(compute=compute, comm=comm, memory=iv.union(mcp, mst), memcpy=mcp, memset=mst,
                   device_span=device_span, host_compute=host_compute, host_comm=host_comm, host_span=host_span,
                   runtime=host(k == Kind.RUNTIME), dataloader=host(dl),
                   host_ops=host((op | ann | (k == Kind.PYTHON)) & ~tb.comm), threads=threads,
                   collectives=comm if collective_source((kernel & tb.comm & tb.scope).any()) == ON_DEVICE
                   else host_comm)
