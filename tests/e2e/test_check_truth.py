"""distprof check tells the truth: resumed, cut-short, triggered and not-uploaded windows, writer clashes, runs on
fsspec URLs, and run directories that try to make it read outside themselves, hang or run out of memory.

Run directories are written by the real Profiler on CPU (and a real crashing child process); fields written by
other parts of distprof (trigger, upload failure, memory guard, writer conflict) are set on real manifest lines.
"""

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once
from conftest import JOBS
from helpers import PEAK_MB, run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ray import cfg as ray_cfg  # noqa: F401 - the local Ray cluster fixture
from test_ray import cluster, make, train  # noqa: F401 - cluster: the local Ray cluster fixture
from tracekit import cli  # the real CLI app, in this process unless process=True

from distprof import Profiler, ProfilerConfig
from distprof.analysis.check import STATUSES, check_run

JOB = os.path.join(JOBS, "crash_job.py")
CPU = {"activities": ["cpu"]}


def items(res, status=None):
    return [i for i in res.items if status is None or i.status == status]


def rank_folder(root, role="main", rank=0):
    return root / role / f"rank{rank:05d}"


def records(root, role="main", rank=0):
    return [json.loads(x) for x in (rank_folder(root, role, rank) / "manifest.jsonl").read_text().splitlines()]


def rewrite(root, recs, role="main", rank=0):
    (rank_folder(root, role, rank) / "manifest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def saved_config(root):
    return ProfilerConfig.from_saved(json.loads((root / "run.json").read_text())["config"])


@pytest.fixture(scope="module")
def two_windows(tmp_path_factory):
    """Rank 0 of role main, windows 1-2 and 4, run through step 5."""
    root = tmp_path_factory.mktemp("tw") / "run"
    run(Profiler(ProfilerConfig(enable=True, save_path=str(root), steps=[1, 2, 4], torch=CPU)), 6)
    return root


@pytest.fixture
def copy(two_windows, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(two_windows, dst)
    return dst


# ---- resumed, cut short, not reached ------------------------------------------------------------------------
def test_resumed_mid_window_is_incomplete_not_missing(tmp_path):
    root = tmp_path / "run"
    cfg = ProfilerConfig(enable=True, save_path=str(root), steps=[3, 4, 5], torch=CPU)
    run(Profiler(cfg), 3)  # stopped at 3: nothing captured
    run(Profiler(cfg, global_step=4), 3)  # resumed at 4: the file is step00000004-00000005, the line [4, 5]
    assert [r["steps"] for r in records(root)] == [[4, 5]]
    res = check_run(str(root))
    (item,) = res.items
    assert (item.steps, item.status, item.detail) == ([3, 5], "incomplete", "resumed at step 4: steps 3-3 were not captured")
    assert item.file.endswith("step00000004-00000005.pt.trace.json.gz")  # listed, not "unlisted"
    code, out, err = cli("check", root)
    assert code == 1 and "resumed at step 4" in out and "missing" not in out and "unlisted" not in out


@pytest.mark.slow
def test_window_split_by_a_crash_and_a_resume_in_another_process_is_whole(tmp_path):
    root = tmp_path / "run"
    proc = warmpython.run([sys.executable, JOB, "raise", str(root)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "boom at step 4" in proc.stderr
    (cut,) = records(root)
    assert (cut["steps"], cut["complete"], cut["stopped_by"]) == ([3, 4], False, "exception")
    alone = check_run(str(root))
    (item,) = alone.items
    assert item.status == "incomplete" and item.detail == "cut short by exception after step 4: steps 5-5 were not captured"

    run(Profiler(saved_config(root), role="main", global_step=4), 4)  # the job resumed at 4, in this process
    res = check_run(str(root))
    assert res.ok, res.to_dict()
    assert [(i.steps, i.status) for i in res.items] == [([3, 5], "ok"), ([3, 5], "ok")]
    assert any("written by 2 processes one after another" in n and str(cut["pid"]) in n for n in res.notes)


def test_cut_short_run_leaves_later_windows_not_reached(tmp_path):
    root = tmp_path / "run"
    cfg = ProfilerConfig(enable=True, save_path=str(root), ranks="all", steps=[1, 2, 3, 6, 7], torch=CPU)
    run(Profiler(cfg, rank=0, world_size=2), 4)  # ran steps 0-3: window 1-3 whole, 6-7 never reached
    res = check_run(str(root))
    got = {(i.rank, tuple(i.steps), i.status) for i in res.items}
    assert got == {(0, (1, 3), "ok"), (0, (6, 7), "not_reached"), (1, (1, 3), "missing"), (1, (6, 7), "not_reached")}
    assert next(i for i in items(res, "not_reached")).detail == "not reached (the run ended at step 3)"
    assert not res.ok  # rank 1 reached window 1-3 and has nothing
    shutil.rmtree(root)
    run(Profiler(cfg, rank=0, world_size=2), 4)
    run(Profiler(cfg, rank=1, world_size=2), 4)
    res = check_run(str(root))
    assert res.ok and len(items(res, "not_reached")) == 2  # not reached is not a failure
    code, out, _ = cli("check", root, "--json")
    assert code == 0 and out["ok"] is True


def test_a_run_that_captured_nothing_fails_with_every_window_missing(copy):
    os.unlink(rank_folder(copy) / "manifest.jsonl")
    res = check_run(str(copy))
    assert res.problems == ["main: nothing was captured (no manifest line in any rank folder)"]
    assert [(i.steps, i.status) for i in res.items if i.status != "unlisted"] == [([1, 2], "missing"), ([4, 4], "missing")]


def test_missing_windows_of_a_rank_on_a_node_collect_could_not_reach_name_the_node(copy):
    """collect.json (written by distprof.integrations.ray.collect) says which node held which ranks; a rank's missing windows say
    so. Entries of the wrong shape, or naming a role outside the run, are ignored."""
    shutil.rmtree(rank_folder(copy))
    (copy / "collect.json").write_text(json.dumps({"unreachable_nodes": [
        {"node_id": "ab" * 20, "address": "10.0.0.7", "error": "the node is dead", "not_copied": None,
         "ranks": [{"role": "main", "rank": 0}, {"role": "../x", "rank": 0}, {"role": "main", "rank": "0"}, 7]},
        "junk", {"ranks": "x"}], "unreachable_workers": []}))
    res = check_run(str(copy))
    why = "not collected: node abababababab (10.0.0.7) was unreachable: the node is dead"
    missing = items(res, "missing")
    assert missing and all(i.detail.endswith(why) for i in missing) and not res.ok
    from distprof.trace.listing import find_traces

    assert not any(f.path.endswith("collect.json") for f in find_traces(str(copy)))  # a run file, never a trace
    (copy / "collect.json").write_text("{not json")
    res = check_run(str(copy))
    assert not any(why in i.detail for i in res.items) and any(n.startswith("collect.json: not valid JSON") for n in res.notes)


def test_memory_guard_stop_names_its_numbers(copy):
    recs = records(copy)
    recs[0].update(steps=[1, 1], complete=False, stopped_by="memory_guard", guard={"limit": "max_host_memory_gb", "measured": 9.5, "limit_value": 8.0, "rss_gb": 9.5})
    rewrite(copy, recs)
    res = check_run(str(copy))
    item = next(i for i in res.items if i.steps == [1, 2])
    assert item.status == "incomplete"
    assert item.detail == ("stopped by the memory guard after step 1 (max_host_memory_gb: measured 9.5, limit 8.0): "
                           "steps 2-2 were not captured")


# ---- triggered, not uploaded, writers -----------------------------------------------------------------------
def test_triggered_window_is_expected_by_its_own_line(copy):
    recs = records(copy)
    src = rank_folder(copy) / "step00000004-00000004.pt.trace.json.gz"
    for steps, name in (([9, 9], "step00000009-00000009.pt.trace.json.gz"), ([11, 11], "step00000011-00000011.pt.trace.json.gz")):
        shutil.copy(src, rank_folder(copy) / name)
        entry = {"path": f"main/rank00000/{name}", "bytes": src.stat().st_size}
        recs.append(dict(recs[1], steps=steps, trigger=f"req-{steps[0]}", files=[entry], **entry))
    skipped = {k: v for k, v in recs[1].items() if k not in ("files", "file", "bytes")}
    recs.append(dict(skipped, steps=[20, 21], trigger="req-20", complete=False, stopped_by="trigger_skipped"))
    rewrite(copy, recs)
    os.unlink(rank_folder(copy) / "step00000011-00000011.pt.trace.json.gz")
    res = check_run(str(copy))
    trig = {tuple(i.steps): (i.status, i.detail) for i in res.items if "on demand" in i.detail}
    assert trig == {(9, 9): ("ok", "on demand (request req-9)"),
                    (11, 11): ("missing", "on demand (request req-11); listed in the manifest but not on disk")}
    assert not items(res, "unlisted")
    assert res.notes == ["main rank 0: skipped requested steps 20-21 (request req-20, trigger_skipped)"]


def test_failed_upload_is_not_uploaded_and_names_host_and_folder(copy):
    recs = records(copy)
    recs[1].update(upload_error="EndpointConnectionError: s3 unreachable", local_path="/scratch/distprof/run")
    rewrite(copy, recs)
    os.unlink(rank_folder(copy) / "step00000004-00000004.pt.trace.json.gz")  # it never reached save_path
    res = check_run(str(copy))
    (item,) = items(res, "not_uploaded")
    assert item.steps == [4, 4] and recs[1]["host"] in item.detail and "/scratch/distprof/run" in item.detail
    assert "s3 unreachable" in item.detail and not res.ok


def test_two_writers_at_once_are_a_problem_one_after_another_a_note(copy):
    recs = records(copy)
    recs[1]["pid"] = recs[0]["pid"] + 1
    recs[1]["start_time"] = recs[0]["start_time"] + 1e-6  # overlaps the first window: two processes, one rank
    rewrite(copy, recs)
    res = check_run(str(copy))
    assert res.problems == [f"two writers claimed main rank 0 (pids {recs[0]['pid']}, {recs[1]['pid']})"]
    recs[1]["start_time"] = recs[0]["end_time"] + 1  # after it: a resumed run
    recs[1]["end_time"] = recs[1]["start_time"] + 1
    rewrite(copy, recs)
    res = check_run(str(copy))
    assert res.ok and any("one after another" in n for n in res.notes)
    recs[1]["writer_conflict"] = True  # its name was taken, by a writer that had finished: a resumed job
    rewrite(copy, recs)
    res = check_run(str(copy))
    assert res.ok and any("kept in both copies" in n for n in res.notes)
    del recs[1]["start_time"]  # a clash that cannot be placed in time is a clash
    rewrite(copy, recs)
    assert check_run(str(copy)).problems == [f"two writers claimed main rank 0 (pids {recs[0]['pid']}, {recs[1]['pid']})"]


def test_a_window_captured_twice_by_a_resumed_job_is_whole(copy):
    """A job resumed from a checkpoint captures window 4 again; the second writer keeps its copy under a pid-named
    file and marks its line ``writer_conflict`` (as the profiler does when a window's name is taken)."""
    recs = records(copy)
    src = rank_folder(copy) / "step00000004-00000004.pt.trace.json.gz"
    pid = recs[1]["pid"] + 1
    name = f"step00000004-00000004.pid{pid}.pt.trace.json.gz"
    shutil.copy(src, rank_folder(copy) / name)
    entry = {"path": f"main/rank00000/{name}", "bytes": src.stat().st_size}
    t0 = recs[1]["end_time"] + 60
    recs.append(dict(recs[1], pid=pid, start_time=t0, end_time=t0 + 1, writer_conflict=True, files=[entry], **entry))
    rewrite(copy, recs)
    res = check_run(str(copy))
    assert res.ok, res.to_dict()
    assert [(i.steps, i.status, i.detail) for i in res.items if i.steps == [4, 4]] == [
        ([4, 4], "ok", "this window was captured more than once (both copies kept)")] * 2
    assert any("one after another" in n and "kept in both copies" in n for n in res.notes)


# ---- nothing outside is read, followed, waited on or loaded whole ----------------------------------------------
def test_manifest_naming_files_outside_its_rank_folder_is_broken_and_not_read(copy):
    recs = records(copy)
    size = os.path.getsize("/etc/passwd")
    for rec, path in zip(recs, ("../../../../../../etc/passwd", "/etc/passwd")):
        rec["files"] = [{"path": path, "bytes": size}]
        rec["file"], rec["bytes"] = path, size
    rewrite(copy, recs)
    res = check_run(str(copy))
    broken = [(i.file, i.detail) for i in items(res, "broken")]
    assert broken == [("../../../../../../etc/passwd", "names a file outside its rank folder; not read"),
                      ("/etc/passwd", "names a file outside its rank folder; not read")]
    assert not items(res, "ok")


def test_symlinks_out_are_not_followed_even_to_a_valid_trace(copy, tmp_path):
    folder = rank_folder(copy)
    trace = folder / "step00000004-00000004.pt.trace.json.gz"
    outside = tmp_path / "elsewhere.pt.trace.json.gz"
    shutil.move(trace, outside)
    trace.symlink_to(outside)  # same bytes, valid trace: followed, it would be "ok"
    (folder / "passwd.json").symlink_to("/etc/passwd")
    res = check_run(str(copy))
    item = next(i for i in res.items if i.steps == [4, 4])
    assert (item.status, item.detail) == ("broken", "symlink points outside the run directory; not followed")
    assert "main/rank00000/passwd.json: symlink points outside the run directory; not followed" in res.notes


def test_symlink_to_dev_zero_and_fifo_neither_load_nor_hang(copy):
    folder = rank_folder(copy)
    trace = folder / "step00000004-00000004.pt.trace.json.gz"
    os.unlink(trace)
    trace.symlink_to("/dev/zero")
    first = folder / "step00000001-00000002.pt.trace.json.gz"
    os.unlink(first)
    os.mkfifo(first)  # a writer that never comes: opening it blocking would hang
    os.mkfifo(folder / "stray.pt.trace.json")
    code, doc, err = cli("check", copy, "--json", process=True)  # a process of its own: a hang stays in it
    got = {tuple(i["steps"]): (i["status"], i["detail"]) for i in doc["items"]}
    assert code == 1 and "Traceback" not in err
    assert got == {(1, 2): ("broken", "not a regular file (a FIFO); not read"),
                   (4, 4): ("broken", "symlink points outside the run directory; not followed")}
    assert "main/rank00000/stray.pt.trace.json: not a regular file (a FIFO); not read" in doc["notes"]


def test_gzip_bomb_is_streamed_in_bounded_memory(copy):
    """8 GiB of trace (one event name that never ends) in 8 MB of concatenated gzip members: check streams it and
    stops at the reader's search limit (decoded whole, as check once did, it would take 8 GiB)."""
    trace = rank_folder(copy) / "step00000004-00000004.pt.trace.json.gz"
    member = gzip.compress(b"a" * (1 << 20), 9)
    with open(trace, "wb") as f:
        f.write(gzip.compress(b'{"traceEvents": [{"ph": "X", "name": "'))
        for _ in range(8192):
            f.write(member)
    recs = records(copy)
    recs[1]["files"][0]["bytes"] = recs[1]["bytes"] = trace.stat().st_size
    rewrite(copy, recs)
    code = ("import json, sys; from distprof.analysis.check import check_run; r = check_run(sys.argv[1]); "
            "print(json.dumps([[i.steps, i.status, i.detail] for i in r.items]))\n" + PEAK_MB)
    proc = subprocess.run([sys.executable, "-c", code, str(copy)], capture_output=True, text=True, timeout=600)
    items, peak_mb = proc.stdout.splitlines()[-2:]
    bomb = next(i for i in json.loads(items) if i[0] == [4, 4])
    assert bomb[1] == "broken" and "no event boundary" in bomb[2]
    # 8192 MB inflated; the reader holds its 64 MB search limit and a few working copies of it (224 MB measured,
    # imports included), never the stream.
    assert int(peak_mb) < 512, peak_mb


# ---- paths that are not run directories; fsspec URLs ----------------------------------------------------------
@pytest.mark.slow
def test_a_file_a_missing_path_and_an_empty_folder_exit_2_in_one_line(two_windows, tmp_path):
    for i, (path, message) in enumerate((
            (two_windows / "run.json", f"{two_windows / 'run.json'} is a file, not a run directory"),
            (tmp_path / "nope", f"{tmp_path / 'nope'}: no such file or directory"),
            (tmp_path, "is not a distprof run directory: run.json is missing"))):
        res = check_run(str(path))
        assert res.error and message in res.error and not res.ok
        code, out, err = cli("check", path, process=i == 0)  # the first as `distprof check` in a process of its own
        assert code == 2 and message in " ".join(err.split()) and "Traceback" not in err
        code, out, _ = cli("check", path, "--json")
        assert code == 2 and message in out["error"]


def test_run_directory_at_a_memory_url(tmp_path):
    url = "memory://check-truth/run"
    cfg = ProfilerConfig(enable=True, save_path=url, ranks="all", steps=[1, 2], torch=CPU)
    run(Profiler(cfg, rank=0, world_size=2), 4)
    run(Profiler(cfg, rank=1, world_size=2), 4)
    res = check_run(url)
    assert res.ok, res.to_dict()
    assert [(i.rank, i.status) for i in res.items] == [(0, "ok"), (1, "ok")]
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.rm(f"/check-truth/run/main/rank00001/{os.path.basename(res.items[1].file)}")
    fs.pipe_file("/check-truth/run/main/rank00000/manifest.jsonl",
                 fs.cat_file("/check-truth/run/main/rank00000/manifest.jsonl") + b'{"role": 3}\n')
    res = check_run(url)
    assert {(i.rank, i.status) for i in res.items} == {(0, "ok"), (0, "broken"), (1, "missing")}
    assert check_run("memory://check-truth/nothing").error == "memory://check-truth/nothing: no such file or directory"


@pytest.mark.slow
def test_run_directory_on_s3(s3):
    url = f"{s3}/run"
    cfg = ProfilerConfig(enable=True, save_path=url, ranks="all", steps=[2, 3], torch=CPU)
    for rank in (0, 1):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 5)
    code, doc, err = cli("check", url, "--json")
    assert code == 0, err
    assert [(i["role"], i["rank"], i["steps"], i["status"]) for i in doc["items"]] == [
        ("actor", 0, [2, 3], "ok"), ("actor", 1, [2, 3], "ok")]
    import fsspec

    fsspec.filesystem("s3").rm(f"{url}/{doc['items'][1]['file']}")
    code, out, _ = cli("check", url, "--json")
    assert code == 1 and [i["status"] for i in out["items"]] == ["ok", "missing"]
    code, out, err = cli("check", f"{s3}/nothing-here")
    assert code == 2 and "no such file or directory" in err and "Traceback" not in err


# ---- wrong shapes -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target,content", [
    ("main/role.json", "[1, 2]"), ("main/role.json", '"a string"'), ("main/role.json", '{"world_size": "eight"}'),
    ("main/role.json", '{"config": {"steps": "x"}, "mesh": 7}'), ("run.json", '"a string"'), ("run.json", "[]"),
    ("run.json", '{"config": 5}'), ("run.json", '{"config": {}, "world_size": [1]}'),
    ("main/rank00000/manifest.jsonl", '[]\n{"role": "main", "rank": "zero"}\n7\n'),
])
@pytest.mark.slow
def test_wrong_shapes_are_reported_in_one_line(copy, target, content):
    (copy / target).write_text(content)
    res = check_run(str(copy))
    assert not res.ok
    code, out, err = cli("check", copy)
    assert code in (1, 2) and "Traceback" not in err and "internal error" not in err
    for verb in ("summary", "steps"):
        code, out, err = cli(verb, copy)
        assert code in (0, 1, 2) and "Traceback" not in err and "internal error" not in err, (verb, err)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.sampled_from(
                         ["config", "world_size", "role", "rank", "steps", "files", "path", "bytes", "complete",
                          "backend", "ranks", "mesh", "trigger", "pid", "start_time", "end_time",
                          "unreachable_nodes", "node_id", "address", "error"]), c, max_size=6),
                     max_leaves=12)
_content = st.binary(max_size=64) | _json.map(lambda v: json.dumps(v).encode())


@settings(max_examples=50, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(["run.json", "main/role.json", "main/rank00000/manifest.jsonl", "collect.json"]),
       data=_content)
def test_fuzzed_run_files_never_raise(two_windows, tmp_path, target, data):
    from typer.testing import CliRunner

    from distprof.cli import app

    root = tmp_path / f"f{abs(hash((target, data)))}"
    shutil.copytree(two_windows, root)
    (root / target).write_bytes(data)
    res = check_run(str(root))
    assert all(i.status in STATUSES for i in res.items)
    out = CliRunner().invoke(app, ["check", str(root), "--json"])
    assert out.exit_code in (0, 1, 2), out.output
    assert json.loads(out.stdout)["ok"] is (out.exit_code == 0)
    shutil.rmtree(root)


# ---- collect ------------------------------------------------------------------------------------------------
def test_collect_node_listing_never_brings_a_symlink_along(copy):
    """collect() copies exactly what its node task ``_node_list`` lists: a link to /etc/passwd is not in it."""
    from distprof.integrations.ray.collect import _node_list

    (rank_folder(copy) / "step00000009-00000009.pt.trace.json.gz").symlink_to("/etc/passwd")
    (copy / "main" / "leak").symlink_to("/etc")
    listing = _node_list(str(copy), 0.0, [])
    paths = {f["path"] for f in listing["files"]}
    assert paths == {"run.json", "main/role.json", "main/rank00000/manifest.jsonl",
                     "main/rank00000/step00000001-00000002.pt.trace.json.gz",
                     "main/rank00000/step00000004-00000004.pt.trace.json.gz"}


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time (test_ray counts the raylets it leaves)
def test_collect_through_a_real_ray_cluster_leaves_symlinks_behind(cluster, tmp_path):  # noqa: F811 - the fixture
    """Ray collect() from a real local cluster: a link to /etc/passwd and a linked folder placed in the worker's run
    directory are neither copied nor followed; everything else arrives and passes check."""
    from distprof.integrations.ray import ProfiledGroup, collect

    ws = make(n=1)
    g = ProfiledGroup(ws, ray_cfg(tmp_path), role="actor")
    train(ws, g, 4)
    folder = tmp_path / "scratch" / "actor" / "rank00000"
    (folder / "step00000007-00000007.pt.trace.json.gz").symlink_to("/etc/passwd")
    (folder / "etc").symlink_to("/etc")
    report = collect([g], str(tmp_path / "dest"))
    copied = {f["path"] for f in report.copied}
    assert report.ok and "actor/rank00000/step00000001-00000002.pt.trace.json.gz" in copied
    assert not any("step00000007" in p or "etc" in p.split("/") for p in copied)
    dest = tmp_path / "dest" / "actor" / "rank00000"
    assert not (dest / "step00000007-00000007.pt.trace.json.gz").exists() and not (dest / "etc").exists()
    assert check_run(str(tmp_path / "dest")).ok
