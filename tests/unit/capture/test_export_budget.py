"""The export budget (max_export_share, capture/budget.py): a window whose closing would hold the training thread
over a share of the job's collective timeout is shortened, with the numbers in its manifest line and one warning.

Real torch.profiler windows and a real gloo process group (a world of one, its timeout chosen by the test). The
estimate is made deterministic by the heap reading the memory guard's estimator uses (``guard.heap_in_use``,
advanced by the test at each step) or by the seconds-per-byte constant; nothing is timed.
"""

import datetime
import logging
import subprocess
import sys

import msgspec
import pytest
import torch
import torch.distributed as dist
from conftest import config, trace_files
from helpers import Trainer

from distprof import Profiler, ProfilerConfig
from distprof.analysis.check import check_run
from distprof.capture import budget, guard
from distprof.capture.budget import BUDGET_STOP, ExportBudget, collective_timeout_s
from distprof.capture.trigger import make_request

HEAVY = {"activities": ["cpu"], "profile_memory": True, "record_shapes": True, "with_stack": True}
MB = 1_000_000


def manifest(tmp_path):
    p = tmp_path / "run" / "main" / "rank00000" / "manifest.jsonl"
    return [msgspec.json.decode(line) for line in p.read_bytes().splitlines()] if p.exists() else []


def budget_logs(caplog):
    return [r for r in caplog.records if r.name == "distprof.capture.budget"]


@pytest.fixture
def group():
    """A real gloo process group of one rank, with the collective timeout the test asks for."""
    made = []

    def init(timeout_s):
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=timeout_s))
        made.append(True)

    yield init
    if made and dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def heap(monkeypatch):
    """The C heap in use as the memory guard's estimator reads it: the test sets it (bytes). Every sample is due;
    closing costs 10 ns per estimated byte in the background, 85 ns inline (whatever this machine measured)."""
    now = {"bytes": 100 * MB}
    monkeypatch.setattr(guard, "heap_in_use", lambda: now["bytes"])
    monkeypatch.setattr(budget, "INTERVAL_S", 0.0)
    monkeypatch.setattr(budget, "SECONDS_PER_TRACE_BYTE", {"background": 10e-9, "inline": 85e-9})
    return now


def train(p, steps, heap=None, grow=0):
    trainer = Trainer()
    with p:
        for _ in range(steps):
            trainer.train_step()
            if heap is not None:
                heap["bytes"] += grow
            p.step()


def test_the_process_groups_timeout_is_read_and_unknown_without_one(group, monkeypatch):
    assert not dist.is_initialized() and collective_timeout_s() is None
    group(7)
    assert collective_timeout_s() == 7.0
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=3))  # the timeout in force is read
    assert collective_timeout_s() == 3.0

    def moved():
        raise AttributeError("a private API this torch lacks")

    monkeypatch.setattr(dist.distributed_c10d, "_get_default_group", moved)
    assert collective_timeout_s() is None  # unknown: the check is off, nothing raises


def test_reading_the_timeout_never_imports_torch():
    code = ("import sys; from distprof.capture.budget import collective_timeout_s; "
            "assert collective_timeout_s() is None; assert 'torch' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_window_over_the_budget_is_shortened_with_the_numbers_and_one_warning(tmp_path, group, heap, caplog):
    caplog.set_level(logging.INFO, logger="distprof")
    group(1)  # share 0.25 (the default) of 1 s: closing may hold the training thread 0.25 s
    # 20 MB of heap per step is 28 MB of trace, 0.28 s at 10 ns per byte (background export): over after 1 step.
    p = Profiler(config(tmp_path, steps="2-9,20-29")).start()
    train(p, 32, heap, grow=20 * MB)
    lines = manifest(tmp_path)
    assert [line["steps"] for line in lines] == [[2, 2], [20, 20]]  # both windows shortened; the second opened
    for line in lines:
        g = line["guard"]
        assert line["stopped_by"] == BUDGET_STOP == "export_budget" and line["complete"] is False
        assert g["limit"] == "max_export_share" and g["collective_timeout_s"] == 1.0
        assert g["timeout_source"] == "process_group" and g["max_export_share"] == 0.25
        assert g["limit_value"] == 0.25 and g["measured"] == pytest.approx(0.28, abs=0.01)
        assert g["trace_estimate_mb"] == pytest.approx(28, abs=0.1) and g["export"] == "background"
        assert g["seconds_per_mb"] == pytest.approx(0.01)
        assert g["step"] == line["steps"][1] and "exported" not in g
        assert [f["path"].endswith(".pt.trace.json.gz") for f in line["files"]] == [True]
    assert len(trace_files(tmp_path / "run")) == 2  # both written, in the background
    logs = budget_logs(caplog)
    assert [r.levelno for r in logs] == [logging.WARNING, logging.INFO]  # one warning, the rest at info
    w = logs[0].getMessage()
    for part in ("closing window 2-9 after step 2", "estimated 0.28 s", "trace estimate 28 MB", "background",
                 "max_export_share=0.25", "collective timeout 1 s (process_group) = 0.25 s", "keeping steps 2-2",
                 "not repeated"):
        assert part in w, (part, w)


def test_a_budget_of_several_steps_keeps_them(tmp_path, group, heap):
    group(10)  # 2.5 s: 0.28 s a step, over after the 9th recorded step
    p = Profiler(config(tmp_path, steps="2-20")).start()
    train(p, 22, heap, grow=20 * MB)
    [line] = manifest(tmp_path)
    assert line["steps"] == [2, 10] and line["stopped_by"] == "export_budget"


def test_inline_export_uses_its_own_constant_and_is_refused_past_the_whole_timeout(tmp_path, group, heap, caplog):
    caplog.set_level(logging.WARNING, logger="distprof")
    group(1)
    p = Profiler(config(tmp_path, steps="2-9", torch={"activities": ["cpu"], "background_export": False})).start()
    train(p, 12, heap, grow=20 * MB)  # 28 MB x 85 ns = 2.4 s: over the 0.25 s allowed and over the whole 1 s
    [line] = manifest(tmp_path)
    g = line["guard"]
    assert line["steps"] == [2, 2] and line["stopped_by"] == "export_budget" and not line.get("files")
    assert g["export"] == "inline" and g["exported"] is False and "whole collective timeout" in g["reason"]
    assert trace_files(tmp_path / "run") == []
    assert "dropping steps 2-2 unexported" in budget_logs(caplog)[0].getMessage()
    item = next(i for i in check_run(str(tmp_path / "run")).items if i.status == "incomplete")
    assert "stopped by the export budget after step 2; no trace file: closing estimated" in item.detail


def test_distprof_check_says_why_a_window_was_shortened(tmp_path, group, heap):
    group(1)
    p = Profiler(config(tmp_path, steps="2-9")).start()
    train(p, 12, heap, grow=20 * MB)
    res = check_run(str(tmp_path / "run"))
    [item] = [i for i in res.items if i.steps == [2, 9]]
    assert item.status == "incomplete" and item.file
    assert "stopped by the export budget after step 2 (max_export_share: measured 0.28, limit 0.25)" in item.detail


def test_a_real_heavy_window_trips_on_its_real_heap_growth(tmp_path, group, monkeypatch):
    """No patched heap: the memory guard's real estimate (glibc's heap, or RSS) of a heavy window, against a
    closing cost made large (1 µs a byte) so that any real trace is over 0.25 s."""
    monkeypatch.setattr(budget, "SECONDS_PER_TRACE_BYTE", {"background": 1e-6, "inline": 1e-6})
    group(1)
    p = Profiler(config(tmp_path, steps="2-40", torch=HEAVY)).start()
    x, w = torch.randn(8, 8), torch.randn(8, 8)
    with p:
        for _ in range(42):
            for _ in range(150):
                x = torch.tanh(x @ w)
            p.step()
    [line] = manifest(tmp_path)
    assert line["stopped_by"] == "export_budget" and line["steps"][1] < 40
    assert line["guard"]["trace_estimate_mb"] > 0.25 and line["guard"]["trace_basis"] in ("heap", "rss")


@pytest.mark.parametrize("case", ["off", "generous", "no_group"])
def test_nothing_changes_when_off_generous_or_the_timeout_is_unknown(tmp_path, group, heap, caplog, case):
    caplog.set_level(logging.INFO, logger="distprof")
    if case != "no_group":
        group(3600 if case == "generous" else 1)
    fields = {"max_export_share": None} if case == "off" else {}
    p = Profiler(config(tmp_path, steps="2-9", **fields)).start()
    train(p, 12, heap, grow=20 * MB)
    [line] = manifest(tmp_path)
    assert line["steps"] == [2, 9] and line["complete"] is True and line.get("stopped_by") is None
    assert budget_logs(caplog) == []
    if case == "off":
        assert p._memory is None  # no memory limit and no budget: nothing is sampled at all


def test_the_configured_timeout_is_used_without_a_process_group(tmp_path, heap):
    assert not dist.is_initialized()
    p = Profiler(config(tmp_path, steps="2-9", collective_timeout_s=1)).start()
    train(p, 12, heap, grow=20 * MB)
    [line] = manifest(tmp_path)
    assert line["steps"] == [2, 2] and line["guard"]["timeout_source"] == "collective_timeout_s"


def test_the_process_groups_timeout_wins_over_the_configured_one(tmp_path, group, heap):
    group(3600)
    p = Profiler(config(tmp_path, steps="2-9", collective_timeout_s=1)).start()
    train(p, 12, heap, grow=20 * MB)
    assert manifest(tmp_path)[0]["steps"] == [2, 9]


def test_a_requested_window_is_checked_as_written_inline(tmp_path, group, heap):
    group(10)  # 2.5 s allowed: 28 MB of trace a step x 85 ns (inline: a requested window) = 2.4 s, over at step 2
    p = Profiler(config(tmp_path, trigger=True, trigger_poll_s=0, steps=None)).start()
    trainer = Trainer()
    with p:
        for _ in range(3):
            trainer.train_step()
            p.step()
        assert p.trigger_request(make_request(8, start_step=5))["state"] == "accepted"
        for _ in range(12):
            trainer.train_step()
            heap["bytes"] += 20 * MB
            p.step()
    [line] = manifest(tmp_path)
    assert line["trigger"] and line["stopped_by"] == "export_budget" and line["steps"] == [5, 6]
    assert line["guard"]["export"] == "inline" and line["guard"]["measured"] == pytest.approx(4.76, abs=0.01)
    assert len(line["files"]) == 1


def test_the_budget_is_off_for_other_backends_and_by_config():
    assert ExportBudget.from_config(ProfilerConfig(), object) is not None  # on by default
    assert ExportBudget.from_config(ProfilerConfig(max_export_share=None), object) is None
    assert ExportBudget.from_config(ProfilerConfig(backend="cuda_memory"), object) is None


def test_config_defaults_and_environment(monkeypatch):
    c = ProfilerConfig()
    assert c.max_export_share == 0.25 and c.collective_timeout_s is None
    monkeypatch.setenv("DISTPROF_MAX_EXPORT_SHARE", "0.5")
    monkeypatch.setenv("DISTPROF_COLLECTIVE_TIMEOUT_S", "600")
    c = ProfilerConfig()
    assert (c.max_export_share, c.collective_timeout_s) == (0.5, 600.0)
    monkeypatch.setenv("DISTPROF_MAX_EXPORT_SHARE", "null")
    assert ProfilerConfig().max_export_share is None


@pytest.mark.parametrize("field,value,expect", [
    ("max_export_share", 0, "max_export_share must be > 0 and <= 1, got 0"),
    ("max_export_share", 1.5, "max_export_share must be > 0 and <= 1, got 1.5"),
    ("max_export_share", -0.1, "got -0.1"),
    ("max_export_share", float("nan"), "got nan"),
    ("max_export_share", "lots", "max_export_share must be a number, got 'lots'"),
    ("collective_timeout_s", 0, "collective_timeout_s must be a finite number > 0, got 0"),
    ("collective_timeout_s", float("inf"), "got inf"),
])
def test_config_validation_names_field_value_and_fix(field, value, expect):
    with pytest.raises(ValueError) as e:
        ProfilerConfig(**{field: value})
    assert expect in str(e.value)
    fix = "e.g. max_export_share: 0.25" if field == "max_export_share" else "e.g. collective_timeout_s: 600"
    assert fix in str(e.value)


def test_a_share_of_one_is_allowed():
    assert ProfilerConfig(max_export_share=1).max_export_share == 1.0

