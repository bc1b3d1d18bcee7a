"""cuda_memory and the nsys capture-range companion.

There is no GPU here, so torch.cuda's memory-history and profiler entry points are replaced by
recorders (a stand-in for the CUDA runtime). Everything around them (when they are called, what is
written where, the OOM path, fault isolation) is the real code.
"""

import logging
import os
import pickle

import msgspec
import pytest
import torch
from conftest import all_files
from helpers import run

from distprof import Profiler, ProfilerConfig


@pytest.fixture
def fake_cuda(monkeypatch):
    calls = []
    observers = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **kw: calls.append(("history", enabled, kw)))
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: {"segments": [], "device_traces": [[{"action": "alloc"}]]})
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", lambda fn: observers.append(fn), raising=False)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append(("cudaProfilerStart",)))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append(("cudaProfilerStop",)))
    import distprof.capture.backends.cuda_memory as cm

    monkeypatch.setattr(cm._install_oom_observer, "installed", False, raising=False)
    cm._oom_hook.clear()
    return calls, observers


def test_cuda_memory_window_records_history_and_dumps_snapshot(tmp_path, fake_cuda):
    calls, observers = fake_cuda
    cfg = ProfilerConfig(enable=True, backend="cuda_memory", save_path=str(tmp_path / "run"), steps=[1, 2, 5])
    run(Profiler(cfg, role="actor"), 7)
    files = [f for f in all_files(tmp_path / "run") if f.endswith(".memory.pickle")]
    assert files == ["actor/rank00000/step00000001-00000002.memory.pickle", "actor/rank00000/step00000005-00000005.memory.pickle"]
    with open(tmp_path / "run" / files[0], "rb") as f:
        assert pickle.load(f)["device_traces"] == [[{"action": "alloc"}]]
    starts = [c for c in calls if c[0] == "history" and c[1] == "all"]
    assert len(starts) == 2 and starts[0][2] == {"context": "all", "stacks": "python", "max_entries": 100_000}
    assert sum(1 for c in calls if c[0] == "history" and c[1] is None) == 2
    assert len(observers) == 1  # one observer per process, however many windows


def test_cuda_memory_oom_dumps_a_snapshot(tmp_path, fake_cuda):
    _, observers = fake_cuda
    cfg = ProfilerConfig(enable=True, backend="cuda_memory", save_path=str(tmp_path / "run"), steps=[0, 1, 2])
    p = Profiler(cfg, role="actor")
    p.start()
    observers[0](0, 1 << 30, 0, 0)  # what torch calls on an out-of-memory error
    p.stop()
    oom = [f for f in all_files(tmp_path / "run") if os.path.basename(f).startswith("oom-")]
    assert len(oom) == 1 and oom[0].startswith("actor/rank00000/") and oom[0].endswith(f"pid{os.getpid()}.memory.pickle")


def test_cuda_memory_oom_snapshot_is_in_the_manifest_and_check_accepts_it(tmp_path, fake_cuda):
    """The OOM snapshot gets its own manifest line (stopped_by: oom, the steps from the window's first to the one
    the allocation failed in), so check lists it as ok rather than unlisted. The CUDA side is fake_cuda's stand-in
    (the one place the contract of torch.cuda.memory and the OOM observer is imitated); the rest is real."""
    from distprof.analysis.check import check_run

    _, observers = fake_cuda
    cfg = ProfilerConfig(enable=True, backend="cuda_memory", save_path=str(tmp_path / "run"), steps=[2, 3, 4])

    def oom_in_step_3(p):
        if p.global_step == 3:  # step 3 is running: torch calls the observer when an allocation fails
            observers[0](0, 1 << 40, 0, 0)

    run(Profiler(cfg, role="actor"), 6, on_step=oom_in_step_3)
    (oom,) = [f for f in all_files(tmp_path / "run") if os.path.basename(f).startswith("oom-")]
    lines = [msgspec.json.decode(x) for x in (tmp_path / "run" / "actor" / "rank00000" / "manifest.jsonl").read_bytes().splitlines()]
    (line,) = [x for x in lines if x.get("stopped_by") == "oom"]
    assert line["file"] == oom and line["files"] == [{"path": oom, "bytes": os.path.getsize(tmp_path / "run" / oom)}]
    assert (line["steps"], line["complete"], line["backend"], line["pid"]) == ([2, 3], False, "cuda_memory", os.getpid())
    assert [x["steps"] for x in lines if x is not line] == [[2, 4]]  # the window itself, closed as planned
    res = check_run(str(tmp_path / "run"))
    assert res.ok, res.to_dict()
    (item,) = [i for i in res.items if i.file == oom]
    assert (item.status, item.steps, item.detail) == ("ok", [2, 3], "CUDA out-of-memory snapshot, taken in step 3")
    assert not [i for i in res.items if i.status == "unlisted"]


def test_cuda_memory_without_cuda_is_logged_once_and_training_goes_on(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="distprof")
    cfg = ProfilerConfig(enable=True, backend="cuda_memory", save_path=str(tmp_path / "run"), steps=[1, 3])
    p = Profiler(cfg)
    trainer = run(p, 5)
    assert trainer.steps_run == 5 and not p.enabled
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "needs CUDA" in str(errors[0].exc_info[1])


def test_nsys_companion_marks_recorded_steps_only(tmp_path, fake_cuda):
    calls, _ = fake_cuda
    cfg = ProfilerConfig(enable=True, backend="nsys", save_path=str(tmp_path / "run"), steps=[2, 3, 6])
    seen = []
    run(Profiler(cfg), 8, on_step=lambda p: seen.append((p.global_step, [c[0] for c in calls if c[0].startswith("cuda")])))
    marks = {g: c for g, c in seen}
    # Window 2-3 warms up on step 1 (no mark), starts before step 2, stops after step 3; then 6.
    assert marks[1] == [] and marks[2] == ["cudaProfilerStart"]
    assert marks[4] == ["cudaProfilerStart", "cudaProfilerStop"]
    assert marks[7] == ["cudaProfilerStart", "cudaProfilerStop", "cudaProfilerStart", "cudaProfilerStop"]


def test_nsys_whole_lifetime_makes_no_capture_range_calls(tmp_path, fake_cuda):
    calls, _ = fake_cuda
    p = Profiler(ProfilerConfig(enable=True, backend="nsys", save_path=str(tmp_path / "run")))
    run(p, 4)
    assert p.enabled and not [c for c in calls if c[0].startswith("cuda")]
    assert not any(f.endswith(".gz") for f in all_files(tmp_path / "run"))  # nsys writes its own report
