"""The streaming reader: batches cut at event boundaries whatever the events contain, header and trailer keys."""

import gzip
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from distprof.analysis.reader import TraceStream, read_trace

# Names and args full of the bytes a boundary search could trip on: braces, brackets, commas, quotes.
_tricky = st.lists(st.sampled_from(list('ab}{][,:" \\\n') + ["é", "},", "}, {", "]}"]), max_size=8).map("".join)
_args = st.recursive(st.one_of(st.integers(-5, 5), _tricky, st.none()),
                     lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_tricky, inner, max_size=3)),
                     max_leaves=6)
_event = st.fixed_dictionaries({"ph": st.sampled_from(["X", "i", "M", "s", "f"]), "name": _tricky,
                                "ts": st.integers(0, 10**6), "dur": st.integers(0, 1000)},
                               optional={"args": st.dictionaries(_tricky, _args, max_size=3), "cat": _tricky})


@settings(max_examples=60)
@given(events=st.lists(_event, max_size=40), indent=st.sampled_from([None, 1]), form=st.sampled_from(["object", "list"]),
       batch=st.integers(16, 600), gz=st.booleans())
def test_stream_yields_every_event_in_order(tmp_path_factory, events, indent, form, batch, gz):
    if form == "object":
        # Kineto puts some keys before the array and some (baseTimeNanoseconds) after it.
        doc = {"schemaVersion": 1, "distributedInfo": {"rank": 3, "note": "}, {"}, "traceEvents": events,
               "deviceProperties": [{"id": 0, "name": "x"}, {"id": 1}], "baseTimeNanoseconds": 2_000_000}
    else:
        doc = events
    raw = json.dumps(doc, indent=indent).encode()
    p = tmp_path_factory.mktemp("t") / ("trace.json.gz" if gz else "trace.json")
    p.write_bytes(gzip.compress(raw) if gz else raw)
    s = TraceStream(str(p), batch_bytes=batch)
    got = [(e.ph, e.name, e.ts, e.dur, json.loads(bytes(e.args)) if e.args else None)
           for b in s.batches() for e in b]
    assert got == [(e["ph"], e["name"], e["ts"], e["dur"], e.get("args")) for e in events]
    assert s.event_count == len(events) and not s.salvaged
    if form == "object":
        assert s.rank == 3 and s.offset_us == 2000.0 and [d["id"] for d in s.device_properties] == [0, 1]


def test_big_trace_is_read_in_bounded_batches(tmp_path):
    events = [{"ph": "X", "cat": "kernel", "name": f"k{i}", "ts": i, "dur": 1, "args": {"a": {"b": [i]}}} for i in range(20000)]
    p = tmp_path / "rank-0.json"
    p.write_text(json.dumps({"traceEvents": events}))
    s = TraceStream(str(p), batch_bytes=64 << 10)
    sizes = [len(b) for b in s.batches()]
    assert sum(sizes) == 20000
    assert len(sizes) > 10 and max(sizes) < 20000 // 5  # never the whole file at once
    assert read_trace(str(p)).events[-1].name == "k19999"


def test_truncated_mid_stream_keeps_every_complete_event(tmp_path):
    events = [{"ph": "X", "name": f"k{i}", "ts": i, "dur": 1, "args": {"x": "}, {"}} for i in range(3000)]
    raw = json.dumps({"traceEvents": events}).encode()
    p = tmp_path / "cut.json"
    cut = raw.index(b'"k2500"')  # inside event 2500
    p.write_bytes(raw[:cut])
    s = TraceStream(str(p), batch_bytes=4096)
    names = [e.name for b in s.batches() for e in b]
    assert names == [f"k{i}" for i in range(2500)] and s.salvaged
