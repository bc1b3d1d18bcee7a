"""Checks that need a CUDA device, for a GPU machine (written for one H100):

    python benchmarks/gpu_smoke.py [CHECK ...] [--out DIR]

Each check prints one short line per expectation (``ok`` or ``FAIL``) and the figures it measured; the script
exits 1 when an expectation fails, 2 when this machine has no CUDA device. Needs only torch and distprof; the
whole script runs in well under 2 minutes on an H100. Checks (all by default; name some to run only those):

- ``cost`` (issue 18, items 1 and 2): a plain loop profiled on steps [10, 11] with stacks, shapes and memory:
  the manifest's ``export_s`` and the ``profiling_cost`` row (reliable, reason, figures) from
  ``distprof.analysis.analyze.summary``. Issue 22: the window is written by a child forked from this CUDA process
  (no fallback warning), and the closing step is within 50 ms of an unprofiled step.
- ``cost_big``: the same on a 12-step window (steps 10-21) of a 4-layer TransformerEncoder (d=512, AdamW), the
  size of window whose export the issue measured at 4.86 s.
- ``ddp`` (issue 18, items 14 and 15): two ranks on one GPU, DDP over gloo with CUDA tensors, rank 1 sleeping 80 ms
  in ``train/data`` every step (the job behind ``distprof-h100/ddp-gloo-cuda-slow-rank1``), profiled on steps 10-12:
  diagnose must name rank 1 and ``train/data``, must not call it launch-bound, and every analysis must count the
  gloo collectives as communication.
- ``flops`` (issue 23): FLOPs from shapes, achieved TFLOP/s and MFU on a bf16 MLP whose FLOPs per step are known
  analytically (``summary``'s ``flops`` rows must equal them exactly).
- ``oom`` (issue 18, item 12): a real CUDA out-of-memory error under ``backend: cuda_memory`` (allocate until
  the device is full, catch it, go on): the snapshot's manifest line and what ``check_run`` says of each file.
  Issue 23: the memory answers of that real OOM snapshot (``summary``'s ``memory`` rows, :func:`check_memory_answers`,
  which tests/unit/analysis/test_memory_smoke.py runs on a stand-in snapshot without a GPU): the peak at least what
  was held, the request exactly the 2 GiB block that failed, a phase (the ``fill`` annotation, where torch records
  annotations in snapshots) or the allocating frame named, and diagnose's ``oom`` finding.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

FAILED: list[str] = []


def expect(name: str, cond: bool, detail: str = "") -> None:
    print(f"{'ok  ' if cond else 'FAIL'} {name}" + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        FAILED.append(name)


def check_cost(out: str, big: bool = False) -> None:
    import torch

    import distprof
    from distprof.analysis import analyze
    from distprof.rundir.store import manifest_records

    run = os.path.join(out, "cost-big" if big else "cost")
    last = 21 if big else 11  # big: a 12-step window, as the 4.86 s export on an H100
    cfg = distprof.ProfilerConfig(enable=True, save_path=run, steps=f"10-{last}",
                                  torch={"record_shapes": True, "profile_memory": True, "with_stack": True})
    torch.manual_seed(0)
    if big:  # the 4-layer TransformerEncoder of distprof-h100/transformer-fp32 (d=512, fp32, AdamW)
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 4).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        x = torch.randn(32, 256, 512, device="cuda")
    else:
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(512, 2048, device="cuda")
    import logging

    said: list[str] = []
    hear = logging.Handler()
    hear.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("distprof").addHandler(hear)
    prof = distprof.Profiler(cfg)
    wall = []  # each step as the loop sees it, prof.step() (and the export in it) included
    with prof:
        for _ in range(last + 3):
            t0 = time.perf_counter()
            with distprof.annotate("train/step"):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
                torch.cuda.synchronize()
            prof.step()
            wall.append(time.perf_counter() - t0)
    recs = manifest_records(run)
    expect("cost: one window", [r.steps for r in recs] == [[10, last]], str([r.steps for r in recs]))
    if not recs:
        return
    rec = recs[0]
    print(f"     manifest: export_s {rec.export_s}, {rec.bytes} bytes, baseline steps {rec.baseline_step_numbers}, "
          f"baseline ms {[round(t * 1e3, 2) for t in rec.baseline_times_s]}, "
          f"profiled ms {[round(t * 1e3, 2) for t in rec.step_times_s]}; loop's closing step {wall[last]:.3f} s")
    expect("cost: export_s recorded", rec.export_s is not None and rec.export_s > 0, f"{rec.export_s} s")
    # Issue 22: the window is written by a child forked from this CUDA process (background_export, the default).
    fell_back = [m for m in said if "in this process instead" in m]
    expect("cost: the forked child wrote the window (no fallback)", not fell_back, "; ".join(fell_back)[:300])
    others = sorted(wall[3:last] + wall[last + 1:])
    extra = wall[last] - others[len(others) // 2]
    expect("cost: the closing step within 50 ms of an unprofiled step", extra <= 0.05, f"{extra * 1e3:.0f} ms more")
    expect("cost: the closing step held the loop at least export_s", rec.export_s is not None and wall[last] >= rec.export_s,
           f"step {last} took {wall[last]:.3f} s in the loop")
    expect("cost: baseline is steps 3-8 (0-2 warm-up, 9 the window's warm-up)",
           rec.baseline_step_numbers == list(range(3, 9)), str(rec.baseline_step_numbers))
    s = analyze.summary(run)
    (row,) = s["profiling_cost"] or [None]
    expect("cost: one profiling_cost row", row is not None)
    if row is None:
        return
    fig = "-" if row["inflation"] is None else f"{row['inflation']:+.1%}"
    spread = "-" if row["baseline_spread"] is None else f"{row['baseline_spread']:.2f}x"
    ms = {k: "-" if row[k] is None else f"{row[k] * 1e3:.2f} ms" for k in ("baseline_s", "profiled_s")}
    print(f"     profiling_cost: reliable {row['reliable']}, inflation {fig}, baseline {ms['baseline_s']}, "
          f"profiled {ms['profiled_s']}, spread {spread}, export_s {row['export_s']}")
    print(f"     reason: {row['reason']}")
    expect("cost: reliable on a steady GPU loop", row["reliable"] is True, row["reason"])
    expect("cost: a figure exactly when reliable", (row["inflation"] is not None) == row["reliable"])
    expect("cost: export_s carried into profiling_cost", row["export_s"] == rec.export_s)
    expect("cost: device kernels in the trace", bool(s["kernels"]), f"{len(s['kernels'])} kernel names")


def check_flops(out: str) -> None:
    """Issue 23: FLOPs from shapes and MFU on a bf16 MLP whose FLOPs are known: L bias-free d x d layers on a
    (B, d) batch, the input not requiring grad: per step the forward's L GEMMs, the weight gradients' L and the
    input gradients' L - 1 (none for the first layer), each 2 B d^2 FLOPs."""
    import torch

    import distprof
    from distprof.analysis import analyze

    run = os.path.join(out, "flops")
    B, d, L = 4096, 4096, 8
    want = 2 * B * d * d * (3 * L - 1)
    model = torch.nn.Sequential(*[torch.nn.Linear(d, d, bias=False) for _ in range(L)]).cuda().to(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(B, d, device="cuda", dtype=torch.bfloat16)
    cfg = distprof.ProfilerConfig(enable=True, save_path=run, steps="10-11", torch={"record_shapes": True})
    wall = []
    with distprof.Profiler(cfg) as prof:
        for _ in range(13):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with distprof.annotate("train/step"):
                model(x).float().square().mean().backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize()
            wall.append(time.perf_counter() - t0)
            prof.step()
    s = analyze.summary(run)
    rows = [r for r in s.get("flops", []) if r.get("step") in (10, 11)]
    expect("flops: a row per recorded step", [r["step"] for r in rows] == [10, 11], str(s.get("flops"))[:300])
    for r in rows:
        expect(f"flops: step {r['step']} FLOPs from shapes = 2 B d^2 (3L - 1)", r["flops"] == want,
               f"{r['flops']:.4e} against {want:.4e}")
        expect(f"flops: step {r['step']} dtype bf16, a peak from the table", r["dtype"] == "bf16" and
               bool(r["peak_tflops"]), f"{r['dtype']}, {r['peak_tflops']} TFLOP/s on {r.get('device')}")
        mfu = r["mfu"]
        expect(f"flops: step {r['step']} MFU between 0 and 1", mfu is not None and 0 < mfu < 1,
               f"{r['tflops_per_s']:.1f} TFLOP/s, MFU {mfu:.1%}" if mfu is not None else "none")
    unprof = sorted(wall[3:9])[3]
    print(f"     analytic: {want / unprof / 1e12:.1f} TFLOP/s on an unprofiled step ({unprof * 1e3:.2f} ms)")


def _ddp_worker(rank: int, init_file: str, run: str) -> None:
    import torch
    import torch.distributed as dist

    import distprof

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
    model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    cfg = distprof.ProfilerConfig(enable=True, save_path=run, ranks="all", steps="10-12")
    with distprof.Profiler(cfg, role="trainer") as prof:
        for _ in range(16):
            with distprof.annotate("train/data"):
                x = torch.randn(256, 1024, device="cuda")
                if rank == 1:
                    time.sleep(0.08)  # the straggler: slow data on rank 1
            with distprof.annotate("train/forward"):
                loss = model(x).square().mean()
            with distprof.annotate("train/backward"):
                loss.backward()
            with distprof.annotate("train/optimizer"):
                opt.step()
                opt.zero_grad()
            prof.step()
    dist.destroy_process_group()


def check_ddp(out: str) -> None:
    import torch.multiprocessing as mp

    from distprof.analysis import analyze
    from distprof.analysis.diagnose import diagnose

    run = os.path.join(out, "ddp")
    mp.start_processes(_ddp_worker, args=(os.path.join(out, "rdzv"), run), nprocs=2, join=True, start_method="spawn")
    inv = analyze.investigate(run)
    found = diagnose(inv)
    for f in found:
        print(f"     finding {f.id}: {f.claim[:150]}")
    ids = [f.id for f in found]
    strag = [f for f in found if f.id == "straggler"]
    expect("ddp: straggler is rank 1 in train/data",
           bool(strag) and strag[0].evidence.ranks[:1] == [1] and "train/data" in strag[0].evidence.names,
           str((strag[0].evidence.ranks, strag[0].evidence.names) if strag else ids))
    expect("ddp: not launch-bound (the host sleeps and all-reduces)", "launch_bound" not in ids, str(ids))
    s = analyze.summary(run)
    comm = {r["rank"]: (r.get("temporal") or {}).get("device", {}).get("communication_us") for r in s.get("ranks", [])}
    print(f"     device communication us per rank: {comm}")
    expect("ddp: device communication counted on rank 0 (gloo collectives)", (comm.get(0) or 0) > 0, str(comm))
    for row in s.get("profiling_cost") or []:
        print(f"     profiling_cost rank {row['rank']}: reliable {row['reliable']}, inflation {row['inflation']}, "
              f"export_s {row['export_s']}; {row['reason']}")


def check_oom(out: str) -> None:
    import torch

    import distprof
    from distprof.analysis.check import check_run
    from distprof.rundir.store import manifest_records

    run = os.path.join(out, "oom")
    cfg = distprof.ProfilerConfig(enable=True, backend="cuda_memory", save_path=run, steps=[2, 3])
    prof = distprof.Profiler(cfg)
    held = None
    with prof:
        for _ in range(5):
            a = torch.randn(1024, 1024, device="cuda")
            (a @ a).sum().item()
            if prof.global_step == 3:  # step 3: fill the device in 2 GiB blocks until CUDA says no
                blocks = []
                try:
                    with distprof.annotate("fill"):
                        while len(blocks) < 4096:
                            blocks.append(torch.empty(2 << 30, dtype=torch.uint8, device="cuda"))
                except torch.cuda.OutOfMemoryError:
                    held = len(blocks) * 2
                finally:
                    del blocks
                    torch.cuda.empty_cache()
            prof.step()
    expect("oom: a real CUDA OOM was raised and caught", held is not None, f"after {held} GiB")
    recs = manifest_records(run)
    oom = [r for r in recs if r.stopped_by == "oom"]
    expect("oom: one manifest line with stopped_by: oom", len(oom) == 1, str([(r.steps, r.stopped_by, r.file) for r in recs]))
    if oom:
        r = oom[0]
        expect("oom: the line names the snapshot, steps [2, 3], complete false",
               (r.steps, r.complete, os.path.basename(r.file or "").startswith("oom-")) == ([2, 3], False, True),
               f"{r.file}, {r.bytes} bytes")
    res = check_run(run)
    for item in res.items:
        print(f"     check: {item.status} {item.steps} {item.file}: {item.detail}")
    expect("oom: check_run passes", res.ok, "; ".join(res.problems))
    expect("oom: nothing unlisted", not [i for i in res.items if i.status == "unlisted"])
    expect("oom: the snapshot is ok as an OOM snapshot",
           any(i.status == "ok" and "out-of-memory snapshot" in i.detail for i in res.items))
    check_memory_answers(run, request_bytes=2 << 30, held_bytes=(held or 0) << 30, phase="fill")


def check_memory_answers(run: str, request_bytes: int, held_bytes: int = 0, phase: str | None = None) -> None:
    """Issue 23's memory answers of an OOM snapshot under ``run`` (what ``summary`` and ``diagnose`` say), printed and
    checked: an OOM row, its request exactly ``request_bytes``, the peak at least ``held_bytes``, ``phase`` (or, where
    the snapshot holds no annotations, the allocating Python frame) named, and diagnose's ``oom`` finding."""
    from distprof.analysis import analyze
    from distprof.analysis.memory import NO_STACK, fmt_bytes

    rows = analyze.summary_result(run).memory or []
    for r in rows:
        print(f"     memory rank {r.rank} ({r.source}): peak {fmt_bytes(r.peak_allocated_bytes)} allocated, "
              f"{fmt_bytes(r.peak_reserved_bytes)} reserved, at step {r.at.step} phase {r.at.phase}; top: "
              + "; ".join(f"{fmt_bytes(t.bytes)} {t.frame} [{t.phase}]" for t in r.top[:3]))
        for line in r.oom.lines if r.oom else []:
            print(f"     OOM: {line}")
    ooms = [r for r in rows if r.oom is not None]
    expect("memory: the OOM snapshot has an OOM answer", len(ooms) == 1, f"{len(rows)} rows")
    if not ooms:
        return
    r, o = ooms[0], ooms[0].oom
    assert o is not None
    expect("memory: the request is the block that failed", o.request_bytes == request_bytes,
           f"{fmt_bytes(o.request_bytes)}, expected {fmt_bytes(request_bytes)}")
    expect("memory: the peak holds what was allocated", r.peak_allocated_bytes >= held_bytes,
           f"peak {fmt_bytes(r.peak_allocated_bytes)}, held {fmt_bytes(held_bytes)}")
    named = o.at.phase == phase if phase and r.at.phase is not None else bool(o.frame and o.frame != NO_STACK)
    expect("memory: a phase (or, without annotations, the allocating frame) named", named,
           f"phase {o.at.phase}, frame {o.frame}")
    ids = [f.id for f in analyze.diagnose_result(run).findings]
    expect("memory: diagnose has the oom finding", "oom" in ids, str(ids))


CHECKS = {"cost": check_cost, "cost_big": lambda out: check_cost(out, big=True), "ddp": check_ddp, "oom": check_oom,
          "flops": check_flops}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checks", nargs="*", help=f"which checks: {', '.join(CHECKS)} (default: all)")
    ap.add_argument("--out", help="where the run directories go (default: a new temporary folder)")
    args = ap.parse_args()
    if set(args.checks) - set(CHECKS):
        ap.error(f"unknown check {sorted(set(args.checks) - set(CHECKS))}; choose from {', '.join(CHECKS)}")
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: nothing checked")
        return 2
    out = args.out or tempfile.mkdtemp(prefix="distprof-gpu-smoke-")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, run directories in {out}")
    for name in args.checks or CHECKS:
        t0 = time.perf_counter()
        try:
            CHECKS[name](out)
        except Exception as e:  # a check that crashes is a failed expectation, and the others still run
            expect(f"{name}: ran without an exception", False, f"{type(e).__name__}: {e}")
        print(f"     ({name}: {time.perf_counter() - t0:.1f} s)")
    print(f"{len(FAILED)} expectation(s) failed" + (f": {', '.join(FAILED)}" if FAILED else ""))
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
