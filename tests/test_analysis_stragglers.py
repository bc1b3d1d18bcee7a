"""distprof stragglers on the real 8-rank NCCL set and on a real gloo job with a deliberately slow rank."""

import gzip
import json
import os
import subprocess
import sys
from collections import defaultdict

from distprof.analysis import find_traces, read_trace
from distprof.analysis.stragglers import extract_collectives, match_stragglers
from distprof.demo import gloo_job

from conftest import SHARED

DLRM = os.path.join(SHARED, "data", "traces", "dlrm-8rank-v100")


def _independent(folder):
    """NCCL kernel starts per rank in order (json module), then the last arrival of each k-th collective."""
    starts = {}
    for name in os.listdir(folder):
        with gzip.open(os.path.join(folder, name), "rt") as f:
            doc = json.load(f)
        ks = sorted(float(e["ts"]) for e in doc["traceEvents"]
                    if e.get("ph") == "X" and e.get("cat") == "kernel" and "nccl" in e["name"].lower())
        starts[doc["distributedInfo"]["rank"]] = ks
    caused, late = defaultdict(float), defaultdict(int)
    for i in range(min(len(v) for v in starts.values())):
        arrivals = {r: v[i] for r, v in starts.items()}
        last = max(arrivals, key=lambda r: (arrivals[r], r))
        total = sum(arrivals[last] - a for a in arrivals.values())
        if total > 0:
            caused[last] += total
            late[last] += 1
    return caused, late


def test_dlrm_stragglers_match_independent_computation():
    r = match_stragglers([extract_collectives(read_trace(f)) for f, *_ in find_traces(DLRM)])
    caused, late = _independent(DLRM)
    assert r["sources"] == ["gpu"] and r["matched"] == 8 and r["mismatched"] == []
    got = {row["rank"]: (row["wait_caused_us"], row["late_arrivals"]) for row in r["ranks"]}
    assert got == {rank: (caused.get(rank, 0.0), late.get(rank, 0)) for rank in range(8)}
    assert [row["wait_caused_us"] for row in r["ranks"]] == sorted((v[0] for v in got.values()), reverse=True)
    assert r["ranks"][0]["rank"] == 7 and r["steps"][0]["slowest_rank"] == 7


def test_gloo_job_with_a_slow_rank(tmp_path):
    out = str(tmp_path / "run")
    gloo_job.run(out, steps=5, world_size=2, config={"steps": [2, 3]}, slow_rank=1, slow_s=0.3)
    r = match_stragglers([extract_collectives(read_trace(f, manifest_rank=mr, role=role)) for f, mr, role, _ in find_traces(out)])
    assert r["sources"] == ["cpu"] and r["matched"] >= 8  # 4 parameter all-reduces per step, 2 steps
    top = r["ranks"][0]
    assert top["rank"] == 1 and top["role"] == "train"
    # Rank 1 sleeps 300 ms before each step's all-reduces, so rank 0 waits for it in every profiled step
    # (the bound is a third of one sleep: the structure is asserted, not the machine's speed).
    assert top["wait_caused_us"] > 100_000 and top["late_arrivals"] >= 2
    assert r["ranks"][1]["rank"] == 0 and r["ranks"][1]["waited_us"] > 100_000
    assert {s["step"] for s in r["steps"]} == {2, 3} and all(s["slowest_rank"] == 1 for s in r["steps"])


def test_cli_stragglers_json_keys():
    out = subprocess.run([sys.executable, "-m", "distprof.cli", "stragglers", DLRM, "--json"],
                         capture_output=True, text=True, check=True)
    doc = json.loads(out.stdout)
    assert [set(r) >= {"rank", "wait_caused_us", "late_arrivals"} for r in doc["ranks"]] == [True] * 8
    caused = [r["wait_caused_us"] for r in doc["ranks"]]
    assert caused == sorted(caused, reverse=True)
    table = subprocess.run([sys.executable, "-m", "distprof.cli", "stragglers", DLRM], capture_output=True, text=True)
    assert table.returncode == 0 and "Stragglers: 8 collectives matched" in table.stdout


def test_kernel_metadata_names_group_and_collective():
    """nccl_data.json.gz records ``Process Group Name`` and ``Collective name`` on each NCCL kernel."""
    path = os.path.join(SHARED, "data", "traces", "hta", "nccl_data.json.gz")
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    expected = defaultdict(int)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "nccl" in e["name"].lower():
            expected[(e["args"]["Process Group Name"], e["args"]["Collective name"])] += 1
    got = defaultdict(int)
    for g, k, *_ in extract_collectives(read_trace(path))["collectives"]:
        got[(g, k)] += 1
    assert dict(got) == dict(expected) and set(expected) == {("0", "allreduce"), ("0", "broadcast")}


def _rank_trace(tmp_path, rank, starts):
    """A GPU trace whose NCCL kernels carry no group; the launching record_param_comms op names it."""
    events = []
    for i, (group, ts) in enumerate(starts):
        events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": ts - 5, "dur": 3,
                       "args": {"External id": 100 + i, "Process Group Name": group, "Collective name": "all_reduce"}})
        events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7,
                       "ts": ts, "dur": 10, "args": {"External id": 100 + i}})
    p = tmp_path / f"rank-{rank}.json"
    p.write_text(json.dumps({"distributedInfo": {"rank": rank}, "traceEvents": events}))
    return str(p)


def test_groups_from_the_launching_op_are_matched_separately(tmp_path):
    # Rank 1 is late in group "tp" only; group "dp" collectives interleave differently on the two ranks,
    # which would pair the wrong collectives if groups were not told apart.
    a = _rank_trace(tmp_path, 0, [("tp", 100), ("dp", 200), ("tp", 300)])
    b = _rank_trace(tmp_path, 1, [("dp", 150), ("tp", 160), ("tp", 360)])
    r = match_stragglers([extract_collectives(read_trace(p)) for p in (a, b)])
    assert r["matched"] == 3 and r["mismatched"] == []
    by = {(w["group"], w["index"]): (w["last_rank"], w["wait_caused_us"]) for w in r["worst"]}
    assert by == {("tp", 0): (1, 60.0), ("tp", 1): (1, 60.0), ("dp", 0): (0, 50.0)}


def test_plain_torch_profiler_traces_of_a_gloo_job(tmp_path):
    """No distprof in the job: torch.profiler + tensorboard_trace_handler, rank only in distributedInfo."""
    out = str(tmp_path / "tb")
    gloo_job.run(out, steps=5, world_size=2, config={"steps": [2, 3]}, slow_rank=0, slow_s=0.3, plain_torch=True)
    files = find_traces(out)
    assert len(files) == 2 and all(f.path.endswith(".pt.trace.json") and f.manifest_rank is None for f in files)
    per_rank = [extract_collectives(read_trace(f.path)) for f in files]
    r = match_stragglers(per_rank)
    assert sorted(x["rank"] for x in per_rank) == [0, 1] and r["sources"] == ["cpu"]
    assert r["ranks"][0]["rank"] == 0 and r["ranks"][0]["wait_caused_us"] > 100_000
    assert {s["step"] for s in r["steps"]} == {2, 3} and all(s["slowest_rank"] == 0 for s in r["steps"])
