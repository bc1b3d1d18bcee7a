"""Run identity: files of different jobs in one folder are never analysed as one job (issue 18, item 4)."""

import os
import shutil

from tracekit import TRACES, X, write

from distprof.analysis import analyze
from distprof.analysis import diagnose as diagnose_mod
from distprof.analysis.records import to_json

HTA = os.path.join(TRACES, "hta")
T0 = 1_700_000_000_000_000.0  # epoch µs
STEP = 10_000.0
KERNEL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"


def _job_file(path, rank, world, start, steps, late, pid=1):
    """One rank of a synthetic NCCL job: ProfilerStep ranges, one all-reduce per step; rank ``late`` arrives 2 ms
    after the others, who wait for it."""
    events = []
    for k, s in enumerate(steps):
        t = start + k * STEP
        events.append(X(f"ProfilerStep#{s}", t, STEP - 100, cat="user_annotation", pid=pid))
        events.append(X("aten::mm", t + 10, 500, pid=pid))
        arrive = t + 1_000 + (2_000 if rank == late else 0)
        events.append(X(KERNEL, arrive, t + 4_100 - arrive, cat="kernel", pid=0, tid=7))  # all end together
    return write(path, events, distributedInfo={"rank": rank, "world_size": world, "backend": "nccl"})


def _roles(doc):
    return {r["role"]: sorted(x["rank"] for x in doc["ranks"] if x["role"] == r["role"]) for r in doc["ranks"]}


def test_two_jobs_with_the_same_ranks_at_the_same_time_but_different_world_sizes_are_two_runs(tmp_path):
    # Job A (2 ranks, rank 1 late) and job B (ranks 0, 1 of a 4-rank job, rank 0 late), traced over the same
    # seconds: the old grouping (time spans only) made them one job, and kept one file per rank (conflicts).
    for rank in (0, 1):
        _job_file(tmp_path / f"a-rank-{rank}.json", rank, 2, T0, [5, 6, 7], late=1)
        _job_file(tmp_path / f"b-rank-{rank}.json", rank, 4, T0 + 15_000, [5, 6, 7], late=0)
    r = analyze.stragglers(str(tmp_path), workers=1, top=None)
    assert r["conflicts"] == []
    runs = {row["role"]: row for row in r["ranks"] if row["wait_caused_us"] > 0}
    assert set(_roles(r)) == {"(run 1)", "(run 2)"} and all(v == [0, 1] for v in _roles(r).values())
    # Each job's own straggler, matched with its own peers only: 3 collectives per job, 2 ms of waiting each.
    assert {role: row["rank"] for role, row in runs.items()} == {"(run 1)": 1, "(run 2)": 0}
    assert r["matched"] == 6 and all(abs(row["wait_caused_us"] - 6_000) < 1 for row in runs.values())
    (w,) = r["warnings"]
    assert "world size 2 vs 4" in w and "run 1: ranks 0,1; run 2: ranks 0,1" in w
    s = analyze.steps(str(tmp_path), workers=1)
    assert sorted((row["role"], row["step"]) for row in s["steps"]) == \
        [("(run 1)", 5), ("(run 1)", 6), ("(run 1)", 7), ("(run 2)", 5), ("(run 2)", 6), ("(run 2)", 7)]
    for row in s["steps"]:  # a row holds one job's files only
        assert {os.path.basename(x["path"])[0] for x in row["ranks"]} == {"a" if row["role"] == "(run 1)" else "b"}


def test_a_reused_tensorboard_folder_holds_two_runs_and_one_process_windows_stay_one(tmp_path):
    # tensorboard_trace_handler names files {host}_{pid}.{ms}.pt.trace.json. Job 1 (pids 100, 101) wrote two cycles
    # 10 minutes apart; job 2 profiled the same steps 3 hours later into the same folder, from a container that gave
    # its processes the same pids (a pid that runs step 3 again hours later is another process).
    def name(pid, t):
        return tmp_path / f"node1_{pid}.{int(t / 1000)}.pt.trace.json"

    for rank in (0, 1):
        _job_file(name(100 + rank, T0), rank, 2, T0, [3, 4], late=1)
        _job_file(name(100 + rank, T0 + 600e6), rank, 2, T0 + 600e6, [10, 11], late=1)
        _job_file(name(100 + rank, T0 + 3 * 3600e6), rank, 2, T0 + 3 * 3600e6, [3, 4], late=0)
    r = analyze.stragglers(str(tmp_path), workers=1, top=None)
    assert r["conflicts"] == []  # before: job 2's files "held the same steps" as job 1's and were dropped
    assert _roles(r) == {"(run 1)": [0, 1], "(run 2)": [0, 1]}
    by_run = {(s["role"], s["step"]): s["slowest_rank"] for s in r["steps"]}
    assert by_run == {("(run 1)", 3): 1, ("(run 1)", 4): 1, ("(run 1)", 10): 1, ("(run 1)", 11): 1,
                      ("(run 2)", 3): 0, ("(run 2)", 4): 0}
    (w,) = r["warnings"]
    assert "traced at least 2.8 hours apart" in w and "world size" not in w


def _finding_keys(doc):
    return {(f["id"], tuple(f["evidence"]["ranks"]), tuple(f["evidence"]["steps"]), round(f["cost_us"], 1))
            for f in doc["findings"]}


def test_hta_folder_of_unrelated_jobs_finds_nothing_no_single_job_has(tmp_path):
    """HTA's sample traces share rank numbers across jobs of 2022-2023: rank 1 of a 2-rank job (trace-diff/test) and
    ranks 0, 1 of a 128-rank job (two-rank-sampled), rank 0 of a single-GPU benchmark (simple_add). Grouped into one
    "run" they gave an outlier_steps finding (steps 551-552 against the other job's median step) and matched
    collectives across jobs."""
    folder = tmp_path / "hta"
    folder.mkdir()
    jobs = {"sampled": ["two-rank-sampled/sampled_rank-0.json.gz", "two-rank-sampled/sampled_rank-1.json.gz"],
            "test": ["trace-diff/test.json.gz"], "simple_add": ["simple_add.json.gz"]}
    for job, names in jobs.items():
        (tmp_path / job).mkdir()
        for n in names:
            for dest in (folder, tmp_path / job):
                shutil.copy(os.path.join(HTA, n), dest / os.path.basename(n))
    inv = analyze.investigate(str(folder), workers=1)  # what diagnose, steps and stragglers answer, from one read
    findings = [f.to_dict() for f in diagnose_mod.diagnose(inv)]
    alone = set()
    for job in jobs:
        alone |= _finding_keys(analyze.diagnose(str(tmp_path / job), workers=1))
    assert _finding_keys({"findings": findings}) <= alone  # nothing the jobs do not show one by one
    assert not any(f["id"] == "outlier_steps" for f in findings)
    w = next(w for w in inv.envelope()["warnings"] if "different runs" in w)
    assert "world size 2 vs 128 vs unknown" in w
    # The per-rank verbs keep the jobs apart: each steps row and each matched collective is one job's.
    job_of = {os.path.basename(n): job for job, names in jobs.items() for n in names}
    for row in inv.steps.steps:
        assert len({job_of[os.path.basename(x.path)] for x in row.ranks}) == 1, row.role
    # simple_add, sampled, test: three runs
    assert sorted(_roles(to_json(inv.stragglers)).values()) == [[0], [0, 1], [1]]
    assert inv.stragglers.conflicts == []


def test_run_directories_traced_together_are_two_runs_and_a_copy_is_one(tmp_path):
    """Two run directories under one folder, traced over the same seconds by different processes, are two jobs
    (before: one, and the second's ranks were dropped as conflicts). A copy of a run directory (the same
    processes wrote it) stays one run whose duplicate files are reported as conflicts."""
    import json

    from helpers import run

    from distprof import Profiler, ProfilerConfig

    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "runs" / "exp1"), ranks="all", steps=[1],
                         torch={"activities": ["cpu"]})
    for rank in (0, 1):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 3)
    shutil.copytree(tmp_path / "runs" / "exp1", tmp_path / "copy" / "exp1")
    shutil.copytree(tmp_path / "runs" / "exp1", tmp_path / "copy" / "again")
    shutil.copytree(tmp_path / "runs" / "exp1", tmp_path / "runs" / "exp2")
    for manifest in (tmp_path / "runs" / "exp2").rglob("manifest.jsonl"):  # exp2: another job's processes
        lines = [json.loads(x) for x in manifest.read_text().splitlines()]
        manifest.write_text("".join(json.dumps({**x, "pid": x["pid"] + 1}) + "\n" for x in lines))
    two = analyze.steps(str(tmp_path / "runs"), workers=1)
    assert two["conflicts"] == [] and {r["role"] for r in two["steps"]} == {"actor (run 1)", "actor (run 2)"}
    assert any("run directory exp1 vs exp2" in w for w in two["warnings"])
    copies = analyze.steps(str(tmp_path / "copy"), workers=1)
    assert {r["role"] for r in copies["steps"]} == {"actor"} and len(copies["conflicts"]) == 2
    assert not any("different runs" in w for w in copies["warnings"])
