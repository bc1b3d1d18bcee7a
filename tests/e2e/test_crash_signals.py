"""Signals while a window is being written, and forked children: a real child process (tests/jobs/crash_job.py).

With HOLD_EXPORT=1 the job stops inside every export once torch has written the window's temporary trace, prints
"exporting" and waits on stdin: the test sends real signals at exactly that moment (no sleep), then lets the export
go on. distprof must hold the signal until the window and its manifest line are written, then end the process as
the signal asks, leave no temporary behind, and say so in one warning (capture/shutdown.py).
"""

import gzip
import json
import os
import signal
import subprocess
import sys

import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once
from conftest import JOBS

JOB = os.path.join(JOBS, "crash_job.py")


def start(tmp_path, how, style="startstop", inline=True, session=False, **env):
    """The job, holding each export once torch has written the trace. ``inline``: windows are written inside the
    closing step (``torch.background_export: false``), so a signal lands in the profiler's own export; else the
    export runs in the background while the training thread goes on."""
    out = tmp_path / "run"
    proc = warmpython.Popen([sys.executable, JOB, how, str(out), style], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HOLD_EXPORT": "1", **({"INLINE_EXPORT": "1"} if inline else {}), **env},
                            start_new_session=session)
    return proc, out


def say(proc, line):
    try:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    except BrokenPipeError:  # the process died already (old code): the assertions below say how
        pass


def signal_during_export(proc, signum, times=1):
    """Wait until the job is inside its export, send ``signum`` ``times`` times (each handled before the next is
    sent), then let the export finish. Returns (exit status, stderr)."""
    try:
        assert proc.stdout.readline().strip() == "exporting"
        for i in range(times):
            proc.send_signal(signum)
            if i + 1 < times:
                say(proc, "more")
                proc.stdout.readline()  # "again" (or nothing, if the process already died)
        say(proc, "go")
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, err


def manifest(out, rank=0):
    path = out / "main" / f"rank{rank:05d}" / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def step_numbers(out, record):
    with gzip.open(out / record["file"], "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#")})


def temporaries(out):
    return [os.path.join(d, n) for d, _, names in os.walk(out) for n in names if n.startswith(".tmp")]


@pytest.mark.slow
def test_sigterm_during_the_export_of_stop_waits_for_the_window(tmp_path):
    """stop() cuts window 3-5 short after step 4; SIGTERM lands while it exports (the old code had put SIGTERM's
    default action back first: the process died, the window was lost and torch's temporary left behind)."""
    proc, out = start(tmp_path, "short")
    rc, err = signal_during_export(proc, signal.SIGTERM)
    assert rc == -signal.SIGTERM, err[-2000:]  # ends as SIGTERM's default action would have ended it
    [rec] = manifest(out)
    assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == "SIGTERM"
    assert step_numbers(out, rec)[:2] == [3, 4]  # (plus the range up to stop(): README, "one more ProfilerStep")
    assert temporaries(out) == []
    assert ("SIGTERM came during its stop; it waited until its window was written, and the process now stops "
            "for SIGTERM") in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_sigterm_during_the_export_at_exit_waits_for_the_window(tmp_path):
    """sys.exit(3) at step 4: the window is written by the atexit handler, and SIGTERM (torchrun tearing the other
    ranks down) lands during that export. The window is kept, then the process ends by SIGTERM."""
    proc, out = start(tmp_path, "exit")
    rc, err = signal_during_export(proc, signal.SIGTERM)
    assert rc == -signal.SIGTERM, err[-2000:]
    [rec] = manifest(out)
    assert rec["steps"] == [3, 3] and rec["complete"] is False and rec["stopped_by"] == "SIGTERM"
    assert temporaries(out) == []
    assert ("SIGTERM came while distprof wrote the open windows at exit; it waited until its window was written, "
            "and the process now ends by SIGTERM") in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_more_sigterms_during_the_export_at_exit_do_not_cut_it_short(tmp_path):
    """A first SIGTERM in step 4 sends the job to its atexit export; two more land during it. The old code logged
    "could not write its window at exit" with a ``SystemExit: 143`` traceback after writing it."""
    proc, out = start(tmp_path, "sigterm_wait")
    assert proc.stdout.readline().strip() == "ready"  # the job is inside step 4
    proc.send_signal(signal.SIGTERM)
    rc, err = signal_during_export(proc, signal.SIGTERM, times=2)
    assert rc == -signal.SIGTERM, err[-2000:]
    [rec] = manifest(out)
    assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == "SIGTERM"
    assert step_numbers(out, rec) == [3, 4]
    assert temporaries(out) == []
    assert "Traceback" not in err and "SystemExit" not in err and "could not write" not in err
    assert ("SIGTERM came while distprof wrote the open windows at exit; it waited until its window was written, "
            "and the process now ends by SIGTERM (1 more signal came meanwhile and did not cut it short)") in err


@pytest.mark.slow
def test_sigint_during_the_export_at_a_windows_end_keeps_it(tmp_path):
    """Ctrl-C while step 5's end exports the whole window 3-5 (in a with block). The old code lost the window (no
    file, no line) and then logged "stopped at step 6 without capturing a window"."""
    proc, out = start(tmp_path, "ok", "with")
    rc, err = signal_during_export(proc, signal.SIGINT)
    assert rc == -signal.SIGINT, err[-2000:]  # Python's own ending for an uncaught KeyboardInterrupt
    [rec] = manifest(out)
    assert rec["steps"] == [3, 5] and rec["complete"] is True  # the signal came after the window's last step
    assert step_numbers(out, rec) == [3, 4, 5]
    assert temporaries(out) == []
    assert ("SIGINT came during its step; it waited until its window was written, and the process now stops for "
            "SIGINT") in err
    assert "without capturing a window" not in err
    assert err.rstrip().endswith("KeyboardInterrupt")  # raised again for the user's code, as Ctrl-C does


@pytest.mark.slow
def test_sigint_during_the_export_of_a_window_cut_short_is_its_stopped_by(tmp_path):
    proc, out = start(tmp_path, "short", "with")
    rc, err = signal_during_export(proc, signal.SIGINT, times=2)
    assert rc == -signal.SIGINT, err[-2000:]
    [rec] = manifest(out)
    assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == "SIGINT"
    assert temporaries(out) == []
    assert ("SIGINT came during its stop; it waited until its window was written, and the process now stops for "
            "SIGINT (1 more signal came meanwhile and did not cut it short)") in err


@pytest.mark.slow
def test_a_forked_child_never_writes_the_parents_windows(tmp_path):
    """A raw os.fork() at step 4, inside window 3-5 of a with block: the child runs the rest of the loop, leaves the
    with block and exits normally. Only the parent writes; `check` sees one writer (the old code's child exported
    into the parent's rank folder: "two writers claimed main rank 0")."""
    from distprof.analysis.check import check_run

    out = tmp_path / "run"
    proc = warmpython.run([sys.executable, JOB, "fork", str(out), "with"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "DISTPROF_LOG_LEVEL": "INFO"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "child exit 0" in proc.stdout
    [rec] = manifest(out)
    assert rec["steps"] == [3, 5] and rec["complete"] is True and rec["pid"] == proc_pid(proc.stderr)
    assert step_numbers(out, rec) == [3, 4, 5]
    assert temporaries(out) == []
    assert sorted(os.listdir(out / "main" / "rank00000")) == sorted(["manifest.jsonl", rec["file"].split("/")[-1]])
    [line] = [x for x in proc.stderr.splitlines() if "forked child" in x]
    assert "inherited profiler 'main' rank 0" in line and "writes none of their windows" in line
    res = check_run(str(out))
    assert res.ok and not res.problems and not any("writer" in n for n in res.notes), res.to_dict()


def proc_pid(stderr):
    """The parent's pid, from the child's log line ("... from pid N; ...")."""
    [line] = [x for x in stderr.splitlines() if "forked child" in x]
    return int(line.split(" from pid ")[1].split(";")[0])


@pytest.mark.slow
@pytest.mark.parametrize("signum, to", [(signal.SIGTERM, "pid"), (signal.SIGINT, "pid"), (signal.SIGTERM, "group")])
def test_a_signal_while_training_goes_on_beside_a_background_export_keeps_the_window(tmp_path, signum, to):
    """The window 3-5 is written in the background (the default, by a child process) while step 6 runs; a signal
    then ends the training thread: sent to the process, or to its whole process group as torchrun and scancel do
    (the child writing the window gets it too). The process waits for the export, publishes the whole window,
    and ends by the signal."""
    proc, out = start(tmp_path, "train_on", "with", inline=False, session=to == "group")
    try:
        # Two processes print (the child writing the window, the training process): their lines may interleave.
        got = proc.stdout.readline() + proc.stdout.readline()
        assert "exporting" in got and "training on" in got, got
        if to == "group":
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        say(proc, "go")
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signum, err[-2000:]
    [rec] = manifest(out)
    assert rec["steps"] == [3, 5] and rec["complete"] is True and rec.get("stopped_by") is None
    assert step_numbers(out, rec) == [3, 4, 5]
    assert temporaries(out) == [] and "without capturing a window" not in err


@pytest.mark.slow
def test_sys_exit_right_after_a_window_closed_waits_for_its_background_export(tmp_path):
    proc = warmpython.run([sys.executable, JOB, "exit_after", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    [rec] = manifest(tmp_path / "run")
    assert rec["steps"] == [3, 5] and rec["complete"] is True
    assert step_numbers(tmp_path / "run", rec) == [3, 4, 5] and temporaries(tmp_path / "run") == []
