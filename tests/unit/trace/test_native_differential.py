"""The native decoder against the Python path, its oracle (issue 24): wherever ``native.reduce_native(run)``
answers, the answer is the :class:`~distprof.trace.columns.Columns` ``reduce_run(run)`` builds (compared in the
canonical form of ``nativecheck.canon``: ids replaced by what they stand for), and where ``reduce_run`` finds no
events (the run does not decode) the native path does not answer either.

Checked on every trace under tests/data (cut into runs as the reader cuts them, and whole; each file's
``TraceTable`` read with the native path on and off), on a fixed corpus of well-formed Kineto-like runs (where the
native path must answer), and on hypothesis-built runs of hostile events (every phase and unknown ones, fields of
the wrong type, numbers at the bounds, escapes, invalid UTF-8, duplicate keys ...).

The native halves need the library, built by ``pip install -e .`` where cargo exists; without it these tests run
the Python side only (the oracle must never raise), and ``test_native_built_where_cargo_is`` fails where cargo is on
PATH but the library is not loaded (never a silent skip).
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import tempfile

import msgspec
import pytest
from conftest import DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nativekit import CORPUS, MAY_DECLINE, InlinePool, canon, diff, hostile_run, require_built, table_canon, typed_run

from distprof.trace import native
from distprof.trace.columns import Columns, reduce_run
from distprof.trace.reader import TraceStream, open_trace
from distprof.trace.runs import Span
from distprof.trace.source import TraceError, read_span
from distprof.trace.table import TraceTable

RUN_BATCH = 1 << 16  # the reader's batch here: small, so that every file gives several runs
WHOLE_UP_TO = 500_000  # gzipped bytes: a file also checked as one run (all but HTA's four big ones)


def _traces() -> list[str]:
    out = []
    for root, _, files in os.walk(DATA):
        for f in files:
            if f.endswith(".json.gz") or (f.endswith(".json") and f not in ("run.json", "role.json")):
                out.append(os.path.join(root, f))
    return sorted(out)


TRACES = _traces()
SMALL = [p for p in TRACES if os.path.getsize(p) < 200_000]


def _id(p: str) -> str:
    return os.path.relpath(p, DATA).replace(os.sep, "/").removesuffix(".json.gz")


@pytest.fixture
def native_state():
    prev = native.use(True)
    yield
    native.use(prev)


def check(data: bytes, must_answer: bool = False, pickled: bool = True) -> Columns | None:
    """The contract on one run: the Python path never raises; the native path answers only where the run decodes,
    and then with the same columns (and columns that survive a pickle, as a worker's do)."""
    py = reduce_run(data)
    nat = native.reduce_native(data)
    if py is None:
        assert nat is None, f"the run does not decode, yet the native path answered: {data[:300]!r}"
        return None
    if nat is None:
        assert not (must_answer and native.available()), f"the native path did not answer: {data[:300]!r}"
        return py
    assert isinstance(nat, Columns), type(nat)
    a, b = canon(py), canon(nat)
    assert a == b, f"native != Python: {diff(a, b)}; run: {data[:300]!r}"
    if pickled:
        again = canon(pickle.loads(pickle.dumps(nat)))
        assert again == a, f"native columns change in a pickle: {diff(a, again)}"
    return py


# ---- the library is there where it can be ----------------------------------------------------------------
def test_native_built_where_cargo_is():
    require_built()


# ---- real traces ------------------------------------------------------------------------------------------
def _runs(path: str) -> list[bytes]:
    """The runs the reader hands to workers (``batches(defer=True)``), as bytes."""
    t = TraceStream(path, lean=True, batch_bytes=RUN_BATCH)
    out = []
    for b in t.batches(defer=True):
        if isinstance(b, Span):
            out.append(bytes(read_span(b.path, b.start, b.end, brackets=True, ident=b.ident)))
        elif isinstance(b, (bytes, bytearray)):
            out.append(bytes(b))
    return out


class _Doc(msgspec.Struct):
    traceEvents: list[msgspec.Raw] = []


def _whole(path: str) -> bytes:
    """The file's whole events list as one run (each event's bytes as they are in the file)."""
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    try:
        raws = msgspec.json.decode(data, type=_Doc).traceEvents
    except msgspec.ValidationError:
        raws = msgspec.json.decode(data, type=list[msgspec.Raw])
    return b"[" + b",".join(bytes(r) for r in raws) + b"]"


@pytest.mark.parametrize("path", TRACES, ids=_id)
def test_trace_runs_native_equals_python(path):
    """Every run the reader cuts from the file, and the whole events list (up to a few MB: the biggest files are
    checked in their runs only, which cover every event): native == Python; the native path answers on all of them
    (a scanner that always falls back fails here)."""
    runs = _runs(path)
    assert runs or os.path.getsize(path) < 60_000, "the reader cut no runs from a file of several batches"
    whole = [_whole(path)] if os.path.getsize(path) < WHOLE_UP_TO else []
    for i, data in enumerate([*whole, *runs]):
        check(data, must_answer=True, pickled=i == 0)


def test_plain_file_spans(tmp_path):
    """A plain (not gzipped) copy: the reader hands out spans of the file; their bytes, native == Python."""
    src = next(p for p in TRACES if "rank00000" in p and "ddp-gloo" in p)
    plain = tmp_path / "rank0.pt.trace.json"
    plain.write_bytes(gzip.open(src).read())
    t = TraceStream(str(plain), lean=True, batch_bytes=RUN_BATCH)
    spans = [b for b in t.batches(defer=True) if isinstance(b, Span)]
    assert spans, "no spans from a plain file of several batches"
    for s in spans:
        check(bytes(read_span(s.path, s.start, s.end, brackets=True, ident=s.ident)), must_answer=True)


def _table(path: str, on: bool, pool: bool = False) -> dict:
    native.use(on)
    t = TraceStream(path, lean=True, batch_bytes=RUN_BATCH) if pool else open_trace(path, lean=True)
    tb = TraceTable.read(t, pool=InlinePool() if pool else None)  # type: ignore[arg-type]
    assert tb is not None
    return table_canon(tb)


# Python against itself without the library: one small file keeps the comparison itself tested.
@pytest.mark.parametrize("path", TRACES if native.available() else SMALL[:1], ids=_id)
def test_table_native_on_equals_off(path, native_state):
    """The table every verb reads, with the native path on and off, in one process and through a pool's path (runs
    reduced apart, then appended): every column bit for bit, every dict."""
    for pool in (False, True):
        off, on = _table(path, False, pool), _table(path, True, pool)
        assert on == off, f"pool {pool}: {diff(off, on)}"


# ---- a fixed corpus of well-formed runs: the native path must answer -------------------------------------
@pytest.mark.parametrize("data", CORPUS, ids=[f"corpus{i}" for i in range(len(CORPUS))])
def test_corpus(data):
    assert reduce_run(data) is not None, "the corpus holds runs that decode"
    check(data, must_answer=True)


@pytest.mark.parametrize("data", MAY_DECLINE, ids=[f"may_decline{i}" for i in range(len(MAY_DECLINE))])
def test_corpus_may_decline(data):
    assert reduce_run(data) is not None
    check(data)


def test_runs_appended_mixed(native_state):
    """Runs reduced apart and appended in file order (a file some of whose runs fall back): native and Python
    pieces mixed in any order give the columns of the whole."""
    whole = reduce_run(b"[" + b",".join(CORPUS[i][1:-1] for i in range(len(CORPUS))) + b"]")
    assert whole is not None
    for pick in ("native", "python", "alternate"):
        c = Columns()
        for i, data in enumerate(CORPUS):
            use_native = pick == "native" or (pick == "alternate" and i % 2 == 0)
            part = native.reduce_native(data) if use_native else None
            c.extend(part if part is not None else reduce_run(data))
        a, b = canon(whole), canon(c)
        # has_shapes is per batch: a run appended keeps the first answer
        a.pop("has_shapes"), b.pop("has_shapes")
        assert a == b, f"{pick}: {diff(a, b)}"


# ---- hostile runs -----------------------------------------------------------------------------------------
_H = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                      HealthCheck.function_scoped_fixture])


@_H
@given(hostile_run())
def test_hostile_runs(data):
    check(data)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(typed_run())
def test_typed_runs(data):
    """Well-typed events with values at the edges (most of these decode)."""
    check(data)


def _outcome(path: str, on: bool, pool: bool, batch: int = 256):
    """The table of a file (or the error reading it gives), native path on or off, in tiny batches."""
    prev = native.use(on)
    try:
        t = TraceStream(path, lean=True, batch_bytes=batch)
        tb = TraceTable.read(t, pool=InlinePool() if pool else None)  # type: ignore[arg-type]
        return None if tb is None else table_canon(tb)
    except TraceError as e:
        return ("TraceError", str(e))
    finally:
        native.use(prev)


@settings(max_examples=25 if native.available() else 5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(typed_run(), typed_run(), hostile_run()), min_size=1, max_size=6), st.booleans(),
       st.booleans(), st.one_of(st.none(), st.floats(0, 1)))
def test_table_of_odd_file_native_on_equals_off(runs, gz, pool, cut):
    """A file of such events (some runs of which do not decode, so the reader falls back and salvages; ``cut``: the
    file cut off there), read in batches of 256 bytes with the native path on and off: the same table, or the same
    error."""
    inner = [r.strip()[1:-1] for r in runs if r.strip().startswith(b"[") and r.strip().endswith(b"]")]
    doc = b'{"traceEvents": [' + b",".join(i for i in inner if i.strip()) + b'], "baseTimeNanoseconds": 5}'
    doc = doc if cut is None else doc[:int(len(doc) * cut)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rank0.pt.trace.json" + (".gz" if gz else ""))
        with (gzip.open if gz else open)(path, "wb") as f:
            f.write(doc)
        off, on = _outcome(path, False, pool), _outcome(path, True, pool)
    assert on == off, diff(off, on) if isinstance(off, dict) and isinstance(on, dict) else (off, on)


_SHAPED = [{"ph": "X", "name": "aten::mm", "ts": i, "args": {"Input Dims": [[2, 3], [3, 4]]} if i >= 3 else {}}
           for i in range(6)]  # three ops without shapes, then three with


@pytest.mark.parametrize("gz", [False, True])
def test_shapes_stop_the_same_way_on_and_off(tmp_path, gz):
    """A file whose first batch holds shaped ops without shapes and a later one ops with: the same table whether
    the native path reads it or not (has_shapes, shapes). Finding F5: runs reduced apart and appended
    (Columns.extend) once took the later shapes that a batch-by-batch read stops looking for."""
    path = tmp_path / ("rank0.json.gz" if gz else "rank0.json")
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(json.dumps({"traceEvents": _SHAPED}).encode())
    off, on = _outcome(str(path), False, False, batch=128), _outcome(str(path), True, False, batch=128)
    assert on == off, diff(off, on)


@pytest.mark.parametrize("first_has_dims", [False, True])
def test_the_first_shaped_op_decides_wherever_the_file_is_cut(tmp_path, first_has_dims):
    """has_shapes is the stream's first shaped op's: the same table at every batch size, one process or the pool's
    path, native on or off (found by a red-team pass: the rule was once the first *batch*'s, so where a batch or
    a run was cut changed FLOPs and MFU)."""
    filler = [{"ph": "X", "name": "my_op", "ts": i, "dur": 0.5, "args": {"External id": i}} for i in range(40)]
    dims = {"Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}
    ops = [{"ph": "X", "name": "aten::mm", "ts": 100 + i, "dur": 1, "args": dims if (i == 0) == first_has_dims
            else {}} for i in range(3)]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": filler[:20] + ops[:1] + filler[20:] + ops[1:]}))
    seen = {(_outcome(str(path), on, pool, batch)["has_shapes"] if on or not pool else None) for on in (False, True)
            for pool in (False, True) for batch in (64, 256, 1 << 20)} - {None}
    tables = [_outcome(str(path), on, pool, batch) for on in (False, True) for pool in (False, True)
              for batch in (64, 256, 1 << 20)]
    assert seen == {("bool", first_has_dims)}
    assert all(t == tables[0] for t in tables)


# ---- nesting: the oracle's limit moves with the caller's stack -------------------------------------------
@pytest.mark.parametrize("depth", [200, 600, 990, 1200, 100_000])
@pytest.mark.parametrize("where", ["args", "unread", "dims"])
def test_deep_nesting_native_refuses(depth, where):
    """msgspec counts nesting against the interpreter's recursion limit, frames already on the stack included, so
    whether a deep run decodes depends on who calls: the native path must not answer there (it answers None below
    any depth Python could give up at; see /work/b32 finding F2)."""
    deep = b"[" * depth + b"]" * depth
    data = {"args": b'[{"ph":"X","cat":"kernel","args":{"x":' + deep + b'}}]',
            "unread": b'[{"ph":"B","foo":' + deep + b'}]',
            "dims": b'[{"ph":"X","name":"aten::mm","args":{"Input Dims":' + deep + b'}}]'}[where]
    if depth < 300:  # (well within any caller's stack: the two agree)
        check(data)
    else:
        reduce_run(data)  # never raises
        assert native.reduce_native(data) is None


def test_deep_ranks_string_is_no_traceback():
    """Group ranks written as a string nested past json's depth: unknown ranks, not a traceback (finding F1)."""
    data = (b'[{"ph":"X","cat":"kernel","args":{"Collective name":"a","Process Group Ranks":"' + b"[" * 100_000 +
            b'"}}]')
    check(data)



def test_comm_range_with_op_args_of_the_wrong_shape_records_no_sizes(tmp_path, native_state):
    """A nccl:* range whose Concrete Inputs or Sequence number is of the wrong type records no tensor sizes, on
    both paths (the shaped ops' args were split off their decoder; the ranges kept its rules)."""
    from tracekit import X, table

    ev = [X("ProfilerStep#1", 0, 1000, cat="user_annotation"),
          X("nccl:all_reduce", 100, 50, Input_Dims=[[1024]], Input_type=["float"], Concrete_Inputs=7),
          X("nccl:all_reduce", 300, 50, Input_Dims=[[1024]], Input_type=["float"], Sequence_number="x"),
          X("nccl:all_reduce", 500, 50, Input_Dims=[[1024]], Input_type=["float"])]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    for on in (True, False):
        native.use(on)
        assert sorted(table(path).range_comm_args) == [3]
