"""A window's files are written beside training (torch.background_export, the default; capture/exporter.py).

The mechanism, in this process with real torch.profiler windows: the step that closes a window returns before
its file exists, the file is whole afterwards with its manifest line, the next window waits for the previous
export, a failed export takes the fault path on the training thread, and ``background_export: false`` writes
inside the step. How a process ends during a background export (SIGTERM, SIGINT, sys.exit) is tested on real
child processes in tests/e2e/test_crash_signals.py; what it spares the other ranks, in benchmarks/.
"""

import gzip
import json
import logging
import os
import threading

import msgspec
from conftest import config, trace_files
from helpers import Trainer

from distprof import Profiler
from distprof.capture.backends import torch_backend


def manifest(root, role="main", rank=0):
    p = root / role / f"rank{rank:05d}" / "manifest.jsonl"
    return [msgspec.json.decode(line) for line in p.read_bytes().splitlines()] if p.exists() else []


def visible(root):
    return [f for f in trace_files(root) if not os.path.basename(f).startswith(".")]  # not the hidden temporaries


def gated(monkeypatch):
    """Hold every export made off the training thread once torch has written its plain trace (in this process or
    in the child it forks to write the window), until ``release()``. ``where()`` waits for the next export to
    reach that point and says where it runs: "training thread" (never held: no hang) or "elsewhere"."""
    parent = os.getpid()
    reach_r, reach_w = os.pipe()
    go_r, go_w = os.pipe()
    real = torch_backend.check_trace

    def check_trace(path):
        training = os.getpid() == parent and threading.current_thread() is threading.main_thread()
        os.write(reach_w, b"T" if training else b"E")
        if not training:
            os.read(go_r, 1)
        real(path)

    monkeypatch.setattr(torch_backend, "check_trace", check_trace)
    where = lambda: {b"T": "training thread", b"E": "elsewhere"}[os.read(reach_r, 1)]  # noqa: E731
    release = lambda: os.write(go_w, b"g")  # noqa: E731
    return where, release


def test_the_closing_step_returns_before_the_file_exists_and_the_file_is_whole_after(tmp_path, monkeypatch):
    where, release = gated(monkeypatch)
    root = tmp_path / "run"
    p = Profiler(config(tmp_path, steps=[1, 2])).start()
    trainer = Trainer()
    try:
        for _ in range(3):  # steps 0-2: step 2's end closes the window 1-2
            trainer.train_step()
            p.step()
        assert where() == "elsewhere"  # torch wrote its trace, off the training thread; the export is held there
        assert visible(root) == [] and manifest(root) == []  # nothing published yet, and the step has returned
        assert not p.capturing
        trainer.train_step()  # training goes on while the export is held
        p.step()
    finally:
        release()
    p.stop()  # waits for the export
    (f,) = trace_files(root)
    with gzip.open(f) as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert {"ProfilerStep#1", "ProfilerStep#2"} <= names
    (line,) = manifest(root)
    assert line["steps"] == [1, 2] and line["complete"] is True and line["file"].endswith(".pt.trace.json.gz")
    assert line["summary"]["top"] and 0 <= line["export_s"]  # the summary is computed in the background too


def test_the_next_window_opens_after_the_previous_one_is_written(tmp_path, monkeypatch):
    seen = []
    real_begin = torch_backend.TorchBackend.begin

    def begin(self, window, step, ctx):
        seen.append((window.start, len(manifest(tmp_path / "run"))))  # lines published when this window opens
        real_begin(self, window, step, ctx)

    monkeypatch.setattr(torch_backend.TorchBackend, "begin", begin)
    p = Profiler(config(tmp_path, steps=[1, 3, 5]))
    trainer = Trainer()
    with p:
        for _ in range(7):
            trainer.train_step()
            p.step()
    assert seen == [(1, 0), (3, 1), (5, 2)]
    assert [line["steps"] for line in manifest(tmp_path / "run")] == [[1, 1], [3, 3], [5, 5]]


def test_a_failed_background_export_is_a_fault_on_the_training_thread(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="distprof")

    def boom(path):
        raise OSError("disk on fire")

    monkeypatch.setattr(torch_backend, "check_trace", boom)
    p = Profiler(config(tmp_path, steps=[1, 4]))
    trainer = Trainer()
    with p:
        for _ in range(6):
            trainer.train_step()
            p.step()
    assert p.enabled is False and p.global_step == 6  # switched off; training's steps all counted
    (err,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "disk on fire" in str(err.exc_info[1]) and "profiling is disabled" in err.getMessage()
    assert visible(tmp_path / "run") == [] and manifest(tmp_path / "run") == []
    assert not [f for f in (tmp_path / "run").rglob("*") if f.name.startswith(".tmp-")]  # no temporaries left


def test_background_export_false_writes_inside_the_closing_step(tmp_path):
    root = tmp_path / "run"
    p = Profiler(config(tmp_path, steps=[1, 2], torch={"activities": ["cpu"], "background_export": False})).start()
    trainer = Trainer()
    for _ in range(3):
        trainer.train_step()
        p.step()
    assert len(visible(root)) == 1 and len(manifest(root)) == 1  # written before step() returned
    p.stop()


def test_the_files_are_written_by_a_forked_child_and_a_child_that_dies_is_a_fault(tmp_path, monkeypatch, caplog):
    """torch's writer holds the GIL: the window is written in a child forked for it (its own GIL, another core),
    and this process drops torch's results at once. A child that dies (the OOM killer, say) takes its window with
    it: one error names it, profiling turns off, the training goes on, and nothing half-made is left."""
    caplog.set_level(logging.WARNING, logger="distprof")
    parent = os.getpid()
    real = torch_backend.check_trace
    r, w = os.pipe()

    def check_trace(path):
        os.write(w, b"c" if os.getpid() != parent else b"p")  # who writes, in order
        if os.getpid() != parent and p._windows_closed == 1:  # the second window's child (this memory is a copy)
            os._exit(9)  # dies before the files are whole
        real(path)

    monkeypatch.setattr(torch_backend, "check_trace", check_trace)
    p = Profiler(config(tmp_path, steps=[1, 3, 5]))
    trainer = Trainer()
    with p:
        for _ in range(7):
            trainer.train_step()
            p.step()
    assert trainer.steps_run == 7 and p.global_step == 7 and p.enabled is False
    assert os.read(r, 16) == b"cc"  # windows 1 and 3: each by its child, none by this process; 5: never opened
    assert [line["steps"] for line in manifest(tmp_path / "run")] == [[1, 1]]
    assert len(trace_files(tmp_path / "run")) == 1  # no temporary of the dead child left
    (err,) = [x for x in caplog.records if x.levelno >= logging.ERROR]
    assert "window 3-3 was lost" in str(err.exc_info[1]) and "status 9" in str(err.exc_info[1])
