"""Hang evidence on real processes (issue 25 items 1, 2, 4): a 4-rank gloo job (tests/jobs/hang_job.py) in which
ranks stop entering collectives at a step the test picks, one way per rank (rank 1 sleeps, rank 2 deadlocks on a
lock, rank 3 blocks in a C call that keeps the GIL) while rank 0 waits in the all-reduce; and a job with a slow
rank that goes on. One job each (about 5 s apiece on an idle 2-core machine): the first is killed as soon as
every rank's evidence is in the run directory."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once

from distprof.analysis.analyze import diagnose_result
from distprof.analysis.hang import hang_result
from distprof.rundir.layout import HANG, HANG_STACKS, MANIFEST

pytestmark = pytest.mark.slow

JOB = os.path.join(os.path.dirname(os.path.dirname(__file__)), "jobs", "hang_job.py")


def line_of(text):
    with open(JOB) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


def start(out, spec, at, steps, timeout_s):
    return warmpython.Popen([sys.executable, JOB, str(out), spec, str(at), str(steps), str(timeout_s)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def evidence_state(out, rank):
    try:
        with open(os.path.join(out, "train", f"rank{rank:05d}", HANG)) as f:
            return json.load(f).get("state")
    except (OSError, ValueError):
        return None


def in_collective(out, rank):
    try:
        with open(os.path.join(out, "train", f"rank{rank:05d}", HANG)) as f:
            return bool(json.load(f).get("in_collective"))
    except (OSError, ValueError):
        return False


def c_dump(out, rank):
    try:
        with open(os.path.join(out, "train", f"rank{rank:05d}", HANG_STACKS)) as f:
            return "in stall" in f.read()
    except OSError:
        return False


def test_a_hung_job_leaves_every_ranks_evidence_and_hang_names_the_stuck_ranks(tmp_path):
    out = tmp_path / "run"
    job = start(out, "1:sleep,2:lock,3:cfunc", at=3, steps=10, timeout_s=1)
    try:
        deadline = time.monotonic() + 120
        # Rank 0's first stalled evidence can predate its all-reduce (a loaded machine slowed its step past the
        # timeout); the watchdog rewrites it once the rank waits in the collective.
        while not (all(evidence_state(out, r) == "stalled" for r in (0, 1, 2)) and in_collective(out, 0)
                   and c_dump(out, 3)):
            assert job.poll() is None, job.stdout.read().decode(errors="replace")
            assert time.monotonic() < deadline, "no hang evidence from every rank within 120 s"
            time.sleep(0.05)  # polling the run directory, with a deadline
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)  # the job made its own process group: its ranks go too
        except ProcessLookupError:
            pass
        job.wait(60)

    res = hang_result(str(out))
    assert res.hung and res.stuck_ranks == [1, 2, 3] and not res.errors
    c = res.collective
    assert (c.group, c.seq, c.name, c.waiting) == ("0", 4, "all_reduce", [0])  # steps 0-2 did one all-reduce each
    by = {r.rank: r for r in res.ranks}
    assert by[0].state == "waiting" and by[0].phase == "train/allreduce" and by[0].step == 3
    assert by[0].waiting_in["seq"] == 4
    assert (by[1].state, by[1].step, by[1].phase) == ("stuck", 3, "train/data")
    assert (by[2].state, by[2].step, by[2].phase) == ("stuck", 3, "train/data")
    assert by[1].frame.startswith("stall (") and by[1].frame.endswith(f"hang_job.py:{line_of('time.sleep(120)')})")
    assert by[2].frame.endswith(f"hang_job.py:{line_of('lock.acquire(timeout=120)')})")
    assert by[3].state == "stuck_in_c"  # no Python thread ran: faulthandler's C watchdog wrote its stack
    assert by[3].frame.endswith(f"hang_job.py:{line_of('.sleep(120)  # PyDLL')})")
    assert "ranks 1-3 never entered all_reduce #4 of group 0" in res.verdict

    for rank in (0, 1, 2):  # the window open at the stuck step, as it stands
        lines = [json.loads(x) for x in (out / "train" / f"rank{rank:05d}" / MANIFEST).read_text().splitlines()]
        assert [x["steps"] for x in lines if x.get("stopped_by") == "hang"] == [[3, 3]]
        assert any(x["steps"] == [1, 1] and x["complete"] for x in lines)  # the earlier window's trace

    d = diagnose_result(str(out))
    hang = next(f for f in d.findings if f.id == "hang")
    assert hang.evidence.ranks == [1, 2, 3] and "all_reduce #4 (group 0)" in hang.evidence.names


def test_a_slow_rank_that_goes_on_is_not_called_hung(tmp_path):
    out = tmp_path / "run"
    job = start(out, "2:slow=0.3", at=1, steps=6, timeout_s=2)
    assert job.wait(120) == 0, job.stdout.read().decode(errors="replace")
    res = hang_result(str(out))
    assert not res.hung and res.stuck_ranks == [] and res.collective is None
    assert {r.rank: r.state for r in res.ranks} == {r: "stopped" for r in range(4)}
