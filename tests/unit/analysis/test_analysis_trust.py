"""Numbers a user can trust: regressions for what a new user saw within minutes (issue: multi-rank answers).

Synthetic traces here are small hand-written Kineto-format files, each standing in for a real case the
tests/data set does not hold (MTIA, the 2021 schema, a world-size-1 job with an elementwise
"broadcast" kernel); the real-job cases use the real DDP job in conftest (``ddp_run``).
"""

import json
import os
import stat
import subprocess
import sys

import pytest
from conftest import SLOW_S
from tracekit import DLRM, TRACES, X, cli, table, write

from distprof.analysis import analyze, summary
from distprof.trace.vocab import is_comm_kernel, profiler_step


# ---- CPU / gloo jobs --------------------------------------------------------------------------------------
def test_cpu_job_has_its_own_figures_and_shares_that_fit(ddp_run):
    s = analyze.summary(ddp_run, workers=1, top=None)
    assert not s["kernels"] and {r["rank"] for r in s["ranks"]} == {0, 1}
    for r in s["ranks"]:
        h = r["temporal"]["host"]
        assert r["temporal"]["device"] is None
        parts = h["compute_us"] + h["communication_us"] + h["idle_us"]
        assert parts == pytest.approx(h["span_us"]) and all(0 <= h[k] <= 1 for k in ("compute_share", "communication_share", "idle_share"))
        assert h["threads"]["communication"] > 0  # gloo's run loop threads did the all-reduces
    by = {r["rank"]: r["temporal"]["host"] for r in s["ranks"]}
    # Rank 0 waits for slow rank 1 inside the all-reduces: communication is a real share of its time.
    assert by[0]["communication_us"] > by[1]["communication_us"] and by[0]["communication_share"] > 0.2
    names = {p["name"] for p in s["phases"]}
    assert not any(n.startswith("gloo:") for n in names) and "train/data" in names
    assert all(0 <= p["share"] <= 1 for p in s["phases"])
    data = next(p for p in s["phases"] if p["name"] == "train/data")
    assert data["wall_us"] >= 4 * SLOW_S * 1e6  # rank 1 slept in it in each of its 4 recorded steps
    assert data["share"] == pytest.approx(data["wall_us"] / s["traced_us"])
    b = s["step_breakdown"]
    assert b["communication"] > 0 and b["kernel"] == 0 and sum(b[k] for k in b if k != "dur_us") == pytest.approx(b["dur_us"])


def test_steps_names_the_rank_that_holds_the_others_back(ddp_run):
    d = analyze.steps(ddp_run, workers=1)
    assert [r["step"] for r in d["steps"]] == [2, 3, 5, 6]
    for row in d["steps"]:
        by = {x["rank"]: x for x in row["ranks"]}
        assert row["slowest_rank"] == 1  # slept in train/data: the others waited for it
        assert by[0]["waited_us"] > by[1]["waited_us"] and by[1]["busy_us"] > by[0]["busy_us"]
        assert by[1]["phases"]["train/data"] >= SLOW_S * 1e6 > 10 * by[0]["phases"].get("train/data", 0.0)
    code, text, _ = cli("steps", ddp_run)
    assert code == 0 and "train/data" in text and "1 *" in text  # per-rank phases in the table, not only --json


# ---- what counts as communication, and as device work ------------------------------------------------------
def test_communication_is_recognised_by_family_and_metadata_not_words(tmp_path):
    names = {
        "void at::native::vectorized_elementwise_kernel<4, at::native::_broadcast_kernel_launcher>": False,
        "void at::native::reduce_kernel<512, 1, all_reduce_sum_like>": False,
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": True,
        "ncclDevKernel_Generic": True,
        "void c10d::symmetric_memory::multimem_all_reduce_kernel<float, 16>": True,
        "rcclGenericKernel": True,
    }
    assert {n: is_comm_kernel(n) for n in names} == names
    events = [X(n, 10 * i, 5, cat="kernel", pid=0, tid=7, correlation=i) for i, n in enumerate(names)]
    events.append(X("my_custom_collective", 100, 5, cat="kernel", pid=0, tid=7, Collective_name="allreduce"))
    p = write(tmp_path / "rank-0.json", events, distributedInfo={"rank": 0, "world_size": 1})
    cats = summary.extract(table(p))["categories"]
    assert cats == {"communication": 5.0 * 5, "compute": 5.0 * 2}


def test_other_accelerators_count_and_unknown_device_categories_are_named(tmp_path):
    events = [X("ProfilerStep#1", 0, 100, cat="user_annotation"),
              X("aten::mm", 1, 10, cat="cpu_op"),
              X("mtia_gemm_kernel", 5, 20, cat="mtia_ccp_events", pid=0, tid=1),
              X("mtia_add_kernel", 30, 10, cat="mtia_ccp_events", pid=0, tid=1),
              X("weird_thing", 40, 10, cat="foo_device_kernel", pid=0, tid=2)]
    p = write(tmp_path / "rank-0.json", events)
    code, doc, err = cli("summary", p, "--json")
    assert code == 0 and {k["name"] for k in doc["kernels"]} == {"mtia_gemm_kernel", "mtia_add_kernel"}
    assert doc["ranks"][0]["device_busy_us"] == 30.0
    assert any("foo_device_kernel" in w and "not counted" in w for w in doc["warnings"])
    code, text, err = cli("summary", p)
    assert "foo_device_kernel" in err


def test_legacy_schema_profiler_step_is_a_step_not_an_op(tmp_path):
    events = [X("ProfilerStep#7", 0, 100, cat="Operator"), X("aten::add", 10, 5, cat="Operator"),
              X("add_kernel", 20, 5, cat="Kernel", pid=0, tid=7), X("Memcpy HtoD", 30, 4, cat="Memcpy", pid=0, tid=7),
              X("cudaLaunchKernel", 12, 2, cat="Runtime")]
    p = write(tmp_path / "worker0.pt.trace.json", events)
    s = analyze.summary(p, workers=1)
    assert [o["name"] for o in s["ops"]] == ["aten::add"]
    assert s["categories"] == {"compute": 5.0, "memcpy": 4.0}
    d = analyze.steps(p, workers=1)
    assert [r["step"] for r in d["steps"]] == [7]


def test_step_numbers_are_ascii_digits():
    assert profiler_step("ProfilerStep#12") == 12
    assert profiler_step("ProfilerStep#²") is None and profiler_step("ProfilerStep#١") is None
    assert profiler_step("ProfilerStep#") is None and profiler_step("ProfilerStep#3x") is None


def test_unicode_digit_step_does_not_break_any_verb(tmp_path):
    events = [X("ProfilerStep#²", 0, 100, cat="user_annotation"), X("ProfilerStep#1", 100, 100, cat="user_annotation"),
              X("c10d::allreduce_", 150, 5)]
    src = tmp_path / "in"
    src.mkdir()
    for r in (0, 1):
        write(src / f"rank-{r}.json", events, distributedInfo={"rank": r})
    for verb in ("summary", "steps", "stragglers"):
        code, doc, err = cli(verb, src, "--json")
        assert code == 0, (verb, err)
    code, doc, err = cli("diff", src, src, "--step-a", "1", "--step-b", "1", "--json")
    assert code == 0, err


# ---- work outside the steps --------------------------------------------------------------------------------
def _with_outside_work(tmp_path):
    events = [X("ProfilerStep#3", 100, 100, cat="user_annotation"),
              X("cudaLaunchKernel", 110, 5, cat="cuda_runtime", correlation=1),
              X("cudaLaunchKernel", 120, 5, cat="cuda_runtime", correlation=2),
              X("cudaLaunchKernel", 300, 5, cat="cuda_runtime", correlation=3),  # after the step
              # launched inside the step, running past its end: still the step's
              X("gemm", 150, 80, cat="kernel", pid=0, tid=7, correlation=1),
              X("gemm", 240, 20, cat="kernel", pid=0, tid=7, correlation=2),
              X("gemm", 310, 50, cat="kernel", pid=0, tid=7, correlation=3)]
    return write(tmp_path / "rank-0.json", events)


def test_steps_only_counts_what_the_steps_launched(tmp_path):
    p = _with_outside_work(tmp_path)
    whole = analyze.summary(p, workers=1)
    inside = analyze.summary(p, workers=1, selection=analyze.Selection(steps_only=True))
    assert whole["kernels"][0]["total_us"] == 150.0 and inside["kernels"][0]["total_us"] == 100.0
    assert whole["outside_steps"]["device_us"] == 50.0 and whole["scope"]["steps_only"] is False
    assert inside["scope"]["steps_only"] is True
    code, text, err = cli("summary", p)
    assert "outside ProfilerStep ranges" in text and "33.3% of device time" in text
    code, doc, _ = cli("summary", p, "--steps", "3", "--json")
    assert code == 0 and doc["kernels"][0]["total_us"] == 100.0 and doc["scope"]["steps"] == [3]
    code, _, err = cli("summary", p, "--steps", "4")
    assert code == 2 and "ProfilerStep#4" in err


def test_selection_happens_before_reading_and_on_every_verb():
    for verb in ("summary", "steps", "stragglers"):
        code, doc, _ = cli(verb, DLRM, "--ranks", "1,7", "--json")
        assert code == 0 and doc["skipped"] == 6 and doc["files_read"] == 2, verb
    code, doc, _ = cli("stragglers", DLRM, "--ranks", "1,7", "--json")
    assert {r["rank"] for r in doc["ranks"]} == {1, 7} and doc["matched"] == 8
    code, _, err = cli("summary", DLRM, "--ranks", "x")
    assert code == 2 and "--ranks" in err and "'x'" in err


# ---- error paths: the same codes and keys on every verb ---------------------------------------------------
VERBS = [("summary",), ("steps",), ("stragglers",), ("diff", DLRM)]


@pytest.fixture
def mixed(tmp_path):
    """DLRM's 8 ranks plus one unreadable file and one cut-off copy of rank 0 (renamed rank 9)."""
    import gzip
    import shutil

    src = tmp_path / "mixed"
    shutil.copytree(DLRM, src)
    (src / "rank-8.json").write_text("[[1, 2], [3]]")
    raw = gzip.open(next(src.glob("worker0_*"))).read()
    doc = json.loads(raw)
    doc["distributedInfo"]["rank"] = 9
    cut = json.dumps(doc).encode()
    (src / "rank-9.json").write_bytes(cut[: len(cut) // 2])
    return src


@pytest.mark.slow
@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_exit_codes_and_error_keys_mean_the_same_on_every_verb(verb, mixed, tmp_path):
    args = (verb[0], *verb[1:], mixed)
    code_json, doc, _ = cli(*args, "--json")
    code_text, _, err = cli(*args)
    assert code_json == code_text == 1
    assert [e["path"] for e in doc["errors"]] == [str(mixed / "rank-8.json")]
    message = doc["errors"][0]["message"]  # a list of lists is valid JSON, just not a trace
    assert "not valid JSON" not in message and "trace" in message
    assert [s["path"] for s in doc["salvaged"]] == [str(mixed / "rank-9.json")] and doc["salvaged"][0]["truncated"]
    assert "rank-8.json" in err and "rank-9.json" in err and "salvaged" in err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.json").write_text("{")
    args = (verb[0], *verb[1:], bad)
    assert cli(*args, "--json")[0] == cli(*args)[0] == 2


def test_merge_errors(tmp_path, mixed):
    code, _, err = cli("merge", DLRM, "-o", tmp_path / "no" / "such" / "x.json.gz")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "does not exist" in err
    code, doc, _ = cli("merge", mixed, "-o", tmp_path / "m.json", "--json")
    assert code == 1 and [e["path"] for e in doc["errors"]] == [str(mixed / "rank-8.json")]
    assert [s["path"] for s in doc["salvaged"]] == [str(mixed / "rank-9.json")]
    assert not list(tmp_path.glob(".tmp-*"))  # no temporary output left behind
    assert doc["skipped"] == 0 and doc["scope"]["ranks"] is None and doc["warnings"] == [] and doc["conflicts"] == []


def test_merge_never_writes_over_its_inputs_or_over_what_is_not_a_file(tmp_path):
    """merge writes a temporary file and renames it over -o: as root that replaced its own input (a read-only
    trace in a read-only folder) and /dev/full. Every such output is now refused before anything is read."""
    import hashlib
    import shutil

    src = tmp_path / "in"
    shutil.copytree(DLRM, src)
    victim = next(src.glob("worker0_*"))
    before = hashlib.md5(victim.read_bytes()).hexdigest()
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    for out, words in ((victim, "is one of the traces being read"), (fifo, "not a regular file (a FIFO)"),
                       ("", "the output (-o) is empty"), (tmp_path, "is a directory"),
                       ("/proc/distprof-merge.json", "cannot write")):
        code, _, err = cli("merge", src, "-o", out)
        assert code == 2 and len(err.strip().splitlines()) == 1 and words in err, (out, err)
    assert hashlib.md5(victim.read_bytes()).hexdigest() == before and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_merge_gives_every_file_its_own_track_name(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for name in ("a.json", "b.json"):  # two unranked files, both with a process named "python"
        write(src / name, [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
                           X("op", 1, 1)])
    code, _, err = cli("merge", src, "-o", tmp_path / "m.json")
    assert code == 0, err
    names = [e["args"]["name"] for e in json.loads((tmp_path / "m.json").read_text())["traceEvents"]
             if e["name"] == "process_name"]
    assert len(names) == len(set(names)) == 2
    # Two copies of one run side by side share every file name: the path under PATH tells them apart.
    two = tmp_path / "two"
    for d in ("a", "b"):
        (two / d).mkdir(parents=True)
        write(two / d / "rank-0.json", [X("op", 1, 1)], distributedInfo={"rank": 0})
    code, _, err = cli("merge", two, "-o", tmp_path / "m2.json")
    assert code == 0, err
    names = sorted(e["args"]["name"] for e in json.loads((tmp_path / "m2.json").read_text())["traceEvents"]
                   if e["name"] == "process_name")
    assert names == ["rank 0 (a/rank-0.json) (1)", "rank 0 (b/rank-0.json) (1)"]


def test_names_from_traces_print_as_written(tmp_path):
    names = ["[/x]", "[param|cuda]", "[bold red]loud[/bold red]", "<script>alert(1)</script>"]
    events = [X(n, 10 * i, 5, cat="kernel", pid=0, tid=7) for i, n in enumerate(names)]
    events += [X(n, 10 * i, 5) for i, n in enumerate(names)] + [X(n, 10 * i, 5, cat="user_annotation", tid=2)
                                                               for i, n in enumerate(names)]
    p = write(tmp_path / "rank-0.json", events)
    code, text, err = cli("summary", p)
    assert code == 0, err
    for n in names:
        assert n in text
    assert cli("steps", p)[0] == 0 and cli("diff", p, p)[0] == 0


def test_internal_errors_have_their_own_exit_code(tmp_path):
    code = ("import sys, distprof.analysis.summary as s\n"
            "def boom(tb): raise KeyError('bug')\n"
            "s.extract = boom\n"
            "sys.argv = ['distprof', *sys.argv[1:]]\n"
            "from distprof.cli import main\nmain()\n")
    args = [sys.executable, "-c", code]
    plain = subprocess.run(args + ["summary", DLRM, "--workers", "1"], capture_output=True, text=True)
    assert plain.returncode == 3 and "internal error" in plain.stderr and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1
    debug = subprocess.run(args + ["--debug", "summary", DLRM, "--workers", "1"], capture_output=True, text=True)
    assert debug.returncode == 3 and "Traceback" in debug.stderr and "KeyError" in debug.stderr


def test_out_of_range_ids_in_args_cost_the_links_not_the_file(tmp_path):
    """A correlation id, External id or stream beyond int64 (ids go into int64 columns): the event still
    counts, without its links; before, numpy raised OverflowError and the CLI exited 3."""
    events = [X("cudaLaunchKernel", 0, 5, cat="cuda_runtime", correlation=10**23),
              X("gemm", 10, 20, cat="kernel", pid=0, tid=7, correlation=10**23, stream=-(10**30)),
              X("gemm", 40, 20, cat="kernel", pid=0, tid=7, External_id=2**64)]
    p = write(tmp_path / "rank-0.json", events)
    for verb in ("summary", "steps", "stragglers"):
        code, doc, err = cli(verb, p, "--json")
        assert code == 0 and "Traceback" not in err, (verb, err)
    code, doc, _ = cli("summary", p, "--json")
    assert doc["kernels"] == [{"name": "gemm", "count": 2, "total_us": 40.0, "share": 1.0}]


def test_control_characters_in_names_and_paths_are_escaped(tmp_path):
    """An ESC sequence in a kernel name restyled the terminal; a newline split a table row or an error line."""
    names = ["red\x1b[31mkernel", "two\nlines", "back\rspace"]
    events = [X(n, 10 * i, 5, cat="kernel", pid=0, tid=7) for i, n in enumerate(names)]
    events += [X("step", 0, 100, cat="user_annotation"), X("ProfilerStep#1", 0, 100, cat="user_annotation")]
    p = write(tmp_path / "rank-0.json", events)
    for verb in ("summary", "steps"):
        code, text, err = cli(verb, p)
        assert code == 0 and "\x1b" not in text + err and "\r" not in text, verb
    code, text, _ = cli("summary", p)
    assert "red\\x1b[31mkernel" in text and "two\\nlines" in text and "back\\rspace" in text
    bad = tmp_path / "evil\nname\x1b[2J.json"  # a file name is untrusted too
    bad.write_text("{")
    code, _, err = cli("summary", bad)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "\x1b" not in err and "evil\\nname" in err


def test_ranks_of_different_runs_are_never_matched():
    """trace-diff holds rank 3 of one job and rank 1 of another, 8.5 days apart: both have ProfilerStep#1009-1012,
    and stragglers matched their 60 NCCL kernels as if one job (163 ms of invented waiting)."""
    folder = os.path.join(TRACES, "hta", "trace-diff")
    code, doc, err = cli("stragglers", folder, "--json")
    assert code == 0 and doc["matched"] == 0 and all(r["wait_caused_us"] == 0 for r in doc["ranks"])
    assert {(r["role"], r["rank"]) for r in doc["ranks"]} == {("(run 1)", 3), ("(run 2)", 1)}
    (w,) = doc["warnings"]
    assert "8.5 days apart" in w and "run 1: ranks 3; run 2: ranks 1" in w
    code, doc, _ = cli("steps", folder, "--json")
    assert code == 0 and all(len(row["ranks"]) == 1 for row in doc["steps"]) and len(doc["warnings"]) == 1
    # Ranks traced together stay one run, whatever their windows: DLRM's 8 ranks, the real gloo job's two windows.
    code, doc, _ = cli("stragglers", DLRM, "--json")
    assert doc["warnings"] == [] and {r["role"] for r in doc["ranks"]} == {None}


def test_odd_identities_are_named_not_silently_resolved(tmp_path):
    steps = [X("ProfilerStep#1", 0, 100, cat="user_annotation"), X("ProfilerStep#1", 50, 100, cat="user_annotation"),
             X("op", 10, 5)]
    for bad in (-1, "3", True, 10**30):
        p = write(tmp_path / f"rank-5-{bad!s:.5}.json", steps, distributedInfo={"rank": bad, "world_size": 8})
        code, doc, _ = cli("summary", p, "--json")
        assert code == 0 and doc["ranks"][0]["rank"] == 5  # from the file name
        assert any("distributedInfo.rank" in w and "rank 5 taken from the name" in w for w in doc["warnings"]), bad
        assert any("ProfilerStep #1 appear more than once" in w for w in doc["warnings"])
