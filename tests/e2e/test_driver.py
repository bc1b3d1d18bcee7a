"""The driver role, Ray's task timeline of every window, and the demo's injected slowness (``--slow``, ``--async``).

The reader and ``check`` on timeline files are tested on files written by the real writer (no Ray needed); two
tests run the demo's RL job in process on a real local Ray cluster (about 30 s each, under the heavy lock).
"""

import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import distprof
from distprof.analysis.check import check_run
from distprof.analysis.ray_timeline import TimelineError, busy_intervals, load, parse
from distprof.rundir.layout import ray_timeline_name
from distprof.trace.listing import find_traces

W_ROLLOUT, W_ACTOR1, W_DRIVER = "aa" * 28, "bb" * 28, "01000000" + "ff" * 24
A_ROLLOUT, A_ACTOR1, A_ACTOR0 = "11" * 16, "22" * 16, "33" * 16


def _ev(cat, worker, ts, dur, task=None, name=None, kind="worker"):
    args = {} if task is None else {"task_id": task, "name": name or cat.rsplit(".", 1)[-1]}
    return {"cat": cat, "name": args.get("name", cat), "ph": "X", "pid": "127.0.0.1", "tid": f"{kind}:{worker}",
            "ts": ts, "dur": dur, "args": args}


def _events(t0):
    """Ray's events of one window: workers known by worker id, one (actor rank 0) only by its actor id."""
    return [
        _ev("task::Rollout.generate", W_ROLLOUT, t0 + 10, 300, "ab" * 8 + A_ROLLOUT),
        _ev("task:execute", W_ROLLOUT, t0 + 11, 298),  # a task's inner stage: not counted twice
        _ev("task::Rollout.profile_step", W_ROLLOUT, t0 + 400, 5, "cd" * 8 + A_ROLLOUT),  # distprof's own RPC
        _ev("task::Actor.update", W_ACTOR1, t0 + 320, 50, "ef" * 8 + A_ACTOR1),
        _ev("task::Actor.update", "cc" * 28, t0 + 330, 40, "01" * 8 + A_ACTOR0),  # worker id unknown: by actor id
        _ev("task::Actor.update", W_ACTOR1, t0 - 30, 50, "02" * 8 + A_ACTOR1),  # begins before the window: cut
        _ev("submit_task", W_DRIVER, t0 + 1, 1, kind="driver"),  # the driver's own events: not busy time
        _ev("task::helper", "dd" * 28, t0 + 5, 5, "03" * 8 + "44" * 16),  # a task of no profiled group
    ]


def _workers():
    return [{"role": "rollout", "rank": 0, "worker_id": W_ROLLOUT, "actor_id": A_ROLLOUT},
            {"role": "actor", "rank": 0, "worker_id": None, "actor_id": A_ACTOR0},
            {"role": "actor", "rank": 1, "worker_id": W_ACTOR1, "actor_id": A_ACTOR1},
            {"role": "driver", "rank": 0, "worker_id": W_DRIVER, "actor_id": None}]


class _Group:
    """What the timeline writer reads of a ProfiledGroup: role, workers, where (stand-in: no Ray here)."""

    def __init__(self, role, n, where):
        self.role, self.workers, self.where = role, [object()] * n, where


def _write_run(tmp_path, events=None):
    """A driver window captured by a real Profiler (torch, CPU), and its Ray timeline by the real writer."""
    from distprof.integrations.ray.timeline import TimelineKeeper

    save = str(tmp_path / "run")
    config = distprof.ProfilerConfig(enable=True, save_path=save, steps=[1, 2], torch={"activities": ["cpu"]})
    prof = distprof.Profiler(config, role="driver", rank=0, world_size=1)
    with prof:
        for _ in range(4):
            with distprof.annotate("driver/generate"):
                sum(range(1000))
            prof.step()
    groups = [_Group("rollout", 1, {0: {"worker_id": W_ROLLOUT, "actor_id": A_ROLLOUT}}),
              _Group("actor", 2, {0: {"actor_id": A_ACTOR0}, 1: {"worker_id": W_ACTOR1, "actor_id": A_ACTOR1}})]
    keeper = TimelineKeeper(save, groups, {"role": "driver", "worker_id": W_DRIVER, "pid": os.getpid()})
    t0 = time.time()
    keeper._write(1, 2, t0, t0 + 500e-6, _events(t0 * 1e6) if events is None else events)
    assert keeper.written == [f"driver/rank00000/{ray_timeline_name(1, 2)}"]
    return save, t0 * 1e6


def test_timeline_file_is_a_driver_window_that_check_accepts_and_the_reader_turns_into_busy_intervals(tmp_path):
    save, t0 = _write_run(tmp_path)
    res = check_run(save)
    assert res.ok, [(i.file, i.status, i.detail) for i in res.items]
    tl = [i for i in res.items if i.file and i.file.endswith(".ray_timeline.json.gz")]
    assert [(i.role, i.rank, i.steps, i.status, i.detail) for i in tl] == [("driver", 0, [1, 2], "ok",
                                                                           "Ray's task timeline")]
    # The window's trace is judged as before (not "captured more than once" because of the timeline's line).
    (trace,) = [i for i in res.items if i.file and i.file.endswith(".pt.trace.json.gz")]
    assert trace.status == "ok" and "more than once" not in trace.detail
    # Not a trace: the analysis verbs never read it as one.
    assert [f.path.rsplit("/", 1)[-1] for f in find_traces(save)] == ["step00000001-00000002.pt.trace.json.gz"]
    rows = busy_intervals(os.path.join(save, "driver", "rank00000", ray_timeline_name(1, 2)))
    assert rows == [
        {"role": "actor", "rank": 0, "name": "Actor.update", "start_us": t0 + 330, "dur_us": 40},
        {"role": "actor", "rank": 1, "name": "Actor.update", "start_us": t0, "dur_us": 20},  # cut to the window
        {"role": "actor", "rank": 1, "name": "Actor.update", "start_us": t0 + 320, "dur_us": 50},
        {"role": "rollout", "rank": 0, "name": "Rollout.generate", "start_us": t0 + 10, "dur_us": 300},
    ]
    assert busy_intervals(load(os.path.join(save, "driver", "rank00000", ray_timeline_name(1, 2))), clip=False)[1][
        "start_us"] == t0 - 30


def test_broken_or_foreign_timeline_is_a_problem_never_a_traceback(tmp_path):
    save, _ = _write_run(tmp_path)
    path = os.path.join(save, "driver", "rank00000", ray_timeline_name(1, 2))
    data = open(path, "rb").read()
    for bad, why in ((data[: len(data) // 2], "gzip"), (gzip.compress(b"[1, 2]"), "not a distprof Ray timeline"),
                     (gzip.compress(b"{\"kind\": \"ray_timeline\", \"traceEvents\": {}}"), "not a distprof"),
                     (b"\x00\xff", "does not decode")):
        with pytest.raises(TimelineError, match=why):
            parse(bad, "x")
    # Odd events inside a well-formed file are skipped, not fatal.
    doc = {"kind": "ray_timeline", "workers": _workers() + [7, {"role": 1}], "own_methods": [3],
           "traceEvents": [None, {"cat": "task::A.f", "tid": 5}, {"cat": "task::A.f", "tid": f"worker:{W_ACTOR1}",
                                                                  "ts": "x", "dur": 1}]}
    assert busy_intervals(doc) == []
    # check: a timeline cut in half (same size in the manifest: the file was overwritten) is broken, with a reason.
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2].ljust(len(data), b"\0"))
    res = check_run(save)
    (item,) = [i for i in res.items if i.file and i.file.endswith(".ray_timeline.json.gz")]
    assert not res.ok and item.status == "broken" and "gzip" in item.detail


def test_demo_slow_refuses_an_unknown_phase_in_one_line():
    from distprof.demo.rl_job import PHASES, _slow_plan, parse_slow

    assert parse_slow(["rollout/generate:300", "actor/prepare:0"]) == {"rollout/generate": 300.0, "actor/prepare": 0.0}
    assert _slow_plan(None, None) == {"actor/prepare": 150.0}  # the default stays actor rank 1's prepare
    assert _slow_plan(None, 300) == {"actor/prepare": 300.0}  # --slow-ms: the older name of it
    assert _slow_plan({"ref/log_probs": 200}, 0) == {"actor/prepare": 0.0, "ref/log_probs": 200.0}
    for bad in ("ref/logprob:200", "rollout/generate", "rollout/generate:-1", "rollout/generate:fast"):
        with pytest.raises(ValueError, match="ROLE/PHASE one of"):
            parse_slow([bad])
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", "demo", "--slow", "ref/logprob:200"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "ref/logprob:200" in line and all(p in line for p in PHASES)


def _within_steps(intervals, step_rows, role, rank, name):
    """Each ``name`` interval of (role, rank) lies inside one of that rank's step rows (one clock)."""
    spans = [(k["start_us"], k["start_us"] + k["dur_us"]) for r in step_rows if r["role"] == role
             for k in r["ranks"] if k["rank"] == rank]
    got = [i for i in intervals if (i["role"], i["rank"], i["name"]) == (role, rank, name)]
    assert got and spans
    return all(any(a <= i["start_us"] and i["start_us"] + i["dur_us"] <= b for a, b in spans) for i in got)


@pytest.mark.xdist_group("ray")
def test_demo_driver_role_and_ray_timeline_find_a_slow_rollout(slow_rollout_demo):
    from distprof.analysis.analyze import steps as analyze_steps

    result = slow_rollout_demo
    out = Path(result.run_dir)
    assert result.check.ok, [(i.file, i.status, i.detail) for i in result.check.items if i.status != "ok"]
    assert {r["role"] for r in result.check.roles} == {"driver", "rollout", "rollout/engine", "ref", "actor"}
    from conftest import trace_names

    names = set(trace_names(out / "driver" / "rank00000" / "step00000001-00000002.pt.trace.json.gz"))
    assert {"driver/generate", "driver/reference", "driver/update", "driver/sync_weights"} <= names
    # Ray's timeline of the window, written at the same planned steps, maps Ray's workers to (role, rank).
    tl = out / "driver" / "rank00000" / ray_timeline_name(1, 2)
    doc = load(str(tl))
    assert {(w["role"], w["rank"]) for w in doc["workers"]} == {("rollout", 0), ("ref", 0), ("actor", 0),
                                                               ("actor", 1), ("driver", 0)}
    rows = busy_intervals(doc)
    busy = {}
    for r in rows:
        busy.setdefault(r["role"], {}).setdefault(r["name"], 0.0)
        busy[r["role"]][r["name"]] += r["dur_us"]
    # Every role was busy somewhere in the window, and the slow phase's role is the busiest, through that phase.
    assert {"rollout", "ref", "actor"} <= set(busy)
    total = {role: sum(v.values()) for role, v in busy.items()}
    assert max(total, key=total.get) == "rollout" and max(busy["rollout"], key=busy["rollout"].get) == "Rollout.generate"
    # The same clock as the steps analysis' start_us: each traced call lies inside its worker's profiled steps.
    steps = analyze_steps(str(out), workers=1)["steps"]
    assert _within_steps(rows, steps, "actor", 1, "Actor.update")
    assert _within_steps(rows, steps, "rollout", 0, "Rollout.generate")


@pytest.mark.xdist_group("ray")
def test_demo_async_rollout_overlaps_generation_with_training_and_finds_the_default_straggler(tmp_path):
    from conftest import shared_ray

    from distprof.analysis.analyze import diagnose
    from distprof.demo import rl_job

    shared_ray()  # the suite's cluster: the demo runs on a session it finds connected
    out = tmp_path / "demo"
    result = rl_job.run(str(out), steps=4, async_rollout=True, slow_ms=300)
    assert result.check.ok, [(i.file, i.status, i.detail) for i in result.check.items if i.status != "ok"]
    rows = busy_intervals(str(out / "driver" / "rank00000" / ray_timeline_name(1, 2)))
    gen = [r for r in rows if r["name"] == "Rollout.generate"]
    upd = [r for r in rows if r["name"] == "Actor.update"]
    # One step off-policy: the next batch's generation runs while the actor trains on this one.
    assert any(g["start_us"] < u["start_us"] + u["dur_us"] and u["start_us"] < g["start_us"] + g["dur_us"]
               for g in gen for u in upd)
    # The RL step view says so: the actor's update overlaps another role's work (the next generation) in a
    # profiled step; in the synchronous demo it overlaps nothing (the roles take turns).
    from distprof.analysis.analyze import steps as analyze_steps

    rl = analyze_steps(str(out), workers=1)["rl_steps"]
    assert any(r["role"] == "actor" and r["overlapped_us"] > 0 for s in rl for r in s["roles"]), rl
    findings = diagnose(str(out), workers=1)["findings"]
    (f,) = [f for f in findings if f["id"] == "straggler"]
    assert f["evidence"]["role"] == "actor" and f["evidence"]["ranks"][0] == 1
    assert f["evidence"]["names"][0] == "actor/prepare"


_junk = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=16)
_event = st.fixed_dictionaries({}, optional={"cat": st.sampled_from(["task::Rollout.generate", "task", 3]) | _junk,
                                             "tid": st.sampled_from([f"w:{W_ROLLOUT}", "x"]) | _junk,
                                             "ts": st.floats() | _junk, "dur": st.floats() | _junk,
                                             "args": st.fixed_dictionaries({}, optional={"name": _junk,
                                                                                         "task_id": _junk}) | _junk})
_doc = st.fixed_dictionaries({"kind": st.just("ray_timeline"), "traceEvents": st.lists(_event | _junk, max_size=6)},
                             optional={"workers": st.lists(st.fixed_dictionaries(
                                           {"role": st.just("rollout") | _junk, "rank": st.just(0) | _junk},
                                           optional={"worker_id": st.just(W_ROLLOUT) | _junk}) | _junk, max_size=3) | _junk,
                                       "own_methods": _junk, "window": _junk})


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.one_of(_doc.map(lambda d: json.dumps(d).encode()), st.binary(max_size=64)))
def test_any_timeline_bytes_give_intervals_or_a_timeline_error(data):
    """A Ray timeline file is untrusted input: any bytes give well-formed intervals or one TimelineError."""
    try:
        rows = busy_intervals(data)
    except TimelineError as e:
        assert str(e)
        return
    for r in rows:
        assert isinstance(r["role"], str) and isinstance(r["rank"], int)
        assert math.isfinite(r["start_us"]) and math.isfinite(r["dur_us"]) and r["dur_us"] >= 0
