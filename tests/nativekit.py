"""What the native decoder's tests share (test_native_differential.py, test_native_fuzz.py): the canonical form of a
:class:`~distprof.trace.columns.Columns` and of a :class:`~distprof.trace.table.TraceTable` (what two reads must
agree on), and the check that the library is built wherever it can be.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import strategies as st

from distprof.trace import native
from distprof.trace.columns import Columns

BUILD_HINT = ("build it with `pip install -e .` in the repository (setuptools-rust runs cargo on native/); "
              "DISTPROF_NATIVE=0 switches it off on purpose")
# (read at import, during collection: conftest._clean_env removes DISTPROF_* variables in every test)
SWITCHED_OFF = os.environ.get("DISTPROF_NATIVE") == "0"
MISSING = ("<missing>",)  # an id a column holds that its dict does not name


def value(x: Any) -> Any:
    """A JSON-ish value with its types kept (1, 1.0, True and "1" differ; -0.0 and 0.0 differ), hashable, and
    with dicts compared whatever their order."""
    if x is None or isinstance(x, (bool, str)):
        return (type(x).__name__, x)
    if isinstance(x, int) and type(x) is int:
        return ("int", x)
    if isinstance(x, float) and type(x) is float:
        return ("float", repr(x))
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(value(v) for v in x))
    if isinstance(x, dict):
        return ("dict", tuple(sorted(((value(k), value(v)) for k, v in x.items()), key=repr)))
    return ("other", type(x).__name__, repr(x))  # (a numpy scalar where Python gives an int is a difference)


def _numbers(col) -> tuple[str, bytes]:
    a = np.asarray(col)
    return (a.dtype.str, a.tobytes())  # bit for bit: -0.0 and 0.0 differ


def _keys(col, ids: dict, what: str) -> list:
    """Per row, the key its id stands for (typed: see :func:`value`)."""
    by_id = {i: value(k) for k, i in ids.items()}
    assert len(by_id) == len(ids), f"two {what} share an id: {ids}"
    return [by_id.get(i, MISSING) for i in col]


def canon(c: Columns) -> dict[str, Any]:
    """Everything a :class:`Columns` says, with its internal ids replaced by what they stand for: per row the name,
    kind, ts, dur and (pid, tid); the args rows with their stream's key; the dicts; the order names, threads and
    streams were first seen in (which dense ids and stream numbers follow)."""
    n = len(c.ts)
    for col in ("dur", "kind", "name", "track"):
        assert len(getattr(c, col)) == n, f"column {col} has {len(getattr(c, col))} rows, ts has {n}"
    m = len(c.arg_i)
    for col in ("arg_corr", "arg_ext", "arg_stream"):
        assert len(getattr(c, col)) == m, f"column {col} has {len(getattr(c, col))} rows, arg_i has {m}"
    out: dict[str, Any] = {
        "name": _keys(c.name, c.name_ids, "names"), "track": _keys(c.track, c.track_ids, "threads"),
        "kind": _numbers(c.kind), "ts": _numbers(c.ts), "dur": _numbers(c.dur),
        "arg_i": _numbers(c.arg_i), "arg_corr": _numbers(c.arg_corr), "arg_ext": _numbers(c.arg_ext),
        "arg_stream": _keys(c.arg_stream, c.streams, "streams"),
        "names_order": [value(k) for k in c.name_ids], "tracks_order": [value(k) for k in c.track_ids],
        "streams_order": [value(k) for k in c.streams],
        "memory": [value(t) for t in c.memory], "unknown": value(dict(c.unknown)), "events": value(c.events),
        "has_shapes": value(c.has_shapes),
        # the columns' types: appending a run (Columns.extend) needs arrays of the same typecode
        "types": {col: (type(getattr(c, col)).__name__, getattr(getattr(c, col), "typecode", None))
                  for col in ("ts", "dur", "kind", "name", "track", "arg_i", "arg_corr", "arg_ext", "arg_stream")},
    }
    for d in ("meta", "sizes", "rpc_ext", "rpc_sizes", "comm_dims", "thread_names"):
        out[d] = value(getattr(c, d))
    # the shaped ops: event -> (its shape key, Sequence number), whatever ids the keys were given
    assert len(c.shape_ev) == len(c.shape_key) == len(c.shape_seq), "shape columns of different lengths"
    keys = {v: k for k, v in c.shape_keys.items()}
    out["shapes"] = value({e: (keys[k], q) for e, k, q in zip(c.shape_ev, c.shape_key, c.shape_seq, strict=True)})
    out["types"]["shapes"] = [type(getattr(c, col)).__name__ + getattr(getattr(c, col), "typecode", "")
                              for col in ("shape_ev", "shape_key", "shape_seq")]
    return out


def diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The first difference of two canonical forms, in a line or a few (for assertion messages)."""
    for k in sorted(a.keys() | b.keys()):
        x, y = a.get(k), b.get(k)
        if x == y:
            continue
        if _is_numbers(x) and _is_numbers(y) and x[0] == y[0]:
            x, y = np.frombuffer(x[1], dtype=x[0]).tolist(), np.frombuffer(y[1], dtype=y[0]).tolist()
        if isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                return f"{k}: {len(x)} vs {len(y)} entries; first: {x[:3]} vs {y[:3]}"
            j = next(i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q or repr(p) != repr(q))
            return f"{k}[{j}]: {x[j]!r} vs {y[j]!r}"
        return f"{k}: {str(x)[:600]} vs {str(y)[:600]}"
    return "no difference"


def _is_numbers(v: Any) -> bool:
    return isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str) and isinstance(v[1], bytes)


def table_canon(tb) -> dict[str, Any]:
    """Everything a :class:`~distprof.trace.table.TraceTable` holds (columns bit for bit, dtypes, dicts, threads,
    the file's info)."""
    out: dict[str, Any] = {}
    for k, v in vars(tb).items():
        if k == "_cache_d":
            continue
        if isinstance(v, np.ndarray):
            out[k] = (v.dtype.str, v.shape, v.tobytes())
        elif k == "tracks":
            out[k] = [value((t.pid, t.tid, t.name, t.kind)) for t in v]
        elif k == "info":
            out[k] = value(v.to_dict())
        else:
            out[k] = value(v)
    return out


def require_built() -> None:
    """Fail (never skip) where the library can be built but is not loaded: cargo on PATH, not switched off."""
    if native.available() or SWITCHED_OFF:
        return
    try:
        from distprof.trace import nativelib  # (the loader: absent until the build half of issue 24 is merged)
    except ImportError:
        nativelib = None
    if nativelib is None:
        return  # the skeleton stage (no loader yet): nothing can be built or loaded, nothing to hold it to
    if nativelib.load() is not None and not native.available():
        pytest.fail("the native library loads but trace.native does not use it (native.available() is False)")
    if nativelib.load() is None and shutil.which("cargo") is not None:
        why = getattr(nativelib, "why_not", lambda: "no reason given")()
        pytest.fail(f"cargo is on PATH but the native decoder is not loaded: {why}; {BUILD_HINT}")


# ---- runs of Kineto-like events, well-formed and hostile (hypothesis) --------------------------------------
NAMES = ["aten::mm", "aten::addmm", "aten::linear", "aten::add_", "aten::conv2d", "aten::sum", "aten::mmx", "aten::m",
         "record_param_comms", "nccl:all_reduce", "nccl:all_to_all", "gloo:all_reduce", "rccl:broadcast",
         "c10d::alltoall_base_", "c10d::_allgather_base_", "c10d::allreduce_", "ProfilerStep#1", "ProfilerStep#2",
         "ProfilerStep#x", "[memory]", "thread_name", "process_name", "cudaLaunchKernel", "cudaStreamSynchronize",
         "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
         "Memcpy HtoD (Pageable -> Device)", "Memset (Device)", "void gemm<float>(int)", "", "é", "名前", "😀",
         'a"b\\c/d', "\x00", "\u2028"]
CATS = ["kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cuda_sync", "cpu_op", "Operator", "user_annotation",
        "gpu_user_annotation", "cuda_runtime", "cuda_driver", "python_function", "Trace", "ac2g", "", "fwdbwd",
        "weird", "gpu_weird_kernel", "KERNEL", "kernel ", "é"]
PHASES = [*"XMiBEICbnestfPONDRcSTpFVv()", "Z", "XX", "x", ""]
EDGE_INTS = [0, 1, -1, 7, 2**31, 2**53 + 1, 2**62 - 1, 2**62, 2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64 - 1,
             2**64, 10**19, 12345678901234567890, -12345678901234567890, 10**30]
NUMS = [b"0", b"-0", b"0.0", b"-0.0", b"1", b"-1", b"1e3", b"1E+3", b"1e-7", b"2.5", b"-2.5", b"9e15", b"-9e15",
        b"9000000000000000", b"9000000000000000.4", b"9000000000000000.5", b"9000000000000001", b"-9000000000000001",
        b"9.0000000000000001e15", b"8999999999999999.9", b"9.000000000000001e15", b"1e308", b"1e309", b"-1e400",
        b"1e-400", b"4.9e-324", b"2.2250738585072011e-308", b"0.1", b"123456789.123456789", b"1.7976931348623157e308",
        b"1.0", b"3.0e0", b"1E2", b"0e5", b"-0e-0", b"100000000000000000000000000000.0",
        b"4611686018427387903", b"4611686018427387904", b"4.611686018427388e18", b"0.000001e21",
        b"1" + b"0" * 400, b"0." + b"0" * 400 + b"1", b"1.5e9999999999"]
BAD_NUMS = [b"01", b"1.", b".5", b"+1", b"1e", b"--1", b"0x10", b"NaN", b"Infinity", b"-", b"1.e5", b"-Infinity"]
PIECES = [b"\\ud800", b"\\udc00", b"\\ud800\\u0041", b"\\uDBFF\\uDFFF", b"\\ud83d\\ude00", b"\xff", b"\xc3",
          b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80", b"\x01", b"\x7f", b"\\x41", b"\\u12", b"\t",
          b"\\u0000", b"\xe2\x80\xa8", b"\\/", b'\\"', b"\\\\", b"\\u00e9", b"\\b\\f\\n\\r\\t"]
RANKS_TEXT = ["[0, 1]", "[0,1.0]", "[1e2]", "[NaN]", "[Infinity]", "[true]", "[-1]", " [ 0 , 1 ] ", "[]", "x",
              "[0, 1]x", "[4611686018427387904]", "[4611686018427387903]", "[1.5]", "[[0]]", "[0, 1", "", "[null]",
              '["0"]', "[" * 40 + "]" * 40, "[0,1,2,3,4,5,6,7]", "[1e400]", "[-0.0]", "[ 1 ]\n"]
JSON_TEXT = [b"[[2, 3], [3, 4]]", b"[]", b"[[]]", b"[[2, 3], []]", b"[1, 2]", b"[[[1]]]", b'"x"', b'{"a": 1}',
             b"[[2.0, 3]]", b"[[-1]]", b"[[9223372036854775808]]", b"null", b"[[2, 3], null]", b'[[2, "3"]]']
TYPES_TEXT = [b'["float", "c10::BFloat16"]', b"[]", b'["", 1]', b'"float"', b'["long int", "Scalar"]', b"null",
              b'["c10::Half"]']
INT_KEYS = ["correlation", "External id", "Sequence number", "Total Allocated", "Total Reserved", "Bytes", "Addr",
            "Device Type", "Device Id"]
SIZE_KEYS = ["In msg nelems", "Out msg nelems", "Group size", "Seq"]
RANK_KEYS = ["Process Group Ranks", "In split size", "Out split size"]


def jstr(s: str, style: int) -> bytes:
    """``s`` as a JSON string: as is (UTF-8), ASCII with \\u escapes, every character escaped, or upper-case hex."""
    if style == 0:
        return json.dumps(s, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if style == 1:
        return json.dumps(s).encode()
    units = s.encode("utf-16-le", "surrogatepass")
    hexes = [int.from_bytes(units[i:i + 2], "little") for i in range(0, len(units), 2)]
    fmt = "\\u%04x" if style == 2 else "\\u%04X"
    return ('"' + "".join(fmt % u for u in hexes) + '"').encode()


def string(choices: list[str] | None = None, hostile: bool = False) -> st.SearchStrategy[bytes]:
    return _string(tuple(choices) if choices else None, hostile)


@cache  # (strategies built once: hypothesis validates each new one, which costs more than drawing)
def _string(choices: tuple[str, ...] | None, hostile: bool) -> st.SearchStrategy[bytes]:
    return _string_of(st.sampled_from(choices) if choices else st.text(max_size=6), hostile)


@st.composite
def _string_of(draw, texts: st.SearchStrategy[str], hostile: bool) -> bytes:
    s = draw(texts)
    out = jstr(s, draw(_STYLE if hostile else _STYLE_TYPED))
    if hostile and draw(_D10) == 0:
        at = draw(st.integers(1, len(out) - 1))
        out = out[:at] + draw(_PIECE) + out[at:]
    return out


@cache
def number(hostile: bool = False) -> st.SearchStrategy[bytes]:
    good = st.one_of(st.sampled_from(NUMS), st.sampled_from(EDGE_INTS).map(lambda i: str(i).encode()),
                     st.integers(-(2**70), 2**70).map(lambda i: str(i).encode()),
                     st.floats(allow_nan=False, allow_infinity=False).map(lambda f: repr(f).encode()))
    return st.one_of(good, st.sampled_from(BAD_NUMS)) if hostile else good


@cache
def small_int() -> st.SearchStrategy[bytes]:
    return st.one_of(st.one_of(st.integers(-3, 40), st.sampled_from(EDGE_INTS)).map(lambda i: str(i).encode()),
                     st.just(b"-0"))  # (-0 is the int 0: the same thread, stream or id as 0)


@cache
def any_value(hostile: bool = False) -> st.SearchStrategy[bytes]:
    leaf = st.one_of(number(hostile), string(hostile=hostile), st.sampled_from([b"null", b"true", b"false"]))
    return st.recursive(leaf, lambda c: st.one_of(
        st.lists(c, max_size=3).map(lambda xs: b"[" + b",".join(xs) + b"]"),
        st.lists(st.tuples(string(hostile=hostile), c), max_size=3).map(
            lambda kv: b"{" + b",".join(k + b":" + v for k, v in kv) + b"}")), max_leaves=6)


@cache
def _arg_value(key: str) -> st.SearchStrategy[bytes]:
    if key in INT_KEYS:  # (one of the wrong type makes the event's args unusable: all its links go)
        return st.one_of(small_int(), st.sampled_from([b"3.0", b"1e400", b"null", b'"3"']))
    if key == "stream":
        return st.one_of(small_int(), string(["7", "s", "", "-1", "stream 7"]), st.sampled_from([b"3.0", b"null"]))
    if key == "Process Group Name":
        return st.one_of(string(["0", "1", "default_pg", "é"]), small_int())
    if key == "Collective name":
        return string(["allreduce", "all_reduce", "_allgather_base", "alltoall", "broadcast", ""])
    if key in SIZE_KEYS:
        return st.one_of(small_int(), st.sampled_from([b"1.0", b"1.5", b"1e2", b"-0.0", b"4.611686018427388e18",
                                                       b'"1"', b"true", b"[1]", b"null", b"1e309", b"[1e400]",
                                                       b'{"a": -1e400}', b"1e-400", b"1" + b"0" * 309]))
    if key == "dtype":
        return string(["Float", "BFloat16", "", "é" * 250, "x" * 250])
    if key in RANK_KEYS:
        return st.one_of(string(RANKS_TEXT), st.sampled_from([b"[0, 1]", b"[1.0, 2]", b"[true]", b"[]", b"[-1]",
                                                                b'["0"]', b"[4611686018427387904]"]))
    if key == "Process Group Description":
        return string(["default_pg", "undefined", ""])
    if key == "Input Dims":
        return st.sampled_from(JSON_TEXT)
    if key in ("Input type", "Concrete Inputs"):
        return st.sampled_from(TYPES_TEXT)
    if key == "name":
        return st.one_of(string(["main", "", "pt_autograd_0", "é"]), st.sampled_from([b"5", b"null"]))
    return any_value()


ARG_KEYS = [*INT_KEYS, "stream", "Process Group Name", "Collective name", *SIZE_KEYS, "dtype", *RANK_KEYS,
            "Process Group Description", "Input Dims", "Input type", "Concrete Inputs", "name", "device", "grid"]


_STYLE = st.sampled_from([0, 0, 0, 0, 0, 1, 2, 3])  # mostly as Kineto writes them, often escaped
_STYLE_TYPED = st.sampled_from([0] * 30 + [1, 2, 3])  # (a run with one escape the native path declines is no test)
_PIECE = st.sampled_from(PIECES)
_ints = cache(st.integers)
_pick = cache(st.sampled_from)
_perm = cache(lambda n: st.permutations(range(n)))
_COIN = st.booleans()
_D10 = st.integers(0, 9)


def key(draw, k: str, hostile: bool) -> bytes:
    """A key, written plainly or (hostile) with escapes: ``"n\\u0061me"`` is ``name``."""
    return jstr(k, draw(_STYLE) if hostile and draw(_D10) == 0 else 0)


_ODD_ARGS = st.one_of(st.sampled_from([b"null", b"[]", b"5", b'"x"', b"[{}]", b"{}"]), any_value())
_ARG_KEYS = st.lists(st.sampled_from(ARG_KEYS), max_size=6)
_BAD_PH = st.sampled_from([b"1", b"null", b'["X"]', b"true", b'{"X":1}'])
_IDS = st.one_of(small_int(), string(["1", "stream 7", "", "é"]))
_TIMES = st.sampled_from([b"0", b"-0.0", b"1.5", b"1e3", b"9e15", b"1700000000000000", b"1700000000000000.125", b"12",
                          b"4.9e-324"])
_LISTS = st.sampled_from([b"[", b"[]", b" [ ] ", b"[,]", b"{}", b"", b"[{}]", b"[1]", b"[null]", b"[[]]"])


@st.composite
def _args(draw, hostile: bool) -> bytes:
    if hostile and draw(_D10) == 0:
        return draw(_ODD_ARGS)
    parts = [key(draw, k, hostile) + b":" + draw(_arg_value(k)) for k in draw(_ARG_KEYS)]
    return b"{" + b",".join(parts) + b"}"


_ARGS = {h: _args(h) for h in (False, True)}


@st.composite
def _event(draw, hostile: bool) -> bytes:
    def bad() -> bool:  # a field of the wrong type, now and then
        return hostile and draw(_ints(0, 24)) == 0

    fields: list[tuple[str, bytes]] = []
    ph = draw(_pick(tuple(PHASES) if hostile else ("X",) * 6 + ("M", "i", "B", "s", "f", "C")))
    if not (hostile and draw(_ints(0, 29)) == 0):  # (no ph at all: not an event a table reads)
        fields.append(("ph", draw(string([ph], hostile=hostile)) if not bad() else draw(_BAD_PH)))
    fields.append(("name", draw(string(NAMES, hostile=hostile)) if not bad() else draw(any_value(hostile))))
    if draw(_ints(0, 5)):
        fields.append(("cat", draw(string(CATS, hostile=hostile)) if not bad() else draw(any_value(hostile))))
    for k in ("pid", "tid"):
        if draw(_ints(0, 7)):
            fields.append((k, draw(_IDS) if not bad() else draw(any_value(hostile))))
    for k in ("ts", "dur"):
        if draw(_ints(0, 7)):
            fields.append((k, draw(number() if hostile else _TIMES) if not bad() else draw(any_value(hostile))))
    if draw(_ints(0, 5)):
        fields.append(("args", draw(_ARGS[hostile])))
    for k in ("id", "s", "bp", "tts", "cname", "junk"):
        if draw(_D10) == 0:
            fields.append((k, draw(any_value(hostile))))
    if hostile and fields and draw(_D10) == 0:  # a duplicate key: the last one counts
        k, _ = fields[draw(_ints(0, len(fields) - 1))]
        fields.append((k, draw(any_value(hostile)) if k != "ph" else draw(string(PHASES))))
    order = draw(_perm(len(fields))) if hostile or draw(_COIN) else range(len(fields))
    ws = draw(_pick((b"", b" ", b"\n\t ")))
    return b"{" + (b"," + ws).join(key(draw, fields[i][0], hostile) + b":" + ws + fields[i][1] for i in order) + b"}"


_HOSTILE_EVENTS = st.lists(_event(True), min_size=0, max_size=5)
_TYPED_EVENTS = st.lists(_event(False), min_size=1, max_size=8)


@st.composite
def hostile_run(draw) -> bytes:
    """A run of events any field of which may be of the wrong type, badly written, or missing."""
    if draw(_ints(0, 19)) == 0:  # a few shapes of the list itself
        return draw(_LISTS)
    return b"[" + b",".join(draw(_HOSTILE_EVENTS)) + b"]"


@st.composite
def typed_run(draw) -> bytes:
    """A run of events of the phases a table reads (mostly), well typed, with values at the edges."""
    return b"[" + b",".join(draw(_TYPED_EVENTS)) + b"]"


# ---- a fixed corpus of well-formed Kineto-like runs (the native path must answer on each) --------------------
def _run(*events: dict) -> bytes:
    return json.dumps(list(events)).encode()


def _x(name: str, cat: str, ts: float, dur: float = 1.0, pid: int | str = 1, tid: int | str = 1, **args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


_PG = {"Process Group Name": "0", "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
       "Group size": 2, "dtype": "Float", "In msg nelems": 1024, "Out msg nelems": 1024, "Seq": 3}
CORPUS = [
    _run(_x("cudaLaunchKernel", "cuda_runtime", 1700000000000000.5, 4.25, correlation=11, **{"External id": 5}),
         _x("void gemm<float>(int)", "kernel", 1700000000000010.0, 30.5, pid=0, tid=7, correlation=11, stream=7,
            device=0, **{"External id": 5}),
         _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 1700000000000050.0, 2, pid=0, tid=7, correlation=12),
         _x("Memset (Device)", "gpu_memset", 1700000000000060.0, 0, pid=0, tid=7, correlation=13)),
    _run(_x("ProfilerStep#3", "user_annotation", 10.0, 100.0),
         _x("aten::mm", "cpu_op", 11.0, 5.0, **{"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"],
                                                  "Concrete Inputs": ["", ""], "Sequence number": 4}),
         _x("aten::addmm", "cpu_op", 20.0, 5.0, **{"Input Dims": [[4], [2, 3], [3, 4]], "Input type": []}),
         _x("aten::empty", "cpu_op", 30.0, 1.0, **{"Input Dims": [[]]})),
    _run(_x("aten::mm", "cpu_op", 1.0, 2.0), _x("aten::linear", "cpu_op", 3.0, 2.0, **{"Sequence number": 9})),
    _run(_x("record_param_comms", "cpu_op", 5.0, 3.0, **{"Collective name": "allreduce", "External id": 77, **_PG}),
         _x("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", 9.0, 40.0,
            pid=0, tid=20, correlation=31, stream=20, **{"External id": 77}),
         _x("ncclKernel_AllGather", "kernel", 60.0, 10.0, pid=0, tid=20, correlation=32, stream=20,
            **{"Collective name": "_allgather_base", "In split size": "[1, 2]", "Out split size": [3, 4], **_PG})),
    _run(_x("nccl:all_reduce", "user_annotation", 5.0, 3.0, **{"Input Dims": [[394241]], "Input type": ["float"]}),
         _x("c10d::alltoall_base_", "cpu_op", 6.0, 3.0, **{"Input Dims": [[768], [3392]],
                                                            "Input type": ["float", "float"]}),
         _x("gloo:all_reduce", "user_annotation", 7.0, 1.0, pid=2, tid=3)),
    _run({"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "python3"}},
         {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python3"}},
         {"ph": "M", "name": "thread_name", "pid": "Spans", "tid": "PyTorch Profiler", "args": {"name": "x"}},
         {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 12.5,
          "args": {"Total Allocated": 2048, "Total Reserved": 4096, "Bytes": 512, "Addr": 140000000000,
                   "Device Type": 1, "Device Id": 0}},
         {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 13, "args": {"Total Allocated": 0}},
         _x("aten::add_", "cpu_op", 14.0, 1.0)),
    _run({"ph": "s", "id": 11, "pid": 1, "tid": 1, "ts": 1.0, "cat": "ac2g", "name": "ac2g"},
         {"ph": "f", "id": 11, "pid": 0, "tid": 7, "ts": 2.0, "cat": "ac2g", "name": "ac2g", "bp": "e"},
         {"ph": "C", "name": "counter", "pid": 1, "ts": 3, "args": {"v": 1.5}},
         {"ph": "B", "name": "b", "pid": 1, "tid": 1, "ts": 4}, {"ph": "E", "pid": 1, "tid": 1, "ts": 5},
         _x("my_fn", "python_function", 6.0, 1.0), _x("odd", "weird_category", 7.0, 1.0),
         _x("gpu odd", "gpu_weird_kernel", 8.0, 1.0), _x("t", "Trace", 0.0, 100.0)),
    _run(_x("k1", "kernel", 1.0, 1.0, pid=0, tid=7, correlation=1, stream="s1"),
         _x("k2", "kernel", 2.0, 1.0, pid=0, tid=7, correlation=2, stream=-3),
         _x("k3", "kernel", 3.0, 1.0, pid=0, tid=8, correlation=3),
         _x("k4", "kernel", 4.0, 1.0, pid=0, tid="stream 9", correlation=4),
         _x("k5", "gpu_user_annotation", 5.0, 1.0, pid=0, tid=7, correlation=-1),
         _x("sync", "cuda_sync", 6.0, 1.0, pid=0, tid=7, stream=7),
         _x("cudaStreamSynchronize", "cuda_runtime", 6.0, 1.0, correlation=9223372036854775807)),
    # escapes, non-ASCII and whitespace, as writers other than Kineto write them (one run each: a failure names it)
    b'[ {"ph":"X","name":"caf\\u00e9 \\/ \\"q\\" \\\\","cat":"cpu_op","pid":1,"tid":1,"ts":1,"dur":2,"args":{}} ,\n'
    b' {"ph":"X","name":"tab\\there\\nnl","cat":"cpu_op","pid":1,"tid":1,"ts":1,"dur":2} ]',
    b'[{"name":"\xc3\xa9\xf0\x9f\x98\x80","ph":"X","ts":2.0e0,"dur":0.5E1,"cat":"user_annotation","pid":"p","tid":"t"}]',
    b'[{"ph":"X","name":"k","cat":"kernel","pid":0,"tid":1,"ts":-0.0,"dur":-0.0,"args":{"correlation":null,"stream":"7"}}]',
    _run(*[_x(f"op{i % 7}", "cpu_op" if i % 3 else "kernel", float(i), 0.5, pid=i % 2, tid=i % 5, correlation=i)
           for i in range(300)]),
]

# What json.dumps (ensure_ascii, its default) writes for a character beyond the BMP: a surrogate pair (answered).
CORPUS.append(b'[{"ph":"X","name":"\\ud83d\\ude00","cat":"kernel","pid":0,"tid":1,"ts":3,"dur":1,"args":null}]')

# Well-formed runs the native path may decline (the Python path then reads them): equal where it answers.
MAY_DECLINE = [
    b'[{"\\u0070h":"X","name":"escaped key"}]', b'[{"ph":"\\u0058","name":"escaped phase"}]',
    b'[{"ph":"X","name":"a","name":"b"}]',  # a field given twice: the last counts
    b'[{"ph":"M","name":"thread_nam\\u0065","pid":1,"tid":1,"args":{"name":"x"}}]',
]


class InlinePool:
    """:class:`~distprof.trace.splitpool.SplitPool`'s interface in this process: each run is reduced when submitted,
    so a table read takes the pool's path (runs reduced apart, then appended) without starting processes."""
    workers, backlog = 2, 4

    def submit(self, fn: Callable, *args: Any) -> Future:
        f: Future = Future()
        try:
            f.set_result(fn(*args))
        except Exception as e:  # (raised again where the reader takes the result)
            f.set_exception(e)
        return f
