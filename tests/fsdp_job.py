"""A 2-process FSDP2 job over gloo on CPU, optionally profiled by distprof, for tests/test_fsdp_offload.py.

    python fsdp_job.py RESULT_JSON OFFLOAD [--profile SAVE_PATH] [--flags a,b] [--steps N] [--window A,B]
                       [--final-offload] [--plain]

OFFLOAD says how the sharded parameters leave the compute device between steps:
  policy  FSDP2's own ``CPUOffloadPolicy`` (parameters live on the host; FSDP copies them in for all-gather).
  manual  what verl's and SkyRL's colocated trainers do without it (``offload_fsdp2_model_to_cpu`` /
          ``load_fsdp2_model_to_gpu``): ``model.cpu()`` after each step and ``model.to(device)`` before
          the next. Both go through ``nn.Module._apply``, which replaces FSDP2's DTensor parameters with
          ``torch.utils.swap_tensors``; on this CPU-only machine the device is the host too, but the swap
          (the part that fails under the profiler) runs exactly as on a GPU.

``--flags`` lists the torch.profiler flags turned on (record_shapes, profile_memory, with_stack, with_flops,
with_modules). ``--plain`` profiles the same window with torch.profiler directly instead of distprof (with
``--profile`` as its trace directory). Every rank trains the same seeded model on its own seeded batches and
RESULT_JSON gets, per rank: the loss of every step, a hash of each full (all-gathered) parameter at the
end, and the error that stopped training, if any, with the step it happened in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback
from datetime import timedelta

FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


def _worker(rank: int, world: int, init_file: str, args: argparse.Namespace, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    import distprof

    logging.basicConfig(level=logging.WARNING, format=f"rank{rank} %(name)s %(levelname)s %(message)s")
    # A bounded timeout: a rank that fails alone must not leave its peer waiting forever in a collective.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    result: dict = {"rank": rank, "losses": [], "error": None}
    try:
        mesh = init_device_mesh("cpu", (world,))
        device = torch.device("cpu")
        torch.manual_seed(0)  # the same initial model on every rank, as FSDP expects
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                    torch.nn.ReLU(), torch.nn.Linear(32, 4))
        # pin_memory needs CUDA; on a CPU-only build FSDP2's CPUOffloadPolicy works only without it.
        policy = CPUOffloadPolicy(pin_memory=False) if args.offload == "policy" else OffloadPolicy()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh, offload_policy=policy)
        fully_shard(model, mesh=mesh, offload_policy=policy)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)

        flags = set(filter(None, args.flags.split(",")))
        unknown = flags - set(FLAGS)
        if unknown:
            raise SystemExit(f"unknown --flags {sorted(unknown)}; use {', '.join(FLAGS)}")
        first, last = (int(s) for s in args.window.split(","))
        if args.plain:
            # The same window with torch.profiler as users wire it by hand (no distprof): the upstream behaviour.
            prof = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], **{f: f in flags for f in FLAGS},
                schedule=torch.profiler.schedule(wait=max(first - 1, 0), warmup=1 if first else 0,
                                                 active=last - first + 1, repeat=1),
                on_trace_ready=torch.profiler.tensorboard_trace_handler(args.profile))
        else:
            # on_error="raise": a fault inside distprof reaches the result instead of being logged away.
            config = distprof.ProfilerConfig(
                enable=args.profile is not None, save_path=args.profile, ranks="all",
                steps=list(range(first, last + 1)), torch={"activities": ["cpu"], **{f: f in flags for f in FLAGS}},
                on_error="raise")
            prof = distprof.Profiler(config, role="train")
        gen = torch.Generator().manual_seed(1000 + rank)
        with prof:
            for step in range(args.steps):
                result["step"] = step
                if args.offload == "manual" and step > 0:
                    model.to(device)  # load_fsdp2_model_to_gpu
                x = torch.randn(8, 16, generator=gen)
                y = torch.randn(8, 4, generator=gen)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                result["losses"].append(loss.item())
                if args.offload == "manual":
                    model.cpu()  # offload_fsdp2_model_to_cpu: frees the device for the colocated engine
                prof.step()
            if args.final_offload:
                # After the last window has closed, while the profiler is still started (as before a
                # checkpoint, or handing the device to a colocated engine at the end of an RL iteration).
                result["step"] = "final_offload"
                model.cpu()
        result.pop("step")
        with torch.no_grad():  # the full (all-gathered) trained parameters, bit for bit
            result["params"] = [hashlib.sha256(p.full_tensor().numpy().tobytes()).hexdigest()
                                for p in model.parameters()]
    except Exception as e:  # noqa: BLE001 - reported to the test, which asserts on it
        result["error"] = {"type": type(e).__name__, "message": str(e),
                           "cause": str(e.__cause__) if e.__cause__ is not None else None,
                           "traceback": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if result["error"] is None:
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 2.13 (CPU) sometimes aborts in a C++ destructor at interpreter teardown after a gloo job
    # (see distprof.demo.gloo_job); every result is written by now, so skip the teardown.
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("result")
    ap.add_argument("offload", choices=["policy", "manual"])
    ap.add_argument("--profile", default=None, help="distprof save_path; without it the job runs unprofiled")
    ap.add_argument("--flags", default="")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--window", default="2,3")
    ap.add_argument("--final-offload", action="store_true", help="model.cpu() once after the loop")
    ap.add_argument("--plain", action="store_true", help="profile with torch.profiler directly, not distprof")
    args = ap.parse_args(argv)

    import torch.multiprocessing as mp

    scratch = tempfile.mkdtemp(prefix="fsdp-job-")
    try:
        mp.start_processes(_worker, args=(2, os.path.join(scratch, "rendezvous"), args, scratch), nprocs=2,
                           join=True, start_method="spawn")
        ranks = []
        for r in range(2):
            with open(os.path.join(scratch, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(args.result, "w") as f:
        json.dump({"ranks": ranks}, f)


if __name__ == "__main__":
    main()
