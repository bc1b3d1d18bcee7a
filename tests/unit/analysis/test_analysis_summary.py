"""Trace reader and `distprof summary` on real traces, checked against an independent computation."""

import gzip
import json
import os
from collections import defaultdict

import pytest
from conftest import DATA
from tracekit import cli, table

from distprof.analysis import analyze, find_traces, read_trace, summary
from distprof.trace.listing import rank_from_name
from distprof.trace.reader import TraceError

TRACES = DATA
DLRM = os.path.join(TRACES, "dlrm-8rank-v100")


def _json(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _independent(path):
    """Kernel counts/totals and device busy time computed with the json module and a plain sweep."""
    doc = _json(path)
    kernels = defaultdict(lambda: [0, 0.0])
    spans = []
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels[e["name"]][0] += 1
            kernels[e["name"]][1] += float(e["dur"])
            spans.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            busy += (cur_e - cur_s) if cur_e is not None else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += (cur_e - cur_s) if cur_e is not None else 0.0
    return kernels, busy, doc["distributedInfo"]["rank"]


def test_dlrm_8_ranks_match_independent_computation():
    files = find_traces(DLRM)
    assert len(files) == 8
    tables = [table(f.path) for f in files]
    per_rank = [summary.extract(tb) for tb in tables]
    assert sorted(tb.info.rank for tb in tables) == list(range(8))
    all_kernels = defaultdict(lambda: [0, 0.0])
    for f, tb, s in zip(files, tables, per_rank):
        kernels, busy, rank = _independent(f.path)
        assert tb.info.rank == rank and tb.info.rank_source == "distributedInfo"
        assert {n: (c, pytest.approx(t)) for n, (c, t) in kernels.items()} == s["kernels"]
        assert s["device_busy_us"] == pytest.approx(busy)
        assert 0 < s["idle_share"] < 1
        for n, (c, t) in kernels.items():
            all_kernels[n][0] += c
            all_kernels[n][1] += t
    merged = analyze.summary(DLRM, workers=1)
    assert [(r["name"], r["count"]) for r in merged["kernels"][:3]] == [
        (n, c) for n, (c, _) in sorted(all_kernels.items(), key=lambda kv: (-kv[1][1], kv[0]))[:3]]
    totals = [r["total_us"] for r in merged["kernels"]]
    assert totals == sorted(totals, reverse=True)
    assert merged["categories"]["communication"] > merged["categories"]["compute"] > 0
    assert merged["errors"] == [] and merged["salvaged"] == [] and merged["files_read"] == 8


def test_op_self_time_excludes_nested_ops(tmp_path):
    doc = {"traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "outer", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 10, "dur": 30},
        {"ph": "X", "cat": "cpu_op", "name": "inner", "pid": 1, "tid": 1, "ts": 50, "dur": 20},
        {"ph": "X", "cat": "cpu_op", "name": "leaf", "pid": 1, "tid": 1, "ts": 55, "dur": 5},
        {"ph": "X", "cat": "cpu_op", "name": "other_thread", "pid": 1, "tid": 2, "ts": 10, "dur": 80},
    ]}
    p = tmp_path / "rank-2.json"
    p.write_text(json.dumps(doc))
    tb = table(p)
    s = summary.extract(tb)
    assert tb.info.rank == 2 and tb.info.rank_source == "name"
    assert s["ops"] == {"outer": (1, 100.0, 50.0), "inner": (2, 50.0, 45.0), "leaf": (1, 5.0, 5.0),
                        "other_thread": (1, 80.0, 80.0)}


def test_time_bases_and_forms(tmp_path):
    new = {"baseTimeNanoseconds": 1_700_000_000_000_000_000, "traceEvents": [{"ph": "X", "name": "a", "ts": 5.5, "dur": 1}]}
    (tmp_path / "new.json").write_text(json.dumps(new))
    (tmp_path / "list.json").write_text(json.dumps([{"ph": "X", "name": "a", "ts": 1_700_000_000_000_005.5, "dur": 1}]))
    a, b = read_trace(str(tmp_path / "new.json")), read_trace(str(tmp_path / "list.json"))
    assert a.events[0].ts + a.offset_us == b.events[0].ts + b.offset_us


def test_rank_sources(tmp_path):
    assert read_trace(os.path.join(TRACES, "hta", "cpu_only_rank-34.pt.trace.json.gz")).rank == 34
    t = read_trace(os.path.join(TRACES, "hta", "rank_not_found.json.gz"))
    assert t.rank is None and t.rank_source == "none"
    assert [rank_from_name(n) for n in ("a/rank-3.json", "rank00012/step.json.gz", "worker7_step_12.json", "x.json")] == [3, 12, 7, None]


def test_run_directory_ranks_from_manifest(tmp_path):
    from helpers import run

    from distprof import Profiler, ProfilerConfig

    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all", steps=[1], torch={"activities": ["cpu"]})
    for rank in (0, 1):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 3)
    s = analyze.summary(str(tmp_path / "r"), workers=1)
    assert sorted((r["role"], r["rank"]) for r in s["ranks"]) == [("actor", 0), ("actor", 1)]
    assert all(r["idle_share"] is None and r["temporal"]["device"] is None for r in s["ranks"])
    assert s["ops"] and not s["kernels"]


@pytest.mark.parametrize("content, words", [
    (b"", "empty file"),
    (b"hello world", "not JSON"),
    (b'{"traceEvents": 5}', "not a Chrome/Kineto trace"),
    (b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na', None),  # salvaged
    (b'{"traceEv', "nothing could be salvaged"),
])
def test_corrupt_inputs_give_one_clear_message(tmp_path, content, words):
    p = tmp_path / "bad.json"
    p.write_bytes(content)
    if words is None:
        t = read_trace(str(p))
        assert t.salvaged and [e.name for e in t.events] == ["a"]
        return
    with pytest.raises(TraceError) as e:
        read_trace(str(p))
    assert str(p) in str(e.value) and words in str(e.value)


def test_truncated_gzip_is_salvaged(tmp_path):
    raw = gzip.compress(json.dumps({"traceEvents": [{"ph": "X", "name": f"k{i}", "cat": "kernel", "ts": i, "dur": 1}
                                                     for i in range(5000)]}).encode())
    p = tmp_path / "cut.json.gz"
    p.write_bytes(raw[: len(raw) * 2 // 3])
    t = read_trace(str(p))
    assert t.salvaged and 0 < len(t.events) < 5000


def test_cli_summary_json_and_exit_codes(tmp_path):
    code, doc, _ = cli("summary", DLRM, "--json", "--top", "5")
    assert code == 0 and {"kernels", "ops", "ranks", "errors", "salvaged", "scope"} <= set(doc)
    for key in ("kernels", "ops"):
        assert all({"name", "count", "total_us"} <= set(r) for r in doc[key]) and len(doc[key]) == 5
        totals = [r["total_us"] for r in doc[key]]
        assert totals == sorted(totals, reverse=True)
    code, text, _ = cli("summary", DLRM, "--ranks", "3", "--workers", "1")
    assert code == 0 and "Device kernels" in text
    (tmp_path / "bad.json").write_text("nope")
    code, _, err = cli("summary", tmp_path)
    assert code == 2 and "bad.json" in err
    code, _, err = cli("summary", tmp_path / "nope")
    assert code == 2 and "no such file" in err


def test_progress_counts_bytes_as_well_as_files(tmp_path):
    from dataclasses import replace

    seen = []
    s = analyze.summary(DLRM, workers=2, progress=lambda p: seen.append(replace(p)))
    total = sum(os.path.getsize(os.path.join(DLRM, n)) for n in os.listdir(DLRM))
    assert s["files_read"] == 8 and not s["errors"]
    assert (seen[-1].files_done, seen[-1].files_total, seen[-1].bytes_done, seen[-1].bytes_total) == (8, 8, total, total)
    # One big file in this process: bytes move while the file is still being read.
    big = tmp_path / "rank-0.json"
    big.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": f"k{i % 50}", "ts": i, "dur": 1}
                                               for i in range(200_000)]}))
    seen.clear()
    analyze.summary(str(big), workers=1, progress=lambda p: seen.append(replace(p)))
    during = [p.bytes_done for p in seen if p.files_done == 0]
    assert len(during) > 2 and during == sorted(during) and seen[-1].bytes_done == big.stat().st_size


def test_summary_host_table_shows_time_in_annotated_phases_apart_from_idle():
    """Rank 1 of the H100 DDP run sleeps 80 ms per step in train/data, a phase running no op: the host table called
    it idle (72%); it now has its own column, as the report's host chart has its own colour."""
    run = os.path.join(DATA, "distprof-h100", "ddp-gloo-cuda-slow-rank1")
    code, text, _ = cli("summary", run, "--workers", "1")
    assert code == 0
    rows = text[text.index("Per rank: host time"):].splitlines()
    head = next(ln for ln in rows if ln.startswith("rank"))
    assert head.split()[:6] == ["rank", "traced", "compute", "communication", "in", "phases"]
    rank1 = next(ln for ln in rows if ln.startswith("1 ")).split()
    host = analyze.summary(run, workers=1)["ranks"][1]["temporal"]["host"]
    assert rank1[5] == f"{host['in_phases_share']:.1%}" and host["in_phases_share"] > 0.5
    assert rank1[6] == f"{host['idle_share'] - host['in_phases_share']:.1%}"
