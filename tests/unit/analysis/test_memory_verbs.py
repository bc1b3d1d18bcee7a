"""Memory answers through the verbs: real profile_memory traces (torch.profiler on CPU writes real ``[memory]``
events) and a run directory of allocator snapshots (the stand-in, torch's format), checked against figures computed
here from the files themselves."""

from __future__ import annotations

import json
import os
import sys

import pytest
from typer.testing import CliRunner

from distprof.analysis import analyze
from distprof.analysis import open as open_run
from distprof.analysis.memory import BEFORE
from distprof.cli import app
from distprof.rundir.layout import MANIFEST, rank_dir, window_file_name
from distprof.rundir.manifest import FileEntry, WindowRecord, encode_record

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "jobs"))
from memsnap_standin import Builder, frame, write

MB = 1_000_000


def _profile(path: str, leak: bool) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    keep = []
    sched = schedule(wait=0, warmup=1, active=4)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, schedule=sched,
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as p:
        for _ in range(5):
            with record_function("forward"):
                x = torch.empty(1_000_000)  # 4 MB, freed at the end of the step
                if leak:
                    keep.append(torch.empty(5_000_000))  # 20 MB kept: a leak
                y = x + 1
            del x, y
            p.step()


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    root = tmp_path_factory.mktemp("memtraces")
    for name, leak in (("leak", True), ("flat", False)):
        os.makedirs(root / name)
        _profile(str(root / name / "rank0.pt.trace.json"), leak)
    return root


def _by_hand(path: str) -> tuple[int, list[tuple[int, int]]]:
    """From the JSON itself: the largest Total Allocated of the host's events, and at each ProfilerStep's start the
    Total Allocated of the last event before it."""
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    mem = sorted((e["ts"], e["args"]["Total Allocated"]) for e in ev
                 if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
    steps = sorted((e["ts"], int(e["name"].split("#")[1])) for e in ev if e.get("name", "").startswith("ProfilerStep#"))
    first = mem[0][1] - next(e["args"]["Bytes"] for e in ev if e.get("name") == "[memory]"
                             and (e["ts"], e["args"]["Total Allocated"]) == mem[0])
    at = [(n, ([v for t, v in mem if t < ts] or [first])[-1]) for ts, n in steps]
    return max(v for _, v in mem), at


def test_profile_memory_trace_answers_by_hand(traces):
    path = str(traces / "leak" / "rank0.pt.trace.json")
    (row,) = analyze.summary_result(str(traces / "leak")).memory
    peak, at = _by_hand(path)
    assert row.source == "trace" and row.device_type == "cpu" and row.rank == 0
    assert row.peak_allocated_bytes == peak
    assert [(s.step, s.allocated_bytes) for s in row.steps] == at
    assert row.at.phase == "forward" and row.at.step in {s for s, _ in at}
    # at the peak every kept 20 MB block is live, each allocated inside forward
    assert row.top[0].phase == "forward" and row.top[0].bytes >= 4 * 20 * MB
    assert sum(t.bytes for t in row.top) == peak
    assert max(row.series["allocated"]) == peak


def test_leak_fires_on_the_leaking_trace_only(traces):
    leak = [f for f in analyze.diagnose_result(str(traces / "leak")).findings if f.id == "memory_leak"]
    assert len(leak) == 1
    figs = leak[0].evidence.figures
    assert figs["per_step_bytes"] == pytest.approx(20 * MB, rel=0.01)
    assert "20.0 MB per step" in leak[0].claim and leak[0].cost_us == 0
    assert not [f for f in analyze.diagnose_result(str(traces / "flat")).findings if f.id == "memory_leak"]


TRAIN = [frame("/venv/site-packages/torch/nn/modules/linear.py", 125, "forward"), frame("/job/train.py", 30, "step")]


def _record(role, rank, steps, name, size, stopped_by=None):
    return encode_record(WindowRecord(role=role, rank=rank, steps=steps, files=[FileEntry(path=name, bytes=size)],
                                      world_size=2, complete=stopped_by is None, stopped_by=stopped_by,
                                      backend="cuda_memory"))


@pytest.fixture
def snap_run(tmp_path):
    """rank 1 of role "train": a window (steps 3-5, 100 MB kept per step) and an OOM in step 6."""
    d = tmp_path / rank_dir("train", 1)
    os.makedirs(d)
    b = Builder()
    b.segment(2_000 * MB)
    for s in (3, 4, 5):
        b.annotate(f"ProfilerStep#{s}", "START")
        b.annotate("forward", "START")
        b.alloc(100 * MB, TRAIN)
        tmp = b.alloc(50 * MB, TRAIN)
        b.annotate("forward", "END")
        b.free(tmp)
        b.annotate(f"ProfilerStep#{s}", "END")
    b.annotate("ProfilerStep#6", "START")
    win = window_file_name(3, 5, ".memory.pickle")
    write(str(d / win), b.snapshot())
    b.annotate("forward", "START")
    b.oom(5_000 * MB, device_free=200 * MB, frames=TRAIN)
    oom = "oom-20261127T000000-pid7.memory.pickle"
    write(str(d / oom), b.snapshot())
    with open(d / MANIFEST, "wb") as f:
        f.write(_record("train", 1, [3, 5], f"train/rank00001/{win}", 1))
        f.write(_record("train", 1, [6, 6], f"train/rank00001/{oom}", 1, stopped_by="oom"))
    return tmp_path


def test_snapshot_run_summary_and_diagnose(snap_run):
    s = analyze.summary_result(str(snap_run))
    rows = s.memory
    assert [(r.role, r.rank, r.source) for r in rows] == [("train", 1, "snapshot")] * 2
    win, oom = sorted(rows, key=lambda r: r.oom is not None)
    # 100 -> 150 -> 100 | 200 -> 250 -> 200 | 300 -> 350 -> 300: the peak is 350 MB in step 5's forward
    assert (win.peak_allocated_bytes, win.at.step, win.at.phase) == (350 * MB, 5, "forward")
    assert win.peak_reserved_bytes == 2_000 * MB
    assert [(t.frame, t.bytes, t.blocks) for t in win.top] == [("job/train.py:30 step", 350 * MB, 4)]
    assert [(x.step, x.allocated_bytes) for x in win.steps] == [(3, 0), (4, 100 * MB), (5, 200 * MB), (6, 300 * MB)]
    assert oom.oom.request_bytes == 5_000 * MB and oom.oom.allocated_bytes == 300 * MB
    assert (oom.oom.at.step, oom.oom.at.phase) == (6, "forward")
    assert oom.oom.lines[0].startswith("at the OOM (step 6, in forward), 300.0 MB allocated")
    assert s.files_read == 2 and s.errors == []
    d = analyze.diagnose_result(str(snap_run))
    ids = [f.id for f in d.findings]
    assert ids.count("memory_leak") == 1 and ids.count("oom") == 1  # (one per rank, over both files' steps)
    assert d.files_read == 2 and d.thresholds["memory_leak"]["min_growth_bytes"] == 16 << 20
    r = CliRunner().invoke(app, ["diagnose", str(snap_run)])
    assert r.exit_code == 0 and "oom  costs" in r.output and "the request was 5.0 GB" in r.output.replace("\n", " ")
    doc = analyze.summary(str(snap_run))
    assert set(doc["memory"][0]) >= {"role", "rank", "peak_allocated_bytes", "peak_reserved_bytes", "at", "top"}
    assert set(doc["memory"][0]["at"]) >= {"step", "phase"}


def test_snapshot_selection_bad_file_and_cli(snap_run):
    d = snap_run / rank_dir("train", 1)
    (d / "step00000009-00000009.memory.pickle").write_bytes(b"\x80\x04cos\nsystem\n.")
    s = analyze.summary_result(str(snap_run))
    assert [e["path"] for e in s.errors] == [str(d / "step00000009-00000009.memory.pickle")]
    assert analyze.exit_code(analyze.to_json(s)) == 1
    assert len(analyze.summary_result(str(snap_run), analyze.Selection.of(steps="6")).memory) == 1
    r = CliRunner().invoke(app, ["summary", str(snap_run)])
    assert r.exit_code == 1
    assert "Memory per rank" in r.output and "OOM: at the OOM (step 6, in forward)" in r.output.replace("\n", " ")
    assert "Traceback" not in r.output


def test_report_has_the_memory_plot(snap_run, tmp_path):
    out = open_run(str(snap_run)).report(str(tmp_path / "r.html"))
    html = open(out).read()
    assert 'id="memory"' in html and "Memory over time per rank" in html


def test_history_before_the_window_is_its_own_group(tmp_path):
    b = Builder()
    b.alloc(10 * MB, TRAIN)
    write(str(tmp_path / "x.memory.pickle"), b.snapshot(before={1: 70 * MB}))
    (row,) = analyze.summary_result(str(tmp_path)).memory
    assert row.peak_allocated_bytes == 80 * MB
    assert [(t.frame, t.bytes) for t in row.top] == [(BEFORE, 70 * MB), ("job/train.py:30 step", 10 * MB)]


def test_memory_events_read_the_same_split_across_workers(traces):
    """One file decoded in runs by worker processes keeps every [memory] event, in file order."""
    import numpy as np

    from distprof.analysis.parallel import SplitPool
    from distprof.trace.reader import TraceStream
    from distprof.trace.table import TraceTable

    path = str(traces / "leak" / "rank0.pt.trace.json")
    whole = TraceTable.read(TraceStream(path, lean=True, batch_bytes=4 << 10))
    with SplitPool(2) as pool:
        t = TraceStream(path, lean=True, batch_bytes=4 << 10)
        split = TraceTable.read(t, pool=pool)
    assert t._deferred >= 2 and whole.mem.shape[0] > 30
    assert np.array_equal(whole.mem, split.mem) and np.array_equal(whole.mem_ts, split.mem_ts)


def test_a_step_selection_counts_only_those_steps(traces):
    path = str(traces / "leak")
    (row,) = analyze.summary_result(path, analyze.Selection.of(steps="2")).memory
    _, at = _by_hand(path + "/rank0.pt.trace.json")
    assert [(s.step, s.allocated_bytes) for s in row.steps] == [x for x in at if x[0] == 2]
    assert row.at.step == 2 and row.peak_allocated_bytes < analyze.summary_result(path).memory[0].peak_allocated_bytes
