"""The memory guard on real torch.profiler (CPU): a heavy-flag loop of many small ops under a low budget."""

import gc
import gzip
import json
import logging
import os
from functools import partial

import msgspec
import pytest
import torch
from conftest import config, trace_files, trace_names

from distprof import Profiler, ProfilerConfig
from distprof.capture.guard import GUARD_STOP, MemoryGuard

HEAVY = {"activities": ["cpu"], "profile_memory": True, "record_shapes": True, "with_stack": True}


class SmallOps:
    """A training step of a few hundred tiny ops: the heavy flags make its trace grow fast."""

    def __init__(self):
        torch.manual_seed(0)
        self.x, self.w, self.b = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8)
        self.steps_run = 0

    def step(self):
        y = self.x
        for _ in range(150):
            y = torch.tanh(y @ self.w + self.b)
        self.steps_run += 1
        return float(y.sum())


cfg = partial(config, torch=HEAVY)


def manifest(tmp_path):
    p = tmp_path / "run" / "main" / "rank00000" / "manifest.jsonl"
    return [msgspec.json.decode(line) for line in p.read_bytes().splitlines()] if p.exists() else []


def train(prof, n):
    loop = SmallOps()
    with prof:
        for _ in range(n):
            loop.step()
            prof.step()
    return loop


def guard_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "capturing no more windows" in r.getMessage()]


@pytest.mark.slow
def test_trace_budget_closes_the_window_early_keeps_its_file_and_stops_capturing(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="distprof")
    # Window 1-40 would export tens of MB with these flags; the budget is 3 MB. Window 50-51 must never open.
    prof = Profiler(cfg(tmp_path, steps="1-40,50-51", max_trace_mb=3))
    loop = train(prof, 60)
    assert loop.steps_run == 60 and prof.global_step == 60  # training went on to the end
    (rec,) = manifest(tmp_path)  # one window only: the second was not opened
    assert rec["complete"] is False and rec["stopped_by"] == GUARD_STOP == "memory_guard"
    first, last = rec["steps"]
    assert first == 1 and 1 <= last < 40
    g = rec["guard"]
    assert g["limit"] == "max_trace_mb" and g["limit_value"] == 3 and g["measured"] > 3 and g["step"] == last
    assert g["trace_estimate_mb"] == pytest.approx(g["measured"], abs=0.1) and g["rss_gb"] >= g["rss_at_open_gb"]
    (f,) = trace_files(tmp_path / "run")
    with gzip.open(f) as fh:
        raw = fh.read()
    json.loads(raw)  # complete, valid JSON
    # The estimate tracks the real size (it is what the limit is about): within a factor of 2 either way.
    assert 0.5 <= len(raw) / 1e6 / g["trace_estimate_mb"] <= 2
    steps = sorted(int(n.split("#")[1]) for n in trace_names(f, "ProfilerStep#"))
    assert steps[0] == 1 and set(range(1, last + 1)) <= set(steps) and max(steps) <= last + 1
    assert rec["step_times_s"] and len(rec["step_times_s"]) == last - first + 1
    (w,) = guard_warnings(caplog)  # warned once, with the numbers
    assert "max_trace_mb=3" in w and "estimated trace size" in w and "closing window 1-40" in w
    assert prof.windows_closed == 1 and not prof.capturing


@pytest.mark.slow
def test_trace_budget_not_fooled_by_memory_an_earlier_window_freed(tmp_path):
    """RSS does not grow while a window refills heap an earlier window freed; the heap estimate does."""
    # The earlier window: torch.profiler with the same flags over 30 steps, ~20 MB of buffers freed with the
    # profile. Not exported (writing 20 MB of JSON with stacks was most of this test's time): freed is freed.
    loop = SmallOps()
    earlier = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                     record_shapes=True, with_stack=True)
    with earlier:
        for _ in range(30):
            loop.step()
    del earlier
    gc.collect()
    prof = Profiler(cfg(tmp_path, steps="1-40", max_trace_mb=5))
    train(prof, 42)
    (rec,) = manifest(tmp_path)
    assert rec["stopped_by"] == "memory_guard" and rec["steps"][1] < 40
    assert rec["guard"]["trace_basis"] == "heap" and rec["guard"]["trace_estimate_mb"] > 5


@pytest.mark.parametrize("limit,kw,words", [
    ("max_host_memory_gb", {"max_host_memory_gb": 0.001}, "process RSS"),
    ("min_available_memory_gb", {"min_available_memory_gb": 1e6}, "host available memory"),
])
def test_host_limits_crossed_at_once_capture_nothing_and_say_why(tmp_path, caplog, limit, kw, words):
    """A limit already crossed when the window opens: closed at the first step end (its warm-up), so nothing is
    recorded and no file written, but the window has its manifest line saying so; the warning names the limit;
    later windows are not opened."""
    caplog.set_level(logging.WARNING, logger="distprof")
    prof = Profiler(cfg(tmp_path, steps=[2, 3, 6], **kw))
    loop = train(prof, 8)
    assert loop.steps_run == 8
    assert trace_files(tmp_path / "run") == []
    (rec,) = manifest(tmp_path)  # window 2-3, closed in its warm-up (step 1); window 6 never opened
    assert rec["steps"] == [2, 3] and rec["complete"] is False and rec["stopped_by"] == "memory_guard"
    assert "file" not in rec and rec.get("files", []) == []
    g = rec["guard"]
    assert g["limit"] == limit and g["step"] == 1 and g["exported"] is False and "warm-up" in g["reason"]
    (w,) = guard_warnings(caplog)
    assert limit in w and words in w and "in its warm-up: nothing recorded yet" in w
    assert prof.windows_closed == 0


@pytest.mark.slow
def test_generous_guard_changes_nothing(tmp_path):
    plain_dir, guarded_dir = tmp_path / "plain", tmp_path / "guarded"
    train(Profiler(cfg(plain_dir, steps=[2, 3, 6])), 8)
    prof = Profiler(cfg(guarded_dir, steps=[2, 3, 6], max_trace_mb=10_000, max_host_memory_gb=10_000,
                        min_available_memory_gb=0.001))
    assert isinstance(prof._mem_guard, MemoryGuard)  # the guard is really on
    train(prof, 8)
    a, b = manifest(plain_dir), manifest(guarded_dir)
    assert [(r["steps"], r["complete"]) for r in a] == [(r["steps"], r["complete"]) for r in b] == \
        [([2, 3], True), ([6, 6], True)]
    assert all("guard" not in r and "stopped_by" not in r for r in b)


def test_guard_samples_at_most_every_interval():
    g = MemoryGuard(max_trace_bytes=1e12, interval_s=3600)
    g.open()
    assert g.check() is None and g.samples == 1
    assert all(g.check() is None for _ in range(100)) and g.samples == 1  # not due: no psutil read
    assert g.sample() is None and g.samples == 2


def test_no_limit_no_guard(tmp_path):
    assert MemoryGuard.from_config(ProfilerConfig()) is None
    assert Profiler(cfg(tmp_path, steps=[1]))._mem_guard is None


@pytest.mark.parametrize("field", ["max_host_memory_gb", "min_available_memory_gb", "max_trace_mb"])
@pytest.mark.parametrize("bad", [0, -1, "lots", float("nan"), float("inf"), True, [1]])
def test_bad_limits_refused_naming_field_value_and_fix(field, bad):
    with pytest.raises(ValueError) as e:
        ProfilerConfig(**{field: bad})
    text = str(e.value)
    assert field in text and "> 0" in text and "null to turn it off" in text


def test_limits_from_environment_and_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTPROF_MAX_TRACE_MB", "500")
    monkeypatch.setenv("DISTPROF_MAX_HOST_MEMORY_GB", "8")
    c = ProfilerConfig()
    assert c.max_trace_mb == 500.0 and c.max_host_memory_gb == 8.0 and c.min_available_memory_gb is None
    monkeypatch.delenv("DISTPROF_MAX_TRACE_MB")
    monkeypatch.delenv("DISTPROF_MAX_HOST_MEMORY_GB")
    p = tmp_path / "c.yaml"
    p.write_text("min_available_memory_gb: 1.5\n")
    assert ProfilerConfig.from_yaml(p).min_available_memory_gb == 1.5


class Burst:
    """A step that runs many small ops inside one step: the window's trace grows far past its budget between two
    step ends, where the guard cannot look."""

    def __init__(self):
        self.x, self.w = torch.randn(4, 4), torch.randn(4, 4)

    def step(self, n):
        y = self.x
        for _ in range(n):
            y = torch.tanh(y @ self.w)
        return float(y.sum())


def test_window_grown_far_over_budget_within_one_step_is_not_exported_but_recorded(tmp_path, caplog):
    """Window 3 (one step, warm-up at 2) records a burst of 3000 ops x 3 events with shapes and memory: tens of
    MB of trace for a 0.2 MB budget, all inside its one step. The guard sees it at that step's end, before the
    export: over 4x the budget, the trace is dropped unexported (no file, no 40 s export), and the manifest line
    says so with the numbers; training goes on and no later window opens."""
    caplog.set_level(logging.WARNING, logger="distprof")
    prof = Profiler(cfg(tmp_path, steps="3,6", max_trace_mb=0.2, torch={"activities": ["cpu"], "record_shapes": True,
                                                                       "profile_memory": True}))
    burst = Burst()
    with prof:
        for s in range(8):
            burst.step(3000 if s == 3 else 5)
            prof.step()
    assert prof.global_step == 8
    assert trace_files(tmp_path / "run") == []  # refused: never exported
    assert not [n for n in os.listdir(tmp_path / "run" / "main" / "rank00000") if n.startswith(".tmp")]
    (rec,) = manifest(tmp_path)  # window 6 never opened
    assert rec["steps"] == [3, 3] and rec["complete"] is False and rec["stopped_by"] == "memory_guard"
    assert rec.get("files", []) == [] and "file" not in rec and len(rec["step_times_s"]) == 1
    g = rec["guard"]
    assert g["limit"] == "max_trace_mb" and g["step"] == 3 and g["limit_value"] == 0.2
    assert g["trace_estimate_mb"] > 4 * 0.2 and g["exported"] is False
    assert "not exported" in g["reason"] and "4x max_trace_mb=0.2" in g["reason"]
    (w,) = guard_warnings(caplog)
    assert "not exported" in w and "dropping steps 3-3 unexported" in w
    assert prof.windows_closed == 0 and not prof.capturing
    from distprof.analysis.check import check_run

    res = check_run(str(tmp_path / "run"))  # check names the window and why it has no file, not "ok"
    (item,) = [i for i in res.items if i.steps == [3, 3]]
    assert item.status == "incomplete" and item.file is None and "not exported" in item.detail and not res.ok


def test_a_guard_closed_window_whose_export_fails_still_gets_its_line(tmp_path, caplog):
    """The guard closes window 1-40 a little over its 3 MB budget (so the export is attempted), and the export
    fails for real: a file-size limit (RLIMIT_FSIZE, 256 KB; Python ignores SIGXFSZ, so the write gets EFBIG) cuts
    torch's JSON short, as an allocation failure or a full disk would end it. The window is still recorded: its
    manifest line (small, under the limit) names the error; profiling switches off, training goes on."""
    import resource

    caplog.set_level(logging.WARNING, logger="distprof")
    prof = Profiler(cfg(tmp_path, steps="1-40", max_trace_mb=3))
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    loop = SmallOps()
    with prof:
        for s in range(45):
            loop.step()
            if prof.capturing and s >= 1:
                resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, hard))
            try:
                prof.step()
            finally:
                resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert loop.steps_run == 45 and not prof.enabled  # the export's fault switched profiling off
    assert trace_files(tmp_path / "run") == []
    assert not [n for n in os.listdir(tmp_path / "run" / "main" / "rank00000") if n.startswith(".tmp")]
    (rec,) = manifest(tmp_path)
    assert rec["stopped_by"] == "memory_guard" and rec["complete"] is False and rec.get("files", []) == []
    first, last = rec["steps"]
    assert first == 1 and 1 <= last < 40
    g = rec["guard"]
    assert g["limit"] == "max_trace_mb" and g["exported"] is False and g["export_error"]
    assert 3 < g["trace_estimate_mb"] <= 12  # within the export bound: it was tried
    # torch's write was cut off: no trace, or the empty temporary distprof created for it (rundir/safefile.py)
    assert g["export_error"].startswith(("TraceExportError: torch wrote no trace", "TraceExportError: torch wrote an empty trace"))
