"""A fault anywhere in the profiler never reaches training: logged once, profiler off, loop goes on."""

import logging
import os

import pytest

from distprof import Profiler, ProfilerConfig
from distprof.backends.torch_backend import TorchBackend
from distprof.rundir.store import RunDir

from conftest import all_files, trace_files
from helpers import run

FAULTS = [
    (TorchBackend, "begin"),
    (TorchBackend, "advance"),
    (TorchBackend, "_on_trace_ready"),  # export
    (TorchBackend, "finish"),
    (RunDir, "publish"),  # writing the file
    (RunDir, "append_manifest"),
    (RunDir, "write_run_json"),
]


def cfg(tmp_path, **kw):
    return ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[1, 2, 5], torch={"activities": ["cpu"]}, **kw)


def _explode(*a, **k):
    raise OSError("injected fault")


@pytest.mark.parametrize("cls, method", FAULTS, ids=[f"{c.__name__}.{m}" for c, m in FAULTS])
def test_fault_disables_profiler_and_training_continues(tmp_path, monkeypatch, caplog, cls, method):
    caplog.set_level(logging.ERROR, logger="distprof")
    monkeypatch.setattr(cls, method, _explode)
    p = Profiler(cfg(tmp_path))
    trainer = run(p, 8)
    assert trainer.steps_run == 8 and p.global_step == 8
    assert p.enabled is False and not p.capturing
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "injected fault" in str(errors[0].exc_info[1])
    assert "profiling is disabled" in errors[0].getMessage()
    # Nothing half-made is left behind.
    if (tmp_path / "run").exists():
        assert not [f for f in all_files(tmp_path / "run") if os.path.basename(f).startswith(".tmp-")]


@pytest.mark.parametrize("cls, method", FAULTS[:3], ids=[f"{c.__name__}.{m}" for c, m in FAULTS[:3]])
def test_on_error_raise_reraises(tmp_path, monkeypatch, cls, method):
    monkeypatch.setattr(cls, method, _explode)
    with pytest.raises(OSError, match="injected fault"):
        run(Profiler(cfg(tmp_path, on_error="raise")), 8)


def test_stop_is_never_called_on_a_torch_profiler_that_did_not_start(tmp_path, monkeypatch):
    from torch.profiler import profile

    stops = []
    monkeypatch.setattr(profile, "start", _explode)
    monkeypatch.setattr(profile, "stop", lambda self: stops.append(self))
    trainer = run(Profiler(cfg(tmp_path)), 6)
    assert trainer.steps_run == 6 and stops == []


def test_fault_after_first_window_keeps_its_file(tmp_path, monkeypatch):
    calls = {"n": 0}
    real_begin = TorchBackend.begin

    def begin_second_fails(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("second window fails")
        return real_begin(self, *a, **k)

    monkeypatch.setattr(TorchBackend, "begin", begin_second_fails)
    p = Profiler(cfg(tmp_path))
    run(p, 8)
    assert [os.path.basename(f) for f in trace_files(tmp_path / "run")] == ["step00000001-00000002.pt.trace.json.gz"]
    assert calls["n"] == 2
