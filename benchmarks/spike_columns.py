"""The columns every candidate of benchmarks/spike_decode.py ends with (:class:`Cols`), how two runs are compared
(:func:`fingerprint`, :func:`compare`), the msgspec reference (today's reader: lean events reduced by
``distprof.trace.columns.Columns``) and the Rust scanner's ctypes binding (benchmarks/spike_rust): build, load,
scan, columns. tests/unit/trace/test_spike_rust.py imports this module (the crate's agreement and fuzz tests).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import subprocess
import time
from typing import ClassVar

SCAN_S = [0.0]  # seconds spent in the scanner itself (the rest of rust_cols is Python)
CRATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "spike_rust")


# ---- the Rust scanner ------------------------------------------------------------------------------------------
def build_rust(target_dir: str, release: bool = True) -> str | None:
    """Build benchmarks/spike_rust into ``target_dir``; the library's path, or None (and why, printed) without cargo."""
    cargo = shutil.which("cargo")
    if cargo is None:
        print("rust: skipped (no cargo on PATH)")
        return None
    cmd = [cargo, "build", "--offline", "--quiet", "--manifest-path", os.path.join(CRATE, "Cargo.toml"),
           "--target-dir", target_dir] + (["--release"] if release else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"rust: skipped (cargo build failed: {proc.stderr.strip()[-500:]})")
        return None
    lib = os.path.join(target_dir, "release" if release else "debug", "libdistprof_spike_scan.so")
    return lib if os.path.isfile(lib) else None


class RustScan:
    """One scan's columns, as numpy views of the scanner's buffers (alive as long as this object)."""
    COLS: ClassVar[list[tuple[str, str]]] = [  # the scanner's column numbers are the positions here
        ("ts", "f8"), ("dur", "f8"), ("name", "u4"), ("cat", "u4"), ("track", "u4"), ("corr", "i8"), ("ext", "i8"),
        ("stream", "u4"), ("flag", "u1"), ("span_row", "u8"), ("span_off", "u8"), ("span_len", "u8"),
        ("str_blob", "u1"), ("str_off", "u8"), ("track_pid", "u4"), ("track_tid", "u4"), ("tn_pid", "u4"),
        ("tn_name", "u4"), ("tn_tid", "u4"), ("name_str", "u4")]

    def __init__(self, lib: ctypes.CDLL, data: bytes) -> None:
        import numpy as np
        self._lib = lib
        self._h = lib.dp_scan(data, len(data))
        self.status, self.err_at, self.events, self.broken = (lib.dp_info(self._h, k) for k in (0, 1, 2, 3))
        n = ctypes.c_uint64()
        for which, (col, dt) in enumerate(self.COLS):
            ptr = lib.dp_column(self._h, which, ctypes.byref(n))
            size = n.value * np.dtype(dt).itemsize
            buf = (ctypes.c_char * size).from_address(ptr) if size else b""
            setattr(self, col, np.frombuffer(buf, dtype=dt))

    def __del__(self) -> None:
        if getattr(self, "_h", None):
            self._lib.dp_free(self._h)
            self._h = None


def load_rust(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    lib.dp_scan.restype = ctypes.c_void_p
    lib.dp_scan.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.dp_info.restype = ctypes.c_uint64
    lib.dp_info.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib.dp_column.restype = ctypes.c_void_p
    lib.dp_column.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64)]
    lib.dp_free.restype = None
    lib.dp_free.argtypes = [ctypes.c_void_p]
    return lib


# ---- the columns every candidate ends with --------------------------------------------------------------
class Cols:
    """What distprof needs of one file: names (id -> str), per complete event name id, kind, ts, dur, track id;
    corr / ext per event (-1: none); tracks, thread names, collective metadata and shapes by event index."""

    def __init__(self, names, name, kind, ts, dur, track, tracks, corr, ext, thread_names, meta, shapes) -> None:
        self.names, self.name, self.kind, self.ts, self.dur, self.track = names, name, kind, ts, dur, track
        self.tracks, self.corr, self.ext = tracks, corr, ext
        self.thread_names, self.meta, self.shapes = thread_names, meta, shapes


def _needs_args():
    import numpy as np

    from distprof.trace import columns
    return np.array(columns._NEEDS_ARGS, dtype=bool)


def fingerprint(c: Cols, acc: dict) -> None:
    """Add one file's figures to ``acc``: per name [count, sum ts, sum dur]; over device work and launches the
    count and sum of correlation and External ids; counts of tracks, thread names, comm metadata, shapes."""
    import numpy as np
    ids = np.asarray(c.name, dtype=np.int64)
    n = len(c.names)
    cnt = np.bincount(ids, minlength=n)
    sts = np.bincount(ids, weights=np.asarray(c.ts, dtype=np.float64), minlength=n)
    sdu = np.bincount(ids, weights=np.asarray(c.dur, dtype=np.float64), minlength=n)
    per = acc.setdefault("names", {})
    for i in np.flatnonzero(cnt):
        row = per.setdefault(c.names[i], [0, 0.0, 0.0])
        row[0] += int(cnt[i])
        row[1] += float(sts[i])
        row[2] += float(sdu[i])
    sel = _needs_args()[np.asarray(c.kind, dtype=np.int64)]
    for key, col in (("corr", c.corr), ("ext", c.ext)):
        v = np.asarray(col, dtype=np.int64)[sel]
        v = v[v >= 0]
        acc[key + "_n"] = acc.get(key + "_n", 0) + len(v)
        acc[key + "_sum"] = acc.get(key + "_sum", 0) + int(v.sum(dtype=np.int64)) % (1 << 62)
    for key, val in (("events", len(ids)), ("tracks", len(c.tracks)), ("thread_names", len(c.thread_names)),
                     ("meta", len(c.meta)), ("shapes", len(c.shapes))):
        acc[key] = acc.get(key, 0) + val


def compare(ref: dict, got: dict) -> str:
    """'yes', or what differs first."""
    for key in sorted(set(ref) | set(got)):
        if key == "names":
            continue
        if ref.get(key) != got.get(key):
            return f"no: {key} {got.get(key)} vs {ref.get(key)}"
    a, b = ref.get("names", {}), got.get("names", {})
    if a.keys() != b.keys():
        return f"no: {len(a.keys() ^ b.keys())} names differ"
    for nm, (n, t, d) in a.items():
        m, u, e = b[nm]
        if n != m or not math.isclose(t, u, rel_tol=1e-12) or not math.isclose(d, e, rel_tol=1e-12, abs_tol=1e-9):
            return f"no: {nm!r} {b[nm]} vs {a[nm]}"
    return "yes"


def _shape_and_comm(names, name_idx, kinds, get_args, decode_raw: bool):
    """Collective metadata (device work and launches, and record_param_comms) and the shaped ops' shapes, by row;
    raw args are decoded as distprof does (one msgspec call for each kind of args)."""
    from distprof.trace import columns
    from distprof.trace.vocab import SHAPED_OPS
    rpc = {i for i, nm in enumerate(names) if nm == "record_param_comms"}
    shaped = {i for i, nm in enumerate(names) if nm in SHAPED_OPS}
    need = columns._NEEDS_ARGS
    comm_rows, comm_args, op_rows, op_args = [], [], [], []
    for row, a in get_args():
        nid = int(name_idx[row])
        if need[int(kinds[row])] or nid in rpc:
            comm_rows.append(row)
            comm_args.append(a)
        if nid in shaped:
            op_rows.append(row)
            op_args.append(a)
    meta, shapes = {}, {}
    if decode_raw:
        comm_args = [(a.pg, a.collective) for a in columns._decode_many(comm_args)] if comm_args else []
        op_args = [a.dims for a in columns._decode_ops(op_args)] if op_args else []
    else:
        comm_args = [(a.get("Process Group Name"), a.get("Collective name")) for a in comm_args]
        op_args = [a.get("Input Dims") for a in op_args]
    for row, (g, c) in zip(comm_rows, comm_args, strict=True):
        if g is not None or c is not None:
            meta[row] = (g, c)
    for row, dims in zip(op_rows, op_args, strict=True):
        if dims is not None:
            shapes[row] = dims
    return meta, shapes


# ---- the candidates (each returns Cols for one file's bytes) --------------------------------------------
_LEAN_DOC = None


def decode_msgspec(data: bytes, reduce: bool):
    global _LEAN_DOC
    import msgspec

    from distprof.trace.events import Lean
    if _LEAN_DOC is None:
        doc = msgspec.defstruct("Doc", [("traceEvents", list[Lean], [])], gc=False)
        _LEAN_DOC = msgspec.json.Decoder(doc)
    evs = _LEAN_DOC.decode(data).traceEvents
    if not reduce:
        return evs
    return from_columns(evs)


def from_columns(evs) -> Cols:
    """distprof's own reduction (Columns.add in batches of 4,096, as the reader's), as Cols."""
    import numpy as np

    from distprof.trace.columns import Columns, dense, shape_of
    c = Columns()
    for i in range(0, len(evs), 4096):
        c.add(evs[i:i + 4096])
    corr = np.full(len(c.ts), -1, dtype=np.int64)
    ext = corr.copy()
    ai = np.frombuffer(c.arg_i, dtype=np.int64)
    corr[ai] = np.frombuffer(c.arg_corr, dtype=np.int64)
    ext[ai] = np.frombuffer(c.arg_ext, dtype=np.int64)
    return Cols(list(c.name_ids), dense(c.name, c.name_ids), np.frombuffer(c.kind, dtype=np.int8),
                np.frombuffer(c.ts), np.frombuffer(c.dur), dense(c.track, c.track_ids), list(c.track_ids), corr, ext,
                c.thread_names, c.meta, _shapes(c, shape_of))


def _shapes(c, shape_of) -> dict:
    """event -> (Input Dims, Input type, Concrete Inputs, Sequence number or None) of the columns' shaped ops."""
    keys = {v: k for k, v in c.shape_keys.items()}
    return {e: (*shape_of(keys[k]), None if q == -1 else q)
            for e, k, q in zip(c.shape_ev, c.shape_key, c.shape_seq, strict=True)}


def _intern(values: list) -> tuple[list, list]:
    """Unique values (first seen first) and each value's index among them."""
    ids = {v: i for i, v in enumerate(dict.fromkeys(values))}
    return list(ids), list(map(ids.__getitem__, values))




def rust_cols(lib: ctypes.CDLL, data: bytes) -> Cols:
    """The scanner's columns as Cols: each unique string unescaped once, cats turned into kinds through a table,
    the comm and shape args of the rows that need them decoded by msgspec (one call each, as Columns does)."""
    import numpy as np

    from distprof.trace import columns
    from distprof.trace.vocab import KIND_OF_CATEGORY, SHAPED_OPS, Kind
    t0 = time.perf_counter()
    s = RustScan(lib, data)
    SCAN_S[0] += time.perf_counter() - t0
    if s.status != 0:
        raise ValueError(f"rust scanner: status {s.status} at byte {s.err_at}")
    blob = s.str_blob.tobytes()
    off = s.str_off.tolist()
    raw = [blob[off[i]:off[i + 1]] for i in range(len(off) - 1)]
    strs = [r.decode() if b"\\" not in r else json.loads(b'"' + r + b'"') for r in raw]
    names = [strs[i] for i in s.name_str.tolist()]
    name_idx = s.name
    if len(set(names)) != len(names):  # one name spelt two ways (escaped or not): one id
        names, ids = _intern(names)
        name_idx = np.array(ids, dtype=np.int64)[s.name]
    kind_lut = np.fromiter((KIND_OF_CATEGORY.get(t, Kind.UNKNOWN) for t in strs), dtype=np.int8, count=len(strs))
    kinds = kind_lut[s.cat]
    tok = {i: json.loads(raw[i]) for i in {*s.track_pid.tolist(), *s.track_tid.tolist(), *s.tn_pid.tolist(),
                                           *s.tn_tid.tolist()}}  # pid / tid values
    tracks = [(tok[p], tok[t]) for p, t in zip(s.track_pid.tolist(), s.track_tid.tolist(), strict=True)]
    track = s.track
    if len(set(tracks)) != len(tracks):  # (the same: 7 and "7" are two threads, but "a" and "\u0061" one)
        tracks, ids = _intern(tracks)
        track = np.array(ids, dtype=np.int64)[s.track]
    need = _needs_args()[kinds]
    corr = np.where(need, s.corr, -1)
    ext = np.where(need, s.ext, -1)
    tn = {(tok[p], tok[t]): strs[n] for p, t, n in zip(s.tn_pid.tolist(), s.tn_tid.tolist(), s.tn_name.tolist(),
                                                        strict=True) if strs[n]}
    # Only the spans distprof decodes: comm metadata of device work, launches and record_param_comms; shaped ops.
    sr = s.span_row.astype(np.int64)
    nm = name_idx[sr]
    is_rpc = np.array([n == "record_param_comms" for n in names] + [False], dtype=bool)
    is_shaped = np.array([n in SHAPED_OPS for n in names] + [False], dtype=bool)
    fl = s.flag[sr]
    meta, shapes = {}, {}
    comm = np.flatnonzero(((fl & 1) != 0) & (need[sr] | is_rpc[nm]))
    if len(comm):
        got = columns._decode_many([data[o:o + n] for o, n in zip(s.span_off[comm].tolist(),
                                                                   s.span_len[comm].tolist(), strict=True)])
        meta = {r: (a.pg, a.collective) for r, a in zip(sr[comm].tolist(), got, strict=True)
                if a.pg is not None or a.collective is not None}
    ops = np.flatnonzero(((fl & 2) != 0) & is_shaped[nm])
    if len(ops):
        got = columns._decode_ops([data[o:o + n] for o, n in zip(s.span_off[ops].tolist(), s.span_len[ops].tolist(),
                                                                  strict=True)])
        shapes = {r: a.dims for r, a in zip(sr[ops].tolist(), got, strict=True) if a.dims is not None}
    cols = Cols(names, name_idx, kinds, s.ts, s.dur, track, tracks, corr, ext, tn, meta, shapes)
    cols.scan = s  # the columns are views of the scanner's buffers: they live as long as it
    return cols
