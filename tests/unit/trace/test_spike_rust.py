"""The decoder spike's Rust scanner (benchmarks/spike_rust, issue 24): it agrees with msgspec + Columns on real
traces, and whatever the bytes it answers with a status, never a crash (it parses untrusted input).

Skipped without cargo. The crate is built once per module in debug (integer overflow checks on: an overflow is a
panic, which the scanner turns into status 3 and the fuzz rejects).
"""

import gzip
import importlib.util
import json
import os
import shutil

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracekit import TRACES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
pytestmark = pytest.mark.skipif(shutil.which("cargo") is None, reason="no cargo: the Rust scanner is not built")


@pytest.fixture(scope="module")
def spike(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("spike_columns", os.path.join(ROOT, "benchmarks", "spike_columns.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = mod.build_rust(str(tmp_path_factory.mktemp("spike-target")), release=False)
    assert path is not None, "cargo is here but the crate did not build"
    return mod, mod.load_rust(path)


REAL = [os.path.join(TRACES, p) for p in (
    "distprof-h100/ddp-gloo-cuda-slow-rank1/trainer/rank00001/step00000003-00000006.pt.trace.json.gz",  # gloo comm
    "distprof-h100/gpt2-bf16-shapes-step4/trainer/rank00000/step00000004-00000006.pt.trace.json.gz",  # shapes
    "hta/amd_mi250_rocm.json.gz",
)]


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.split("/")[-4 if "distprof-h100" in p else -1])
def test_rust_columns_match_msgspec(spike, path):
    mod, lib = spike
    with gzip.open(path, "rb") as f:
        data = f.read()
    ref, got = mod.decode_msgspec(data, reduce=True), mod.rust_cols(lib, data)
    assert len(ref.ts) > 0
    assert [ref.names[i] for i in ref.name] == [got.names[i] for i in got.name]
    assert np.array_equal(ref.ts, got.ts) and np.array_equal(ref.dur, got.dur)
    assert np.array_equal(ref.kind, got.kind)
    assert [ref.tracks[i] for i in ref.track] == [got.tracks[i] for i in got.track]
    assert np.array_equal(ref.corr, got.corr) and np.array_equal(ref.ext, got.ext)
    assert ref.thread_names == got.thread_names
    assert ref.meta == got.meta
    assert {k: v[0] for k, v in ref.shapes.items()} == got.shapes
    a, b = {}, {}
    mod.fingerprint(ref, a)
    mod.fingerprint(got, b)
    assert mod.compare(a, b) == "yes"


def test_rust_escapes_and_bad_ids(spike):
    """Escaped keys and names, ids that are not int64, string pids, thread names: as msgspec reads them."""
    mod, lib = spike
    evs = [{"ph": "X", "cat": "kernel", "name": "a\"b\u00e9", "pid": "host", "tid": 7, "ts": 1.5, "dur": 2,
            "args": {"correlation": 2**64, "External id": 3.5, "stream": 7}},
           {"ph": "M", "name": "thread_name", "pid": "host", "tid": 7, "args": {"name": "main"}},
           {"ph": "X", "cat": "cuda_runtime", "name": "a\"b\u00e9", "pid": "host", "tid": 7, "ts": 1e3, "dur": 0.25,
            "args": {"correlation": 9, "External id": -4}}]
    data = json.dumps({"traceEvents": evs}).replace('"ph"', '"\\u0070h"').encode()
    ref, got = mod.decode_msgspec(data, reduce=True), mod.rust_cols(lib, data)
    assert got.names == ref.names == ['a"b\u00e9'] and list(got.ts) == [1.5, 1000.0]
    assert list(got.corr) == list(ref.corr) and list(got.ext) == list(ref.ext)
    assert got.tracks == ref.tracks and got.thread_names == ref.thread_names == {("host", 7): "main"}


def _small() -> bytes:
    evs = [{"ph": "X", "cat": ("kernel", "cpu_op")[i % 2], "name": f"op{i % 3}", "pid": 0, "tid": i % 2,
            "ts": 10.25 * i, "dur": 5, "args": {"correlation": i, "Input Dims": [[i, 2], []], "note": "}, {\"ph\": ]"}}
           for i in range(6)]
    evs.insert(2, {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "main"}})
    return json.dumps({"schemaVersion": 1, "traceEvents": evs, "baseTimeNanoseconds": 5}).encode()


SMALL = _small()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(
    st.tuples(st.integers(0, len(SMALL)), st.integers(0, 8), st.binary(max_size=8)).map(
        lambda t: SMALL[:t[0]] + t[2] + SMALL[t[0] + t[1]:]),  # a span replaced by random bytes
    st.integers(0, len(SMALL)).map(lambda n: SMALL[:n]),  # cut anywhere
    st.binary(max_size=64),
    st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.integers() | st.text(),
                 lambda c: st.lists(c) | st.dictionaries(st.text(), c), max_leaves=20).map(
        lambda v: json.dumps({"traceEvents": [v, {"ph": "X", "args": v}]}).encode()),
))
def test_rust_scanner_fuzz(spike, data):
    """Never a crash or an internal error; malformed JSON (msgspec's verdict) is refused; a valid document with an
    events list is read, with columns of one length."""
    mod, lib = spike
    s = mod.RustScan(lib, data)
    assert s.status in (0, 1, 2)
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError):
        assert s.status != 0
        return
    if isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list):
        assert s.status == 0
        n = len(s.ts)
        assert all(len(getattr(s, c)) == n for c in ("dur", "name", "cat", "track", "corr", "ext", "stream", "flag"))
        assert s.events == len(doc["traceEvents"])
        assert len(s.str_off) >= 1 and int(s.str_off[-1]) == len(s.str_blob)
        try:  # where msgspec reads every event, the columns are the same (differential)
            ref = mod.decode_msgspec(data, reduce=True)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return
        a, b = {}, {}
        mod.fingerprint(ref, a)
        mod.fingerprint(mod.rust_cols(lib, data), b)
        assert mod.compare(a, b) == "yes"
