"""distprof check on complete and deliberately broken run directories."""

import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers import run

from distprof import Profiler, ProfilerConfig
from distprof.analysis.check import check_run


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    """Two ranks of one role with two windows each, and one rank of another role."""
    root = tmp_path_factory.mktemp("good") / "run"
    cfg = ProfilerConfig(enable=True, save_path=str(root), ranks="all", steps=[1, 2, 4], torch={"activities": ["cpu"]})
    for rank in range(2):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 6)
    run(Profiler(cfg, role="rollout", rank=0, world_size=1), 6)
    return root


@pytest.fixture
def copy(good_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(good_run, dst)
    return dst


def statuses(res):
    return {(i.role, i.rank, tuple(i.steps) if i.steps else None, i.status) for i in res.items}


def test_complete_run_passes(good_run):
    res = check_run(str(good_run))
    assert res.ok, res.to_dict()
    assert {(r["role"], r["world_size"]) for r in res.roles} == {("actor", 2), ("rollout", 1)}
    assert len([i for i in res.items if i.status == "ok"]) == 6  # 3 workers x 2 windows


def _trace(root, role="actor", rank=1, steps="00000004-00000004"):
    return root / role / f"rank{rank:05d}" / f"step{steps}.pt.trace.json.gz"


def test_missing_file(copy):
    os.unlink(_trace(copy))
    res = check_run(str(copy))
    assert not res.ok and ("actor", 1, (4, 4), "missing") in statuses(res)


def test_truncated_file_is_broken(copy):
    p = _trace(copy)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    res = check_run(str(copy))
    assert ("actor", 1, (4, 4), "broken") in statuses(res)
    assert "manifest says" in next(i.detail for i in res.items if i.status == "broken")


def test_same_size_garbage_is_broken(copy):
    p = _trace(copy)
    n = p.stat().st_size
    p.write_bytes(gzip.compress(b"{" * 10)[:n].ljust(n, b"\0"))
    res = check_run(str(copy))
    assert ("actor", 1, (4, 4), "broken") in statuses(res)


def test_missing_window_and_missing_rank(copy):
    m = copy / "actor" / "rank00000" / "manifest.jsonl"
    m.write_text(m.read_text().splitlines()[0] + "\n")  # rank 0 lost its second window's line
    shutil.rmtree(copy / "rollout" / "rank00000")
    res = check_run(str(copy))
    s = statuses(res)
    assert ("actor", 0, (4, 4), "missing") in s
    assert ("rollout", 0, (1, 2), "missing") in s and ("rollout", 0, (4, 4), "missing") in s
    assert ("actor", 0, None, "unlisted") in s  # the file whose line was lost is still reported


def test_corrupt_manifest_line_and_leftover_temporary(copy):
    m = copy / "actor" / "rank00001" / "manifest.jsonl"
    m.write_text(m.read_text() + "{not json\n")
    (copy / "actor" / "rank00001" / ".tmp-999-trace.pt.trace.json.gz").write_bytes(b"partial")
    res = check_run(str(copy))
    s = {i.status for i in res.items}
    assert {"broken", "unfinished"} <= s and not res.ok


def test_not_a_run_directory(tmp_path):
    res = check_run(str(tmp_path))
    assert not res.ok and "run.json is missing" in res.problems[0]


def test_incomplete_window(tmp_path):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), steps=[1, 2, 3], torch={"activities": ["cpu"]})
    run(Profiler(cfg), 3)  # stops after step 2
    res = check_run(str(tmp_path / "r"))
    assert {i.status for i in res.items} == {"incomplete"} and not res.ok


def test_open_ended_schedule_expects_windows_up_to_the_last_step_reached(tmp_path):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all",
                         schedule={"wait": 1, "warmup": 1, "active": 1, "repeat": 0}, torch={"activities": ["cpu"]})
    run(Profiler(cfg, rank=0, world_size=2), 9)  # windows 2, 5, 8
    run(Profiler(cfg, rank=1, world_size=2), 6)  # windows 2, 5: misses 8
    res = check_run(str(tmp_path / "r"))
    assert ("main", 1, (8, 8), "missing") in statuses(res)
    assert len([i for i in res.items if i.status == "ok"]) == 5


def test_process_backend_outputs(tmp_path):
    root = tmp_path / "r"
    (root / "rollout").mkdir(parents=True)
    (root / "run.json").write_text(json.dumps({"config": {"enable": True, "backend": "py_spy", "save_path": str(root)}, "world_size": 1}))
    (root / "rollout" / "role.json").write_text(json.dumps({"role": "rollout", "world_size": 1, "backend": "py_spy"}))
    assert ("rollout", None, None, "missing") in statuses(check_run(str(root)))
    (root / "rollout" / "py_spy-pid10.speedscope.json").write_text('{"profiles": []}')
    (root / "rollout" / "py_spy-pid11.speedscope.json").write_text('{"profi')
    res = check_run(str(root))
    assert {(i.file, i.status) for i in res.items} == {("rollout/py_spy-pid10.speedscope.json", "ok"),
                                                       ("rollout/py_spy-pid11.speedscope.json", "broken")}


def test_cli_exit_codes_and_json(good_run, copy):
    ok = subprocess.run([sys.executable, "-m", "distprof.cli", "check", str(good_run), "--json"], capture_output=True, text=True)
    assert ok.returncode == 0
    doc = json.loads(ok.stdout)
    assert doc["ok"] is True and {"run_dir", "roles", "items", "problems"} <= set(doc)
    os.unlink(_trace(copy))
    bad = subprocess.run([sys.executable, "-m", "distprof.cli", "check", str(copy)], capture_output=True, text=True)
    assert bad.returncode == 1 and "missing" in bad.stdout and "incomplete" in bad.stdout
