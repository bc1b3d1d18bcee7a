"""How the features merged into capture/profiler.py meet: requested (triggered) windows with the memory guard, step timing,
held exports, stop(), faults while idle and fsspec uploads; and hostile `.requests/` folders. Real Profiler on CPU
with real torch.profiler; the CLI as a subprocess."""

import os
from functools import partial

import fsspec
import torch
from conftest import config
from tracekit import cli, load

import distprof
from distprof import Profiler
from distprof.analysis.check import check_run
from distprof.capture.profiler import IDLE, INERT
from distprof.capture.trigger import RequestStore, make_request
from distprof.rundir.manifest import read_manifest
from distprof.rundir.store import manifest_records

cfg = partial(config, run=None, typed=False, enable=None, trigger=True, trigger_poll_s=0, ranks="all")


def work(ops=20):
    for _ in range(ops):
        torch.randn(8, 8) @ torch.randn(8, 8)


def run_to(prof, step, ops=20, **kw):
    while prof.global_step < step:
        work(ops)
        prof.step(**kw)
        if not kw.get("export", True):
            prof.export()


def acks(save):
    store = RequestStore(str(save))
    return [a for rid in store.ids() for a in store.acks(rid)]


def profiler_steps(path):
    return sorted(int(e["name"].split("#")[1]) for e in load(path)["traceEvents"]
                  if e.get("name", "").startswith("ProfilerStep#"))


def test_requested_window_closed_by_the_memory_guard_says_both_and_is_timed(tmp_path):
    # max_trace_mb of 4 MB: crossed after a few recorded steps of about 3 MB each (sampled every 10 ms), under 4x
    # the budget (a window estimated over 4x is not exported: test_guard.py), so it is exported, cut short.
    p = Profiler(cfg(tmp_path, max_trace_mb=4), rank=0, world_size=1).start()
    run_to(p, 2)
    req = make_request(20, start_step=6, flags="record_shapes,profile_memory")
    assert p.trigger_request(req)["state"] == "accepted"
    run_to(p, 30, ops=400)  # steps of a few ms: the guard samples at most every 10 ms
    p.stop()
    (rec,) = manifest_records(str(tmp_path))
    assert rec.trigger == req.id and rec.stopped_by == "memory_guard" and not rec.complete
    assert rec.guard["limit"] == "max_trace_mb" and rec.steps[0] == 6 and rec.steps[1] < 25
    # profiling's own cost is recorded for a requested window too: its steps, and 3-4 before its warm-up (0-2 settle)
    assert len(rec.step_times_s) == rec.steps[1] - 5 and rec.baseline_step_numbers == [3, 4]
    (ack,) = acks(tmp_path)
    assert ack.state == "captured" and "cut short (memory_guard)" in ack.detail and ack.steps == rec.steps
    steps = profiler_steps(tmp_path / rec.file)  # torch opens the next ProfilerStep at the cut; test_guard.py too
    assert ack.file == rec.file and steps[0] == 6 and set(range(6, rec.steps[1] + 1)) <= set(steps)


def test_guard_trip_in_the_warm_up_of_a_requested_window_is_said_not_refused(tmp_path):
    p = Profiler(cfg(tmp_path, max_host_memory_gb=0.001), rank=0, world_size=1).start()  # crossed at once
    run_to(p, 2)
    req = make_request(3, start_step=5)
    p.trigger_request(req)
    run_to(p, 10)
    p.stop()
    (ack,) = acks(tmp_path)
    # was: refused "the backend wrote no file" with steps [5, 4], and no manifest line at all
    assert ack.state == "skipped" and "memory_guard" in ack.detail and ack.steps is None
    (rec,) = manifest_records(str(tmp_path))
    assert rec.trigger == req.id and rec.stopped_by == "memory_guard" and not rec.files
    assert rec.guard["limit"] == "max_host_memory_gb"
    res = check_run(str(tmp_path))
    assert any(req.id in n and "memory_guard" in n for n in res.notes), res.notes
    # and the guard refuses the next request on this rank
    p2 = Profiler(cfg(tmp_path / "b", max_host_memory_gb=0.001), rank=0, world_size=1).start()
    p2.trigger_request(make_request(2, start_step=3))
    run_to(p2, 8)
    assert p2.trigger_request(make_request(2, start_step=20))["state"] == "refused"
    p2.stop()


def test_stop_in_the_warm_up_of_a_requested_window_skips_it(tmp_path):
    p = Profiler(cfg(tmp_path), rank=0, world_size=1).start()
    run_to(p, 2)
    req = make_request(3, start_step=5)
    p.trigger_request(req)
    run_to(p, 4)
    assert p.capturing  # step 4 is the warm-up step
    p.stop()
    (ack,) = acks(tmp_path)
    assert ack.state == "skipped" and "cut short (stop)" in ack.detail
    (rec,) = manifest_records(str(tmp_path))
    assert rec.trigger == req.id and rec.stopped_by == "stop" and not rec.files


def test_held_export_of_a_requested_window(tmp_path):
    p = Profiler(cfg(tmp_path), rank=0, world_size=1).start()
    run_to(p, 2, export=False)
    req = make_request(2, start_step=4)
    p.trigger_request(req)
    run_to(p, 9, export=False)
    p.stop()
    (rec,) = manifest_records(str(tmp_path))
    assert rec.trigger == req.id and rec.complete and rec.steps == [4, 5]
    assert profiler_steps(tmp_path / rec.file) == [4, 5]
    (ack,) = acks(tmp_path)
    assert ack.state == "captured" and ack.file == rec.file


def test_a_fault_while_idle_leaves_the_profiler_inert_whatever_the_poll_timer_does(tmp_path):
    p = Profiler(cfg(tmp_path, trigger_poll_s=3600), rank=0, world_size=1).start()
    run_to(p, 3)
    assert p._fast == IDLE  # idle: the fast step is in place
    timer = p._poll_timer
    # A request that is not a TriggerRequest (a dict from a caller's code): a fault inside the profiler. (A folder
    # it cannot store the request in is no fault: that request is skipped, test_trigger_hostile.py.)
    assert p.trigger_request({"steps": 2}) is None
    assert not p.enabled
    timer.fire()  # the timer thread waking after the fault must not put the full step back
    assert p._fast == INERT
    run_to(p, 8)
    p.stop()
    assert p.global_step == 8 and not p.capturing and manifest_records(str(tmp_path)) == []


def test_requested_window_on_an_fsspec_url_is_acknowledged_once_uploaded():
    url = "memory://interplay/run"
    p = Profiler(cfg(url), rank=0, world_size=1).start()
    run_to(p, 2)
    req = make_request(2, start_step=4)
    p.trigger_request(req)
    run_to(p, 8)
    p.stop()  # waits for the upload thread
    fs = fsspec.filesystem("memory")
    (rec,) = read_manifest(fs.cat_file("/interplay/run/main/rank00000/manifest.jsonl")).records
    assert rec.trigger == req.id and rec.complete and rec.local_path is None
    (ack,) = acks(url)
    assert ack.state == "captured" and ack.file == rec.file
    assert fs.exists(f"/interplay/run/{ack.file}")


def test_hostile_requests_folder_neither_hangs_the_job_nor_the_status(tmp_path):
    p = Profiler(cfg(tmp_path), rank=0, world_size=1).start()
    rid = distprof.trigger(str(tmp_path), steps=1, start_step=4)
    req_dir = tmp_path / ".requests"
    os.mkfifo(req_dir / "0123456789abcdef.json")  # a FIFO named like a request: reading it blocked forever
    os.mkdir(req_dir / "fedcba9876543210.json")  # a folder named like one: IsADirectoryError, exit 3
    os.mkfifo(req_dir / f"{rid}.start")
    (req_dir / f"{rid}.acks").mkdir()
    os.symlink("/etc/passwd", req_dir / f"{rid}.acks" / "x-00000.json")  # never read through
    run_to(p, 6)  # the training loop polls that folder at every step (trigger_poll_s: 0)
    p.stop()
    code, st, err = cli("trigger", tmp_path, "--status", "--json")
    assert code == 0, err
    assert "Traceback" not in err and "root:" not in err
    (req,) = st["requests"]
    assert [a["state"] for a in req["acks"]] == ["captured"]
    (tmp_path / "run.json").unlink()
    os.mkfifo(tmp_path / "run.json")
    code, _, err = cli("trigger", tmp_path, "--status")
    assert code == 2 and "not a distprof run directory" in err and "Traceback" not in err


def test_a_request_accepted_during_a_planned_window_is_still_timed(tmp_path):
    p = Profiler(cfg(tmp_path, steps=[3]), rank=0, world_size=1).start()
    run_to(p, 1)
    req = make_request(2, start_step=8)
    assert p.trigger_request(req)["state"] == "accepted"
    run_to(p, 12)  # the planned window 3 closes first; closing it re-plans the timing
    p.stop()
    planned, requested = sorted(manifest_records(str(tmp_path)), key=lambda r: r.steps)
    assert planned.trigger is None and requested.trigger == req.id and requested.steps == [8, 9]
    assert len(requested.step_times_s) == 2 and requested.baseline_step_numbers == [5, 6]  # 4 follows the export


def test_a_linked_requests_folder_is_never_written_through(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    p = Profiler(cfg(run), rank=0, world_size=1).start()
    run_to(p, 2)
    os.symlink(outside, run / ".requests")
    code, _, err = cli("trigger", run, "--steps", "2")
    assert code == 2 and "symbolic link" in err and "Traceback" not in err
    p.trigger_request(make_request(2))  # in-process (the Ray path): refused by a fault, not written outside
    run_to(p, 6)
    p.stop()
    assert list(outside.iterdir()) == []
