"""SkyRL's torch profiler over distprof: the policy workers' training step on chosen ranks, and a per-rank summary.

SkyRL's `torch_profiler_config` (`enable`, `ranks`, `save_to_dir`) profiles the policy workers' training
step, and a summary RPC returns each rank's top kernels/ops. Here: 2 data-parallel policy workers (gloo, CPU)
profiled on ranks 0 and 1 for global steps 2-3, each printing the summary of its window.

    python examples/skyrl_policy_trainer.py OUT_DIR
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distprof


def worker(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    # SkyRL: trainer.policy.torch_profiler_config = {enable: true, ranks: [0, 1], save_to_dir: ...}
    config = distprof.ProfilerConfig(enable=True, ranks=[0, 1], steps="2-3", save_path=out,
                                     torch={"activities": ["cpu"]})
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with distprof.Profiler(config, role="policy") as prof:  # rank and world size from torch.distributed
        for _ in range(5):
            with distprof.annotate("policy/ppo_train"):
                loss = model(torch.randn(32, 64)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            prof.step()
    top = (prof.summary() or {}).get("ops", [])[:3]  # SkyRL's per-rank summary, from the last window
    # One write with its newline: both ranks print at once, and print()'s separate newline write could interleave.
    print(f"rank {rank}: " + ", ".join(f"{o['name']} {o['self_cpu_us']:.0f} us" for o in top) + "\n", end="", flush=True)
    dist.destroy_process_group()


def main(out: str) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(worker, args=(2, os.path.join(scratch, "rendezvous"), out), nprocs=2)


if __name__ == "__main__":
    main(sys.argv[1])
