"""distprof steps on the real 8-rank set and on a run directory distprof wrote."""

import gzip
import json
import os
import subprocess
import sys

import pytest

from distprof import Profiler, ProfilerConfig
from distprof.analysis import find_traces, read_trace
from distprof.analysis.steps import combine_steps, extract_steps

from conftest import SHARED
from helpers import run

DLRM = os.path.join(SHARED, "data", "traces", "dlrm-8rank-v100")


def test_dlrm_step_durations_match_the_trace():
    per_rank = [extract_steps(read_trace(f)) for f, *_ in find_traces(DLRM)]
    d = combine_steps(per_rank)
    expected = {}
    for f, *_ in find_traces(DLRM):
        with gzip.open(f, "rt") as fh:
            doc = json.load(fh)
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"):
                expected[(doc["distributedInfo"]["rank"], int(e["name"].split("#")[1]))] = float(e["dur"])
    got = {(x["rank"], row["step"]): x["dur_us"] for row in d["steps"] for x in row["ranks"]}
    assert got == expected and len({s for _, s in got}) >= 1
    for row in d["steps"]:
        assert row["max_us"] == max(x["dur_us"] for x in row["ranks"])
        assert row["slowest_rank"] == max(row["ranks"], key=lambda x: x["dur_us"])["rank"]


def test_phases_and_steps_of_a_distprof_run(tmp_path):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all", steps=[2, 3], torch={"activities": ["cpu"]})
    for rank in (0, 1):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 5)
    d = combine_steps([extract_steps(read_trace(f, manifest_rank=r, role=role)) for f, r, role, _ in find_traces(str(tmp_path / "r"))])
    assert [(row["role"], row["step"], len(row["ranks"])) for row in d["steps"]] == [("actor", 2, 2), ("actor", 3, 2)]
    for row in d["steps"]:
        for x in row["ranks"]:
            assert {"train/forward", "train/backward"} <= set(x["phases"])
            assert sum(x["phases"].values()) <= x["dur_us"]


def test_cli_steps_json():
    out = subprocess.run([sys.executable, "-m", "distprof.cli", "steps", DLRM, "--json"], capture_output=True, text=True, check=True)
    d = json.loads(out.stdout)
    assert d["steps"] and {"step", "ranks", "slowest_rank", "max_us"} <= set(d["steps"][0])
    assert len(d["steps"][0]["ranks"]) == 8


def test_a_trace_without_step_markers_is_reported_by_its_manifest_window(tmp_path):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all", steps=[2, 3], torch={"activities": ["cpu"]})
    run(Profiler(cfg, role="actor", rank=0, world_size=1), 5)
    (f,) = find_traces(str(tmp_path / "r"))
    assert f.window["steps"] == [2, 3] and f.role == "actor"
    # Strip the ProfilerStep ranges, as a trace from another tool or an older exporter would lack them.
    with gzip.open(f.path, "rt") as fh:
        doc = json.load(fh)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")]
    with gzip.open(f.path, "wt") as fh:
        json.dump(doc, fh)
    d = combine_steps([extract_steps(read_trace(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window))])
    (row,) = d["steps"]
    assert row["step"] == 2 and row["window"] == [2, 3] and row["ranks"][0]["source"] == "manifest"
    assert row["max_us"] == (f.window["end_time"] - f.window["start_time"]) * 1e6
    forward = [e for e in doc["traceEvents"] if e.get("name") == "train/forward" and e.get("cat") == "user_annotation"]
    expected = sum(float(e["dur"]) for e in forward)
    assert expected > 0 and row["ranks"][0]["phases"]["train/forward"] == pytest.approx(expected)
