"""Detect, then capture, then diagnose, on real processes (issue 22 items 2-4, 6): 4-rank gloo jobs with step
telemetry on every rank and the in-job watcher (``detect: true``: a ``distprof watch`` process started by rank 0);
telemetry through a kill -9; a watcher that dies under a job that goes on."""

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once
from detect_job import config as detect_job_config
from detect_job import run as detect_run

from distprof.analysis.telemetry import read_run
from distprof.rundir.layout import DETECTIONS
from distprof.rundir.store import manifest_records

pytestmark = pytest.mark.slow


def watcher_ended(out, timeout=120):
    """Wait until no watcher holds the run directory's lock (it took one last look and ended): a blocking
    flock, in a thread so that a watcher that never ends fails the test instead of hanging it."""
    path = os.path.join(out, ".watcher.lock")
    if not os.path.exists(path):
        return True
    fd = os.open(path, os.O_RDONLY)
    got = threading.Event()

    def take():
        fcntl.flock(fd, fcntl.LOCK_EX)
        got.set()

    threading.Thread(target=take, daemon=True).start()
    ok = got.wait(timeout)
    if ok:
        os.close(fd)
    return ok


def detections(out):
    try:
        with open(os.path.join(out, DETECTIONS)) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def test_a_rank_turning_slow_mid_run_is_detected_captured_with_a_peer_and_diagnosed(tmp_path):
    out = str(tmp_path / "run")
    detect_run(out, steps=40, slow_rank=2, slow_from=30, slow_s=0.04, until_finding=True)
    assert watcher_ended(out)
    lines = detections(out)
    (line,) = [d for d in lines if d["rule"] == "slow_rank"]
    assert line["role"] == "train" and line["rank"] == 2
    # Within the rule's steps: slow_steps (5) slow steps, plus what one look of the watcher can lag (poll_s). Not
    # before the rank turned slow; one step earlier than step 34 is a busy machine stretching step 29's 10 ms sleep.
    assert 30 <= line["step"] <= 30 + 5 + 30
    captured = line["captured"]
    assert 2 in captured and len(set(captured)) == 2  # the slow rank and one healthy peer
    windows = [r for r in manifest_records(out) if r.trigger]
    assert sorted({r.rank for r in windows}) == sorted(captured)
    assert all(r.steps[0] > line["step"] for r in windows)  # captured after the detection, at aligned steps
    assert len({tuple(r.steps) for r in windows}) == 1
    finding = line["finding"]
    assert finding["id"] == "straggler" and finding["evidence"]["ranks"][0] == 2
    assert "train/data" in finding["evidence"]["names"]
    # Every rank's telemetry covers the whole run.
    tel = read_run(out)
    assert sorted(tel.series) == [("train", r) for r in range(4)]
    assert all(s.steps[0].step == 0 and len(s.steps) == s.steps[-1].step + 1 for s in tel.series.values())


def test_a_healthy_job_of_200_steps_has_no_detection_and_no_capture(tmp_path):
    out = str(tmp_path / "run")
    detect_run(out, steps=200)
    assert watcher_ended(out)
    assert detections(out) == []
    assert manifest_records(out) == []
    tel = read_run(out)
    assert [len(tel.series[("train", r)].steps) for r in range(4)] == [200] * 4


KILLED = r"""
import os, sys
import distprof
out = sys.argv[1]
p = distprof.Profiler(distprof.ProfilerConfig(save_path=out, telemetry=True, telemetry_options={"flush_s": 300}),
                      rank=1, world_size=4).start()
step = 0
while True:
    with distprof.annotate("train/forward"):
        pass
    p.step()
    step += 1
    if step == 20:
        p._telemetry.flush()  # what the writer thread does every flush_s
        print("flushed", flush=True)
"""


def test_telemetry_written_before_a_kill_9_stays_readable(tmp_path):
    out = str(tmp_path / "run")
    proc = warmpython.Popen([sys.executable, "-c", KILLED, out], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "flushed"
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    tel = read_run(out)
    s = tel.series[("main", 1)]
    assert [r.step for r in s.steps][:20] == list(range(20)) and not tel.errors
    assert all("train/forward" in r.phases for r in s.steps)


WATCHER_KILLED = r"""
import os, signal, sys
import distprof
out = sys.argv[1]
cfg = distprof.ProfilerConfig(save_path=out, telemetry=True, detect=True, telemetry_options={"flush_s": 0.05})
p = distprof.Profiler(cfg, rank=0, world_size=1).start()
watcher = p._watcher
for step in range(300):
    with distprof.annotate("train/forward"):
        pass
    if step == 10:
        os.kill(watcher.pid, signal.SIGKILL)
        watcher.wait()
    p.step()
p.stop()
print(watcher.returncode, p.global_step, flush=True)
"""


def test_the_watcher_dying_does_not_touch_training(tmp_path):
    out = str(tmp_path / "run")
    proc = warmpython.run([sys.executable, "-c", WATCHER_KILLED, out], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(-signal.SIGKILL), "300"]
    steps = read_run(out).series[("main", 0)].steps
    assert [r.step for r in steps] == list(range(300))


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time on a 2-core machine
def test_a_ray_worker_group_goes_through_the_same_path(tmp_path):
    """A Ray worker group (the suite's local cluster; one machine, so save_path is shared by every worker): the
    same config, every worker keeps telemetry, rank 0's worker starts the watcher, which captures the slow worker
    and a peer through on-demand requests the workers poll for."""
    from conftest import shared_ray

    ray = shared_ray()
    from ray_workers import PhasedWorker

    from distprof.integrations.ray import ProfiledGroup, step_all

    out = str(tmp_path / "run")
    cfg = {**detect_job_config(out), "trigger_poll_s": 0.2}
    workers = [ray.remote(num_cpus=0.25)(PhasedWorker).remote() for _ in range(3)]
    try:
        group = ProfiledGroup(workers, cfg, "rollout")
        assert sorted(group.active) == [0, 1, 2]  # telemetry: every rank, not only the ones ranks selects
        with group:
            step = 0
            while step < 600 and not any(d["captured"] for d in detections(out)):
                ray.get([w.compute.remote(r, step, 1, 20, 0.05) for r, w in enumerate(workers)])
                step_all([group])
                step += 1
    finally:
        for w in workers:
            ray.kill(w)
    assert watcher_ended(out)
    (line,) = [d for d in detections(out) if d["rule"] == "slow_rank"]
    assert (line["role"], line["rank"], line["phase"]) == ("rollout", 1, "train/compute")
    assert 1 in line["captured"] and len(set(line["captured"])) == 2
    windows = [r for r in manifest_records(out) if r.trigger == line["request"]]
    assert sorted(r.rank for r in windows) == sorted(line["captured"])
    tel = read_run(out)
    assert sorted(tel.series) == [("rollout", r) for r in range(3)]
