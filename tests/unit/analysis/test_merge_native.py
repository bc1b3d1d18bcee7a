"""merge's pass 1 with the native decoder (``native.merge_run`` reads the runs of the events list) against its own
decoding of every event (the decoder off): the same clock, names, threads, steps and lanes on every trace in
tests/data, cut into many runs, and on hypothesis-built files of odd events (merge's own checks: a timed event's
``ts`` or any event's ``tid`` of the wrong type, an empty ``ph``); the same merged bytes; and the native path
really answering on real traces (a scanner that always declines fails here)."""

import functools
import gzip
import os
import tempfile
from dataclasses import asdict

import pytest
from conftest import DATA
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nativekit import hostile_run, require_built, typed_run, value

from distprof.analysis import merge_scan
from distprof.analysis.merge import merge_traces
from distprof.trace import native
from distprof.trace.listing import find_traces
from distprof.trace.reader import TraceStream
from distprof.trace.selection import Selection
from distprof.trace.source import TraceError

RUNS = [os.path.join(DATA, "dlrm-8rank-v100"), os.path.join(DATA, "hta", "two-rank-sampled"),
        *sorted(os.path.join(DATA, "distprof-h100", d) for d in os.listdir(os.path.join(DATA, "distprof-h100")))]


def _small_batches(monkeypatch, batch: int) -> None:
    """The reader cuts every file into runs of about ``batch`` bytes (many runs per test file)."""
    def stream(f, on_read, lean, decoders):
        return TraceStream(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window, on_read=on_read,
                           lean=lean, decoders=decoders, batch_bytes=batch)
    monkeypatch.setattr(merge_scan, "_stream", stream)


def _scan(f, on: bool, steps: bool = False):
    """Pass 1 of one file, the decoder on or off: its fields (typed: 1 and 1.0 differ), or the error."""
    prev = native.use(on)
    try:
        scan = merge_scan._scan(f, selection=Selection(steps=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]) if steps else Selection())
    except TraceError as e:
        return ("error", str(e))
    finally:
        native.use(prev)
    fields = asdict(scan)
    fields.pop("file")
    return value(fields)


@pytest.mark.parametrize("run", RUNS, ids=os.path.basename)
def test_every_trace_scans_the_same_with_the_decoder_on_and_off(run, monkeypatch):
    require_built()
    _small_batches(monkeypatch, 1 << 14)
    answered = []
    orig = native.merge_run
    monkeypatch.setattr(native, "merge_run", lambda d: answered.append(orig(d) is not None) or orig(d))
    for f in find_traces(run):
        for steps in (False, True):
            assert _scan(f, True, steps) == _scan(f, False, steps), f.path
    assert answered and all(answered), f"the native path declined {answered.count(False)} of {len(answered)} runs"


def test_the_merged_file_is_the_same_with_the_decoder_on_and_off(tmp_path):
    run = os.path.join(DATA, "dlrm-8rank-v100")
    out = {}
    for on in (True, False):
        prev = native.use(on)
        try:
            merge_traces(run, str(tmp_path / f"{on}.json"), workers=1)
        finally:
            native.use(prev)
        out[on] = (tmp_path / f"{on}.json").read_bytes()
    assert out[True] == out[False]


_MERGE_ODD = st.sampled_from([
    b'{"ph":"s","ts":"5","tid":1}', b'{"ph":"f","ts":1e16}', b'{"ph":"P","tid":1.5}', b'{"ph":"B","tid":true}',
    b'{"ph":"","ts":1}', b'{"ph":"C","ts":-7.25,"tid":2}', b'{"ph":"i","tid":99999,"ts":0}',
    b'{"ph":"M","name":"process_name","pid":3,"args":{"name":"w"}}', b'{"ph":"M","name":"thread_name","tid":"t",'
    b'"args":{"name":1}}', b'{"ph":"X","name":"ProfilerStep#2","ts":3,"dur":4,"tid":7}',
    b'{"ph":"X","ts":1,"dur":10,"tid":7},{"ph":"X","ts":5,"dur":10,"tid":7}'])


@st.composite
def odd_file(draw) -> bytes:
    """An events list of well-typed and hostile runs with merge's own odd events among them."""
    runs = draw(st.lists(st.one_of(typed_run(), typed_run(), hostile_run()), min_size=1, max_size=5))
    inner = [r.strip()[1:-1] for r in runs if r.strip().startswith(b"[") and r.strip().endswith(b"]")]
    inner += draw(st.lists(_MERGE_ODD, max_size=4))
    order = draw(st.permutations(range(len(inner))))
    return b'{"traceEvents": [' + b",".join(inner[i] for i in order if inner[i].strip()) + \
        b'], "baseTimeNanoseconds": 5}'


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(doc=odd_file(), gz=st.booleans(), cut=st.one_of(st.none(), st.floats(0, 1)), steps=st.booleans())
def test_odd_files_scan_the_same_with_the_decoder_on_and_off(doc, gz, cut, steps, monkeypatch):
    _small_batches(monkeypatch, 128)
    doc = doc if cut is None else doc[:int(len(doc) * cut)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "rank0.pt.trace.json" + (".gz" if gz else ""))
        with (functools.partial(gzip.open, compresslevel=1) if gz else open)(path, "wb") as fh:
            fh.write(doc)
        [f] = find_traces(d)
        assert _scan(f, True, steps) == _scan(f, False, steps)
