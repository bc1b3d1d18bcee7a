"""distprof merge: every event kept, one track per rank and role, clocks aligned, flows per rank."""

import gzip
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict

from distprof import Profiler, ProfilerConfig
from distprof.analysis import find_traces, read_trace
from distprof.analysis.merge import PID_STRIDE, merge_traces

from conftest import SHARED
from helpers import run

DLRM = os.path.join(SHARED, "data", "traces", "dlrm-8rank-v100")


def test_merge_dlrm_keeps_events_aligns_clocks_and_flows(tmp_path):
    out = str(tmp_path / "merged.json.gz")
    r = merge_traces(DLRM, out)
    with gzip.open(out, "rt") as f:
        doc = json.load(f)  # valid Chrome trace JSON
    ev = doc["traceEvents"]
    assert r["events"] == len(ev) and r["files"] == 8
    inputs = [read_trace(f) for f, _, _ in find_traces(DLRM)]
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
            assert e["id"].split(":")[0] == str(e["pid"] // PID_STRIDE)  # ids are scoped to their rank
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
