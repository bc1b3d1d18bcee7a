"""What the capture side prints in processes that configured no logging (torchrun children, Ray workers, HF and
Lightning jobs): one line per process saying where its traces go, and with DISTPROF_LOG_LEVEL every distprof
message, prefixed with role and rank. Real child processes: a process's logging set-up is what is tested."""

import os
import subprocess
import sys

import pytest
import warmpython  # python SCRIPT, forked from a server that imported torch once
from conftest import JOBS

JOB = """
import logging, sys, torch, distprof
if sys.argv[2] == "app":
    logging.basicConfig(level=logging.WARNING, format="APP %(name)s: %(message)s")
cfg = {"enable": True, "save_path": sys.argv[1], "steps": [1, 3], "ranks": "all", "torch": {"activities": ["cpu"]}}
p = distprof.Profiler(cfg, role="actor", rank=1, world_size=2)
with p:
    for _ in range(5):
        torch.randn(8, 8).sum()
        p.step()
assert p.windows_closed == 2
"""


def run_job(tmp_path, level=None, app=False, name="run"):
    env = {k: v for k, v in os.environ.items() if k != "DISTPROF_LOG_LEVEL"}
    if level is not None:
        env["DISTPROF_LOG_LEVEL"] = level
    out = tmp_path / name
    proc = warmpython.run([sys.executable, "-c", JOB, str(out), "app" if app else "plain"], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, [ln for ln in proc.stderr.splitlines() if "distprof" in ln]


@pytest.mark.slow
def test_without_the_variable_a_process_says_once_where_its_traces_go(tmp_path):
    out, lines = run_job(tmp_path)
    assert lines == [f"[distprof actor rank 1] traces go to {out}/actor/rank00001; read the run with: "
                     f"distprof diagnose {out}"]  # two windows, one line; nothing else from distprof


@pytest.mark.slow
@pytest.mark.parametrize("level", ["WARNING", "error"])
def test_distprof_log_level_quiets_the_where_line(tmp_path, level):
    _, lines = run_job(tmp_path, level)
    assert lines == []


@pytest.mark.slow
def test_distprof_log_level_info_prints_every_message_prefixed(tmp_path):
    out, lines = run_job(tmp_path, "INFO")
    assert lines == [
        "[distprof actor rank 1] opened window 1-1 (warm-up from 0)",
        f"[distprof actor rank 1] wrote {out}/actor/rank00001/step00000001-00000001.pt.trace.json.gz "
        f"({os.path.getsize(out / 'actor/rank00001/step00000001-00000001.pt.trace.json.gz')} bytes)",
        f"[distprof actor rank 1] traces go to {out}/actor/rank00001; read the run with: distprof diagnose {out}",
        "[distprof actor rank 1] opened window 3-3 (warm-up from 2)",
        f"[distprof actor rank 1] wrote {out}/actor/rank00001/step00000003-00000003.pt.trace.json.gz "
        f"({os.path.getsize(out / 'actor/rank00001/step00000003-00000003.pt.trace.json.gz')} bytes)",
    ]


@pytest.mark.slow
def test_an_application_that_configured_logging_gets_each_line_once_in_its_format(tmp_path):
    out, lines = run_job(tmp_path, app=True)
    assert lines == [f"APP distprof.where: distprof: profiler 'actor' rank 1: traces go to {out}/actor/rank00001; "
                     f"read the run with: distprof diagnose {out}"]
    _, lines = run_job(tmp_path, "INFO", app=True, name="again")
    assert len(lines) == 5 and all(ln.startswith("APP distprof.") for ln in lines)
    assert sum("opened window 1-1" in ln for ln in lines) == 1


@pytest.mark.slow
def test_torchrun_children_log_with_role_and_rank(tmp_path):
    """The issue's case: DISTPROF_LOG_LEVEL=INFO under torchrun printed nothing (no handler in the children)."""
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_"))}
    env["DISTPROF_LOG_LEVEL"] = "INFO"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "--max-restarts", "0", os.path.join(JOBS, "crash_job.py"), "ok", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        mine = [ln for ln in proc.stderr.splitlines() if ln.startswith(f"[distprof main rank {rank}] ")]
        assert mine[0] == f"[distprof main rank {rank}] opened window 3-5 (warm-up from 2)"
        assert f"[distprof main rank {rank}] traces go to {out}/main/rank{rank:05d}; read the run with: distprof " \
               f"diagnose {out}" in mine
        assert len(mine) == 3  # opened, wrote, where: each once
