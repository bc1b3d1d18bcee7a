"""A 4-rank gloo job in which some ranks stop entering collectives at a chosen step, for tests/e2e/test_hang_e2e.py.

``python hang_job.py OUT SPEC STEP STEPS TIMEOUT_S``: every rank runs ``STEPS`` steps of ``train/data`` (a short
sleep), ``train/compute`` and ``train/allreduce`` (one gloo all-reduce), then ``prof.step()``, with hang evidence
on (``hang.timeout_s`` TIMEOUT_S) and capture windows at step 1 and at STEP on every rank. SPEC says what goes
wrong, per rank, from step STEP on, inside ``train/data``:

- ``R:sleep``: rank R sleeps for 120 s (a Python-level stall: the watchdog thread runs);
- ``R:lock``: rank R acquires a lock it holds (a deadlock);
- ``R:cfunc``: rank R calls libc ``sleep`` through ``ctypes.PyDLL``, which keeps the GIL: no Python thread runs,
  only faulthandler's C watchdog can write its stacks;
- ``R:slow=S``: rank R sleeps S s more in every step from STEP on (slow, but it goes on).

The others block in the all-reduce, so the test kills the job (its process group: the parent makes one) once the
evidence is there. A job with only ``slow`` ranks ends by itself. Every stall and the gloo timeout end after 120 s:
a job the test failed to kill ends by itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import os
import sys
import threading
import time


def stall(mode: str) -> None:
    if mode == "sleep":
        time.sleep(120)
    elif mode == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire(timeout=120)  # never takes it: the lock is ours
    elif mode == "cfunc":
        ctypes.PyDLL(ctypes.util.find_library("c")).sleep(120)  # PyDLL: the GIL stays held


def worker(rank: int, world: int, init: str, out: str, spec: dict, at: int, steps: int, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    import distprof

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    torch.set_num_threads(1)
    cfg = distprof.ProfilerConfig.from_dict({
        "enable": True, "save_path": out, "ranks": "all", "steps": [1, at], "torch": {"activities": ["cpu"]},
        "hang": {"enabled": True, "timeout_s": timeout_s}})
    prof = distprof.Profiler(cfg, role="train", rank=rank, world_size=world)
    mode = spec.get(rank, "")
    x = torch.ones(64)
    with prof:
        for step in range(steps):
            with distprof.annotate("train/data"):
                time.sleep(0.01)
                if step >= at and mode.startswith("slow="):
                    time.sleep(float(mode[5:]))
                elif step == at and mode:
                    stall(mode)
            with distprof.annotate("train/compute"):
                y = (x * 2).sum()
            with distprof.annotate("train/allreduce"):
                dist.all_reduce(x)
            prof.step()
    del y
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)


def main() -> None:
    import multiprocessing
    import tempfile

    out, spec_s, at, steps, timeout_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    spec = {int(r): m for r, _, m in (p.partition(":") for p in spec_s.split(",") if p)}
    os.setpgid(0, 0)  # one process group: the test kills the job, ranks included, with one killpg
    init = os.path.join(tempfile.mkdtemp(prefix="distprof-hang-"), "rendezvous")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=worker, args=(r, 4, init, out, spec, at, steps, timeout_s)) for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(abs(p.exitcode or 0) for p in procs))


if __name__ == "__main__":
    main()
