"""A small data-parallel training job: N processes, gloo all-reduce, profiled by distprof.

Every rank trains a tiny MLP on random data, averages gradients with
``all_reduce`` over gloo, and is profiled on the configured steps. It runs on
CPU in a few seconds and writes a complete run directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass
class DemoResult:
    run_dir: str
    world_size: int
    steps: int
    files: list[dict[str, Any]]


def rendezvous_file(scratch: str) -> str:
    """A fresh file for torch.distributed's FileStore rendezvous.

    A file, not a TCP port: a port picked free here can be taken by another process (any outgoing
    connection's ephemeral port) before rank 0 binds it, which failed jobs under a busy test run.
    """
    return os.path.join(scratch, "rendezvous")


def _plain_torch_profiler(out: str, first: int, last: int):
    """torch.profiler as users wire it by hand: a schedule and tensorboard_trace_handler, no distprof."""
    import torch

    return torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=max(first - 1, 0), warmup=1 if first else 0, active=last - first + 1),
        on_trace_ready=torch.profiler.tensorboard_trace_handler(out))


def _worker(rank: int, world_size: int, init_file: str, config: dict, steps: int, slow_rank: int | None = None,
            slow_s: float = 0.0, plain_torch: bool = False, ddp: bool = False) -> None:
    import torch
    import torch.distributed as dist

    import distprof

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(rank)
        if ddp:
            # Wider layers in small buckets: several all-reduces per backward, running on gloo's threads
            # while backward goes on, as in real DDP jobs.
            model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                        torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 10))
            model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.1)
        else:
            model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        if plain_torch:
            prof = _plain_torch_profiler(config["save_path"], min(config["steps"]), max(config["steps"]))
            annotate = torch.profiler.record_function
        else:
            prof = distprof.Profiler(distprof.ProfilerConfig.from_dict(config), role="train")
            annotate = distprof.annotate
        with prof:
            for _ in range(steps):
                with annotate("train/data"):
                    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
                    if rank == slow_rank:
                        time.sleep(slow_s)  # a straggler (slow data): the others wait for it in the all-reduce
                with annotate("train/forward"):
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                with annotate("train/backward"):
                    loss.backward()  # with DDP, the gradient all-reduces run here
                if not ddp:
                    with annotate("train/allreduce"):
                        for p in model.parameters():
                            dist.all_reduce(p.grad)
                            p.grad /= world_size
                with annotate("train/optimizer"):
                    opt.step()
                    opt.zero_grad()
                prof.step()
    finally:
        dist.destroy_process_group()
    # torch 2.13 (CPU) aborts about one process exit in fifteen after a gloo job, profiler on or off:
    # "terminate called without an active exception" from a C++ destructor once Python has finalized.
    # The work is done and every file is written by now, so skip interpreter teardown.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(out: str, steps: int = 6, world_size: int = 2, config: dict | None = None,
        slow_rank: int | None = None, slow_s: float = 0.0, plain_torch: bool = False, ddp: bool = False,
        start_method: str = "spawn") -> DemoResult:
    """Run the job in ``world_size`` fresh processes and return what it wrote under ``out``.

    ``config`` entries override the demo's profiler config (all ranks, two steps near the end). With
    ``plain_torch``, each rank profiles those steps with torch.profiler and tensorboard_trace_handler
    instead (traces named ``{host}_{pid}.{time}.pt.trace.json``, no manifest), as a job without distprof.
    ``slow_rank`` sleeps ``slow_s`` in its ``train/data`` phase every step. With ``ddp``, the model is wrapped
    in DistributedDataParallel (small buckets: several overlapping all-reduces per backward).
    ``start_method`` is multiprocessing's: the tests pass ``"forkserver"``, with a server that has imported torch
    already, instead of two interpreters importing it per job.
    """
    import msgspec
    import torch.multiprocessing as mp

    from distprof.rundir.store import manifest_records

    config = {"enable": True, "save_path": out, "ranks": "all", "steps": [max(steps - 3, 1), max(steps - 2, 1)],
              "torch": {"activities": ["cpu"]}, **(config or {})}
    scratch = tempfile.mkdtemp(prefix="distprof-rdzv-")
    try:
        mp.start_processes(_worker, args=(world_size, rendezvous_file(scratch), config, steps, slow_rank, slow_s,
                                          plain_torch, ddp),
                           nprocs=world_size, join=True, start_method=start_method)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    files = [msgspec.to_builtins(r) for r in manifest_records(out)]
    return DemoResult(run_dir=os.path.abspath(out), world_size=world_size, steps=steps, files=files)
