"""distprof diff between two real runs and between two ranks."""

import gzip
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict

import pytest
from conftest import DATA
from tracekit import cli, table

from distprof.analysis import diff, summary
from distprof.analysis.records import to_json

TD = os.path.join(DATA, "hta", "trace-diff")
DLRM = os.path.join(DATA, "dlrm-8rank-v100")


def _kernel_totals(path):
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    tot = defaultdict(float)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"):
            tot[e["name"]] += float(e["dur"])
    return tot


@pytest.mark.slow
def test_two_runs_match_independent_totals_and_sort_by_change():
    a, b = (os.path.join(TD, n) for n in ("control.json.gz", "test.json.gz"))
    d = to_json(diff.compare([summary.extract(table(a))], [summary.extract(table(b))]))
    ka, kb = _kernel_totals(a), _kernel_totals(b)
    kernels = {r["name"]: r for r in d["rows"] if r["kind"] == "kernel"}
    assert set(kernels) == set(ka) | set(kb)
    for name, r in kernels.items():
        assert abs(r["change_us"] - (kb.get(name, 0.0) - ka.get(name, 0.0))) < 1e-6
    changes = [abs(r["change_us"]) for r in d["rows"]]
    assert changes == sorted(changes, reverse=True)
    assert abs(d["kernel_total_b_us"] - sum(kb.values())) < 1e-3


@pytest.mark.slow
def test_two_ranks_cli_json():
    code, d, _ = cli("diff", DLRM, DLRM, "--rank-a", "7", "--rank-b", "1", "--json", "--top", "5", "--workers", "2")
    assert code == 0 and len(d["rows"]) == 5 and {"kind", "name", "a_us", "b_us", "change_us", "ratio"} <= set(d["rows"][0])
    assert d["errors"] == [] and d["salvaged"] == []
    # Rank 1 spends far longer in NCCL than rank 7 (rank 7 is the straggler the others wait for).
    comm = next(r for r in d["rows"] if r["kind"] == "category" and r["name"] == "communication")
    assert comm["change_us"] > 0
    code, same, _ = cli("diff", DLRM, DLRM, "--json")
    assert code == 0 and all(r["change_us"] == 0 for r in same["rows"])


@pytest.mark.slow
def test_unreadable_files_are_errors_with_exit_1(tmp_path):
    src = tmp_path / "in"
    shutil.copytree(DLRM, src)
    (src / "rank-9.json").write_text("{not json")
    code, d, _ = cli("diff", DLRM, src, "--json")
    assert code == 1 and [e["path"] for e in d["errors"]] == [str(src / "rank-9.json")]
    code, text, err = cli("diff", DLRM, src)
    assert code == 1 and "rank-9.json" in err


def test_two_steps_of_one_run_by_phase(tmp_path):
    from helpers import run

    from distprof import Profiler, ProfilerConfig

    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all", steps=[2, 3], torch={"activities": ["cpu"]})
    run(Profiler(cfg, role="actor", rank=0, world_size=1), 5)
    (f,) = [os.path.join(d, n) for d, _, ns in os.walk(tmp_path / "r") for n in ns if n.endswith(".pt.trace.json.gz")]
    with gzip.open(f, "rt") as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]

    def phase_in_step(name, step):  # independent: annotation time that starts inside ProfilerStep#step
        (s,) = [e for e in events if e["name"] == f"ProfilerStep#{step}"]
        return sum(float(e["dur"]) for e in events if e["name"] == name and e.get("cat") == "user_annotation"
                   and float(s["ts"]) <= float(e["ts"]) < float(s["ts"]) + float(s["dur"]))

    out = subprocess.run([sys.executable, "-m", "distprof.cli", "diff", str(tmp_path / "r"), str(tmp_path / "r"),
                          "--step-a", "2", "--step-b", "3", "--json"], capture_output=True, text=True, check=True)
    rows = {(r["kind"], r["name"]): r for r in json.loads(out.stdout)["rows"]}
    fwd = rows[("phase", "train/forward")]
    assert fwd["a_count"] == fwd["b_count"] == 1
    assert abs(fwd["a_us"] - phase_in_step("train/forward", 2)) < 1e-6
    assert abs(fwd["b_us"] - phase_in_step("train/forward", 3)) < 1e-6
    missing = subprocess.run([sys.executable, "-m", "distprof.cli", "diff", str(tmp_path / "r"), str(tmp_path / "r"),
                              "--step-a", "99"], capture_output=True, text=True)
    assert missing.returncode == 2 and "ProfilerStep#99" in missing.stderr


def _steps_trace(path, n, rank=0, kernel_us=0.0, steps=True):
    """One rank: ``n`` steps of 10 ms, each with 4 ms of train/data, 1 ms of aten::mm and, when asked, a kernel."""
    from tracekit import X, write

    events = []
    for k in range(n):
        t = 1_000 + k * 10_000
        if steps:
            events.append(X(f"ProfilerStep#{3 + k}", t, 10_000, cat="user_annotation"))
        events.append(X("train/data", t + 100, 4_000, cat="user_annotation"))
        events.append(X("aten::mm", t + 5_000, 1_000))
        if kernel_us:
            events.append(X("gemm_kernel", t + 5_100, kernel_us, cat="kernel", pid=0, tid=7))
    return write(path, events, distributedInfo={"rank": rank, "world_size": 2})


def test_the_same_job_profiled_for_5_and_3_steps_compares_equal(tmp_path):
    """Rows compare means per step: before, a 5-step and a 3-step capture of one job gave 'train/data 0.60x'."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _steps_trace(tmp_path / "a" / "rank-0.json", 5)
    _steps_trace(tmp_path / "b" / "rank-0.json", 3)
    code, d, _ = cli("diff", tmp_path / "a", tmp_path / "b", "--json", "--workers", "1")
    assert code == 0 and d["compares"] == "per_step" and d["steps"] == {"a": 5, "b": 3}
    rows = {(r["kind"], r["name"]): r for r in d["rows"]}
    data = rows[("phase", "train/data")]
    assert data["ratio"] == 1.0 and data["a_per_step_us"] == data["b_per_step_us"] == 4_000
    assert (data["a_us"], data["b_us"]) == (20_000, 12_000)  # totals stay
    assert rows[("op", "aten::mm")]["ratio"] == 1.0
    assert [(s["role"], s["a_median_us"], s["b_median_us"], s["ratio"]) for s in d["step_time"]] == \
        [(None, 10_000, 10_000, 1.0)]
    assert any("step sets differ" in w and "A holds 5 steps (3-7), B 3 (3-5)" in w for w in d["warnings"])
    code, text, _ = cli("diff", tmp_path / "a", tmp_path / "b", "--workers", "1")
    assert code == 0 and "Step time, median 10.00 ms -> 10.00 ms (1.00x" in text
    assert "kernel" not in text.lower()  # a CPU run: no "device kernel time 0.0 us -> 0.0 us"


def test_diff_headlines_device_time_and_warns_when_ranks_differ(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    for rank in (0, 1):
        _steps_trace(tmp_path / "a" / f"rank-{rank}.json", 4, rank, kernel_us=500)
    _steps_trace(tmp_path / "b" / "rank-0.json", 4, 0, kernel_us=750)
    code, d, _ = cli("diff", tmp_path / "a", tmp_path / "b", "--json", "--workers", "1")
    assert code == 0 and d["rank_steps"] == {"a": 8, "b": 4}
    k = next(r for r in d["rows"] if r["name"] == "gemm_kernel")
    assert (k["a_per_step_us"], k["b_per_step_us"], k["ratio"]) == (500, 750, 1.5)  # per step and rank
    assert any("rank sets differ: A has 0-1, B has 0" in w for w in d["warnings"])
    code, text, _ = cli("diff", tmp_path / "a", tmp_path / "b", "--workers", "1")
    assert "Device kernel time per step and rank: 500.0 us -> 750.0 us (1.50x)" in text


def test_traces_without_steps_compare_totals_and_say_so(tmp_path):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _steps_trace(tmp_path / "a" / "rank-0.json", 5)
    _steps_trace(tmp_path / "b" / "rank-0.json", 3, steps=False)  # a foreign trace: no ProfilerStep ranges
    code, d, _ = cli("diff", tmp_path / "a", tmp_path / "b", "--json", "--workers", "1")
    assert code == 0 and d["compares"] == "totals" and d["steps"] == {"a": 5, "b": 0}
    data = next(r for r in d["rows"] if r["name"] == "train/data")
    assert data["ratio"] == 0.6 and data["a_per_step_us"] is None and data["b_per_step_us"] is None
    assert any("side B: 1 file without steps" in w and "rows compare totals" in w for w in d["warnings"])


def test_report_compare_compares_per_step_as_diff_does(tmp_path):
    """`report --compare` drew totals (a 5-step and a 3-step capture of one job looked 40% faster); now per step."""
    from distprof.report import write_report

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _steps_trace(tmp_path / "a" / "rank-0.json", 5)
    _steps_trace(tmp_path / "b" / "rank-0.json", 3)
    r = write_report(str(tmp_path / "a"), str(tmp_path / "r.html"), compare=str(tmp_path / "b"), workers=1)
    page = (tmp_path / "r.html").read_text()
    assert "No difference: both runs have the same kernels" in page and "Compared per step" in page
    assert any("step sets differ" in w for w in r["warnings"])
