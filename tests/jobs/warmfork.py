"""Real child processes without a torch import apiece: forked from one server process that imported torch once.

A spawned process (or a fresh ``python``) imports torch (about 2 s of CPU) and, when its first torch.profiler
window opens, torch._inductor too (torch.profiler's ``prepare_trace`` asks ``hasattr(torch, "_inductor")``,
which imports it with torch._dynamo: 1.5 to 3 s more). On a busy 2-core machine that is most of what a test
starting several processes costs. Processes from :func:`context` are real, separate processes all the same (each
its own pid, torch.profiler session, gloo connections and exit), forked from a server that imported those modules
and ran nothing else.

Only for children that start as a ``multiprocessing`` target (its children end as multiprocessing ends them, with
``os._exit``: no ``atexit``): a job whose end is the test's subject (an uncaught exception, ``sys.exit``, a
signal; tests/jobs/crash_job.py, chaos_job.py) starts as ``python SCRIPT`` through :mod:`warmpython`, which ends
it as an interpreter ends.
This module imports no torch itself, so a job script's parent process can use it and stay light.
"""

import multiprocessing
import multiprocessing.connection
import os
from multiprocessing import forkserver

PRELOAD = ["torch", "torch._inductor", "torch.distributed", "distprof", "distprof.capture.backends.torch_backend"]

# What a server started by a test process leaves out of its environment: a test's children get their rank and
# distprof settings as arguments, never from whatever the first test to start the server had set.
_NOT_INHERITED = ("DISTPROF_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def context(preload=PRELOAD, whole_env=False):
    """The ``forkserver`` context, its server started now (importing ``preload``) if it is not running yet.

    The server (one per process that calls this) keeps the environment it started with for every child it forks
    later: less distprof's and torch.distributed's variables, or all of it with ``whole_env`` (a job script
    whose children read the environment the test gave the script).
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(preload))
    saved = {} if whole_env else {k: os.environ.pop(k) for k in list(os.environ) if k.startswith(_NOT_INHERITED)}
    try:
        forkserver.ensure_running()
    finally:
        os.environ.update(saved)
    return ctx


def run_ranks(ctx, target, args_of_rank, world: int) -> list[int]:
    """Start ``target(*args_of_rank(rank))`` for every rank, wait for all, and return their exit codes.

    As torch.multiprocessing.start_processes does: once a rank fails, the others are terminated rather than left
    waiting for it in a collective.
    """
    procs = [ctx.Process(target=target, args=args_of_rank(rank)) for rank in range(world)]
    for p in procs:
        p.start()
    running = list(procs)
    while running:
        multiprocessing.connection.wait([p.sentinel for p in running])
        for p in [p for p in running if p.exitcode is not None]:
            running.remove(p)
            if p.exitcode != 0:
                for other in running:
                    other.terminate()
    for p in procs:
        p.join()
    return [p.exitcode for p in procs]
