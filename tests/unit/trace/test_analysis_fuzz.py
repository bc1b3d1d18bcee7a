"""Fuzzing the trace reader: whatever the bytes, reading yields events or raises TraceError, and never hangs.

Real inputs: a real Kineto trace from tests/data (cut at every offset, plain and gzipped) and a small trace in
its format (mutated by hypothesis). Small ``batch_bytes`` make every boundary search and fallback run.
"""

import gzip
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracekit import TRACES, X

from distprof.trace.reader import Complete, Meta, TraceError, TraceStream

CPU_ONLY = os.path.join(TRACES, "hta", "cpu_only_rank-34.pt.trace.json.gz")
_FIXTURE_OK = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


def _small() -> bytes:
    """A small trace in Kineto's layout: keys before the events, events with nested args, keys after them."""
    events = [X(f"op{i}", 10 * i, 5, cat=("kernel", "cpu_op")[i % 2], pid=0, tid=i % 3, correlation=i,
                shape=[[i, 2], [3]], note="}, {\"ph\": ]") for i in range(8)]
    events.insert(3, {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "main"}})
    doc = {"schemaVersion": 1, "distributedInfo": {"rank": 1, "world_size": 2}, "traceEvents": events,
           "traceName": "x.json", "baseTimeNanoseconds": 5000}
    return json.dumps(doc, indent=1).encode()


SMALL = _small()


def _key(e):
    return (e.ph, e.name, e.cat, e.pid, e.tid, e.ts, e.dur, bytes(e.args))


def _read(path, batch):
    """The events read, with the report; or None when the reader refused the file with a TraceError (the only
    exception allowed)."""
    s = TraceStream(str(path), batch_bytes=batch)
    try:
        return [_key(e) for b in s.batches() for e in b], s.report
    except TraceError as e:
        assert str(e).startswith(str(path)) and "\n" not in str(e)
        return None


@pytest.fixture(scope="module")
def small_events(tmp_path_factory):
    p = tmp_path_factory.mktemp("small") / "t.json"
    p.write_bytes(SMALL)
    events, report = _read(p, 1 << 20)
    assert len(events) == 9 and not report.salvaged
    return events


@settings(max_examples=400, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(data=st.binary(max_size=400), gz=st.booleans(), batch=st.integers(1, 128))
def test_random_bytes_give_events_or_a_trace_error(tmp_path, data, gz, batch):
    p = tmp_path / "r.json"
    p.write_bytes(gzip.compress(data) if gz else data)
    _read(p, batch)


_edit = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.sampled_from([b"{", b"}", b"[", b"]", b",", b'"', b"\\",
                                                                         b"\xff", b"NaN", b"1e999", b" " * 50])),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 40)),
)


def _mutate(data: bytes, edits) -> bytes:
    b = bytearray(data)
    for kind, at, arg in edits:
        at %= len(b) + 1
        if kind == "flip" and at < len(b):
            b[at] ^= 1 << arg
        elif kind == "insert":
            b[at:at] = arg
        elif kind == "delete":
            del b[at:at + arg]
    return bytes(b)


@settings(max_examples=600, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(edits=st.lists(_edit, min_size=1, max_size=4), gz=st.sampled_from(["no", "before", "after"]),
       batch=st.integers(8, 512))
@pytest.mark.slow
def test_mutated_traces_give_events_or_a_trace_error(tmp_path, small_events, edits, gz, batch):
    # Mutate the JSON (then maybe gzip it), or mutate the gzip stream itself.
    data = _mutate(SMALL, edits) if gz != "after" else _mutate(gzip.compress(SMALL), edits)
    p = tmp_path / "m.json"
    p.write_bytes(gzip.compress(data) if gz == "before" else data)
    got = _read(p, batch)
    if got is not None and gz != "after" and all(k == "flip" for k, *_ in edits):
        events, report = got
        assert len(events) + report.events_skipped <= len(small_events) + 1  # a flip cannot conjure events


def _both(path, batch):
    """The full and the lean stream of one file: (complete events, metadata events, event count, report) each, or
    None when refused. A lean stream keeps exactly the complete and metadata events (the class is the phase)."""
    out = []
    for lean in (False, True):
        s = TraceStream(str(path), batch_bytes=batch, lean=lean)
        try:
            evs = [e for b in s.batches() for e in b]
        except TraceError:
            out.append(None)
            continue
        x = [(e.name, e.cat, e.pid, e.tid, e.ts, e.dur, bytes(e.args)) for e in evs
             if (type(e) is Complete if lean else e.ph == "X")]
        m = [(e.name, e.pid, e.tid, bytes(e.args)) for e in evs if (type(e) is Meta if lean else e.ph == "M")]
        out.append((x, m, len(evs), s.report.to_dict()))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(edits=st.lists(_edit, min_size=1, max_size=4), batch=st.integers(8, 512),
       phase=st.sampled_from([None, "Q", "", "X", "f"]))
@pytest.mark.slow
def test_a_lean_stream_reads_what_a_full_one_does(tmp_path, edits, batch, phase):
    """Whatever the damage, the lean stream (what analyses read) keeps every complete and metadata event the
    full stream keeps, in order; it may keep more, but only events the full stream skipped for a field the lean
    one does not read (``"s": 5`` on a complete event), one for one. An event of an odd phase, or of none, is an
    event in both."""
    doc = json.loads(SMALL)
    odd = {"name": "odd", "ts": 3, "dur": 1}
    if phase is not None:
        odd["ph"] = phase
    doc["traceEvents"].insert(2, odd)
    p = tmp_path / "l.json"
    p.write_bytes(_mutate(json.dumps(doc).encode(), edits))
    full, lean = _both(p, batch)
    if full is None:
        return
    assert lean is not None
    (fx, fm, fn, fr), (lx, lm, ln, lr) = full, lean
    assert _subsequence(fx, lx) and _subsequence(fm, lm)
    assert ln - fn == fr["events_skipped"] - lr["events_skipped"] >= 0
    assert (lr["truncated"], lr["bytes_unread"]) == (fr["truncated"], fr["bytes_unread"])


def _subsequence(a, b):
    it = iter(b)
    return all(any(x == y for y in it) for x in a)


@settings(max_examples=300, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(cut=st.integers(0, len(SMALL)), gz=st.booleans(), batch=st.integers(8, 512))
def test_a_truncated_trace_yields_a_prefix_of_its_events(tmp_path, small_events, cut, gz, batch):
    p = tmp_path / "c.json"
    p.write_bytes(gzip.compress(SMALL[:cut]) if gz else SMALL[:cut])
    got = _read(p, batch)
    if got is None:
        return
    events, report = got
    assert events == small_events[:len(events)] and report.events_skipped == 0
    assert report.truncated == (cut < len(SMALL.rstrip()))


def _real():
    raw = gzip.open(CPU_ONLY).read()
    text = raw.decode()
    _, end = json.JSONDecoder().raw_decode(text, text.index("[", text.index('"traceEvents"')))
    return raw, end


@pytest.mark.slow
def test_a_real_trace_cut_at_every_offset(tmp_path):
    raw, array_end = _real()  # raw[array_end - 1] is the "]" closing traceEvents; keys follow it
    closed = len(raw.rstrip())  # the document's last "}" ends here
    p = tmp_path / "cut.json"
    p.write_bytes(raw)
    full, report = _read(p, 1 << 12)
    assert len(full) == 30 and not report.salvaged
    # Every byte around the events list's end and through the keys after it; every 3rd byte before.
    offsets = sorted(set(range(0, array_end - 2000, 3)) | set(range(array_end - 2000, len(raw) + 1)))
    refused = 0
    for cut in offsets:
        p.write_bytes(raw[:cut])
        got = _read(p, 1 << 11)
        if got is None:
            refused += 1
            assert cut < array_end  # a cut after the events list always keeps them all
            continue
        events, report = got
        assert events == full[:len(events)] and report.events_skipped == 0, cut
        assert report.truncated == (cut < closed), cut
        if cut >= array_end:
            assert events == full, cut
    assert 0 < refused < len(offsets)


def test_a_real_gzip_trace_cut_at_every_nth_byte(tmp_path):
    raw, _ = _real()
    gz = gzip.compress(raw)
    full = _read(CPU_ONLY, 1 << 12)[0]
    p = tmp_path / "cut.json.gz"
    kept = []
    for cut in range(0, len(gz), 7):
        p.write_bytes(gz[:cut])
        got = _read(p, 1 << 11)
        if got is not None:
            events, report = got
            assert events == full[:len(events)] and report.salvaged, cut  # a cut gzip stream is always noted
            kept.append(len(events))
    assert kept == sorted(kept) and kept[-1] >= 25  # more of the file, more of its events


@settings(max_examples=100, deadline=None, suppress_health_check=_FIXTURE_OK)
@given(splits=st.lists(st.integers(0, len(SMALL)), max_size=5), tail=st.sampled_from([b"", b"\0\0\0", b"junk"]),
       batch=st.integers(8, 512))
def test_gzip_members_split_anywhere_read_whole(tmp_path, small_events, splits, tail, batch):
    cuts = [0, *sorted(splits), len(SMALL)]
    p = tmp_path / "g.json.gz"
    p.write_bytes(b"".join(gzip.compress(SMALL[a:b]) for a, b in zip(cuts, cuts[1:])) + tail)
    events, report = _read(p, batch)
    assert events == small_events and not report.salvaged


@pytest.mark.parametrize("name", ["dlrm-8rank-v100/worker7_step_12.1694128201553.pt.trace.json.gz",
                                  "hta/nccl_data.json.gz", "hta/amd_mi250_rocm.json.gz", "hta/trace-diff/test.json.gz"])
def test_a_lean_stream_of_a_real_trace_is_the_full_one_minus_unread_phases(name):
    full, lean = _both(os.path.join(TRACES, name), 1 << 20)
    assert full == lean and len(full[0]) > 100
