"""A 2-process FSDP2 job over gloo on CPU, for tests/test_fsdp_offload.py: several training runs, one after another.

    python fsdp_job.py OUT_DIR VARIANTS_JSON

VARIANTS_JSON is a list of runs, each ``{"name": ..., "offload": "policy"|"manual", "profiler": null|"distprof"|
"plain", "flags": [...], "final_offload": false, "steps": 5, "window": [2, 3]}`` (only name and offload needed).
Each run trains a fresh seeded model in the same two processes (one process group; launching the processes is most
of the cost), with its traces under OUT_DIR/NAME. A run that fails ends the job: its peer may be left inside a
collective. So a run expected to fail goes last.

offload says how the sharded parameters leave the compute device between steps:
  policy  FSDP2's own ``CPUOffloadPolicy`` (parameters live on the host; FSDP copies them in for all-gather).
  manual  what verl's and SkyRL's colocated trainers do without it (``offload_fsdp2_model_to_cpu`` /
          ``load_fsdp2_model_to_gpu``): ``model.cpu()`` after each step and ``model.to(device)`` before
          the next. Both go through ``nn.Module._apply``, which replaces FSDP2's DTensor parameters with
          ``torch.utils.swap_tensors``; on this CPU-only machine the device is the host too, but the swap
          (the part that fails under the profiler) runs exactly as on a GPU.

flags lists the torch.profiler flags turned on (record_shapes, profile_memory, with_stack, with_flops,
with_modules). profiler ``plain`` profiles the same window with torch.profiler directly instead of distprof, null
runs unprofiled. final_offload moves the model once more (``model.cpu()``) after the loop, the profiler still
started. Every rank trains the same seeded model on its own seeded batches and OUT_DIR/result.json gets, per run
and rank: the loss of every step, a hash of each full (all-gathered) parameter at the end, the error that stopped
training, if any, with the step it happened in, and the warnings distprof logged during the run.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import traceback
from datetime import timedelta

import warmfork

FLAGS = ("record_shapes", "profile_memory", "with_stack", "with_flops", "with_modules")


class _Warnings(logging.Handler):
    """distprof's warnings during one run (on the root logger: it changes nothing of how distprof logs)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        if record.name.startswith("distprof"):
            self.messages.append(record.getMessage())


def _train(rank: int, mesh, v: dict, out_dir: str) -> dict:
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    import distprof

    result: dict = {"rank": rank, "losses": [], "error": None}
    device = torch.device("cpu")
    torch.manual_seed(0)  # the same initial model on every rank, as FSDP expects
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32),
                                torch.nn.ReLU(), torch.nn.Linear(32, 4))
    # pin_memory needs CUDA; on a CPU-only build FSDP2's CPUOffloadPolicy works only without it.
    policy = CPUOffloadPolicy(pin_memory=False) if v["offload"] == "policy" else OffloadPolicy()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, offload_policy=policy)
    fully_shard(model, mesh=mesh, offload_policy=policy)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    flags = set(v.get("flags", ()))
    unknown = flags - set(FLAGS)
    if unknown:
        raise SystemExit(f"unknown flags {sorted(unknown)}; use {', '.join(FLAGS)}")
    first, last = v.get("window", (2, 3))
    save = os.path.join(out_dir, v["name"])
    if v.get("profiler") == "plain":
        # The same window with torch.profiler as users wire it by hand (no distprof): the upstream behaviour.
        prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], **{f: f in flags for f in FLAGS},
            schedule=torch.profiler.schedule(wait=max(first - 1, 0), warmup=1 if first else 0,
                                             active=last - first + 1, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(save))
    else:
        # on_error="raise": a fault inside distprof reaches the result instead of being logged away.
        config = distprof.ProfilerConfig(
            enable=v.get("profiler") == "distprof", save_path=save, ranks="all", steps=list(range(first, last + 1)),
            torch={"activities": ["cpu"], **{f: f in flags for f in FLAGS}}, on_error="raise")
        prof = distprof.Profiler(config, role="train")
    gen = torch.Generator().manual_seed(1000 + rank)
    try:
        with prof:
            for step in range(v.get("steps", 5)):
                result["step"] = step
                if v["offload"] == "manual" and step > 0:
                    model.to(device)  # load_fsdp2_model_to_gpu
                x = torch.randn(8, 16, generator=gen)
                y = torch.randn(8, 4, generator=gen)
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                result["losses"].append(loss.item())
                if v["offload"] == "manual":
                    model.cpu()  # offload_fsdp2_model_to_cpu: frees the device for the colocated engine
                prof.step()
            if v.get("final_offload"):
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
    return result


def _worker(rank: int, world: int, init_file: str, variants: list[dict], out_dir: str, scratch: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    logging.basicConfig(level=logging.WARNING, format=f"rank{rank} %(name)s %(levelname)s %(message)s")
    # A bounded timeout: a rank that fails alone must not leave its peer waiting forever in a collective.
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (world,))
    results: dict = {}
    for v in variants:
        warnings = _Warnings()
        logging.getLogger().addHandler(warnings)
        try:
            results[v["name"]] = _train(rank, mesh, v, out_dir)
        finally:
            logging.getLogger().removeHandler(warnings)
        results[v["name"]]["warnings"] = warnings.messages
        gc.collect()  # this run's FSDP modules are gone before the next run looks for live ones
        if results[v["name"]]["error"] is not None:
            break
    with open(os.path.join(scratch, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    if all(r["error"] is None for r in results.values()):
        dist.destroy_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # torch 2.13 (CPU) sometimes aborts in a C++ destructor at interpreter teardown after a gloo job
    # (see distprof.demo.gloo_job); every result is written by now, so skip the teardown.
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    out_dir, variants = (argv if argv is not None else sys.argv[1:])
    variants = json.loads(variants)
    # The two ranks are forked from a server that imported torch (tests/jobs/warmfork.py); this process imports none.
    ctx = warmfork.context(warmfork.PRELOAD + ["torch.distributed.fsdp", "torch.distributed.device_mesh"],
                           whole_env=True)
    scratch = tempfile.mkdtemp(prefix="fsdp-job-")
    try:
        codes = warmfork.run_ranks(ctx, _worker, lambda r: (r, 2, os.path.join(scratch, "rendezvous"), variants,
                                                            out_dir, scratch), 2)
        if codes != [0, 0]:
            raise SystemExit(f"a rank failed: exit codes {codes}")
        ranks = []
        for r in range(2):
            with open(os.path.join(scratch, f"rank{r}.json")) as f:
                ranks.append(json.load(f))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(os.path.join(out_dir, "result.json"), "w") as f:
        json.dump({name: [r.get(name) for r in ranks] for name in ranks[0]}, f)


if __name__ == "__main__":
    main()
