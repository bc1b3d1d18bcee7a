"""Profiler + torch backend on real torch.profiler (CPU)."""

import gzip
import json
import logging
import os
import re
import subprocess
import sys
import time

import msgspec
import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once
import torch
from conftest import all_files, config, load_trace, trace_files, trace_names
from helpers import Trainer, run

from distprof import Profiler, ProfilerConfig

cfg = config


def steps_in(path):
    return sorted(int(n.split("#")[1]) for n in trace_names(path, "ProfilerStep#"))


def manifest(tmp_path, role="main", rank=0):
    p = tmp_path / "run" / role / f"rank{rank:05d}" / "manifest.jsonl"
    return [msgspec.json.decode(line) for line in p.read_bytes().splitlines()]


def test_explicit_steps_one_window_per_run_of_consecutive_steps(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[2, 3, 7]), role="actor"), 10)
    files = trace_files(tmp_path / "run")
    assert [os.path.basename(f) for f in files] == [
        "step00000002-00000003.pt.trace.json.gz", "step00000007-00000007.pt.trace.json.gz"]
    assert steps_in(files[0]) == [2, 3] and steps_in(files[1]) == [7]
    lines = manifest(tmp_path, "actor")
    assert [m["steps"] for m in lines] == [[2, 3], [7, 7]]
    m = lines[0]
    assert m["complete"] and m["bytes"] == os.path.getsize(files[0]) and m["pid"] == os.getpid()
    assert m["backend"] == "torch" and m["torch"] == torch.__version__ and m["host"]
    assert m["end_time"] >= m["start_time"] > 0
    assert m["annotations"]["train/forward"]["count"] == 2  # recorded steps only, not the warm-up step
    assert m["summary"]["top"] and m["summary"]["self_cpu_us"] > 0


def test_trace_carries_rank_and_world_without_torch_distributed(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[1], ranks=[3]), rank=3, world_size=4), 3)
    (f,) = trace_files(tmp_path / "run")
    t = load_trace(f)
    assert t["distributedInfo"]["rank"] == 3 and t["distributedInfo"]["world_size"] == 4
    assert "rank00003" in f


def test_step_zero_has_no_warmup_and_is_recorded(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[0, 1])), 3)
    (f,) = trace_files(tmp_path / "run")
    assert steps_in(f) == [0, 1]


@pytest.mark.parametrize("schedule, n, expected", [
    (dict(skip_first=0, wait=1, warmup=1, active=2, repeat=1), 10, [[2, 3]]),
    (dict(skip_first=0, wait=0, warmup=1, active=1, repeat=2), 10, [[1], [3]]),
    (dict(skip_first=0, wait=1, warmup=1, active=1, repeat=0), 9, [[2], [5], [8]]),
    (dict(skip_first=4, wait=0, warmup=1, active=2, repeat=1), 10, [[5, 6]]),
])
def test_schedules(tmp_path, schedule, n, expected):
    run(Profiler(cfg(tmp_path, schedule=schedule)), n)
    assert [steps_in(f) for f in trace_files(tmp_path / "run")] == expected


def test_resume_at_later_global_step_profiles_same_steps(tmp_path):
    sched = dict(skip_first=0, wait=2, warmup=1, active=1, repeat=0)
    fresh, resumed = tmp_path / "fresh", tmp_path / "resumed"
    run(Profiler(cfg(fresh, schedule=sched)), 12)
    run(Profiler(cfg(resumed, schedule=sched), global_step=6), 6)
    f = [steps_in(p) for p in trace_files(fresh / "run")]
    r = [steps_in(p) for p in trace_files(resumed / "run")]
    assert f == [[3], [7], [11]] and r == [[7], [11]]


def test_stop_mid_window_writes_what_was_recorded(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[2, 3, 4, 5])), 4)  # steps 0..3 run
    (f,) = trace_files(tmp_path / "run")
    assert os.path.basename(f).startswith("step00000002-00000003")
    # torch also writes the marker of the step about to start when stop() came (step 4, empty).
    assert steps_in(f) == [2, 3, 4]
    assert manifest(tmp_path)[0]["complete"] is False and manifest(tmp_path)[0]["steps"] == [2, 3]


def test_stop_before_first_recorded_step_writes_nothing(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[3])), 3)  # warm-up on 2; step 3 never runs
    assert trace_files(tmp_path / "run") == []
    run(Profiler(cfg(tmp_path, steps=[3])), 2)  # stops during warm-up
    assert trace_files(tmp_path / "run") == []


def test_exception_inside_window_keeps_the_failing_step(tmp_path):
    p = Profiler(cfg(tmp_path, steps=[1, 2, 3]))
    t = Trainer()
    with pytest.raises(RuntimeError, match="boom"):
        with p:
            for i in range(5):
                t.train_step()
                if i == 2:
                    raise RuntimeError("boom")
                p.step()
    (f,) = trace_files(tmp_path / "run")
    assert os.path.basename(f).startswith("step00000001-00000002")
    assert 2 in steps_in(f) and manifest(tmp_path)[0]["complete"] is False


@pytest.mark.parametrize("kw, ctor", [
    (dict(enable=False), {}),
    (dict(ranks=[1]), dict(rank=0, world_size=2)),
    (dict(roles=["rollout"]), dict(role="actor")),
])
def test_inert_profiler_writes_nothing_and_counts_steps(tmp_path, kw, ctor):
    c = cfg(tmp_path, steps=[1, 2], **kw) if kw.get("enable", True) else ProfilerConfig(save_path=str(tmp_path / "run"), steps=[1, 2])
    p = Profiler(c, **ctor)
    run(p, 5)
    assert not p.enabled and p.global_step == 5 and p.summary() is None
    assert not (tmp_path / "run").exists()


def test_inert_profiler_imports_no_torch():
    code = ("import sys, distprof\np = distprof.Profiler(distprof.ProfilerConfig())\n"
            "with p:\n    p.step()\n    with distprof.annotate('x'): pass\n"
            "assert 'torch' not in sys.modules and 'ray' not in sys.modules\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_rank_beyond_world_size_refused(tmp_path):
    with pytest.raises(ValueError, match=r"ranks \[2\] do not exist"):
        Profiler(cfg(tmp_path, ranks=[0, 2]), rank=0, world_size=2)


def test_unwritable_save_path_refused_at_construction(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="save_path .* not a directory"):
        Profiler(ProfilerConfig(enable=True, save_path=str(tmp_path / "file"), steps=[1]))
    with pytest.raises(ValueError, match="save_path .*nosuchproto"):
        Profiler(ProfilerConfig(enable=True, save_path="nosuchproto://b/x", steps=[1]))


def test_role_in_code_is_sanitized_or_refused(tmp_path):
    assert Profiler(cfg(tmp_path), role="actor//micro_step/").role == "actor/micro_step"
    for bad in ("../x", "/abs", "a/../../b", ""):
        with pytest.raises(ValueError):
            Profiler(cfg(tmp_path), role=bad)


def test_role_with_control_characters_is_refused_when_the_profiler_is_built(tmp_path):
    """README: control characters are refused in role names. A role holding one used to be accepted in code and
    fault later inside Kineto's rename of the trace; it is a ValueError naming the role, the character and the fix
    before anything is written."""
    for bad in ("actor\nx", "a\x00b", "rollout\x1b[31m", "ref\x7f", "x\u0085y"):
        char = next(c for c in bad if not c.isprintable())
        with pytest.raises(ValueError, match=rf"^role {re.escape(repr(bad))} contains the control character "
                                             rf"{re.escape(repr(char))}; use a printable name"):
            Profiler(cfg(tmp_path), role=bad)
    assert not (tmp_path / "run").exists()


def test_rank_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    p = Profiler(cfg(tmp_path, ranks="all"))
    assert (p.rank, p.world_size) == (1, 3)


def test_two_profilers_in_one_process(tmp_path):
    """slime's targets: one profiler per global step, one per grad-accumulation micro-step; config picks."""
    c = cfg(tmp_path, steps=[1], roles=["actor/micro_step"])
    outer, inner = Profiler(c, role="actor"), Profiler(c, role="actor/micro_step")
    t = Trainer()
    with outer, inner:
        for _ in range(2):
            for _ in range(3):
                t.train_step()
                inner.step()
            outer.step()
    assert not outer.enabled and inner.global_step == 6
    (f,) = trace_files(tmp_path / "run")
    assert "actor/micro_step/rank00000/step00000001-00000001" in f


def test_cuda_requested_without_cuda_warns_once_and_captures_cpu(tmp_path, caplog, monkeypatch):
    from distprof.capture.backends import torch_backend

    monkeypatch.setattr(torch_backend, "_warned_missing", set())  # a fresh process's state: no warning given yet
    caplog.set_level(logging.WARNING, logger="distprof")
    run(Profiler(cfg(tmp_path, steps=[1, 3], torch={"activities": ["cuda"]})), 5)
    assert len(trace_files(tmp_path / "run")) == 2
    assert sum("CUDA is not available" in r.message for r in caplog.records) == 1  # two windows, one warning
    assert any("aten::" in n for n in trace_names(trace_files(tmp_path / "run")[0]))


def test_summary_matches_trace(tmp_path):
    p = Profiler(cfg(tmp_path, steps=[1, 2], torch={"activities": ["cpu"], "summary_top": 10_000}))  # every op
    run(p, 4)
    s = p.summary()
    (f,) = trace_files(tmp_path / "run")
    addmm_in_trace = sum(1 for n in trace_names(f) if n == "aten::addmm")
    full = {r["name"]: r for r in s["ops"]}
    assert s["total_ops"] == len(full) and s["self_cpu_us"] > 0 and s["device_busy_us"] == 0.0
    assert addmm_in_trace == 2 * 2  # two Linear layers, two recorded steps
    assert full["aten::addmm"]["count"] == addmm_in_trace
    assert s["ops"] == sorted(s["ops"], key=lambda r: (r["self_device_us"], r["self_cpu_us"]), reverse=True)


def test_annotations_in_trace_and_timings(tmp_path):
    p = Profiler(cfg(tmp_path, steps=[1]))
    run(p, 3)
    (f,) = trace_files(tmp_path / "run")
    names = trace_names(f)
    assert names.count("train/forward") == 1 and names.count("train/backward") == 1
    times = p.annotation_times()
    assert times["train/forward"]["count"] == 1 and times["train/forward"]["total_s"] > 0


def test_export_stacks(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[1], torch={"activities": ["cpu"], "with_stack": True, "export_stacks": True})), 3)
    files = all_files(tmp_path / "run")
    assert "main/rank00000/step00000001-00000001.stacks.txt" in files
    assert "main/rank00000/step00000001-00000001.pt.trace.json.gz" in files


def test_plain_json_when_gzip_off(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[1], torch={"activities": ["cpu"], "gzip": False})), 3)
    (f,) = trace_files(tmp_path / "run")
    assert f.endswith("step00000001-00000001.pt.trace.json")
    json.loads(open(f).read())


def test_run_json_first_writer_wins(tmp_path):
    from distprof.rundir.store import RunDir

    r = RunDir(str(tmp_path / "r"))
    assert r.write_run_json({"who": 1}) is True
    assert r.write_run_json({"who": 2}) is False
    assert json.loads((tmp_path / "r" / "run.json").read_text()) == {"who": 1}
    assert all_files(tmp_path / "r") == ["run.json"]


def test_run_json_contents(tmp_path):
    run(Profiler(cfg(tmp_path, steps=[1]), world_size=1), 3)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["config"]["steps"] == [1] and info["world_size"] == 1 and info["versions"]["torch"] == torch.__version__


def test_files_are_never_seen_half_written(tmp_path, monkeypatch):
    """Exports go to hidden temporary names; every visible trace decodes completely at every step."""
    from torch.profiler import profile

    log = tmp_path / "exports.txt"  # written by whichever process exports (a child forked to write the window)
    real_export = profile.export_chrome_trace

    def spy(self, path, *a, **k):
        with open(log, "a") as f:
            f.write(os.path.basename(path) + "\n")
        exported = log.read_text().split()
        # While torch writes, the window's final name does not exist yet: only earlier windows are visible.
        visible = [f for f in all_files(tmp_path / "run") if f.endswith(".gz") and not os.path.basename(f).startswith(".")]
        assert len(visible) == len(exported) - 1
        return real_export(self, path, *a, **k)

    monkeypatch.setattr(profile, "export_chrome_trace", spy)
    seen = []

    def check(_):
        for f in all_files(tmp_path / "run"):
            name = os.path.basename(f)
            if name.startswith("."):
                continue
            if name.endswith(".gz"):
                with gzip.open(tmp_path / "run" / f) as fh:
                    json.load(fh)  # raises on a partial file
                seen.append(f)
    run(Profiler(cfg(tmp_path, steps=[1, 3, 5, 7])), 9, on_step=check)
    check(None)  # after stop(): the last window, written in the background, too
    exported = log.read_text().split()
    assert exported and all(n.startswith(".tmp-") for n in exported)
    assert len(set(seen)) == 4
    assert not [f for f in all_files(tmp_path / "run") if os.path.basename(f).startswith(".")]


def test_memory_url_save_path(tmp_path):
    import fsspec

    run(Profiler(ProfilerConfig(enable=True, save_path="memory://bucket/run", steps=[1], torch={"activities": ["cpu"]})), 3)
    fs = fsspec.filesystem("memory")
    files = sorted(fs.find("/bucket/run"))
    assert "/bucket/run/run.json" in files
    assert "/bucket/run/main/rank00000/step00000001-00000001.pt.trace.json.gz" in files
    lines = fs.cat_file("/bucket/run/main/rank00000/manifest.jsonl").splitlines()
    assert len(lines) == 1 and msgspec.json.decode(lines[0])["steps"] == [1, 1]
    with gzip.open(fs.open("/bucket/run/main/rank00000/step00000001-00000001.pt.trace.json.gz")) as fh:
        assert "ProfilerStep#1" in {e["name"] for e in json.load(fh)["traceEvents"]}


def test_step_before_start_autostarts(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="distprof")
    p = Profiler(cfg(tmp_path, steps=[2]))
    t = Trainer()
    for _ in range(4):
        t.train_step()
        p.step()
    p.stop()
    assert any("before start()" in r.message for r in caplog.records)
    assert [steps_in(f) for f in trace_files(tmp_path / "run")] == [[2]]
    p.step()  # after stop(): counts, captures nothing, warns nothing new
    assert p.global_step == 5


@pytest.mark.slow
def test_python_O_changes_nothing(tmp_path):
    code = f"""
import distprof, torch, os
try:
    distprof.ProfilerConfig(steps=[-1]); raise SystemExit('accepted a bad config')
except ValueError: pass
p = distprof.Profiler(distprof.ProfilerConfig(enable=True, save_path={str(tmp_path / 'o')!r}, steps=[1], torch={{'activities': ['cpu']}}))
with p:
    for _ in range(3):
        torch.randn(4, 4) @ torch.randn(4, 4)
        p.step()
print(sorted(os.listdir({str(tmp_path / 'o' / 'main' / 'rank00000')!r})))
"""
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True)
    assert "step00000001-00000001.pt.trace.json.gz" in out.stdout and "manifest.jsonl" in out.stdout


def test_held_export_ends_the_step_now_and_writes_later(tmp_path):
    """step(export=False): ProfilerStep#N closes in that call, the files appear only at export() (or the next
    step()/stop()), and the next window opens once the held one is written. What step_all relies on."""
    trainer = Trainer()
    p = Profiler(cfg(tmp_path, steps=[1, 2, 4]), role="actor")
    p.start()
    for step in range(3):  # steps 0, 1, 2: the window 1-2 closes at the end of step 2
        trainer.train_step()
        p.step(export=False)
    assert trace_files(tmp_path / "run") == [] and not p.capturing
    t_held = time.time()
    assert p.export() is True and p.export() is False  # written once; nothing more to write
    (f,) = trace_files(tmp_path / "run")
    assert steps_in(f) == [1, 2]
    (m,) = manifest(tmp_path, "actor")
    assert m["steps"] == [1, 2] and m["end_time"] <= t_held <= m["written_time"]  # ended before it was written
    # Trace: the last step's range ends before the window's files were written.
    t = load_trace(f)
    (last,) = [e for e in t["traceEvents"] if e.get("name") == "ProfilerStep#2"]
    assert (t.get("baseTimeNanoseconds", 0) / 1e3 + last["ts"] + last["dur"]) / 1e6 <= m["written_time"]
    # Window 4 (warm-up at 3) opens as usual; one held at stop() is written by stop().
    for step in range(3, 5):
        trainer.train_step()
        p.step(export=False)
    assert len(trace_files(tmp_path / "run")) == 1
    p.stop()
    assert [steps_in(f) for f in trace_files(tmp_path / "run")] == [[1, 2], [4]]
    assert [m["steps"] for m in manifest(tmp_path, "actor")] == [[1, 2], [4, 4]]


@pytest.mark.slow
@pytest.mark.parametrize("value, shown", [("INFO", True), ("warning", False), ("loud", False)])
def test_distprof_log_level_sets_distprof_loggers_level(tmp_path, value, shown):
    """DISTPROF_LOG_LEVEL reaches a process whose logging the user does not configure (a Ray worker, a torchrun
    child): here the application logs at WARNING, and the variable alone makes distprof's INFO lines appear."""
    code = ("import logging, distprof\n"
            "logging.basicConfig(level=logging.WARNING)\n"
            f"p = distprof.Profiler({{'enable': True, 'save_path': {str(tmp_path / 'r')!r}, 'steps': [1]}}, rank=0, world_size=1)\n"
            "with p:\n    [p.step() for _ in range(3)]\n")
    env = {**os.environ, "DISTPROF_LOG_LEVEL": value}
    proc = warmpython.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("opened window 1-1" in proc.stderr) is shown
    assert ("is not a log level" in proc.stderr) is (value == "loud")


INDUCTOR_PROBE = r"""
import json, sys
import torch
import distprof
if sys.argv[2] == "inductor-loaded":
    import torch._inductor.config
prof = distprof.Profiler(distprof.ProfilerConfig(enable=True, save_path=sys.argv[1], steps=[2, 3],
                                                 torch={"activities": ["cpu"]}))
with prof:
    for step in range(5):
        torch.tanh(torch.randn(8, 8) @ torch.randn(8, 8))
        prof.step()
print(json.dumps({"inductor": "torch._inductor" in sys.modules, "offered": "_inductor" in torch._lazy_modules,
                  "windows": prof.windows_closed}))
"""


@pytest.mark.parametrize("state", ["inductor-unused", "inductor-loaded"])
def test_a_window_imports_no_inductor_in_a_process_that_never_used_it(tmp_path, state):
    """torch.profiler asks whether inductor's CUDA graphs are on by touching ``torch._inductor``, which imports
    inductor and dynamo (1.7 s of CPU in the step opening the first window). distprof's window answers "no" for a
    process that never loaded inductor, and leaves torch's probe alone where inductor is loaded; either way
    torch's lazy-module table is as it was, and the window is written."""
    proc = subprocess.run([sys.executable, "-c", INDUCTOR_PROBE, str(tmp_path / "run"), state], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"inductor": state == "inductor-loaded", "offered": True, "windows": 1}
    assert len(trace_files(tmp_path / "run")) == 1
