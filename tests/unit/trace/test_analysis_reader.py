"""The streaming reader: batches cut at event boundaries whatever the events contain, header and trailer keys."""

import gzip
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distprof.trace.reader import TraceStream, read_trace

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


# ---- hostile input: every case ends in one TraceError line or a counted skip, never a traceback or a hang ----------
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import zlib  # noqa: E402

from helpers import PEAK_MB  # noqa: E402
from tracekit import DLRM, TRACES, X, cli, load, write  # noqa: E402

from distprof.analysis import find_traces  # noqa: E402
from distprof.trace.reader import TraceError, open_trace  # noqa: E402

CPU_ONLY = os.path.join(TRACES, "hta", "cpu_only_rank-34.pt.trace.json.gz")  # a real trace with keys after its events
DLRM_FILES = sorted(os.path.join(DLRM, n) for n in os.listdir(DLRM))


def _read(path, **kw):
    s = TraceStream(str(path), **kw)
    return [(e.ph, e.name, e.ts, e.dur, bytes(e.args)) for b in s.batches() for e in b], s


def _names(path, **kw):
    events, s = _read(path, **kw)
    return [e[1] for e in events], s


@pytest.mark.parametrize("doc, why", [
    (b"[[1, 2], [3]]", "none of the 2 elements of its event list is an event"),
    (b'[1, "x", null]', "none of the 3 elements"),
    (b"42", "the document is a number"),
    (b'"trace"', "the document is a string"),
    (b'{"otherEvents": []}', "an object without a traceEvents key"),
    (b'{"traceEvents": {"ph": "X"}}', "traceEvents is an object, expected a list of events"),
    (b'{"traceEvents": null}', "traceEvents is null"),
])
def test_valid_json_that_is_not_a_trace_is_named_so(tmp_path, doc, why):
    p = tmp_path / "rank-0.json"
    p.write_bytes(doc)
    with pytest.raises(TraceError) as e:
        read_trace(str(p))
    msg = str(e.value)
    assert msg.startswith(f"{p}: not a Chrome/Kineto trace") and why in msg and "not valid JSON" not in msg


def _real_trace():
    """A real Kineto trace and where its events list closes (keys follow it: INFO, traceName, ..., baseTimeNanoseconds)."""
    raw = gzip.open(CPU_ONLY).read()
    assert raw.isascii()
    text = raw.decode()
    start = text.index("[", text.index('"traceEvents"'))
    _, end = json.JSONDecoder().raw_decode(text, start)
    return raw, end  # raw[end - 1] is the list's "]"


@pytest.mark.parametrize("key", [b'"INFO"', b'"traceName"', b'"displayTimeUnit"', b'"baseTimeNanoseconds"'])
def test_a_file_cut_in_the_keys_after_the_events_keeps_every_event(tmp_path, key):
    raw, _ = _real_trace()
    full, whole = _read(CPU_ONLY)
    assert len(full) == 30 and whole.offset_us == 1719853884000000.0 and not whole.salvaged
    p = tmp_path / "cut.json"
    p.write_bytes(raw[: raw.index(key) + len(key) // 2])  # in the middle of the key's name
    got, s = _read(p, batch_bytes=1 << 12)
    assert got == full and s.report.truncated and s.report.bytes_unread > 0 and s.salvaged
    assert s.offset_us == 0.0  # baseTimeNanoseconds comes last: it is lost with the cut, and the note says so
    assert s.report.notes == ["file ends in the keys after the events"]
    p.write_bytes(raw.rstrip()[:-1])  # only the closing brace missing: the clock offset is whole and kept
    got, s = _read(p)
    assert got == full and s.report.truncated and s.offset_us == whole.offset_us


def test_invalid_utf8_skips_the_event_that_holds_it(tmp_path):
    body = [json.dumps(X(f"k{i}", i * 10, 5)).encode() for i in range(4)]
    bad_name = b'{"ph": "X", "name": "caf\xe9", "ts": 1, "dur": 1}'
    bad_args = b'{"ph": "X", "name": "a", "ts": 1, "dur": 1, "args": {"x": "\xff\xfe"}}'
    p = tmp_path / "rank-0.json"
    p.write_bytes(b'{"distributedInfo": {"rank": 3, "host": "h\xff"}, "traceEvents": ['
                  + b", ".join([body[0], bad_name, body[1], bad_args, body[2], body[3]]) + b"]}")
    for batch in (64, 1 << 20):
        names, s = _names(p, batch_bytes=batch)
        assert names == ["k0", "k1", "k2", "k3"] and s.report.events_skipped == 2 and not s.report.truncated
        assert "2 events skipped: invalid UTF-8" in s.report.notes
        assert "key distributedInfo ignored (invalid UTF-8)" in s.report.notes and s.rank == 0  # rank from the name


def test_one_undecodable_rank_does_not_kill_the_others(tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    for f in DLRM_FILES[:2]:
        shutil.copy(f, src)
    ev = [json.dumps(X(f"k{i}", i, 1)).encode() for i in range(3)]
    (src / "rank-8.json").write_bytes(b'{"traceEvents": [' + b", ".join(e.replace(b'"k', b'"\xff') for e in ev) + b"]}")
    (src / "rank-9.json").write_bytes(b'{"traceEvents": [' + b", ".join([ev[0], ev[1].replace(b'"k', b'"\xff'), ev[2]]) + b"]}")
    code, doc, err = cli("summary", src, "--json")
    assert code == 1 and doc["files_read"] == 3 and "Traceback" not in err
    assert [(e["path"], "invalid UTF-8" in e["message"]) for e in doc["errors"]] == [(str(src / "rank-8.json"), True)]
    assert [(s["path"], s["events_skipped"]) for s in doc["salvaged"]] == [(str(src / "rank-9.json"), 1)]
    assert {r["rank"] for r in doc["ranks"]} == {0, 1, 9} and doc["kernels"]  # the good ranks' figures are there
    code_text, _, err = cli("summary", src)
    assert code_text == 1 and "Traceback" not in err and "rank-8.json" in err and "invalid UTF-8" in err


BAD_FIELDS = [{"ts": "12"}, {"dur": None}, {"pid": [1]}, {"name": 5}, {"ts": 1e308}, {"dur": -1e16}, {"tid": 2**70},
              {"dur": -10}, {"ts": float("nan")}, {"dur": float("inf")}]


def test_events_that_do_not_fit_are_skipped_and_counted_and_the_rest_kept(tmp_path):
    events = [X(f"k{i}", i, 1) for i in range(3000)]
    for j, bad in enumerate(BAD_FIELDS):  # json.dumps writes NaN and Infinity literals for the last two
        events.insert(300 * (j + 1), {**X("bad", 1, 1), **bad})
    p = write(tmp_path / "rank-0.json", events)
    for batch in (4096, 1 << 22):
        names, s = _names(p, batch_bytes=batch)
        assert names == [f"k{i}" for i in range(3000)]
        r = s.report
        assert (r.truncated, r.events_skipped, r.bytes_unread, r.salvaged) == (False, len(BAD_FIELDS), 0, True)
        assert "1 event skipped: `ts`: expected `float`, got `str`" in r.notes
        # NaN and Infinity are not JSON: two places jumped over, one event each (their bytes counted).
        assert r.to_dict() == {"truncated": False, "events_skipped": 10, "bytes_unread": 0, "notes": r.notes,
                               "bytes_skipped": r.bytes_skipped, "events_lost_estimate": 2}
        assert 0 < r.bytes_skipped < 200 and any("skipped (2 places): about 2 events lost" in n for n in r.notes)
    # A time whose ns overflow int64 used to stop merge with an OverflowError.
    code, doc, err = cli("merge", p, "-o", tmp_path / "m.json", "--json")
    assert code == 0 and doc["events"] > 3000 and doc["salvaged"][0]["events_skipped"] == 10, err


def test_negative_durations_are_broken_events_not_negative_figures(tmp_path):
    events = [X("k", 0, -50, cat="kernel", pid=0, tid=7), X("op", 0, -10), X("ph", 0, -3, cat="user_annotation"),
              X("k", 10, 5, cat="kernel", pid=0, tid=7), X("op", 10, 5)]
    code, doc, _ = cli("summary", write(tmp_path / "rank-0.json", events), "--json")
    assert code == 0 and doc["salvaged"][0]["events_skipped"] == 3
    assert [(k["name"], k["total_us"], k["share"]) for k in doc["kernels"]] == [("k", 5.0, 1.0)]
    assert doc["ranks"][0]["temporal"]["device"]["span_us"] == 5.0


def test_deeply_nested_args_are_skipped_not_a_recursion_error(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    a, b = (json.dumps(X(n, t, 1, cat="kernel", pid=0, tid=7)).encode() for n, t in (("a", 1), ("b", 3)))
    p = tmp_path / "rank-0.json"
    p.write_bytes(b'{"distributedInfo": ' + deep + b', "traceEvents": [' + a
                  + b', {"ph": "X", "name": "deep", "ts": 2, "dur": 1, "cat": "kernel", "args": ' + deep + b"}, "
                  + b', {"ph": "X", "name": "deep2", "ts": 2, "id2": {"global": ' + deep + b"}}, " + b + b"]}")
    names, s = _names(p, batch_bytes=4096)
    assert names == ["a", "b"] and s.report.events_skipped == 2 and "2 events skipped: nested too deeply" in s.report.notes
    assert any(n.startswith("key distributedInfo ignored") for n in s.report.notes)
    for args in (("summary", p, "--json"), ("merge", p, "-o", tmp_path / "m.json")):
        code, _, err = cli(*args)
        assert code == 0 and "Traceback" not in err and "RecursionError" not in err, err


def test_concatenated_gzip_members_are_read_whole(tmp_path):
    raw = json.dumps({"distributedInfo": {"rank": 4}, "traceEvents": [X(f"k{i}", i, 1) for i in range(3000)],
                      "baseTimeNanoseconds": 7000}).encode()
    cuts = [0, 1, 9, 4095, 4097, len(raw) // 2, len(raw) - 3, len(raw)]  # inside tokens, next to batch edges
    members = [gzip.compress(raw[x:y]) for x, y in zip(cuts, cuts[1:])]
    members.insert(3, gzip.compress(b""))  # an empty member is legal too
    for tail in (b"", b"\0" * 64, b"not gzip at all"):
        p = tmp_path / "rank-4.json.gz"
        p.write_bytes(b"".join(members) + tail)
        names, s = _names(p, batch_bytes=1024)
        assert names == [f"k{i}" for i in range(3000)] and s.rank == 4 and s.offset_us == 7.0 and not s.salvaged


@pytest.mark.parametrize("head", [
    {"distributedInfo": {"rank": 2, "traceEvents": 1}},
    {"note": 'a "traceEvents": [ b', "distributedInfo": {"rank": 2}},
    {"x": {"traceEvents": [{"ph": "X", "name": "fake", "ts": 0}]}, "distributedInfo": {"rank": 2}},
])
def test_the_top_level_traceEvents_key_is_found_whatever_precedes_it(tmp_path, head):
    p = write(tmp_path / "t.json", [X(f"k{i}", i, 1) for i in range(50)], **head)
    names, s = _names(p, batch_bytes=64)
    assert names == [f"k{i}" for i in range(50)] and s.rank == 2 and not s.salvaged


_PEAK = """
import sys
from distprof.trace.reader import TraceError, TraceStream
try:
    s = TraceStream(sys.argv[1])
    print("events", sum(len(b) for b in s.batches()), s.report.to_dict())
except TraceError as e:
    print("error", e)
""" + PEAK_MB


def _bomb(path, head, filler, mb, tail=b""):
    """A gzip file that inflates to ``mb`` MB of ``filler`` between ``head`` and ``tail`` (a few hundred KB on disk)."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    block = filler * ((1 << 20) // len(filler))
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(mb):
            f.write(c.compress(block))
        f.write(c.compress(tail) + c.flush())
    return path


def _peak(path):
    """What reading ``path`` gave, and the reader's peak RSS in MB (a fresh process: its own peak)."""
    out = subprocess.run([sys.executable, "-c", _PEAK, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    *result, rss = out.stdout.strip().splitlines()
    return "\n".join(result), int(rss)


@pytest.mark.slow
def test_a_gzip_bomb_is_read_in_bounded_memory(tmp_path):
    ev = json.dumps(X("a", 1, 1)).encode()
    spaces = _bomb(tmp_path / "spaces.json.gz", b'{"traceEvents": [' + ev + b",", b" ", 300, ev + b"]}")
    nest = _bomb(tmp_path / "nest.json.gz", b'{"traceEvents": [', b"[", 300)
    assert os.path.getsize(spaces) < 1 << 20 and os.path.getsize(nest) < 1 << 20
    result, rss = _peak(spaces)  # 300 MB of whitespace between two events: dropped as it arrives
    assert result.startswith("events 2 ") and "'truncated': False" in result and rss < 250, (result, rss)
    result, rss = _peak(nest)  # no event boundary anywhere: refused at the search limit, not buffered
    assert result == f"error {nest}: no event boundary in the first 64 MB: not a trace" and rss < 600, (result, rss)
    code, _, err = cli("summary", nest)
    assert code == 2 and err.strip().count("\n") == 0 and "no event boundary" in err


def test_fifos_and_unlistable_folders_are_errors_not_hangs(tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    shutil.copy(DLRM_FILES[0], src / "rank-0.json.gz")
    fifo = src / "rank-1.json"
    os.mkfifo(fifo)
    # A folder no one can list. Tests run as root, whom chmod 000 does not stop: a symlink loop fails for root too.
    (src / "sub").symlink_to(src / "sub2")
    (src / "sub2").symlink_to(src / "sub")
    run = [sys.executable, "-m", "distprof.cli", "summary"]
    one = subprocess.run(run + [str(fifo)], capture_output=True, text=True, timeout=120)  # a hang fails here
    assert one.returncode == 2 and one.stderr.strip() == f"error: {fifo}: not a regular file (a FIFO)"
    both = subprocess.run(run + [str(src), "--json"], capture_output=True, text=True, timeout=120)
    doc = json.loads(both.stdout)
    assert both.returncode == 1 and doc["files_read"] == 1
    errors = {e["path"]: e["message"] for e in doc["errors"]}
    assert errors[str(fifo)] == f"{fifo}: not a regular file (a FIFO); not read"
    assert set(errors) == {str(fifo), str(src / "sub"), str(src / "sub2")}
    assert all("Too many levels of symbolic links" in errors[str(src / s)] for s in ("sub", "sub2"))
    with pytest.raises(TraceError, match="not a regular file"):
        list(open_trace(str(fifo)).batches())


def test_symlinks_that_leave_the_folder_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copy(DLRM_FILES[5], outside / "rank-5.json.gz")
    src = tmp_path / "in"
    (src / "deeper").mkdir(parents=True)
    shutil.copy(DLRM_FILES[1], src / "deeper" / "rank-1.json.gz")
    (src / "rank-5.json.gz").symlink_to(outside / "rank-5.json.gz")
    (src / "more").symlink_to(outside)
    (src / "deeper" / "up").symlink_to(src)  # inside the folder: followed, and walked only once
    problems = []
    files = find_traces(str(src), problems)
    assert [f.path for f in files] == [str(src / "deeper" / "rank-1.json.gz")]
    assert sorted((p.path, p.reason) for p in problems) == [(str(p), f"symlink points outside {src}; not followed")
                                for p in (src / "more", src / "rank-5.json.gz")]
    code, doc, err = cli("summary", src, "--json")
    assert code == 1 and doc["files_read"] == 1 and len(doc["errors"]) == 2
    code, doc, err = cli("merge", src, "-o", tmp_path / "m.json", "--json")
    assert code == 1 and doc["files"] == 1 and {e["path"] for e in doc["errors"]} == {str(src / "more"), str(src / "rank-5.json.gz")}


EV = [json.dumps(X(f"k{i}", i, 1)).encode() for i in range(3)]


@pytest.mark.parametrize("name, content, names, skipped", [
    ("bom.json", b"\xef\xbb\xbf" + b'{"traceEvents": [' + b",".join(EV) + b"]}", ["k0", "k1", "k2"], 0),
    ("nan.json", b'{"traceEvents": [' + EV[0] + b', {"ph": "X", "ts": NaN}, ' + EV[1] + b"]}", ["k0", "k1"], 1),
    ("quote.json", b'{"traceEvents": [' + EV[0] + b', {"ph": "X", "name": "say "hi"", "ts": 1}, ' + EV[1] + b"]}",
     ["k0", "k1"], 1),
    ("dup.json", b'{"traceEvents": [{"ph": "X", "name": "a", "name": "b", "ts": 1}]}', ["b"], 0),
    ("items.json", b'{"traceEvents": [1, "x", ' + EV[0] + b", [2], null, " + EV[1] + b"]}", ["k0", "k1"], 4),
    ("big.json", b'[{"ph": "X", "name": "' + b"n" * (5 << 20) + b'", "ts": 1}, ' + EV[0] + b"]", ["n" * (5 << 20), "k0"], 0),
    ("comma.json", b'{"traceEvents": [' + EV[0] + b",]}", ["k0"], 0),
])
def test_odd_but_readable_files(tmp_path, name, content, names, skipped):
    p = tmp_path / name
    p.write_bytes(content)
    got, s = _names(p, batch_bytes=1 << 16)
    assert got == names and s.report.events_skipped == skipped and not s.report.truncated


@pytest.mark.parametrize("name, content, words", [
    ("empty.json", b"", "empty file"),
    ("blank.json", b" \n\t ", "empty file"),
    ("empty.json.gz", gzip.compress(b"", mtime=0), "empty file"),
    ("plain.json.gz", b"plain text", "not JSON (starts with b'plain text')"),
    ("header.json.gz", gzip.compress(b"{}", mtime=0)[:6], "gzip stream ends before any data"),
    ("open.json", b'{"traceEvents": [', "cut off before its first complete event"),
    ("bad.json", b'{"a": nope, "traceEvents": []}', "not valid JSON (at byte "),
])
def test_unreadable_files_give_one_line(tmp_path, name, content, words):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(TraceError) as e:
        read_trace(str(p))
    assert str(e.value).startswith(f"{p}: ") and words in str(e.value) and "\n" not in str(e.value)


def test_a_folder_named_like_a_trace_is_a_folder(tmp_path):
    d = tmp_path / "x.json"
    d.mkdir()
    shutil.copy(DLRM_FILES[2], d / "rank-2.json.gz")
    assert [f.path for f in find_traces(str(tmp_path))] == [str(d / "rank-2.json.gz")]
    with pytest.raises(TraceError, match=r"not a regular file \(a directory\)"):
        list(open_trace(str(d)).batches())


def test_a_manifest_with_foreign_lines_is_not_trusted(tmp_path):
    rank_dir = tmp_path / "run" / "train" / "rank00000"
    rank_dir.mkdir(parents=True)
    write(rank_dir / "step00000002-00000003.pt.trace.json", [X("ProfilerStep#2", 0, 100, cat="user_annotation"),
                                                              X("aten::mm", 10, 5)])
    lines = [b"[1, 2]", b'"x"', b'{"files": [1, {"path": 5}]}', b'{"file": "step00000002-00000003.pt.trace.json",'
             b' "role": ["a"], "steps": ["a", "b"], "start_time": "x", "end_time": null}', b'{"torn": ']
    (rank_dir / "manifest.jsonl").write_bytes(b"\n".join(lines))
    (f,) = find_traces(str(tmp_path / "run"))
    assert f.manifest_rank == 0 and f.role == "train" and f.window is None  # no line of the right shape names it
    for verb in ("summary", "steps", "stragglers"):
        code, doc, err = cli(verb, tmp_path / "run", "--json")
        assert code == 0 and "Traceback" not in err, (verb, err)


HOSTILE = {
    "rank-0.json": b"[[1, 2], [3]]",
    "rank-1.json": b'{"traceEvents": [' + EV[0] + b', {"ph": "X", "ts": "12"}, {"ph": "X", "ts": 1e308}]}',
    "rank-2.json": b'{"traceEvents": [' + EV[0] + b', {"ph": "X", "name": "\xff", "ts": 1}]',
    "rank-3.json": b'{"traceEvents": [' + EV[0] + b', {"ph": "X", "ts": 1, "args": ' + b"{\"a\":" * 5000 + b"1" + b"}" * 5000 + b"}]}",
    "rank-4.json": b'{"distributedInfo": {"rank": 4, "traceEvents": 1}, "traceEvents": [' + EV[1] + b"], \"baseTimeNano",
}


def test_hostile_files_through_every_verb(tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    for name, content in HOSTILE.items():
        (src / name).write_bytes(content)
    expect_errors = [str(src / "rank-0.json")]
    expect_salvaged = [str(src / n) for n in ("rank-1.json", "rank-2.json", "rank-3.json", "rank-4.json")]
    for verb in (("summary",), ("steps",), ("stragglers",), ("diff", src)):
        code_json, doc, _ = cli(*verb, src, "--json")
        code_text, _, err = cli(*verb, src)
        assert code_json == code_text == 1 and "Traceback" not in err and "internal error" not in err, (verb, err)
        assert [e["path"] for e in doc["errors"]] == expect_errors * (2 if verb[0] == "diff" else 1)
        assert sorted(s["path"] for s in doc["salvaged"]) == sorted(expect_salvaged * (2 if verb[0] == "diff" else 1))
    code, doc, err = cli("merge", src, "-o", tmp_path / "m.json.gz", "--json")
    assert code == 1 and doc["files"] == 4 and "Traceback" not in err
    assert len(load(tmp_path / "m.json.gz")["traceEvents"]) >= 4  # a whole, loadable output
    assert not list(tmp_path.glob(".tmp-*"))  # no temporary output left behind
