"""The native decoder's Python side (issue 24): a run of events (the JSON list ``reduce_run`` gets) reduced into
:class:`~distprof.trace.columns.Columns` by the Rust scanner in ``native/`` (a ``cdylib`` with a C ABI, loaded
with ctypes), or ``None`` when the scanner is absent or not sure. The Python path (msgspec's lean events, then
:meth:`Columns.add`) stays the fallback and the oracle: where the scanner answers, the columns are the ones the
Python path builds from the same bytes (tests/unit/trace/test_native_differential.py checks it on every trace and
on fuzzed input); where it is not sure (``native/src/lib.rs`` lists when), the Python path reads the run, and
decides whether it decodes at all.

The scanner writes the columns that cost a Python object per event on the Python path (times, names, categories,
threads, correlation and External ids, streams) and the byte span of every event's args; the few args that need
a full decode (collective metadata, the shapes of the ops FLOPs are computed from, ``[memory]`` events, thread
names) are decoded here with the same msgspec decoders as the Python path, through the same :class:`Columns`
methods, so there is one rule for each.
"""

from __future__ import annotations

import ctypes
import logging
import struct
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from itertools import accumulate, count, pairwise
from typing import Any, ClassVar, NamedTuple, cast

import msgspec
import numpy as np

from distprof.trace import nativelib
from distprof.trace.columns import _NEEDS_ARGS, Columns, _Args, _decode_args, reduce_run
from distprof.trace.runs import Span, run_bytes
from distprof.trace.vocab import KIND_OF_CATEGORY, Kind

logger = logging.getLogger(__name__)

__all__ = ["INLINE", "MergeRun", "available", "list_end", "merge_rewrite", "merge_run", "reduce_any", "reduce_native",
           "use"]

_on = True
_lib: Any = None  # the CDLL with the scanner's functions declared, False once it could not be had
_NEEDS = np.array(_NEEDS_ARGS, dtype=bool)
_KINDS = len(_NEEDS_ARGS)

# The scanner's columns, in the order of its column numbers (native/src/lib.rs, dp_run_column).
_COLS = ("ts f8", "dur f8", "name u4", "cat u4", "track u4", "corr i8", "ext i8", "skind u1", "sval i8", "aoff u8",
         "alen u8", "track_pid u4", "track_tid u4", "tn_pid u4", "tn_tid u4", "tn_off u8", "tn_len u8", "mem_ts f8",
         "mem_off u8", "mem_len u8", "names_blob u1", "names_off u8", "cats_blob u1", "cats_off u8", "toks_blob u1",
         "toks_off u8", "pn_pid u4", "pn_off u8", "pn_len u8")
_ANSWERED, _PY_ARGS = 0, 3  # the run's status when the scanner answered; skind of args msgspec must decode


_P, _N, _U32, _COL = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64)
# The library's C functions, declared once: name -> (return type, argument types): the scanner's runs, merge's rewrite.
_SIGNATURES = {
    "dp_run_scan": (_P, [_P, _N]), "dp_run_info": (ctypes.c_uint64, [_P, _U32]),
    "dp_run_column": (_P, [_P, _U32, _COL]), "dp_run_free": (None, [_P]), "dp_list_end": (ctypes.c_int64, [_P, _N]),
    "dp_merge_parse": (_P, [_P, _N, ctypes.c_double, ctypes.c_int64, ctypes.c_int64]),
    "dp_merge_emit": (_U32, [_P, _P, _N, _P, _N, _P, _N, _P, _N]),
    "dp_merge_info": (ctypes.c_uint64, [_P, _U32]), "dp_merge_column": (_P, [_P, _U32, _COL]),
    "dp_merge_free": (None, [_P]),
}


def _load() -> Any:
    global _lib
    if _lib is None:
        lib = nativelib.load()
        if lib is None:
            _lib = False
        else:
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = res, args
            _lib = lib
    return _lib


def available() -> bool:
    """Whether the native scanner is in use: built, its ABI the one this module speaks, not switched off
    (``DISTPROF_NATIVE=0``, :func:`use`)."""
    return _on and bool(_load())


def use(on: bool) -> bool:
    """Switch the native path on or off in this process (tests read one file both ways); the previous setting."""
    global _on
    prev, _on = _on, bool(on)
    return prev


def _address(data: bytes | bytearray) -> Any:
    """The bytes' address for the scanner, read in place (a bytearray: a run read from the file between brackets)."""
    buf = ctypes.c_char_p(data) if isinstance(data, bytes) else (ctypes.c_char * len(data)).from_buffer(data)
    return ctypes.cast(buf, ctypes.c_void_p)


def list_end(data: bytes) -> int:
    """Where the elements of a list that ``data`` begins inside end: the offset of the list's ``]``; -1 when
    the bytes are no such thing, or the native decoder is not in use (the reader then cuts the events itself)."""
    lib = _load() if _on else None
    return int(lib.dp_list_end(_address(data), len(data))) if lib else -1


class _Scan:
    """One scan's columns, as numpy views of the scanner's buffers (valid until :meth:`free`)."""

    def __init__(self, lib: Any, data: bytes | bytearray) -> None:
        self._lib, self._h = lib, lib.dp_run_scan(_address(data), len(data))
        self.status = lib.dp_run_info(self._h, 0)
        self.events = lib.dp_run_info(self._h, 2)

    def col(self, which: int) -> np.ndarray:
        return _column(self._lib.dp_run_column, self._h, which, _COLS[which].split()[1])

    def info(self, which: int) -> int:
        return int(self._lib.dp_run_info(self._h, which))

    def cols(self) -> dict[str, np.ndarray]:
        return {c.split()[0]: self.col(i) for i, c in enumerate(_COLS)}

    def free(self) -> None:
        if self._h:
            self._lib.dp_run_free(self._h)
            self._h = None


def _texts(blob: np.ndarray, off: np.ndarray) -> list[str]:
    """A table of raw string contents (escapes as written) as str: unescaped by msgspec, as the Python path."""
    raw = blob.tobytes()
    out = []
    for a, b in zip(off[:-1].tolist(), off[1:].tolist(), strict=True):
        s = raw[a:b]
        out.append(msgspec.json.decode(b'"' + s + b'"') if b"\\" in s else s.decode())
    return out


def _tokens(blob: np.ndarray, off: np.ndarray) -> list[Any]:
    """A table of raw tokens (an int64 literal, or a string with its quotes) as the values msgspec decodes."""
    raw = blob.tobytes()
    return [msgspec.json.decode(raw[a:b]) if raw[a:a + 1] == b'"' else int(raw[a:b])
            for a, b in zip(off[:-1].tolist(), off[1:].tolist(), strict=True)]


def _dense(keys: list[Any]) -> tuple[dict[Any, int], np.ndarray]:
    """Keys by id (first seen first; two ids may stand for one key: ``"a\\/b"`` and ``"a/b"``) -> the dict of
    distinct keys in first-seen order and each id's number in it."""
    ids: dict[Any, int] = {}
    remap = np.fromiter((ids.setdefault(k, len(ids)) for k in keys), dtype=np.int64, count=len(keys))
    return ids, remap


class _Row:
    """An event the :class:`Columns` methods read the args of (and, for metadata and memory, its other fields)."""
    __slots__ = ("args", "name", "pid", "tid", "ts")

    def __init__(self, args: Any, name: str = "", pid: Any = 0, tid: Any = 0, ts: float = 0.0) -> None:
        self.args, self.name, self.pid, self.tid, self.ts = args, name, pid, tid, ts


class _Rows:
    """The complete events of a scan as the :class:`Columns` methods read them: ``rows.args(js)``, the raw args of
    rows ``js``; ``rows[j].tid``."""

    def __init__(self, data: bytes | bytearray, off: np.ndarray, ln: np.ndarray, tid: list[Any],
                 track: np.ndarray) -> None:
        self._data, self._off, self._len, self._tid, self._track = data, off, ln, tid, track

    def args(self, js: list[int]) -> list[Any]:
        data, idx = self._data, np.asarray(js, dtype=np.int64)
        return [data[a:a + n] for a, n in zip(self._off[idx].tolist(), self._len[idx].tolist(), strict=True)]

    def __getitem__(self, j: int) -> _Row:
        a = int(self._off[j])
        return _Row(self._data[a:a + int(self._len[j])], tid=self._tid[int(self._track[j])])


def _spans(data: bytes | bytearray, off: np.ndarray, ln: np.ndarray) -> list[Any]:
    return [data[a:a + n] for a, n in zip(off.tolist(), ln.tolist(), strict=True)]


def _build(data: bytes | bytearray, s: _Scan) -> Columns:
    c = s.cols()
    cols = Columns()
    cols.events = int(s.events)
    names = _texts(c["names_blob"], c["names_off"])
    cats = _texts(c["cats_blob"], c["cats_off"])
    toks = _tokens(c["toks_blob"], c["toks_off"])
    cols.name_ids, name_of = _dense(names)
    pids, tids = [toks[i] for i in c["track_pid"].tolist()], [toks[i] for i in c["track_tid"].tolist()]
    cols.track_ids, track_of = _dense(list(zip(pids, tids, strict=True)))
    cols._name_seq, cols._track_seq = count(len(cols.name_ids)), count(len(cols.track_ids))
    n = len(c["ts"])
    name = name_of[c["name"]] if n else np.empty(0, dtype=np.int64)
    track = track_of[c["track"]] if n else np.empty(0, dtype=np.int64)
    kind_of_cat = np.array([KIND_OF_CATEGORY.get(x, Kind.UNKNOWN) for x in cats], dtype=np.int8)
    kind = kind_of_cat[c["cat"]] if n else np.empty(0, dtype=np.int8)
    cols.ts.frombytes(c["ts"].tobytes())
    cols.dur.frombytes(c["dur"].tobytes())
    cols.kind.frombytes(kind.tobytes())
    cols.name.frombytes(name.tobytes())
    cols.track.frombytes(track.tobytes())
    if n and (kind_of_cat == Kind.UNKNOWN).any():
        per = np.bincount(c["cat"], minlength=len(cats))
        cols.unknown = Counter()
        for i in np.flatnonzero((kind_of_cat == Kind.UNKNOWN) & (per > 0)).tolist():
            cols.unknown[cats[i]] += int(per[i])
    rows = _Rows(data, c["aoff"], c["alen"], [t for _, t in cols.track_ids], track)
    need = np.flatnonzero(_NEEDS[kind]) if n else np.empty(0, dtype=np.int64)
    if len(need):
        _links(cols, c, need, rows, toks, track)
    if n:
        cols._add_tail(rows.args, name.tolist(), 0)
    if len(c["tn_pid"]):
        cols._thread_names(cast(Any, _Row)(a, "thread_name", toks[p], toks[t]) for a, p, t in zip(
            _spans(data, c["tn_off"], c["tn_len"]), c["tn_pid"].tolist(), c["tn_tid"].tolist(), strict=True))
    if len(c["mem_ts"]):
        cols._memory(cast(Any, _Row)(a, "[memory]", ts=t)
                     for a, t in zip(_spans(data, c["mem_off"], c["mem_len"]), c["mem_ts"].tolist(), strict=True))
    return cols


def _links(cols: Columns, c: dict[str, np.ndarray], need: np.ndarray, rows: _Rows, toks: list[Any],
           track: np.ndarray) -> None:
    """The correlation and External ids and streams of the rows ``need`` (device work and its launches); rows whose
    args msgspec must decode go through :meth:`Columns._add_links` with every other row, as on the Python path."""
    skind, sval = c["skind"][need], c["sval"][need]
    # a thread's id where it stands for a stream (an int), and whether it is one (a string is not)
    tid_of = [t for _, t in cols.track_ids]
    is_int = np.array([type(t) is int for t in tid_of], dtype=bool)
    if not (skind >= 2).any() and is_int[track[need][skind == 0]].all():
        # Plain rows only: every stream an int. Numbers as Columns._stream_ids gives them: a non-negative id is
        # its own, another one (a negative id) -2 - how many streams were known when it was first seen.
        tids = np.array([t if ok else 0 for t, ok in zip(tid_of, is_int.tolist(), strict=True)], dtype=np.int64)
        keys = np.where(skind == 1, sval, tids[track[need]])
        uniq, first = np.unique(keys, return_index=True)
        order = np.argsort(first, kind="stable")
        seen = uniq[order]
        nums = np.where(seen >= 0, seen, -2 - np.arange(len(seen), dtype=np.int64))
        num_of = np.empty_like(uniq)
        num_of[order] = nums
        cols.arg_i.frombytes(need.astype(np.int64).tobytes())
        cols.arg_corr.frombytes(c["corr"][need].tobytes())
        cols.arg_ext.frombytes(c["ext"][need].tobytes())
        cols.arg_stream.frombytes(num_of[np.searchsorted(uniq, keys)].astype(np.int64).tobytes())
        cols.streams.update(zip(seen.tolist(), nums.tolist(), strict=True))
        return
    al = []
    corr, ext = c["corr"][need].tolist(), c["ext"][need].tolist()
    for j, k, v, co, ex in zip(need.tolist(), skind.tolist(), sval.tolist(), corr, ext, strict=True):
        if k == _PY_ARGS:
            al.append(_decode_args(rows[j].args))
            continue
        st = None if k == 0 else v if k == 1 else toks[v]
        al.append(_Args(correlation=None if co == -1 else co, external_id=None if ex == -1 else ex, stream=st))
    cols._add_links([rows[j] for j in need.tolist()], need.tolist(), al, 0)


def reduce_native(data: bytes | bytearray) -> Columns | None:
    """The run ``data`` (a JSON list of whole events) reduced natively: the same :class:`Columns` that
    ``Columns().add(decode_run(data))`` builds; None when the scanner is absent or not sure (the caller then
    takes the Python path, which also decides whether the run decodes at all)."""
    lib = _load() if _on else None
    if not lib:
        return None
    s = _Scan(lib, data)
    try:
        if s.status != _ANSWERED:
            return None
        return _build(data, s)
    finally:
        s.free()


class MergeRun(NamedTuple):
    """What merge's first pass reads of a run (:mod:`distprof.analysis.merge_scan`), as its own decoding of the same
    events gives it: the earliest ts of the timed events (None when there is none), the largest int tid (at
    least 0), per complete event its (pid, tid), ts, dur and name, and the metadata names in order: process_name as
    (pid, raw args), thread_name as (pid, tid, raw args)."""
    first: float | None
    max_tid: int
    threads: list[tuple[Any, Any]]  # the complete events' (pid, tid), by number
    thread: np.ndarray  # per complete event, its number in ``threads``
    ts: np.ndarray
    dur: np.ndarray
    names: list[str]  # the complete events' names, by number
    name: np.ndarray  # per complete event, its number in ``names``
    process_names: list[tuple[Any, Any]]
    thread_names: list[tuple[Any, Any, Any]]


def merge_run(data: bytes | bytearray) -> MergeRun | None:
    """The run ``data`` read for merge's first pass natively; None when the scanner is absent or not sure, or where
    merge's own decoding of an event could differ from the verbs' (merge then decodes the run itself)."""
    lib = _load() if _on else None
    if not lib:
        return None
    s = _Scan(lib, data)
    try:
        if s.status != _ANSWERED or s.info(3):
            return None
        c = s.cols()
        toks = _tokens(c["toks_blob"], c["toks_off"])
        first = struct.unpack("<d", struct.pack("<Q", s.info(4)))[0]
        max_tid = struct.unpack("<q", struct.pack("<Q", s.info(5)))[0]
        threads = list(zip([toks[i] for i in c["track_pid"].tolist()], [toks[i] for i in c["track_tid"].tolist()],
                           strict=True))
        return MergeRun(None if first == float("inf") else first, max_tid, threads, c["track"].astype(np.int64),
                        c["ts"].copy(), c["dur"].copy(), _texts(c["names_blob"], c["names_off"]),
                        c["name"].astype(np.int64),
                        [(toks[p], a) for p, a in zip(c["pn_pid"].tolist(), _spans(data, c["pn_off"], c["pn_len"]),
                                                      strict=True)],
                        [(toks[p], toks[t], a) for p, t, a in zip(c["tn_pid"].tolist(), c["tn_tid"].tolist(),
                                                                  _spans(data, c["tn_off"], c["tn_len"]), strict=True)])
    finally:
        s.free()


def _column(getter: Any, h: Any, which: int, dtype: str) -> np.ndarray:
    """Column ``which`` of the handle ``h`` (``dp_run_column`` / ``dp_merge_column``) as a numpy view of the
    library's buffer: valid until the handle is freed."""
    n = ctypes.c_uint64()
    ptr = getter(h, which, ctypes.byref(n))
    size = n.value * np.dtype(dtype).itemsize
    if not size:
        return np.empty(0, dtype=dtype)
    return np.frombuffer(memoryview((ctypes.c_char * size).from_address(ptr)), dtype=dtype)


def _buffer(lib: Any, h: Any, which: int, dtype: str) -> np.ndarray:
    return _column(lib.dp_merge_column, h, which, dtype)


def merge_rewrite(data: bytes | bytearray, first: float, start_ns: int, index: int,
                  pids: Callable[[list[Any]], list[int]],
                  process_names: Callable[[list[tuple[Any, Any]]], list[bytes]]) -> tuple[bytes, int] | None:
    """The run ``data`` rewritten natively for merge's output (``native/src/merge.rs``): the events, without the
    list's brackets, and how many; None when the scanner is absent or not sure (merge then writes the run itself).
    ``pids(values)`` gives the output pid of each of the run's pids (first seen first; None: absent), and
    ``process_names([(pid, raw args)])`` the new args of its process_name metadata events: merge's own rules."""
    lib = _load() if _on else None
    if not lib or not -(2**62) < start_ns < 2**62:
        return None
    h = lib.dp_merge_parse(_address(data), len(data), float(first), int(start_ns), int(index))
    try:
        if lib.dp_merge_info(h, 0) != _ANSWERED:
            return None
        raw, off = _buffer(lib, h, 0, "u1").tobytes(), _buffer(lib, h, 1, "u8").tolist()
        toks = [None if a == b else msgspec.json.decode(raw[a:b]) if raw[a:a + 1] == b'"' else int(raw[a:b])
                for a, b in pairwise(off)]  # an int, a string, None: absent
        out_pids = np.array(pids(toks), dtype=np.int64)
        pn = [(toks[p], a) for p, a in zip(
            _buffer(lib, h, 2, "u4").tolist(), _spans(data, _buffer(lib, h, 3, "u8"), _buffer(lib, h, 4, "u8")),
            strict=True)]
        texts = process_names(pn) if pn else []
        blob = b"".join(texts)
        ends = np.array([0, *accumulate(map(len, texts))], dtype=np.uint64)
        pid_buf, end_buf = out_pids.ctypes.data_as(ctypes.c_void_p), ends.ctypes.data_as(ctypes.c_void_p)
        status = lib.dp_merge_emit(h, _address(data), len(data), pid_buf, len(out_pids),
                                   _address(blob) if blob else None, len(blob), end_buf, len(ends))
        if status != _ANSWERED:
            return None
        n = ctypes.c_uint64()
        ptr = lib.dp_merge_column(h, 5, ctypes.byref(n))
        return ctypes.string_at(ptr, n.value) if n.value else b"", int(lib.dp_merge_info(h, 2))
    finally:
        lib.dp_merge_free(h)


def reduce_any(data: bytes | Span) -> Columns | None:
    """A run reduced natively where the scanner answers, else on the Python path (``reduce_run``): what reading
    hands each run to, in this process or in a worker."""
    whole = run_bytes(data)
    if whole is None:
        return None
    cols = reduce_native(whole)
    return cols if cols is not None else reduce_run(whole)


class _Inline:
    """A pool that reduces each run where it is submitted (one file read natively in this process)."""
    backlog: ClassVar[int] = 0

    @staticmethod
    def submit(fn: Any, *args: Any) -> Future:
        f: Future = Future()
        f.set_result(fn(*args))
        return f


INLINE = _Inline()
