"""``distprof wrap`` under a real torchrun (2 ranks, one wrapped): py-spy and memray for real, one torchrun job
each; the run directory they leave passes ``distprof check``. nsys and rocprof-sys cannot run here: their
stand-ins (tests/jobs/fake_nsys.py, fake_rocprof_sys.py) run instead, under plain launches, as do the exit-code and
signal checks."""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import JOBS
from tracekit import cli

JOB = os.path.join(JOBS, "wrap_job.py")
# torchrun --no-python runs the console script, as users do; PYTHONPATH (a checkout's src) reaches it.
DISTPROF = shutil.which("distprof", path=os.path.dirname(sys.executable)) or shutil.which("distprof")

pytestmark = pytest.mark.skipif(DISTPROF is None, reason="the distprof console script is not installed")


def _env(**settings):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "SLURM_", "DISTPROF_"))}
    env.update({f"DISTPROF_{k.upper()}": str(v) for k, v in settings.items()})
    return env


def _torchrun(tmp_path, backend, rank):
    """One 2-rank torchrun of wrap_job.py under ``distprof wrap``, ``backend`` on ``rank`` only."""
    save = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--max-restarts",
         "0", "--no-python", DISTPROF, "wrap", "--", sys.executable, JOB, str(tmp_path), "1.0"],
        env=_env(enable=1, backend=backend, save_path=save, ranks=rank), capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    who = {r: json.loads((tmp_path / f"who-{r}.json").read_text()) for r in (0, 1)}
    return save, who


def _assert_only_rank_wrapped(save, who, backend, rank, ext):
    wrapped, other = who[rank], who[1 - rank]
    # The selected rank runs as the wrapper's child; the other is the process torchrun started (exec: no wrapper).
    assert wrapped["wrapped_by"] == f"{backend}:{wrapped['ppid']}" and wrapped["parent"][1:3] == [DISTPROF, "wrap"]
    assert other["wrapped_by"] is None and other["parent"][1:3] == ["-m", "torch.distributed.run"]
    pid = wrapped["ppid"]
    assert sorted(os.listdir(save / "main")) == [f"{backend}-pid{pid}.rank{rank:05d}{ext}", "role.json"]
    code, out, _ = cli("check", save, "--json")
    assert code == 0 and out["ok"], out
    [item] = out["items"]
    assert (item["rank"], item["status"]) == (rank, "ok")
    return save / "main" / f"{backend}-pid{pid}.rank{rank:05d}{ext}"


def test_torchrun_py_spy_wraps_only_the_selected_rank(tmp_path):
    save, who = _torchrun(tmp_path, "py_spy", 1)
    path = _assert_only_rank_wrapped(save, who, "py_spy", 1, ".speedscope.json")
    data = json.loads(path.read_text())
    frames = [f["name"] for f in data["shared"]["frames"]]
    assert "<module>" in frames and data["profiles"][0]["samples"]  # the job's own Python, sampled


def test_torchrun_memray_wraps_only_the_selected_rank(tmp_path):
    save, who = _torchrun(tmp_path, "memray", 0)
    path = _assert_only_rank_wrapped(save, who, "memray", 0, ".bin")
    assert path.stat().st_size > 0


def _wrap(tmp_path, *args, config=None, env=None, **kw):
    cmd = [sys.executable, "-m", "distprof.cli", "wrap", *(["--config", str(config)] if config else []), "--",
           sys.executable, *args]
    return subprocess.Popen(cmd, env=env or _env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


@pytest.mark.parametrize("wrapped", [False, True], ids=["unwrapped", "py_spy"])
def test_exit_code_passes_through_a_plain_launch(tmp_path, wrapped):
    """No RANK nor SLURM_PROCID: one process, rank 0. py-spy itself exits 0 whatever its app did: the code is the
    app's all the same."""
    env = _env(enable=1, backend="py_spy", save_path=tmp_path / "run") if wrapped else _env()
    proc = _wrap(tmp_path, JOB, str(tmp_path), "0.3", "3", env=env)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-2000:]
    assert json.loads((tmp_path / "who-0.json").read_text())["wrapped_by"] == (
        f"py_spy:{proc.pid}" if wrapped else None)


def test_sigterm_reaches_the_app_and_the_wrapper_ends_by_it(tmp_path):
    """A scheduler's SIGTERM to the wrapper reaches the app as it is; the app dies of it, and so does the wrapper
    (a shell reports 143, torchrun names the signal); py-spy has written its output."""
    save = tmp_path / "run"
    proc = _wrap(tmp_path, JOB, str(tmp_path), "600", env=_env(enable=1, backend="py_spy", save_path=save),
                 start_new_session=True)
    try:
        assert any("Sampling process" in line for line in proc.stdout)  # py-spy is attached
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM
    assert [n for n in os.listdir(save / "main") if n.startswith("py_spy-")] == [
        f"py_spy-pid{proc.pid}.rank00000.speedscope.json"]


def test_nsys_stand_in_gets_capture_ranges_on_the_planned_steps(tmp_path):
    """nsys cannot run here: its stand-in (tests/jobs/fake_nsys.py) records the options it was given. The
    config comes from --config; steps 2-3 and 6 are two windows, so the range repeats twice."""
    config = tmp_path / "profile.yaml"
    config.write_text(f"enable: true\nbackend: nsys\nsave_path: {tmp_path / 'run'}\nsteps: [2, 3, 6]\n"
                      f"nsys:\n  executable: {os.path.join(JOBS, 'fake_nsys.py')}\n")
    proc = _wrap(tmp_path, "-c", "import sys; sys.exit(3)", config=config,
                 env={**_env(), "RANK": "0", "WORLD_SIZE": "1"})
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err[-2000:]
    name = f"nsys-pid{proc.pid}.rank00000.nsys-rep"
    report = json.loads((tmp_path / "run" / "main" / name).read_text())
    assert {"--capture-range=cudaProfilerApi", "--capture-range-end=repeat:2"} <= set(report["options"])
    assert report["app"] == [sys.executable, "-c", "import sys; sys.exit(3)"]


def test_rocprof_sys_stand_in_and_an_unselected_srun_task(tmp_path):
    """rocprof-sys cannot run here: its stand-in writes a result folder. Ranks from SLURM's variables (srun):
    task 1 is selected and wrapped; task 0 runs the command itself."""
    config = tmp_path / "profile.yaml"
    config.write_text(f"enable: true\nbackend: rocprof_sys\nsave_path: {tmp_path / 'run'}\nranks: [1]\n"
                      f"rocprof_sys:\n  executable: {os.path.join(JOBS, 'fake_rocprof_sys.py')}\n")
    for task in (0, 1):
        env = {**_env(), "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task), "SLURM_NTASKS": "2"}
        proc = _wrap(tmp_path, "-c", "print('task ran')", config=config, env=env)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "task ran" in out, err[-2000:]
        if task == 1:
            pid = proc.pid
    assert sorted(os.listdir(tmp_path / "run" / "main")) == [f"rocprof_sys-pid{pid}.rank00001", "role.json"]
    assert os.listdir(tmp_path / "run" / "main" / f"rocprof_sys-pid{pid}.rank00001") == ["wall_clock.json"]
    code, out, _ = cli("check", tmp_path / "run", "--json")
    assert code == 0 and [(i["rank"], i["status"]) for i in out["items"]] == [(1, "ok")], out


def test_sigkill_to_the_wrapper_ends_the_app_too(tmp_path):
    """torchrun's last resort (SIGKILL after its grace period) reaches a wrapped rank's app as it would reach an
    unwrapped rank (the app is in a session of its own, so a process-group kill alone would miss it)."""
    import select

    proc = _wrap(tmp_path, JOB, str(tmp_path), "600", env=_env(enable=1, backend="py_spy", save_path=tmp_path / "run"),
                 start_new_session=True)
    try:
        line = next(line for line in proc.stderr if "app running" in line)
        app = int(line.split()[2])
        fd = os.pidfd_open(app)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        assert select.select([fd], [], [], 60)[0], "the app outlived its wrapper"
        os.close(fd)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize("backend, section", [("nsys", "nsys:\n  executable: /no/such/nsys\n"), ("memray", "")],
                         ids=["tool-missing", "not-a-python-command"])
def test_a_tool_that_cannot_start_leaves_the_rank_unwrapped(tmp_path, backend, section):
    """Training is never lost: one warning, then the command runs as itself (memray needs a Python command)."""
    config = tmp_path / "profile.yaml"
    config.write_text(f"enable: true\nbackend: {backend}\nsave_path: {tmp_path / 'run'}\n{section}")
    cmd = [sys.executable, "-m", "distprof.cli", "wrap", "--config", str(config), "--"]
    cmd += ([sys.executable, "-c", "import sys; print('ran'); sys.exit(4)"] if backend == "nsys" else
            ["/bin/sh", "-c", "echo ran; exit 4"])
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (4, "ran\n"), proc.stderr[-2000:]
    assert " ".join(proc.stderr.split()).count(f"rank 0 runs without {backend}") == 1
