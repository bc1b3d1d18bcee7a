"""A 2-process gloo training loop that opted in to on-demand capture, for tests/test_trigger.py.

    python trigger_job.py SAVE_PATH STARTED_FILE MAX_STEPS

Opts in through the environment (the test sets DISTPROF_TRIGGER=1); the config sets no steps and no
schedule, so nothing is captured until a request comes. Rank 0 creates STARTED_FILE after the first step (the
test sends its request once it exists). The ranks keep training until every rank has written a requested
window (agreed through an all-reduce, so they stop at the same step), or MAX_STEPS. The ranks are forked from a
server that imported torch (tests/jobs/warmfork.py) with this script's environment; this process imports no torch.
"""

import os
import sys
import tempfile

import warmfork


def worker(rank: int, world: int, init_file: str, save: str, started: str, max_steps: int) -> None:
    import torch
    import torch.distributed as dist

    import distprof

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    cfg = distprof.ProfilerConfig(save_path=save, ranks="all", trigger_poll_s=0, torch={"activities": ["cpu"]})
    assert cfg.trigger, "the test opts in with DISTPROF_TRIGGER=1"
    model = torch.nn.Linear(16, 16)
    with distprof.Profiler(cfg, role="train", rank=rank, world_size=world) as prof:
        for step in range(max_steps):
            with distprof.annotate("train/compute"):
                model(torch.randn(8, 16)).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            prof.step()
            if step == 0 and rank == 0:
                open(started, "w").close()
            done = torch.tensor([1 if prof.windows_closed else 0])
            dist.all_reduce(done, op=dist.ReduceOp.MIN)
            if done.item():
                break
    print(f"rank {rank} stopped at step {prof.global_step}", flush=True)
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # torch 2.13 CPU sometimes aborts in gloo teardown after the work is done (see demo/gloo_job.py)


if __name__ == "__main__":
    save, started, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ctx = warmfork.context(whole_env=True)  # the ranks see DISTPROF_TRIGGER as the test set it
    with tempfile.TemporaryDirectory() as scratch:
        codes = warmfork.run_ranks(ctx, worker, lambda r: (r, 2, os.path.join(scratch, "rdzv"), save, started,
                                                           max_steps), 2)
    if codes != [0, 0]:
        sys.exit(f"a rank failed: exit codes {codes}")
