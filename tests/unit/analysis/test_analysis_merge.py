"""distprof merge: every event kept, one track per rank and role, clocks aligned, flows per rank."""

import gzip
import json
import os
import subprocess
import sys
import zlib
from collections import Counter, defaultdict

import numpy as np
import pytest
from conftest import DATA
from helpers import run
from hypothesis import given
from hypothesis import strategies as st
from tracekit import cli

from distprof import Profiler, ProfilerConfig
from distprof.analysis import find_traces, read_trace
from distprof.analysis.lanes import overlap_lanes
from distprof.analysis.merge import FLOW_STRIDE, PID_STRIDE, merge_traces

DLRM = os.path.join(DATA, "dlrm-8rank-v100")


def test_merge_dlrm_keeps_events_aligns_clocks_and_flows(tmp_path):
    out = str(tmp_path / "merged.json.gz")
    r = merge_traces(DLRM, out)
    with gzip.open(out, "rt") as f:
        doc = json.load(f)  # valid Chrome trace JSON
    ev = doc["traceEvents"]
    assert r["events"] == len(ev) and r["files"] == 8
    inputs = [read_trace(f) for f, *_ in find_traces(DLRM)]
    by_file = defaultdict(list)
    for e in ev:
        by_file[e["pid"] // PID_STRIDE].append(e)
    # Files are ordered by rank; each keeps all its events (plus the added sort-index records).
    for i, t in enumerate(sorted(inputs, key=lambda t: t.rank)):
        got = [e for e in by_file[i] if e["name"] not in ("process_sort_index", "process_name")]
        assert Counter((e["ph"], e["name"]) for e in got) == Counter(
            (e.ph, e.name) for e in t.events if e.name not in ("process_sort_index", "process_name"))
        named = {e["pid"] for e in by_file[i] if e["name"] == "process_name"}
        assert named == {e["pid"] for e in by_file[i]}  # every track of this rank is named
        first_in = min(e.ts for e in t.events if e.ph == "X") + t.offset_us
        first_out = min(e["ts"] for e in got if e["ph"] == "X")
        assert abs((first_out + doc["distprofMerge"]["base_time_us"]) - first_in) < 1e-3
    names = {e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert all(any(n.startswith(f"rank {k}") for n in names) for k in range(8))
    flows = defaultdict(set)
    for e in ev:
        if e["ph"] in ("s", "f"):
            flows[e["id"]].add(e["ph"])
            # Perfetto reads a flow id as a number (a string as hex): numeric ids, scoped to their rank.
            assert isinstance(e["id"], int) and e["id"] // FLOW_STRIDE == e["pid"] // PID_STRIDE
    assert flows and all(v == {"s", "f"} for v in flows.values() if "s" in v)


def test_merge_run_directory_roles_cli(tmp_path):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all", steps=[1], torch={"activities": ["cpu"]})
    for role, world in (("actor", 2), ("rollout", 1)):
        for rank in range(world):
            run(Profiler(cfg, role=role, rank=rank, world_size=world), 3)
    out = tmp_path / "m.json"
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", "merge", str(tmp_path / "r"), "-o", str(out), "--json"],
                          capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["files"] == 3
    doc = json.loads(out.read_text())
    labels = {e["args"]["name"].split(" / ")[0].split(" (")[0] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert labels == {"actor rank 0", "actor rank 1", "rollout rank 0"}
    assert sum(1 for e in doc["traceEvents"] if e["name"] == "ProfilerStep#1") == 3


def _partial_overlaps(events):
    """Complete events that cross another's end on the same (pid, tid), in integer ns (as Perfetto stores them)."""
    threads = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            s = round(float(e["ts"]) * 1000)
            threads[(e["pid"], e["tid"])].append((s, -(s + round(float(e["dur"]) * 1000))))
    bad = 0
    for spans in threads.values():
        open_ends = []
        for s, neg_end in sorted(spans):
            while open_ends and open_ends[-1] <= s:
                open_ends.pop()
            if open_ends and -neg_end > open_ends[-1]:
                bad += 1
            else:
                open_ends.append(-neg_end)
    return bad


@pytest.mark.slow
@pytest.mark.parametrize("name", ["simple_add.json.gz", "ns_resolution_rank-0.pt.trace.json.gz"])
def test_overlapping_events_move_to_named_lanes_and_nothing_is_lost(tmp_path, name):
    # Real traces whose threads have partially overlapping complete events (ns rounding, kernels),
    # as two ranks of one job.
    src = tmp_path / "in"
    src.mkdir()
    for rank in (0, 1):
        (src / f"rank-{rank}.json.gz").write_bytes(open(os.path.join(DATA, "hta", name), "rb").read())
    inputs = [read_trace(f) for f, *_ in find_traces(str(src))]
    before = 0
    for t in inputs:  # relative to the first event: epoch µs in ns exceed float64's exact integers
        t0 = min(e.ts for e in t.events if e.ph == "X")
        before += _partial_overlaps([{"ph": e.ph, "pid": e.pid, "tid": e.tid, "ts": e.ts - t0, "dur": e.dur} for e in t.events])
    assert before > 0
    out = str(tmp_path / "m.json")
    r = merge_traces(str(src), out)
    ev = json.load(open(out))["traceEvents"]
    assert _partial_overlaps(ev) == 0 and r["moved_to_lanes"] == before
    x_in = Counter(e.name for t in inputs for e in t.events if e.ph == "X")
    assert Counter(e["name"] for e in ev if e["ph"] == "X") == x_in  # every complete event is still there
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev
             if e["name"] == "thread_name" and "(overlaps, lane" in e["args"]["name"]}
    on_lanes = Counter((e["pid"], e["tid"]) for e in ev if e["ph"] == "X" and (e["pid"], e["tid"]) in lanes)
    assert lanes and set(on_lanes) == set(lanes) and sum(on_lanes.values()) == r["moved_to_lanes"]


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(0, 80)), max_size=40))
def test_overlap_lanes_nest_and_leave_nested_threads_alone(spans):
    ts = np.array([s for s, _ in spans], dtype="d")
    dur = np.array([d for _, d in spans], dtype="d")
    lanes = overlap_lanes(ts, dur)
    events = [{"ph": "X", "pid": 0, "tid": int(lane), "ts": s, "dur": d} for (s, d), lane in zip(spans, lanes)]
    assert _partial_overlaps(events) == 0
    if _partial_overlaps([dict(e, tid=0) for e in events]) == 0:
        assert not lanes.any()  # a thread that already nests keeps every event


def test_merge_skips_an_unreadable_rank(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "rank-0.json").write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1}]}))
    (src / "rank-1.json").write_text("not json")
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", "merge", str(src), "-o", str(tmp_path / "m.json"), "--workers", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "rank-1.json" in proc.stderr and "cannot read" in proc.stderr
    assert [e["name"] for e in json.load(open(tmp_path / "m.json"))["traceEvents"] if e["ph"] == "X"] == ["a"]


def test_every_trace_event_field_survives_and_ids_are_scoped_per_rank(tmp_path):
    """Async, v2-flow and thread-clock fields of the Trace Event Format, with the same ids in two ranks."""
    events = [
        {"ph": "X", "name": "work", "pid": 1, "tid": 1, "ts": 10, "dur": 5, "tts": 3, "tdur": 2, "cname": "good",
         "sf": 7, "bind_id": "0x2a", "flow_out": True, "args": {"k": [1, {"x": 2}]}},
        {"ph": "X", "name": "sink", "pid": 1, "tid": 2, "ts": 20, "dur": 5, "bind_id": 42, "flow_in": True,
         "stack": ["a", "b"]},
        {"ph": "b", "name": "req", "cat": "rpc", "pid": 1, "tid": 1, "ts": 11, "id": 7, "scope": "net"},
        {"ph": "e", "name": "req", "cat": "rpc", "pid": 1, "tid": 1, "ts": 13, "id": 7, "scope": "net"},
        {"ph": "n", "name": "mark", "cat": "rpc", "pid": 1, "tid": 1, "ts": 12, "id2": {"global": "g1"}},
        {"ph": "n", "name": "mark", "cat": "rpc", "pid": 1, "tid": 1, "ts": 12, "id2": {"local": "l1"}},
        {"ph": "i", "name": "tick", "pid": 1, "tid": 1, "ts": 14, "s": "p"},
    ]
    src = tmp_path / "in"
    src.mkdir()
    for rank in (0, 1):
        (src / f"rank-{rank}.json").write_text(json.dumps({"traceEvents": events}))
    merge_traces(str(src), str(tmp_path / "m.json"))
    out = [e for e in json.load(open(tmp_path / "m.json"))["traceEvents"] if e["ph"] != "M"]
    assert len(out) == 2 * len(events)
    for rank in (0, 1):
        mine = [e for e in out if e["pid"] // PID_STRIDE == rank]
        for orig, got in zip(events, mine):
            for key in ("tts", "tdur", "cname", "sf", "scope", "s", "flow_in", "flow_out", "stack", "args"):
                assert got.get(key) == orig.get(key), key
        work, sink, begin, end, glob, local = mine[:6]
        assert work["bind_id"] == sink["bind_id"] == rank * FLOW_STRIDE + 42  # "0x2a" is 42, as Perfetto reads it
        assert begin["id"] == end["id"] == rank * FLOW_STRIDE + 7
        assert glob["id2"] == {"global": f"{rank}:g1"} and local["id2"] == {"local": "l1"}


def test_merge_selects_steps_and_keeps_every_event_of_them(ddp_run, tmp_path):
    """--steps 3 on a real 2-rank DDP run profiled on steps 2-3 and 5-6: the output holds step 3 of both ranks
    (and the events overlapping it), none of steps 2, 5, 6, and the process and thread names; the window 5-6 is
    not even opened (its manifest rules it out)."""
    out = tmp_path / "m.json.gz"
    code, doc, err = cli("merge", ddp_run, "-o", out, "--steps", "3", "--json")
    assert code == 0, err
    with gzip.open(out, "rt") as f:
        events = json.load(f)["traceEvents"]
    steps = sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == ["ProfilerStep#3", "ProfilerStep#3"]  # one per rank
    assert doc["files"] == 2 and doc["skipped"] == 2 and doc["scope"]["steps"] == [3]
    assert any(e.get("ph") == "M" and e.get("name") == "thread_name" for e in events)
    # Every event overlapping step 3 of a rank is there: as many as the whole merge holds in that range.
    full = tmp_path / "all.json.gz"
    assert cli("merge", ddp_run, "-o", full)[0] == 0
    with gzip.open(full, "rt") as f:
        every = json.load(f)["traceEvents"]

    def per_step(evs):  # events of the same file (pid // PID_STRIDE) overlapping each ProfilerStep#3
        out = []
        for s in (e for e in evs if e.get("name") == "ProfilerStep#3"):
            out.append(sum(e.get("ph") == "X" and e["pid"] // PID_STRIDE == s["pid"] // PID_STRIDE
                           and e["ts"] <= s["ts"] + s["dur"] and e["ts"] + e.get("dur", 0) >= s["ts"] for e in evs))
        return sorted(out)

    assert per_step(events) == per_step(every) and min(per_step(events)) > 10
    assert len(events) < len(every)


def test_merge_warns_when_the_output_is_larger_than_a_viewer_loads(ddp_run, tmp_path, monkeypatch):
    from distprof.analysis import merge

    r = merge.merge_traces(ddp_run, str(tmp_path / "m.json"))
    assert r["warnings"] == [] and r["json_bytes"] > 0  # the real bound (500 MB) is far above this run
    monkeypatch.setattr(merge, "VIEWER_LIMIT_BYTES", r["json_bytes"] - 1)
    r = merge.merge_traces(ddp_run, str(tmp_path / "m2.json"))
    (w,) = r["warnings"]
    assert "more than a browser viewer can be expected to load" in w and "--steps" in w
    assert 0 < os.path.getsize(tmp_path / "m2.json") - r["json_bytes"] < 10_000  # the events, plus the header


def _one_member(data: bytes) -> bytes:
    """The content of ``data`` read as ONE gzip member (what a viewer reading only the first member sees)."""
    d = zlib.decompressobj(31)
    body = d.decompress(data) + d.flush()
    assert d.eof and d.unused_data == b""  # the member ends where the file does: nothing after it
    return body


def test_merge_output_is_the_same_for_any_number_of_workers_and_one_gzip_member(tmp_path):
    """The real 8-rank DLRM set merged by 1 and by 2 worker processes: the same events in the same order, the
    .gz output is one gzip member (its parts, compressed by different processes, joined), the same as .json."""
    r1 = merge_traces(DLRM, str(tmp_path / "w1.json.gz"), workers=1)
    r2 = merge_traces(DLRM, str(tmp_path / "w2.json.gz"), workers=2)
    r3 = merge_traces(DLRM, str(tmp_path / "w2.json"), workers=2)
    raw1, raw2 = ((tmp_path / n).read_bytes() for n in ("w1.json.gz", "w2.json.gz"))
    body = _one_member(raw2)
    assert body == gzip.decompress(raw2) == _one_member(raw1) == (tmp_path / "w2.json").read_bytes()
    doc = json.loads(body)
    assert len(doc["traceEvents"]) == r1["events"] == r2["events"] == r3["events"] > 20_000
    assert r1["json_bytes"] == r2["json_bytes"] and r1["moved_to_lanes"] == r2["moved_to_lanes"]
    labels = {e["pid"] // PID_STRIDE: e["args"]["name"].split(" / ")[0] for e in doc["traceEvents"]
              if e["name"] == "process_name"}
    assert labels == {k: f"rank {k}" for k in range(8)}  # every rank, in rank order


def test_parts_join_into_one_gzip_member(tmp_path):
    """Parts written separately (one empty) join into one member whose CRC and length gzip checks."""
    from distprof.analysis.fragments import Joiner, PartWriter

    chunks = [b"alpha " * 50_000, b"", bytes(range(256)) * 3000, b"omega"]
    parts = []
    for k, c in enumerate(chunks):
        w = PartWriter(str(tmp_path / f"{k}.part"), gz=True)
        w.write(c[: len(c) // 2])
        w.write(c[len(c) // 2:])
        parts.append(w.close())
    with open(tmp_path / "out.gz", "wb") as f:
        j = Joiner(f, gz=True)
        j.add(b"<")
        for p in parts:
            j.add_part(p)
            j.add(b"|")
        j.close()
    data = (tmp_path / "out.gz").read_bytes()
    want = b"<" + b"|".join(chunks) + b"|"
    assert gzip.decompress(data) == want == _one_member(data)
    assert not list(tmp_path.glob("*.part"))  # each part's file is gone once joined


def test_untrusted_fields_merge_go_through_as_read(tmp_path):
    """What pass 1 and 2 decode or skip in an event, from a hand-written trace: events without pid, tid, ts or
    dur (read as 0, as the reader reads them), string and int tids on one pid, a phase no one knows, a
    process_name spelt with an escape, a name nested deeper than msgspec decodes, ids of every kind."""
    deep = "[" * 5000 + "]" * 5000
    text = ('{"traceEvents": ['
            '{"ph": "X", "name": "a", "ts": 10, "dur": 5},'
            '{"ph": "X", "name": "b", "pid": 1, "tid": "stream 7", "ts": 12, "dur": 1},'
            '{"ph": "X", "name": "c", "pid": 1, "tid": 9, "ts": 11},'
            '{"ph": "i", "name": "tick", "pid": 1, "tid": 99, "ts": 8, "s": "t"},'
            '{"ph": "Z", "name": "unknown phase", "pid": 1, "tid": 3, "ts": 13},'
            '{"ph": "M", "name": "process_\\u006eame", "pid": 1, "args": {"name": "trainer"}},'
            '{"ph": "M", "name": ' + deep + ', "pid": 1, "tid": 4, "args": {"name": "odd"}},'
            '{"ph": "s", "name": "flow", "pid": 1, "tid": 9, "ts": 11, "id": "zz-not-hex", "cat": "c"},'
            '{"ph": "f", "name": "flow", "pid": 1, "tid": 9, "ts": 12, "id": -5, "bp": "e", "cat": "c"},'
            '{"ph": "X", "name": "bad time", "pid": 1, "tid": 9, "ts": "11", "dur": 1},'
            '7,'
            '{"ph": "X", "name": "odd cat", "pid": 1, "tid": 9, "ts": 11.5, "dur": 0.5, "cat": {"k": [1]}}'
            ']}')
    src = tmp_path / "in"
    src.mkdir()
    for rank in (0, 1):
        (src / f"rank-{rank}.json").write_text(text)
    r = merge_traces(str(src), str(tmp_path / "m.json"), workers=2)
    assert r["errors"] == [] and r["files"] == 2
    ev = json.loads((tmp_path / "m.json").read_text())["traceEvents"]
    for rank in (0, 1):
        mine = [e for e in ev if e["pid"] // PID_STRIDE == rank]
        by_name = {e["name"]: e for e in mine}
        a, c, tick = by_name["a"], by_name["c"], by_name["tick"]
        assert a["tid"] == 0 and a["pid"] != by_name["b"]["pid"]  # no pid: pid 0, a process of its own
        assert c["dur"] == 0 and by_name["b"]["tid"] == "stream 7"
        assert tick["ts"] == 0 and a["ts"] == 2 and c["ts"] == 3  # the earliest timed event (an instant) is 0
        assert by_name["unknown phase"]["ph"] == "Z" and "ts" in by_name["unknown phase"]
        labels = [e["args"]["name"] for e in mine if e["name"] == "process_name" and e["pid"] == c["pid"]]
        assert labels == [f"rank {rank} / trainer"]  # the escaped name is read as process_name, and relabelled
        assert not [e for e in mine if e.get("tid") == 4]  # the event too deep to decode is left out, and counted:
    # Left out and counted, as every verb reads them: the name too deep to decode, the time that is a string, the
    # element that is no event, the category that is no string.
    assert [s["events_skipped"] for s in r["salvaged"]] == [4, 4]
    assert not [e for e in ev if e["name"] in ("bad time", "odd cat")]
    for rank in (0, 1):  # ids that are no hex number, and negative ones, get numbers of their own in the rank's range
        (s,), (f,) = ([e for e in ev if e["pid"] // PID_STRIDE == rank and e["ph"] == ph] for ph in "sf")
        assert s["id"] // FLOW_STRIDE == f["id"] // FLOW_STRIDE == rank and s["id"] != f["id"]


@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 30)), max_size=30))
def test_nesting_check_agrees_with_counting_overlaps(spans):
    from distprof.analysis.lanes import _nested

    start = np.array([s for s, _ in spans], dtype=np.int64)
    end = start + np.array([d for _, d in spans], dtype=np.int64)
    events = [{"ph": "X", "pid": 0, "tid": 0, "ts": s / 1000, "dur": d / 1000} for s, d in spans]
    assert _nested(start, end) == (_partial_overlaps(events) == 0)


def test_processes_of_one_file_with_the_same_name_get_tracks_of_their_own(tmp_path):
    """Two processes named python3 in one trace (the trainer and a DataLoader worker) were both merged as
    'rank 0 / python3': each track's name is unique, with the pid added only where the names clash."""
    from tracekit import X, write

    def named(pid, name):
        return {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}

    events = [named(10, "python3"), named(20, "python3"), named(0, "GPU 0"),
              X("aten::mm", 0, 5, pid=10), X("aten::add", 1, 5, pid=20), X("gemm", 2, 3, cat="kernel", pid=0, tid=7),
              X("aten::relu", 3, 1, pid=30)]
    (tmp_path / "in").mkdir()
    write(tmp_path / "in" / "rank-0.json", events, distributedInfo={"rank": 0})
    out = str(tmp_path / "m.json")
    merge_traces(str(tmp_path / "in"), out, workers=1)
    doc = json.load(open(out))
    names = {}
    for e in doc["traceEvents"]:
        if e["name"] == "process_name":
            names.setdefault(e["pid"], set()).add(e["args"]["name"])
    assert all(len(v) == 1 for v in names.values())
    tracks = sorted(v.pop() for v in names.values())
    assert tracks == ["rank 0 (30)", "rank 0 / GPU 0", "rank 0 / python3 (pid 10)", "rank 0 / python3 (pid 20)"]
    assert len({e["pid"] for e in doc["traceEvents"]}) == 4  # one track per process, each named once
