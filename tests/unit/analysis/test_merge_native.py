"""merge with the native decoder against merge with its own decoding of every event (the decoder off). Pass 1
(``native.merge_run`` reads the runs of the events list): the same clock, names, threads, steps and lanes. Pass 2
(``native.merge_rewrite`` writes them): the same merged bytes and result. On every trace in tests/data cut into
many runs, on hypothesis-built files of odd events (merge's own checks: a timed event's ``ts`` or any event's
``tid`` of the wrong type, an empty ``ph``, string and negative flow ids, ``id2``, escapes, nulls, times beyond
what is written exactly), and with the native path really answering on real traces (a scanner that always
declines fails here)."""

import functools
import gzip
import os
import tempfile
from dataclasses import asdict

import msgspec
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
    if native.available():  # (require_built: it is wherever cargo is)
        assert answered and all(answered), f"the native path declined {answered.count(False)} of {len(answered)} runs"


def _merged(run: str, out: str, on: bool, steps: bool = False):
    """The merged file's bytes and merge's result (or its error), the decoder on or off."""
    prev = native.use(on)
    try:
        got = merge_traces(run, out, workers=1, selection=Selection(steps=[2, 3]) if steps else None)
    except TraceError as e:
        return ("error", str(e).replace(out, "OUT"))
    finally:
        native.use(prev)
    got.pop("out")
    with open(out, "rb") as f:
        data = gzip.decompress(f.read()) if out.endswith(".gz") else f.read()
    return data, value(got)


@pytest.mark.parametrize("run", RUNS, ids=os.path.basename)
def test_every_trace_merges_to_the_same_bytes_with_the_decoder_on_and_off(run, tmp_path, monkeypatch):
    require_built()
    _small_batches(monkeypatch, 1 << 14)
    answered = []
    orig = native.merge_rewrite
    monkeypatch.setattr(native, "merge_rewrite", lambda *a: answered.append(orig(*a) is not None) or orig(*a))
    for name in ("a.json", "b.json.gz"):
        assert _merged(run, str(tmp_path / f"on-{name}"), True) == _merged(run, str(tmp_path / f"off-{name}"), False)
    if native.available():  # (require_built: it is wherever cargo is)
        assert answered and all(answered), f"the native path declined {answered.count(False)} of {len(answered)} runs"
    steps = [_merged(run, str(tmp_path / f"{on}-steps.json"), on, steps=True) for on in (True, False)]
    assert steps[0] == steps[1]


_MERGE_ODD = st.sampled_from([
    b'{"ph":"s","ts":"5","tid":1}', b'{"ph":"f","ts":1e16}', b'{"ph":"P","tid":1.5}', b'{"ph":"B","tid":true}',
    b'{"ph":"","ts":1}', b'{"ph":"C","ts":-7.25,"tid":2}', b'{"ph":"i","tid":99999,"ts":0}',
    b'{"ph":"M","name":"process_name","pid":3,"args":{"name":"w"}}', b'{"ph":"M","name":"thread_name","tid":"t",'
    b'"args":{"name":1}}', b'{"ph":"X","name":"ProfilerStep#2","ts":3,"dur":4,"tid":7}',
    b'{"ph":"X","ts":1,"dur":10,"tid":7},{"ph":"X","ts":5,"dur":10,"tid":7}',
    b'{"ph":"s","id":"0x1f","ts":2,"bp":"e"}', b'{"ph":"f","id":-3,"ts":2}', b'{"ph":"t","id":7,"bind_id":9,"ts":2.5}',
    b'{"ph":"X","name":"a\\"b","ts":1}', b'{"ph":"X","ts":1,"id2":{"global":"x"}}', b'{"ph":"X","ts":1,"tts":2.5}',
    b'{"ph":"X","ts":1,"tts":null,"s":null,"cname":"good","sf":3,"esf":"e","stack":[1, 2],"flow_in":true}',
    b'{"ph":"X","ts":9e15,"dur":0.0004}', b'{"ph":"i","ts":1.0005,"dur":0}', b'{"ph":"M","name":"process_name",'
    b'"args":"x"}', b'{"ph":"M","name":"process_name","pid":"w","dur":2,"args":{"name":"\\u00e9"}}',
    b'{"ph":"X","ts":-0.0,"dur":-0.0,"pid":-0,"tid":-0}', b'{"ph":"X","ts":12,"unknown":{"a":[1]},"cat":""}',
    b'{"ph":"s","ts":1,"bp":"","s":"","scope":"","cname":""}'])  # (None defaults: "" is written)


@st.composite
def odd_file(draw) -> bytes:
    """An events list of well-typed and hostile runs with merge's own odd events among them."""
    runs = draw(st.lists(st.one_of(typed_run(), typed_run(), hostile_run()), min_size=1, max_size=5))
    inner = [r.strip()[1:-1] for r in runs if r.strip().startswith(b"[") and r.strip().endswith(b"]")]
    inner += draw(st.lists(_MERGE_ODD, max_size=4))
    order = draw(st.permutations(range(len(inner))))
    return b'{"traceEvents": [' + b",".join(inner[i] for i in order if inner[i].strip()) + \
        b'], "baseTimeNanoseconds": 5}'


def _write_odd(folder: str, doc: bytes, gz: bool, cut: float | None) -> None:
    """One odd file as rank 0's trace in ``folder`` (gzipped or not), cut at the fraction ``cut`` of its bytes."""
    doc = doc if cut is None else doc[:int(len(doc) * cut)]
    path = os.path.join(folder, "rank0.pt.trace.json" + (".gz" if gz else ""))
    with (functools.partial(gzip.open, compresslevel=1) if gz else open)(path, "wb") as fh:
        fh.write(doc)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(doc=odd_file(), gz=st.booleans(), cut=st.one_of(st.none(), st.floats(0, 1)), steps=st.booleans())
def test_odd_files_scan_the_same_with_the_decoder_on_and_off(doc, gz, cut, steps, monkeypatch):
    _small_batches(monkeypatch, 128)
    with tempfile.TemporaryDirectory() as d:
        _write_odd(d, doc, gz, cut)
        [f] = find_traces(d)
        assert _scan(f, True, steps) == _scan(f, False, steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(doc=odd_file(), gz=st.booleans(), cut=st.one_of(st.none(), st.floats(0, 1)), steps=st.booleans())
def test_odd_files_merge_to_the_same_bytes_with_the_decoder_on_and_off(doc, gz, cut, steps, monkeypatch):
    _small_batches(monkeypatch, 128)
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, "run"))
        _write_odd(os.path.join(d, "run"), doc, gz, cut)
        on = _merged(os.path.join(d, "run"), os.path.join(d, "on.json"), True, steps)
        off = _merged(os.path.join(d, "run"), os.path.join(d, "off.json"), False, steps)
        assert on == off


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.floats(-9e15, 9e15, allow_nan=False), st.floats(-1e4, 1e4, allow_nan=False),
                                    st.integers(-9 * 10**15, 9 * 10**15)),
                          st.one_of(st.floats(0, 9e15, allow_nan=False), st.floats(0, 10, allow_nan=False))),
                min_size=1, max_size=20),
       st.floats(-1e7, 1e7, allow_nan=False), st.integers(-10**13, 10**13))
def test_times_are_written_as_msgspec_writes_them(times, first, start_ns):
    """Each event's ts and dur as the native rewrite writes them, against Python's rule encoded by msgspec (or the
    native path declines: beyond 2^43 µs a double no longer holds every ns apart)."""
    require_built()
    from distprof.analysis.merge import _FileWriter, _Out
    from distprof.analysis.merge_scan import _Scan

    run = b"[" + b",".join(b'{"ph":"X","ts":%r,"dur":%r}' % (t, d) for t, d in times) + b"]"
    got = native.merge_rewrite(run, first, start_ns, 0, lambda pids: [0] * len(pids), lambda rows: [])
    scan = _Scan(None, None, None, 0.0, first, first + start_ns / 1000.0)  # type: ignore[arg-type]
    w = _FileWriter(scan, 0.0)
    w.start_ns = start_ns
    events = msgspec.json.decode(run, type=list[_Out])
    w.fix(events)
    if got is not None:
        assert got == (msgspec.json.encode(events)[1:-1], len(times))
