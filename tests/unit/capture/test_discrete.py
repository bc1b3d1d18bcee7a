"""Discrete mode (verl's): during the planned steps, each outermost annotated stage is its own capture window."""

import gzip
import json
import threading
from functools import partial

import pytest
import torch
from conftest import config
from tracekit import cli

import distprof
from distprof import Profiler, ProfilerConfig
from distprof.analysis import analyze
from distprof.analysis.check import check_run

_config = partial(config, steps=[2, 3], discrete=True)


def _job(prof, steps=5, fail_at=None):
    with prof:
        for step in range(steps):
            with distprof.annotate("rollout/generate"):
                torch.randn(32, 32) @ torch.randn(32, 32)
                with distprof.annotate("rollout/inner"):
                    torch.randn(4, 4).sum()
            with distprof.annotate("actor/update"):
                torch.randn(32, 32).relu()
                if step == fail_at:
                    raise RuntimeError("update failed")
            prof.step()


def _names(path):
    with gzip.open(path, "rt") as f:
        return {e.get("name") for e in json.load(f)["traceEvents"]}


def _manifest(tmp_path, role="actor"):
    p = tmp_path / "run" / role / "rank00000" / "manifest.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()]


def test_one_trace_per_stage_run_in_planned_steps_only(tmp_path):
    _job(Profiler(_config(tmp_path), role="actor"))
    lines = _manifest(tmp_path)
    assert [(x["steps"], x["stage"]) for x in lines] == [
        ([2, 2], "rollout/generate"), ([2, 2], "actor/update"), ([3, 3], "rollout/generate"), ([3, 3], "actor/update")]
    assert all(x["complete"] for x in lines)
    root = tmp_path / "run"
    gen = _names(root / lines[0]["file"])
    upd = _names(root / lines[1]["file"])
    assert lines[0]["file"].endswith("step00000002-00000002.stage-rollout-generate.pt.trace.json.gz")
    # Each trace holds its own stage (its range and nested ranges, its ops), not the other stage's.
    assert {"ProfilerStep#2", "rollout/generate", "rollout/inner", "aten::mm"} <= gen and "aten::relu" not in gen
    assert {"ProfilerStep#2", "actor/update", "aten::relu"} <= upd and "aten::mm" not in upd
    assert set(lines[0]["annotations"]) == {"rollout/generate", "rollout/inner"}


def test_outside_planned_steps_annotate_stays_inert(tmp_path):
    import sys


    state = sys.modules["distprof.capture.annotate"]._STATE
    prof = Profiler(_config(tmp_path, steps=[3]), role="actor").start()
    assert state.active == 0  # step 0 is not planned: ranges take the one-counter fast path
    for _ in range(3):
        prof.step()
    assert state.active == 1  # step 3: listening for stages
    prof.step()
    assert state.active == 0
    prof.stop()


def test_a_stage_that_raises_is_written_and_the_exception_passes_through(tmp_path):
    with pytest.raises(RuntimeError, match="update failed"):
        _job(Profiler(_config(tmp_path), role="actor"), fail_at=2)
    lines = _manifest(tmp_path)
    assert [(x["steps"], x["stage"]) for x in lines] == [([2, 2], "rollout/generate"), ([2, 2], "actor/update")]
    assert "aten::relu" in _names(tmp_path / "run" / lines[1]["file"])


def test_repeated_stages_keep_their_own_files_and_a_stage_open_at_step_end_closes(tmp_path):
    prof = Profiler(_config(tmp_path, steps=[1]), role="actor").start()
    prof.step()
    for _ in range(2):
        with distprof.annotate("actor/update"):
            torch.randn(8, 8).relu()
    r = distprof.annotate("ref/log_prob")
    r.__enter__()
    torch.randn(8, 8).sum()
    prof.step()  # the stage is still open: it ends with the step
    r.__exit__(None, None, None)
    prof.stop()
    lines = _manifest(tmp_path)
    assert [x["file"].rsplit("/", 1)[1] for x in lines] == [
        "step00000001-00000001.stage-actor-update.pt.trace.json.gz",
        "step00000001-00000001.stage-actor-update-2.pt.trace.json.gz",
        "step00000001-00000001.stage-ref-log_prob.pt.trace.json.gz"]
    assert lines[2]["stopped_by"] == "step_end" and lines[2]["complete"] is False


def test_ranges_of_other_threads_do_not_open_or_end_a_stage(tmp_path):
    prof = Profiler(_config(tmp_path, steps=[0]), role="actor").start()
    with distprof.annotate("actor/update"):
        t = threading.Thread(target=lambda: distprof.annotate("other/thread").__enter__().__exit__(None, None, None))
        t.start()
        t.join()
        torch.randn(8, 8).relu()
    prof.step()
    prof.stop()
    assert [x["stage"] for x in _manifest(tmp_path)] == ["actor/update"]


def test_process_backends_are_refused():
    with pytest.raises(ValueError, match="discrete=True needs an in-process backend"):
        ProfilerConfig(enable=True, save_path="/tmp/x", backend="py_spy", discrete=True)


def test_analysis_and_check_understand_stage_files(tmp_path):
    _job(Profiler(_config(tmp_path), role="actor"))
    d = analyze.steps(str(tmp_path / "run"), workers=1)
    assert not d["conflicts"] and not d["errors"]
    assert {(row["role"], row["step"]) for row in d["steps"]} == {
        ("actor:rollout-generate", 2), ("actor:rollout-generate", 3),
        ("actor:actor-update", 2), ("actor:actor-update", 3)}
    res = check_run(str(tmp_path / "run"))
    assert res.ok, [(i.status, i.file, i.detail) for i in res.items]
    assert sum(i.status == "ok" for i in res.items) == 4
    code, _, _ = cli("check", tmp_path / "run")
    assert code == 0


def test_check_names_a_planned_step_without_stages(tmp_path):
    prof = Profiler(_config(tmp_path, steps=[1, 2]), role="actor").start()
    prof.step()
    with distprof.annotate("actor/update"):
        torch.randn(8, 8).relu()
    prof.step()
    prof.step()  # step 2: no stage ran
    prof.stop()
    res = check_run(str(tmp_path / "run"))
    missing = [i for i in res.items if i.status == "missing"]
    assert [(i.steps, i.detail.split(" (")[0]) for i in missing] == [([2, 2], "no stage window for this step")]


def test_a_stage_left_by_an_exception_is_not_complete(tmp_path):
    prof = Profiler(_config(tmp_path, steps=[0]), role="actor").start()
    with pytest.raises(RuntimeError):
        with distprof.annotate("actor/update"):
            raise RuntimeError("boom")
    prof.stop()
    [line] = _manifest(tmp_path)
    assert line["complete"] is False and line["stopped_by"] == "exception"
