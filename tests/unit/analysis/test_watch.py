"""The watcher (distprof.analysis.watch) end to end on real files: telemetry written by real Profilers, capture
requests answered by a real trigger-enabled Profiler, the diagnosis of its windows in detections.jsonl; the lock,
the limits, `distprof watch` (--json, --once, exit 2, the recording run) and the Prometheus endpoint."""

import json
import math
import os
import subprocess
import sys
import time
import urllib.request

import msgspec
import pytest
from tracekit import cli

import distprof
from distprof.analysis.watch import Watcher, options_from_run, read_detections
from distprof.analysis.watch_metrics import MetricsServer, metrics_text
from distprof.capture.annotate import annotate
from distprof.capture.trigger import send as trigger_send
from distprof.config.watch import DetectOptions
from distprof.rundir.layout import DETECTIONS

SLOW_RANK, SLOW_FROM = 2, 40
# The slow rank's phase is 60 ms where the others' take 1-2 ms, and only phases over 25 ms may count as slow: a
# busy test machine stretches a 2 ms sleep to 10 or 20 ms, for several steps in a row (the ranks run one after
# another in this process, so a burst of load lands on one rank's steps, which is what a slow rank looks like).
SLOW_S = 0.06
ROBUST = {"min_phase_ms": 25}


def work(seconds):
    """A phase's work: the step time a test wants (a workload, not a wait for anything)."""
    time.sleep(seconds)


def run_rank(save, rank, steps, start=0, slow=False, extra=None, data=None):
    """One rank of a 4-rank job, in this process: a real Profiler keeping telemetry (ranks run one after another:
    the outermost annotate ranges go to the process's first live telemetry)."""
    cfg = {"telemetry": True, "save_path": str(save), **(extra or {})}
    p = distprof.Profiler(cfg, role="actor", rank=rank, world_size=4, global_step=start)
    p.start()
    for s in range(start, start + steps):
        with annotate("forward"):
            if data is not None:
                next(data)
            else:
                work(SLOW_S if slow and s >= SLOW_FROM else 0.002)
        with annotate("backward"):
            work(0.002)
        p.step()
    p.stop()


def write_stream(save, role, rank, steps):
    """A telemetry stream written directly: ``steps`` is [(step, dur_us, phases)]."""
    folder = save / role / f"rank{rank:05d}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [{"telemetry": 1, "role": role, "rank": rank, "world_size": 4, "pid": 1, "host": "h", "start": 1.0}]
    lines += [{"step": s, "t": 1000.0 + s, "dur_us": d, "phases": ph} for s, d, ph in steps]
    with open(folder / "telemetry.jsonl", "a") as f:
        f.write("".join(json.dumps(x) + "\n" for x in lines))


def synthetic(save, slow_ranks=(SLOW_RANK,), n=60, role="actor"):
    for rank in range(4):
        steps = []
        for s in range(n):
            fwd = 40_000 if rank in slow_ranks and s >= SLOW_FROM else 10_000 + 37 * ((s * 7 + rank) % 11)
            steps.append((s, 60_000, {"forward": fwd, "backward": 20_000}))
        write_stream(save, role, rank, steps)


class FakeSend:
    def __init__(self):
        self.calls = []

    def __call__(self, role, ranks, steps, lead_steps):
        self.calls.append((role, ranks, steps, lead_steps))
        return f"req{len(self.calls)}"


def test_real_profilers_telemetry_a_slow_rank_is_detected_and_a_capture_requested(tmp_path):
    for rank in range(4):
        run_rank(tmp_path, rank, 60, slow=rank == SLOW_RANK)
    send = FakeSend()
    w = Watcher(str(tmp_path), DetectOptions(**ROBUST), send=send, capture_timeout_s=0)
    assert w.lock()
    snap = w.poll()
    assert len(send.calls) == 1
    role, ranks, steps, lead = send.calls[0]
    assert role == "actor" and ranks[0] == SLOW_RANK and len(ranks) == 2 and ranks[1] != SLOW_RANK
    assert (steps, lead) == (DetectOptions().capture_steps, DetectOptions().lead_steps)
    (view,) = snap.roles
    assert view.slowest_rank == SLOW_RANK and [r.rank for r in view.ranks] == [0, 1, 2, 3]
    assert next(r for r in view.ranks if r.rank == SLOW_RANK).slow
    lines = read_detections(str(tmp_path))  # no window came (timeout 0): recorded without a finding
    assert [(d["rule"], d["rank"], d["phase"]) for d in lines] == [("slow_rank", SLOW_RANK, "forward")]
    d = lines[0]
    assert SLOW_FROM <= d["step"] < SLOW_FROM + DetectOptions().slow_steps
    assert d["finding"] is None and d["captured"] == [] and d["request"] == "req1" and "within" in d["reason"]
    w.poll()  # nothing new: nothing again
    assert len(read_detections(str(tmp_path))) == 1 and len(send.calls) == 1
    w.close()
    again = Watcher(str(tmp_path), DetectOptions(**ROBUST), send=send)  # a restarted watcher reports nothing twice
    again.poll(final=True)
    assert len(read_detections(str(tmp_path))) == 1 and len(send.calls) == 1


def test_real_trigger_request_is_captured_by_a_profiler_and_diagnosed(tmp_path):
    torch = pytest.importorskip("torch")

    class Batches(torch.utils.data.Dataset):
        def __init__(self, seconds):
            self.seconds = seconds

        def __len__(self):
            return 10**6

        def __getitem__(self, i):
            work(self.seconds)  # loading is what makes this rank slow
            return torch.ones(4)

    def batches(rank):
        return iter(torch.utils.data.DataLoader(Batches(SLOW_S if rank == SLOW_RANK else 0.001), batch_size=1))

    extra = {"trigger": True, "ranks": "all", "trigger_poll_s": 0, "detection": ROBUST}
    for rank in range(4):
        run_rank(tmp_path, rank, 30, extra=extra, data=batches(rank))

    def send(role, ranks, steps, lead_steps):
        req, new = trigger_send(str(tmp_path), steps=steps, ranks=ranks, roles=[role], lead_steps=lead_steps,
                                align=1)
        assert new
        return req.id

    options, cfg = options_from_run(str(tmp_path))
    assert cfg["trigger"] is True
    w = Watcher(str(tmp_path), options, send=send)
    assert w.lock()
    w.poll()
    assert len(w.pending) == 1 and w.pending[0].ranks[0] == SLOW_RANK
    rid, wanted = w.pending[0].request, w.pending[0].ranks
    assert read_detections(str(tmp_path)) == []  # written once the windows are diagnosed
    for rank in wanted:  # the ranks go on and pick the request up at a step boundary
        run_rank(tmp_path, rank, 10, start=30, extra=extra, data=batches(rank))
    w.poll()
    assert w.pending == []
    (d,) = read_detections(str(tmp_path))
    assert d["rule"] == "slow_rank" and d["rank"] == SLOW_RANK and d["phase"] == "forward"
    assert d["request"] == rid and d["captured"] == sorted(wanted) and d["bytes"] > 0
    assert all(os.path.isfile(tmp_path / f) for f in d["files"]) and len(d["files"]) == 2
    f = d["finding"]
    assert f is not None and {"id", "claim", "cost_us", "evidence", "fix"} <= set(f)
    assert f["evidence"]["ranks"][0] == SLOW_RANK  # the diagnosis names the slow rank first
    w.close()


def test_limits_and_capture_off_are_recorded_with_a_reason(tmp_path):
    synthetic(tmp_path, slow_ranks=(1, 3))  # two slow ranks in the same step: one capture for both
    send = FakeSend()
    w = Watcher(str(tmp_path), DetectOptions(max_captures_per_hour=1), send=send, capture_timeout_s=0)
    w.poll()
    assert send.calls[0][1][:2] == [1, 3] and len(send.calls[0][1]) == 3  # both, and one healthy peer
    lines = read_detections(str(tmp_path))
    assert sorted(d["rank"] for d in lines) == [1, 3] and {d["request"] for d in lines} == {"req1"}
    assert w.captures_total == 1
    # a later episode, on another rank: over the hour's limit
    write_stream(tmp_path, "actor", 0, [(s, 60_000, {"forward": 50_000, "backward": 20_000}) for s in range(60, 70)])
    for rank in (1, 2, 3):
        write_stream(tmp_path, "actor", rank, [(s, 60_000, {"forward": 10_000, "backward": 20_000})
                                               for s in range(60, 70)])
    w.poll()
    late = [d for d in read_detections(str(tmp_path)) if d["rank"] == 0]
    assert len(late) == 1 and late[0]["finding"] is None and "max_captures_per_hour" in late[0]["reason"]
    assert len(send.calls) == 1

    off = tmp_path / "off"
    synthetic(off)
    w2 = Watcher(str(off), DetectOptions(capture=False), send=send)
    w2.poll()
    (d,) = read_detections(str(off))
    assert d["captured"] == [] and "capture is off" in d["reason"] and len(send.calls) == 1


def test_one_recording_watcher_per_run_directory(tmp_path):
    synthetic(tmp_path)
    first = Watcher(str(tmp_path), DetectOptions(capture=False))
    second = Watcher(str(tmp_path), DetectOptions(capture=False))
    assert first.lock()
    assert not second.lock()
    assert second.lock_holder() == f"pid {os.getpid()}"
    code, _, err = cli("watch", tmp_path, "--quiet", "--max-seconds", "0")
    assert code == 0 and "already records" in err
    assert not (tmp_path / DETECTIONS).exists()
    first.close()
    assert second.lock()
    second.close()


def test_cli_json_once_and_no_telemetry(tmp_path):
    synthetic(tmp_path)
    code, doc, _ = cli("watch", tmp_path, "--json")
    assert code == 0 and doc["errors"] == []
    (role,) = doc["roles"]
    assert role["role"] == "actor" and role["slowest_rank"] == SLOW_RANK and len(role["ranks"]) == 4
    assert [(d["rule"], d["rank"], d["recorded"]) for d in doc["detections"]] == [("slow_rank", SLOW_RANK, False)]
    assert doc["detections_total"]["slow_rank"] == 1 and doc["recording"] is False
    assert doc["options"]["slow_factor"] == DetectOptions().slow_factor
    assert not (tmp_path / DETECTIONS).exists()  # a snapshot records nothing

    code, out, _ = cli("watch", tmp_path, "--once")
    assert code == 0 and "actor" in out and "slow_rank" in out and "SLOW" in out
    assert max(len(line) for line in out.splitlines()) <= 200

    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = cli("watch", empty, "--once")
    assert code == 2 and "telemetry: true" in err and str(empty) in err
    code, doc, _ = cli("watch", empty, "--json")
    assert code == 2 and "telemetry: true" in doc["errors"][0]["message"]
    code, _, err = cli("watch", tmp_path / "missing", "--quiet")
    assert code == 2 and "not a folder" in err


def test_cli_records_in_one_poll_and_stops_with_its_parent(tmp_path):
    synthetic(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"config": {"telemetry": True, "trigger": False,
                                                              "detection": {"slow_steps": 3}}}))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid now names no process
    code, _, err = cli("watch", tmp_path, "--quiet", "--parent-pid", gone.pid)
    assert code == 0, err
    (d,) = read_detections(str(tmp_path))
    assert d["rank"] == SLOW_RANK and d["step"] == SLOW_FROM + 2  # slow_steps from run.json's detection
    assert "capture is off" in d["reason"]  # the run has no trigger: true
    assert "slow_rank" in err  # the one log line

    (tmp_path / "run.json").write_text(json.dumps({"config": {"detection": {"slow_factor": 0.5}}}))
    code, _, err = cli("watch", tmp_path, "--once")
    assert code == 2 and "slow_factor" in err


def test_prometheus_endpoint_answers_a_real_get(tmp_path):
    synthetic(tmp_path)
    w = Watcher(str(tmp_path), DetectOptions(capture=False))
    snap = w.poll()
    server = MetricsServer(0, lambda: metrics_text(snap)).start()
    try:
        assert server.port > 0
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/other", timeout=10)
    finally:
        server.stop()
    assert 'distprof_step_seconds{role="actor",rank="2"} 0.060000' in text
    assert f'distprof_slowest_rank{{role="actor"}} {SLOW_RANK}' in text
    assert 'distprof_detections_total{rule="slow_rank"} 1' in text
    assert "distprof_captures_total 0" in text
    assert server._server.server_address[0] == "127.0.0.1"


def test_snapshot_is_plain_json(tmp_path):
    synthetic(tmp_path)
    snap = Watcher(str(tmp_path), DetectOptions(), record=False).poll(final=True)
    doc = json.loads(msgspec.json.encode(snap.to_dict()))
    assert doc["roles"][0]["steps"][-1] == 59 and doc["pending"] == []


def test_cli_capture_sends_a_trigger_request_for_the_slow_rank_and_a_peer(tmp_path):
    synthetic(tmp_path)
    (tmp_path / "run.json").write_text(json.dumps({"config": {"telemetry": True, "trigger": True,
                                                              "trigger_poll_s": 0.5, "save_path": str(tmp_path)}}))
    code, _, err = cli("watch", tmp_path, "--quiet", "--capture", "--max-seconds", "0")
    assert code == 0, err
    from distprof.capture.trigger import status

    (req,) = status(str(tmp_path))["requests"]
    r = req["request"]
    assert r["roles"] == ["actor"] and SLOW_RANK in r["ranks"]  # a request's ranks are sorted
    assert len(r["ranks"]) == 2 and r["steps"] == DetectOptions().capture_steps
    # 60 ms steps and a job polling every 0.5 s: the lead covers two polls, more than lead_steps' 3
    assert r["lead_steps"] == math.ceil(2 * 0.5 / 0.060) + 1
    assert f"request {req['id']}" in err
    assert read_detections(str(tmp_path)) == []  # waiting for the windows when the watcher stopped


def test_the_steps_of_the_watchers_own_capture_are_not_judged(tmp_path):
    synthetic(tmp_path)
    send = FakeSend()
    w = Watcher(str(tmp_path), DetectOptions(), send=send, capture_timeout_s=3600)
    w.poll()
    assert len(send.calls) == 1 and w.pending
    # While its windows are being captured and written, rank 0 turns slow (what profiling does to a rank): no
    # detection, no second capture.
    write_stream(tmp_path, "actor", 0, [(s, 60_000, {"forward": 50_000, "backward": 20_000}) for s in range(60, 70)])
    for rank in (1, 2, 3):
        fwd = 40_000 if rank == SLOW_RANK else 10_000
        write_stream(tmp_path, "actor", rank, [(s, 60_000, {"forward": fwd, "backward": 20_000})
                                               for s in range(60, 70)])
    w.poll()
    assert len(send.calls) == 1 and [d["rank"] for d in read_detections(str(tmp_path))] == []


def test_in_job_watcher_waits_for_the_jobs_folder_and_takes_the_jobs_settings(tmp_path):
    """Started by the job (--parent-pid) before its first steps are flushed: the folder is not there yet, and a job
    that only detects (no enable, no trigger) writes no run.json; the watcher waits while its parent lives and
    judges with the settings the job passed (--job-config), not the defaults."""
    run = tmp_path / "run"
    parent = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    job = json.dumps({"telemetry": True, "trigger": False, "detection": {"slow_steps": 3}})
    watcher = subprocess.Popen([sys.executable, "-m", "distprof.cli", "watch", str(run), "--quiet", "--parent-pid",
                                str(parent.pid), "--job-config", job, "--interval", "0.05"],
                               stderr=subprocess.PIPE, text=True)
    try:
        synthetic(run)  # the job's first flush, whenever the watcher looks
    finally:
        parent.communicate("")  # the job ends: the watcher takes its look and stops
    _, err = watcher.communicate(timeout=120)
    assert watcher.returncode == 0, err
    (d,) = read_detections(str(run))
    assert d["rank"] == SLOW_RANK and d["step"] == SLOW_FROM + 2  # slow_steps 3 from the job's settings


def test_a_job_config_that_is_not_valid_is_one_line_and_exit_2(tmp_path):
    synthetic(tmp_path)
    for bad, what in (("{", "not JSON"), ("[1]", "JSON object"), ('{"detection": {"slow_factor": 0}}', "slow_factor")):
        code, _, err = cli("watch", tmp_path, "--once", "--job-config", bad)
        assert code == 2 and what in err and "Traceback" not in err


def test_stop_asks_the_in_job_watcher_for_one_last_look(tmp_path):
    """The profiler's stop() sends SIGTERM: the watcher reads what the ranks flushed on their way out and records
    it before it ends (the job does not wait for it)."""
    cfg = {"telemetry": True, "detect": True, "save_path": str(tmp_path),
           "detection": {"slow_steps": 3, "poll_s": 3600}}  # one look at start, then only the last one
    p = distprof.Profiler(cfg, role="main", rank=0, world_size=1)
    p.start()
    proc = p._watcher
    assert proc is not None
    synthetic(tmp_path)  # the other role's ranks, flushed before the job ends
    p.step()
    p.stop()
    assert proc.wait(timeout=120) == 0
    (d,) = read_detections(str(tmp_path))
    assert d["role"] == "actor" and d["rank"] == SLOW_RANK and d["step"] == SLOW_FROM + 2


def test_a_prometheus_port_in_use_is_one_warning_and_the_watcher_watches(tmp_path):
    import socket

    synthetic(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = cli("watch", tmp_path, "--quiet", "--no-capture", "--max-seconds", "0", "--prometheus", port)
    assert code == 0, err
    assert f"127.0.0.1:{port}" in err and "without them" in err
    assert [d["rank"] for d in read_detections(str(tmp_path))] == [SLOW_RANK]


def test_a_metrics_client_that_sends_nothing_is_dropped(tmp_path):
    import socket

    server = MetricsServer(0, lambda: "")
    assert server._server.RequestHandlerClass.timeout  # http.server's default: None, wait forever
    server._server.RequestHandlerClass.timeout = 0.2  # what 10 s are in the job
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as c:
            assert c.recv(1) == b""  # the server closed it (a socket timeout here: it never would)
    finally:
        server.stop()


def test_a_lock_file_that_is_a_link_or_a_fifo_is_one_line_and_exit_2(tmp_path):
    for kind in ("link", "fifo"):
        run = tmp_path / kind
        synthetic(run)
        lock = run / ".watcher.lock"
        if kind == "link":
            lock.symlink_to(tmp_path / "elsewhere")
        else:
            os.mkfifo(lock)
        code, _, err = cli("watch", run, "--quiet", "--max-seconds", "0")
        assert code == 2 and str(lock) in err and "regular file" in err and "internal" not in err
        assert not (tmp_path / "elsewhere").exists()
