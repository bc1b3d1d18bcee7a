"""A fault anywhere in the profiler never reaches training: logged once, profiler off, loop goes on."""

import logging
import os
from functools import partial

import pytest
from conftest import all_files, config, load_trace, trace_files
from helpers import run

from distprof import Profiler, ProfilerConfig
from distprof.capture.backends.torch_backend import TorchBackend
from distprof.rundir.store import RunDir, manifest_records

FAULTS = [
    (TorchBackend, "begin"),
    (TorchBackend, "advance"),
    (TorchBackend, "_on_trace_ready"),  # export
    (TorchBackend, "detach"),  # the closing step's part
    (TorchBackend, "_write"),  # the window's files, written in the background (capture/exporter.py)
    (RunDir, "publish"),  # writing the file
    (RunDir, "append_manifest"),
    (RunDir, "write_run_json"),
]


cfg = partial(config, steps=[1, 2, 5])


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


def test_summary_failure_keeps_the_exported_trace(tmp_path, monkeypatch, caplog):
    """key_averages() failing after the export: the trace is published, without a summary, and a warning says so."""
    from torch.profiler import profile

    caplog.set_level(logging.WARNING, logger="distprof")
    monkeypatch.setattr(profile, "key_averages", _explode)
    p = Profiler(cfg(tmp_path))
    run(p, 8)
    assert p.enabled and p.windows_closed == 2 and p.summary() is None
    names = [os.path.basename(f) for f in trace_files(tmp_path / "run")]
    assert names == ["step00000001-00000002.pt.trace.json.gz", "step00000005-00000005.pt.trace.json.gz"]
    records = manifest_records(str(tmp_path / "run"))
    assert [r.complete for r in records] == [True, True] and all(r.summary is None for r in records)
    assert any("summary" in r.getMessage() and "trace is kept" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_export_never_writes_into_tmpdir(tmp_path, monkeypatch):
    """torch's gzip export wrote each window's JSON into $TMPDIR (nodes' /tmp fills up); ours stages beside the
    final file. With the temp folder gone, the windows are still written whole."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-tmpdir"))
    p = Profiler(cfg(tmp_path))
    run(p, 8)
    assert p.enabled and p.windows_closed == 2
    for f in trace_files(tmp_path / "run"):
        assert load_trace(f)["traceEvents"]
    assert not (tmp_path / "no-such-tmpdir").exists()


@pytest.mark.parametrize("written", [b"", b'{"schemaVersion": 1, "traceEvents": [{"ph": "X"'],
                         ids=["empty", "cut-off"])
def test_a_trace_torch_wrote_badly_is_not_published(tmp_path, monkeypatch, caplog, written):
    """Kineto reports a failed write only in its own log: an empty or cut-off export is caught before publishing."""
    from torch.profiler import profile

    caplog.set_level(logging.ERROR, logger="distprof")

    def bad_export(self, path):
        with open(path, "wb") as f:
            f.write(written)

    monkeypatch.setattr(profile, "export_chrome_trace", bad_export)
    p = Profiler(cfg(tmp_path))
    trainer = run(p, 8)
    assert trainer.steps_run == 8 and not p.enabled
    [error] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "not published" in str(error.exc_info[1]) and ".tmp-" in str(error.exc_info[1])  # names the file
    assert trace_files(tmp_path / "run") == [] and manifest_records(str(tmp_path / "run")) == []
    assert not [f for f in all_files(tmp_path / "run") if os.path.basename(f).startswith(".tmp-")]


def test_disk_full_while_gzipping_leaves_no_temporaries(tmp_path, monkeypatch, caplog):
    """ENOSPC half-way through our gzip: both temporaries are removed, one error, training goes on."""
    import errno

    from distprof.capture.backends import torch_backend

    caplog.set_level(logging.ERROR, logger="distprof")
    real_copy = torch_backend.shutil.copyfileobj

    def copy_then_full(fin, fout, length=0):
        fout.write(fin.read(1000))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch_backend.shutil, "copyfileobj", copy_then_full)
    p = Profiler(cfg(tmp_path))
    trainer = run(p, 8)
    monkeypatch.setattr(torch_backend.shutil, "copyfileobj", real_copy)
    assert trainer.steps_run == 8 and not p.enabled
    assert len([r for r in caplog.records if r.levelno >= logging.ERROR]) == 1
    assert trace_files(tmp_path / "run") == []
    assert not [f for f in all_files(tmp_path / "run") if os.path.basename(f).startswith(".tmp-")]


@pytest.mark.parametrize("save_path", ["x" * 100_000, "/tmp/" + "d" * 300 + "/run"], ids=["100k-chars", "long-component"])
def test_save_path_too_long_is_a_value_error_naming_it(save_path):
    with pytest.raises(ValueError, match="save_path") as e:
        Profiler(ProfilerConfig(enable=True, save_path=save_path, steps=[1]))
    assert "limit" in str(e.value) and len(str(e.value)) < 400


def test_two_writers_in_one_process_never_overwrite(tmp_path, caplog):
    """The same (role, rank) run twice in one process (one pid): the second and third keep ``.pidP-N`` names."""
    caplog.set_level(logging.WARNING, logger="distprof")
    c = ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[1], torch={"activities": ["cpu"]})
    for _ in range(3):
        run(Profiler(c, rank=0, world_size=1), 3)
    pid = os.getpid()
    names = sorted(os.path.basename(f) for f in trace_files(tmp_path / "run"))
    assert names == sorted(["step00000001-00000001.pt.trace.json.gz", f"step00000001-00000001.pid{pid}.pt.trace.json.gz",
                            f"step00000001-00000001.pid{pid}-2.pt.trace.json.gz"])
    assert [r.writer_conflict for r in manifest_records(str(tmp_path / "run"))] == [False, True, True]


def test_file_system_without_hard_links_still_publishes_without_overwriting(tmp_path, monkeypatch):
    """Some FUSE mounts refuse link(2) (EPERM): publication falls back to check-then-rename, same names."""
    import errno

    def no_links(src, dst, *a, **k):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    c = ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[1], torch={"activities": ["cpu"]})
    for _ in range(2):
        p = Profiler(c, rank=0, world_size=1)
        run(p, 3)
        assert p.enabled and p.windows_closed == 1
    names = sorted(os.path.basename(f) for f in trace_files(tmp_path / "run"))
    assert names == sorted(["step00000001-00000001.pt.trace.json.gz",
                            f"step00000001-00000001.pid{os.getpid()}.pt.trace.json.gz"])
    for f in trace_files(tmp_path / "run"):
        assert load_trace(f)["traceEvents"]


def test_one_fault_guard_logs_once_switches_off_every_time_and_reraises_only_when_asked(caplog):
    """capture/faults.py: the guard the Profiler, the Lightning profiler and the HF callback share."""
    import pickle

    from distprof.capture.faults import FaultGuard, misfit

    caplog.set_level(logging.DEBUG, logger="distprof")
    offs = []
    guard = FaultGuard("disable", lambda where: f"distprof: it failed during {where} (100% sure)", offs.append)
    assert guard.call("step", lambda x: x + 1, 1) == 2 and offs == [] and not caplog.records
    assert guard.call("step", _explode) is None and guard.call("stop", _explode) is None
    assert offs == ["step", "stop"]  # switched off at each fault
    (line,) = caplog.records  # logged once, with its traceback
    assert line.getMessage() == "distprof: it failed during step (100% sure)" and line.exc_info is not None
    assert line.name == "distprof.capture.faults"
    loud = FaultGuard("raise", str, offs.append, logging.getLogger("distprof.x"))
    with pytest.raises(OSError, match="injected fault"):
        loud.call("start", _explode)
    assert offs[-1] == "start" and caplog.records[-1].name == "distprof.x"
    assert pickle.loads(pickle.dumps(FaultGuard("raise", str, print))).on_error == "raise"

    caplog.clear()
    assert misfit("raise", ValueError("ranks [3] do not exist")) is True and not caplog.records
    assert misfit("disable", ValueError("ranks [3] do not exist")) is False
    (line,) = caplog.records
    assert line.getMessage() == "distprof: profiling is off for this run: ranks [3] do not exist"
    assert line.exc_info is None  # the message says what to fix: no traceback
