"""What a cluster does to a job, done for real to real child processes (tests/jobs/chaos_job.py): kill -9 inside the
export, a disk that fills up, a run directory made read-only, eight processes writing one run directory at once,
a resumed job writing windows an earlier run already wrote.

Whatever happens: training goes on (or the process dies exactly as killed), no half-written file is ever visible
(only hidden ``.tmp-`` names), the manifest never names a file that is not there, and nothing is overwritten.
The disk and read-only cases run the child in its own user and mount namespace (``unshare --user
--map-root-user --mount``), where it may mount a small tmpfs or a read-only bind mount: the tests run as root
here, and chmod does not stop root.
"""

import gzip
import json
import os
import shlex
import signal
import subprocess
import sys

import pytest
import warmfork
import warmpython
from conftest import JOBS
from helpers import run

from distprof import Profiler, ProfilerConfig
from distprof.rundir.layout import MANIFEST, TMP_PREFIX
from distprof.rundir.store import list_files, manifest_records

JOB = os.path.join(JOBS, "chaos_job.py")


def job(save, steps=7, *extra, env=None, namespace_script=None):
    cmd = [sys.executable, JOB, str(save), str(steps), *map(str, extra)]
    start = warmpython.run  # python JOB, forked from a server that imported torch once
    if namespace_script is not None:  # a real python inside namespaces of its own (a small disk, a read-only one)
        cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
               namespace_script.replace("JOB", shlex.join(cmd))]
        start = subprocess.run
    return start(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, **(env or {})})


def hidden(root):
    return [p for d, _, names in os.walk(root) for p in names if p.startswith(TMP_PREFIX)]


def traces(root):
    return sorted(f["path"] for f in list_files(str(root)) if ".pt.trace.json" in f["path"])


def steps_in(path):
    """ProfilerStep numbers of a whole trace (gzip CRC and JSON both checked by reading it)."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted({int(e["name"].split("#")[1]) for e in events if e.get("name", "").startswith("ProfilerStep#")})


def assert_consistent(root):
    """Every visible trace reads whole; every file a manifest names is there."""
    for rel in traces(root):
        assert steps_in(os.path.join(root, rel)), rel
    for rec in manifest_records(str(root)):
        for f in rec.files:
            assert os.path.getsize(os.path.join(root, f.path)) == f.bytes, f.path


@pytest.mark.slow
@pytest.mark.parametrize("where", ["raw", "gzip", "manifest"])
def test_kill_9_inside_the_export_leaves_nothing_half_written(tmp_path, where):
    """SIGKILL from inside the second window's export: after torch wrote the JSON, half-way through the gzip, or
    between publishing the trace and writing its manifest line."""
    save = tmp_path / "run"
    proc = job(save, env={"CHAOS_KILL_AT": where, "CHAOS_KILL_WINDOW": "5"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert_consistent(save)
    [rec] = manifest_records(str(save))  # the first window, whole; the killed one has no line
    assert rec.steps == [1, 2] and rec.complete
    assert steps_in(save / rec.files[0].path) == [1, 2]
    visible = traces(save)
    if where == "manifest":  # published a moment before the kill: whole, just not listed
        assert visible == [rec.files[0].path, "main/rank00000/step00000004-00000005.pt.trace.json.gz"]
    else:
        assert visible == [rec.files[0].path] and hidden(save)  # the torn write stayed under its hidden name


@pytest.mark.slow
def test_disk_full_during_export(tmp_path):
    """A 1 MiB tmpfs holds the run directory and $TMPDIR; at step 3 another writer fills it. The second window's
    export fails: nothing of it is published or left behind, one error, training runs to the end, the first
    window is intact, and the export never wrote into $TMPDIR. (Before staging, a hidden half-made gzip stayed in the
    rank folder and torch's plain JSON in $TMPDIR.)"""
    mnt, out = tmp_path / "mnt", tmp_path / "out"
    mnt.mkdir()
    out.mkdir()
    script = (f"mount -t tmpfs -o size=1m tmpfs {mnt} && mkdir {mnt}/tmp && TMPDIR={mnt}/tmp JOB; rc=$?; "
              f"cp -a {mnt}/run/. {out}/; ls -A {mnt}/tmp | sed 's/^/TMPDIR: /'; exit $rc")
    proc = job(mnt / "run", env={"CHAOS_FILL_AT": "3"}, namespace_script=script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done 7 disabled" in proc.stdout  # every step ran; the profiler switched itself off
    assert proc.stderr.count("profiling is disabled") == 1, proc.stderr[-3000:]
    assert not hidden(out)
    assert not [line for line in proc.stdout.splitlines() if line.startswith("TMPDIR: ") and ".json" in line]
    assert_consistent(out)
    [rec] = manifest_records(str(out))
    assert rec.steps == [1, 2] and traces(out) == [rec.files[0].path]


@pytest.mark.slow
def test_full_tmpdir_does_not_empty_the_traces(tmp_path):
    """$TMPDIR is a 1 MiB tmpfs that fills up at step 3 (a node's /tmp filled by others); the run directory is
    fine. torch's own gzip export staged each window there and published an empty trace marked complete; ours never
    touches $TMPDIR."""
    mnt, save = tmp_path / "mnt", tmp_path / "run"
    mnt.mkdir()
    script = f"mount -t tmpfs -o size=1m tmpfs {mnt} && TMPDIR={mnt} JOB"
    proc = job(save, env={"CHAOS_FILL_AT": "3", "CHAOS_FILL_DIR": str(mnt)}, namespace_script=script)
    assert proc.returncode == 0 and "done 7 enabled" in proc.stdout, proc.stderr[-3000:]
    records = manifest_records(str(save))
    assert [r.steps for r in records] == [[1, 2], [4, 5]] and all(r.complete for r in records)
    assert [steps_in(save / r.files[0].path) for r in records] == [[1, 2], [4, 5]]
    assert not hidden(save)


@pytest.mark.slow
def test_run_directory_made_read_only_after_start(tmp_path):
    """At step 3 the run directory becomes a read-only bind mount (EROFS, which stops root too)."""
    save = tmp_path / "run"
    proc = job(save, env={"CHAOS_READONLY_AT": "3"}, namespace_script="JOB")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done 7 disabled" in proc.stdout
    assert proc.stderr.count("profiling is disabled") == 1, proc.stderr[-3000:]
    assert not hidden(save)
    assert_consistent(save)
    [rec] = manifest_records(str(save))
    assert rec.steps == [1, 2] and traces(save) == [rec.files[0].path]


def _writer(save, role, barrier):
    """One of eight processes that all claim rank 0 of world size 1 (rank detection falling back to 0)."""
    cfg = ProfilerConfig(enable=True, save_path=save, steps=[1, 2, 4], torch={"activities": ["cpu"]})
    prof = Profiler(cfg, role=role, rank=0, world_size=1)
    barrier.wait()  # all eight start together, so their windows close and publish at the same moments
    run(prof, 6)
    assert prof.windows_closed == 2


@pytest.mark.slow
@pytest.mark.parametrize("roles", [["main"] * 8, ["actor"] * 4 + ["critic"] * 4], ids=["same-role", "two-roles"])
def test_eight_processes_write_one_run_directory_at_once(tmp_path, roles):
    save = str(tmp_path / "run")
    ctx = warmfork.context()  # eight real processes, forked from one that imported torch: not eight torch imports
    barrier = ctx.Barrier(len(roles))
    procs = [ctx.Process(target=_writer, args=(save, role, barrier)) for role in roles]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0] * len(roles)
    files = traces(save)
    assert len(files) == 2 * len(roles)  # every window of every process, none overwritten
    assert not hidden(save)
    assert_consistent(save)
    records = manifest_records(save)
    assert sorted(f.path for r in records for f in r.files) == files  # the manifests list them all
    assert len({r.pid for r in records}) == len(roles)
    for role in set(roles):
        mine = [r for r in records if r.role == role]
        writers = roles.count(role)
        for steps in ([1, 2], [4, 4]):
            same = [r for r in mine if r.steps == steps]
            assert len(same) == writers
            # exactly one process got the plain name; every other one said it met another writer
            assert sorted(r.writer_conflict for r in same) == [False] + [True] * (writers - 1)
            plain = [r for r in same if not r.writer_conflict]
            assert f".pid{plain[0].pid}." not in plain[0].files[0].path
            assert all(f".pid{r.pid}." in r.files[0].path for r in same if r.writer_conflict)
    assert {os.path.dirname(f) for f in files} == {f"{role}/rank00000" for role in set(roles)}
    assert all(os.path.exists(os.path.join(save, f"{role}/rank00000", MANIFEST)) for role in set(roles))


@pytest.mark.slow
def test_resumed_job_rewriting_a_window_keeps_both(tmp_path):
    """A job checkpointed at step 2 and resumed there captures window 2-3 again: both copies are kept."""
    save = tmp_path / "run"
    # The first run is this test's process (what chaos_job.py does, in-process: one process start fewer); the
    # resumed one is a real child process, as a restarted job is.
    first = Profiler(ProfilerConfig(enable=True, save_path=str(save), steps=[2, 3], torch={"activities": ["cpu"]}),
                     role="main", rank=0, world_size=1)
    assert run(first, 6).steps_run == 6 and first.windows_closed == 1
    second = job(save, 4, "--steps-plan", "2,3", "--global-step", "2")
    assert second.returncode == 0, second.stderr[-2000:]
    assert "already wrote" in second.stderr and "both files are kept" in second.stderr
    a, b = manifest_records(str(save))
    assert a.steps == b.steps == [2, 3] and a.pid == os.getpid() != b.pid
    assert (a.writer_conflict, b.writer_conflict) == (False, True)
    assert a.files[0].path == "main/rank00000/step00000002-00000003.pt.trace.json.gz"
    assert b.files[0].path == f"main/rank00000/step00000002-00000003.pid{b.pid}.pt.trace.json.gz"
    assert f"process {a.pid} on {a.host}" in second.stderr  # the warning names the other writer
    assert steps_in(save / a.files[0].path) == steps_in(save / b.files[0].path) == [2, 3]
    assert traces(save) == sorted([a.files[0].path, b.files[0].path])
