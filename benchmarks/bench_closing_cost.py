"""The closing step's cost per byte of a window's estimated trace: the constants of the export budget.

``max_export_share`` (distprof.capture.budget) estimates, at a step end of an open window, what closing it would
hold the training thread: the memory guard's trace estimate (C heap growth x 1.4) times seconds per estimated
byte. This script measures those seconds per byte on this machine, for both ways a window is written:

- ``background`` (``torch.background_export``, the default): the closing step runs torch's ``stop()``, frees its
  results and forks the child that writes the files;
- ``inline`` (``background_export: false``, or a window closed by ``stop()`` / exit): the whole export.

One process, CPU, windows of 1,000 small ops per step (x3 events) with stacks, shapes and memory, as in
``bench_export.py``; each window's estimate is read just before the ``step()`` that closes it, and that
``step()`` is timed. Run: python benchmarks/bench_closing_cost.py [--quick]. Prints one row per window and the
largest seconds per estimated byte of each way (the constant should be at or above it: the estimate errs high).
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one window size, once")
    ap.add_argument("--ops", type=int, default=1000, help="small ops per step (x3 events)")
    args = ap.parse_args()

    import torch

    import distprof
    from distprof.capture.budget import SECONDS_PER_TRACE_BYTE

    torch.set_num_threads(1)
    heavy = {"activities": ["cpu"], "record_shapes": True, "with_stack": True, "profile_memory": True}
    sizes = [3] if args.quick else [1, 3, 5]
    x, w = torch.randn(64, 64), torch.randn(64, 64) * 0.1
    worst: dict[str, float] = {}
    print(f"CPU, {args.ops} small ops per step, stacks + shapes + memory; torch {torch.__version__}")
    print(f"{'way':<11} {'steps':>5} {'estimate':>10} {'trace JSON':>11} {'closing step()':>15} {'s / est. byte':>14}")
    with tempfile.TemporaryDirectory() as out:
        for k in sizes:
            for way in ("background", "inline"):
                save = os.path.join(out, f"{way}{k}")
                # max_trace_mb far out of reach: the memory guard samples (its estimate is read here), never fires;
                # max_export_share null: the budget never shortens the measured window.
                cfg = distprof.ProfilerConfig(enable=True, save_path=save, steps=f"3-{2 + k}", max_trace_mb=1e9,
                                              max_export_share=None,
                                              torch={**heavy, "background_export": way == "background"})
                p = distprof.Profiler(cfg, rank=0, world_size=1).start()
                closing = est = 0.0
                while p.global_step <= 2 + k:
                    for _ in range(args.ops):
                        x = torch.tanh(x @ w) * 0.5
                    if p.global_step == 2 + k:
                        guard = p._mem_guard
                        est = guard.trace_estimate(guard._proc.memory_info().rss)
                        t0 = time.perf_counter()
                        p.step()
                        closing = time.perf_counter() - t0
                    else:
                        p.step()
                p.stop()
                trace = [os.path.join(r, f) for r, _, fs in os.walk(save) for f in fs if f.endswith(".json.gz")]
                size = len(gzip.open(trace[0]).read()) if trace else 0
                per = closing / est if est else float("nan")
                worst[way] = max(worst.get(way, 0.0), per)
                print(f"{way:<11} {k:>5} {est / 1e6:>7.1f} MB {size / 1e6:>8.1f} MB {closing * 1e3:>12.0f} ms "
                      f"{per * 1e9:>11.2f} ns")
    for way, per in worst.items():
        print(f"{way}: largest {per * 1e9:.2f} ns per estimated byte; distprof uses "
              f"{SECONDS_PER_TRACE_BYTE[way] * 1e9:g} ns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
