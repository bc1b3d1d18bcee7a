"""Two real processes with torch.distributed (gloo), each with its own Profiler."""

import json
import os

import msgspec
from conftest import gloo_run, load_trace, trace_files


def test_all_ranks_capture(tmp_path):
    out = str(tmp_path / "run")
    result = gloo_run(out, steps=5, world_size=2, config={"steps": [2, 3]})
    files = trace_files(out)
    assert [os.path.relpath(f, out) for f in files] == [
        "train/rank00000/step00000002-00000003.pt.trace.json.gz",
        "train/rank00001/step00000002-00000003.pt.trace.json.gz",
    ]
    for rank, f in enumerate(files):
        t = load_trace(f)
        # Written by torch itself under torch.distributed (gloo), not by our fallback.
        assert t["distributedInfo"]["rank"] == rank and t["distributedInfo"]["world_size"] == 2
        assert t["distributedInfo"]["backend"] == "gloo"
        names = {e.get("name") for e in t["traceEvents"]}
        assert {"ProfilerStep#2", "ProfilerStep#3", "train/allreduce"} <= names
        assert "c10d::allreduce_" in names
    assert sorted(r["rank"] for r in result.files) == [0, 1]
    run_json = json.loads(open(os.path.join(out, "run.json")).read())
    assert run_json["world_size"] == 2 and run_json["config"]["ranks"] == "all"


def test_only_selected_rank_captures(tmp_path):
    out = str(tmp_path / "run")
    gloo_run(out, steps=4, world_size=2, config={"ranks": [1], "steps": [2]})
    assert [os.path.relpath(f, out) for f in trace_files(out)] == ["train/rank00001/step00000002-00000002.pt.trace.json.gz"]
    assert not os.path.exists(os.path.join(out, "train", "rank00000"))
    lines = open(os.path.join(out, "train", "rank00001", "manifest.jsonl"), "rb").read().splitlines()
    assert [msgspec.json.decode(line)["steps"] for line in lines] == [[2, 2]]
