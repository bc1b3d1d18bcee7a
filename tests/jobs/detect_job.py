"""A data-parallel gloo job with step telemetry and the in-job watcher (``detect: true``), for tests/e2e/test_detect.py.

Every rank runs the same steps: ``train/data`` (a sleep standing in for loading a batch), a tiny MLP's forward and
backward, ``train/allreduce`` (the gradients, over gloo), ``train/optimizer``; then ``prof.step()``. With
``slow_rank``, that rank's data phase sleeps ``slow_s`` more from step ``slow_from`` on: a straggler appearing
mid-run, which the others wait for in the all-reduce. The config is the one a user writes for detection:
telemetry on every rank, the watcher started by rank 0, on-demand capture opted in on every rank.

``until_finding``: after ``steps`` steps the job goes on (at most ``max_steps``) until the watcher has written a
detection with its finding into detections.jsonl: rank 0 looks, and its flag travels with the gradients in the
step's one all-reduce, so every rank stops at the same step. Without it the job runs exactly ``steps`` steps.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from distprof.rundir.layout import DETECTIONS

SLEEP_S = 0.01  # every rank's data phase


def config(out: str, **detection) -> dict:
    return {"save_path": out, "telemetry": True, "telemetry_options": {"flush_s": 0.1}, "detect": True,
            "trigger": True, "trigger_poll_s": 0, "ranks": "all", "torch": {"activities": ["cpu"]},
            # slowdown_factor 4: a test machine shared with other tests slows the whole job by 2-3x at times, which
            # the slowdown rule rightly reports; the tests here are about slow ranks (the rule's own tests use 1.3)
            "detection": {"poll_s": 0.2, "slow_steps": 5, "capture_steps": 2, "lead_steps": 3, "slowdown_factor": 4,
                          **detection}}


def has_finding(out: str) -> bool:
    try:
        with open(os.path.join(out, DETECTIONS), "rb") as f:
            return any(json.loads(line).get("finding") for line in f if line.strip())
    except (OSError, ValueError):
        return False


def worker(rank: int, world_size: int, init_file: str, out: str, steps: int, max_steps: int, slow_rank: int | None,
           slow_from: int, slow_s: float, until_finding: bool) -> None:
    import torch
    import torch.distributed as dist

    import distprof

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(rank)
        torch.set_num_threads(1)  # four ranks on a small machine: no rank's idle OpenMP threads spin beside another
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        prof = distprof.Profiler(distprof.ProfilerConfig.from_dict(config(out)), role="train")
        annotate = distprof.annotate
        params = list(model.parameters())
        with prof:
            step = 0
            while True:
                with annotate("train/data"):
                    x, y = torch.randn(16, 32), torch.randint(0, 4, (16,))
                    time.sleep(SLEEP_S + (slow_s if rank == slow_rank and step >= slow_from else 0.0))
                with annotate("train/forward"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                with annotate("train/backward"):
                    loss.backward()
                with annotate("train/allreduce"):  # one collective a step: the gradients and rank 0's stop flag
                    stop = 1.0 if until_finding and rank == 0 and step + 1 >= steps and has_finding(out) else 0.0
                    flat = torch.cat([p.grad.flatten() for p in params] + [torch.tensor([stop])])
                    dist.all_reduce(flat)
                    at = 0
                    for p in params:
                        p.grad.copy_(flat[at:at + p.numel()].view_as(p.grad) / world_size)
                        at += p.numel()
                with annotate("train/optimizer"):
                    opt.step()
                    opt.zero_grad()
                prof.step()
                step += 1
                if step >= (max_steps if until_finding else steps) or flat[-1] > 0:
                    break
        if rank == 0:
            print(json.dumps({"steps": step}), flush=True)
    finally:
        dist.destroy_process_group()
    logging.shutdown()  # as distprof/demo/gloo_job.py: skip torch's teardown after a gloo job
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(out: str, world_size: int = 4, steps: int = 200, max_steps: int = 1500, slow_rank: int | None = None,
        slow_from: int = 0, slow_s: float = 0.0, until_finding: bool = False) -> None:
    """Run the job in ``world_size`` processes forked from the tests' warm server (tests/jobs/warmfork.py)."""
    import shutil
    import tempfile

    import torch.multiprocessing as mp
    import warmfork

    warmfork.context()
    scratch = tempfile.mkdtemp(prefix="distprof-rdzv-")
    try:
        mp.start_processes(worker, args=(world_size, os.path.join(scratch, "rendezvous"), out, steps, max_steps,
                                         slow_rank, slow_from, slow_s, until_finding),
                           nprocs=world_size, join=True, start_method="forkserver")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
