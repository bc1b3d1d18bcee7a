"""Crash-safe capture: a real child process dies in each way a training process dies, inside a capture window.

The child (tests/jobs/crash_job.py) profiles steps 3-5 and dies at step 4. distprof must write the steps it
captured (manifest ``complete: false``, ``stopped_by`` naming the cause), never swallow the exception,
and leave the exit status exactly what it would be without distprof.
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


def run_job(tmp_path, how, style="startstop", **kw):
    out = tmp_path / "run"
    proc = warmpython.run([sys.executable, JOB, how, str(out), style], capture_output=True, text=True,
                          timeout=120, **kw)
    return proc, out


def manifest(out, rank=0):
    path = out / "main" / f"rank{rank:05d}" / "manifest.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def step_numbers(out, record):
    with gzip.open(out / record["file"], "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#")})


@pytest.mark.slow
@pytest.mark.parametrize("style", ["startstop", "with", "callback"])
def test_uncaught_exception_keeps_the_captured_steps(tmp_path, style):
    proc, out = run_job(tmp_path, "raise", style)
    assert proc.returncode == 1  # Python's own status for an uncaught exception; not a segfault (139)
    assert "RuntimeError: boom at step 4" in proc.stderr  # the user's exception is not swallowed
    [rec] = manifest(out)
    assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == "exception"
    assert step_numbers(out, rec) == [3, 4]  # step 3 whole, and the step that failed


@pytest.mark.slow
def test_sys_exit_keeps_its_status_and_the_finished_steps(tmp_path):
    proc, out = run_job(tmp_path, "exit")
    assert proc.returncode == 3, proc.stderr[-2000:]
    [rec] = manifest(out)
    assert rec["steps"] == [3, 3] and rec["complete"] is False and rec["stopped_by"] == "exit"
    assert 3 in step_numbers(out, rec)


@pytest.mark.slow
def test_sigterm_writes_the_window_and_ends_by_sigterm(tmp_path):
    out = tmp_path / "run"
    proc = warmpython.Popen([sys.executable, JOB, "sigterm_wait", str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"  # the child is inside step 4, blocked on stdin
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM  # killed by the signal, as without distprof
    [rec] = manifest(out)
    assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == "SIGTERM"
    assert step_numbers(out, rec) == [3, 4]
    assert "writing its open window" in err


@pytest.mark.slow
def test_sigterm_inside_the_profilers_own_step_waits_for_it(tmp_path):
    """Unwinding from the middle of torch.profiler's step would leave it half-switched (its export then crashes
    the process); the step completes, then the process unwinds and ends by SIGTERM with the window written."""
    proc, out = run_job(tmp_path, "sigterm_in_step")
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert "Segmentation fault" not in proc.stderr
    [rec] = manifest(out)
    assert rec["steps"][0] == 3 and rec["complete"] is False and rec["stopped_by"] == "SIGTERM"
    assert step_numbers(out, rec)[:2] == [3, 4]  # step 3 ended, and the profiler's step into 4 completed


@pytest.mark.slow
def test_a_clean_run_is_untouched(tmp_path):
    proc, out = run_job(tmp_path, "ok")
    assert proc.returncode == 0
    [rec] = manifest(out)
    assert rec["steps"] == [3, 5] and rec["complete"] is True and "stopped_by" not in rec
    assert "still started" not in proc.stderr


@pytest.mark.slow
def test_someone_elses_sigterm_handler_is_left_alone(tmp_path):
    code = (
        "import signal, distprof\n"
        "def mine(s, f): pass\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        f"p = distprof.Profiler(distprof.ProfilerConfig(enable=True, save_path={str(tmp_path / 'r')!r}, steps=[1],"
        " torch={'activities': ['cpu']})).start()\n"
        "assert signal.getsignal(signal.SIGTERM) is mine\n"
        "p.stop()\n"
    )
    proc = warmpython.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
def test_torchrun_tearing_down_after_a_rank_fails(tmp_path):
    """Rank 1 raises at step 4; torchrun then stops rank 0 with SIGTERM. Both ranks' captured steps survive."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts", "0",
         JOB, "peer_dies", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode != 0 and "boom at step 4" in proc.stderr
    assert "exitcode  : -15" in proc.stderr  # torchrun saw rank 0 end by its SIGTERM, not by anything of ours
    for rank, cause in ((1, "exception"), (0, "SIGTERM")):
        [rec] = manifest(out, rank=rank)
        assert rec["steps"] == [3, 4] and rec["complete"] is False and rec["stopped_by"] == cause
        assert step_numbers(out, rec) == [3, 4]


@pytest.mark.slow
def test_two_profilers_with_overlapping_windows_do_not_crash_the_process(tmp_path):
    """torch.profiler records one session per process: the second profiler is switched off with a message, the
    first writes its window, and the process ends normally (a second session used to end with a segfault)."""
    code = (
        "import sys, torch, distprof\n"
        f"c = distprof.ProfilerConfig(enable=True, save_path={str(tmp_path / 'r')!r}, steps=[1, 2],"
        " torch={'activities': ['cpu']})\n"
        "a = distprof.Profiler(c, role='actor').start(); b = distprof.Profiler(c, role='ref').start()\n"
        "for _ in range(4):\n"
        "    torch.randn(8, 8).sum(); a.step(); b.step()\n"
        "a.stop(); b.stop()\n"
        "assert a.windows_closed == 1 and not b.enabled\n"
    )
    proc = warmpython.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "another profiler in this process (role 'actor') has a window open" in proc.stderr


def test_sigterm_is_the_default_again_once_profiling_stops_and_in_forked_children(tmp_path):
    code = (
        "import os, signal, multiprocessing as mp, distprof\n"
        f"p = distprof.Profiler(distprof.ProfilerConfig(enable=True, save_path={str(tmp_path / 'r')!r}, steps=[50],"
        " torch={'activities': ['cpu']})).start()\n"
        "assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL\n"
        "ctx = mp.get_context('fork')\n"
        # The child ends by SIGTERM only if its handler is the default (else it exits 7 itself).
        "c = ctx.Process(target=lambda: os.kill(os.getpid(), signal.SIGTERM) if signal.getsignal(signal.SIGTERM)"
        " is signal.SIG_DFL else os._exit(7))\n"
        "c.start(); c.join(60)\n"
        "assert c.exitcode == -signal.SIGTERM, c.exitcode\n"
        "p.stop()\n"
        "assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL\n"
    )
    proc = warmpython.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_window_cut_short_by_stop_has_no_phantom_step(tmp_path):
    """The trace of a window cut short holds one more ProfilerStep (from the last step's end to the profiler's
    stop); the manifest lists the steps that ran, and the analysis counts only those."""
    import torch

    from distprof import Profiler, ProfilerConfig
    from distprof.analysis import analyze

    p = Profiler(ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), steps="3-8",
                                torch={"activities": ["cpu"]})).start()
    for _ in range(6):
        torch.randn(8, 8).sum()
        p.step()
    p.stop()
    d = analyze.steps(str(tmp_path / "r"), workers=1)
    assert [row["step"] for row in d["steps"]] == [3, 4, 5]
    [rec] = manifest(tmp_path / "r")
    assert rec["steps"] == [3, 5] and rec["stopped_by"] == "stop"


@pytest.mark.slow
@pytest.mark.parametrize("how, cause", [("exit", "exit"), ("raise", "exception")])
def test_stopped_by_names_the_cause_with_a_with_block(tmp_path, how, cause):
    proc, out = run_job(tmp_path, how, "with")
    [rec] = manifest(out)
    assert rec["stopped_by"] == cause and rec["complete"] is False


@pytest.mark.slow
def test_sigterm_in_a_with_block_is_recorded_as_sigterm(tmp_path):
    out = tmp_path / "run"
    proc = warmpython.Popen([sys.executable, JOB, "sigterm_wait", str(out), "with"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM
    [rec] = manifest(out)
    assert rec["stopped_by"] == "SIGTERM" and rec["steps"] == [3, 4]
