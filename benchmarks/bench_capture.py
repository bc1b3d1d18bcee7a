"""Capture overhead, measured side by side in one run (these machines are noisy).

1. Inert profiler: ``prof.step()`` + one ``with annotate(...)`` block per step, as a
   ratio to the cheapest Python stand-in (a preallocated no-op context manager plus
   a no-op method call). Target <= 1.5x.
1b. Opted in to on-demand capture (``trigger: true``), no request pending: the same
   loop on a started profiler that looks for requests every 2 s. Same target.
2. Enabled window: median step time inside a capture window under distprof, as a
   ratio to raw ``torch.profiler.profile`` with the same options and schedule.
   Target <= 1.03x.

Run: python benchmarks/bench_capture.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import timeit


class _NoopCM:
    __slots__ = ()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _NoopStep:
    def step(self):
        pass


def bench_inert(number: int, repeats: int) -> tuple[float, float, float]:
    import distprof

    prof = distprof.Profiler(distprof.ProfilerConfig())  # disabled: inert
    idle = distprof.Profiler(distprof.ProfilerConfig(trigger=True, save_path=tempfile.mkdtemp(prefix="bench-trigger-"),
                                                     torch={"activities": ["cpu"]})).start()
    annotate = distprof.annotate
    noop_cm, noop = _NoopCM(), _NoopStep()

    def floor():
        for _ in range(number):
            with noop_cm:
                pass
            noop.step()

    def inert():
        for _ in range(number):
            with annotate("actor/update"):
                pass
            prof.step()

    def opted_in():
        for _ in range(number):
            with annotate("actor/update"):
                pass
            idle.step()

    floor_t, inert_t, idle_t = [], [], []
    for _ in range(repeats):  # interleaved so drift hits all alike
        floor_t.append(timeit.timeit(floor, number=1) / number)
        inert_t.append(timeit.timeit(inert, number=1) / number)
        idle_t.append(timeit.timeit(opted_in, number=1) / number)
    idle.stop()
    return min(floor_t) * 1e9, min(inert_t) * 1e9, min(idle_t) * 1e9


def bench_enabled(steps: int, rounds: int) -> tuple[float, float]:
    import torch
    from torch.profiler import ProfilerActivity, profile, schedule

    import distprof

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(64, 256)

    def train_step():
        loss = model(x).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()

    for _ in range(20):
        train_step()
    out = tempfile.mkdtemp(prefix="bench-capture-")

    def raw() -> list[float]:
        times = []
        with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(f"{out}/raw.pt.trace.json.gz")) as p:
            for i in range(steps + 2):
                t0 = time.perf_counter()
                train_step()
                p.step()
                if 1 <= i < steps:  # recorded steps, excluding the export at the window's end
                    times.append(time.perf_counter() - t0)
        return times

    def ours(r: int) -> list[float]:
        cfg = distprof.ProfilerConfig(enable=True, save_path=f"{out}/dp{r}", steps=f"1-{steps}",
                                      torch={"activities": ["cpu"]})
        times = []
        with distprof.Profiler(cfg) as p:
            for i in range(steps + 2):
                t0 = time.perf_counter()
                train_step()
                p.step()
                if 1 <= i < steps:
                    times.append(time.perf_counter() - t0)
        return times

    raw_t, our_t = [], []
    for r in range(rounds):  # alternate which goes first, so warm-up and drift favour neither
        if r % 2:
            our_t += ours(r)
            raw_t += raw()
        else:
            raw_t += raw()
            our_t += ours(r)
    return statistics.median(raw_t) * 1e3, statistics.median(our_t) * 1e3


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer iterations (smoke test)")
    args = ap.parse_args()
    number, repeats = (50_000, 5) if args.quick else (500_000, 15)
    steps, rounds = (10, 2) if args.quick else (50, 12)

    floor_ns, inert_ns, idle_ns = bench_inert(number, repeats)
    raw_ms, our_ms = bench_enabled(steps, rounds)
    rows = [
        ("inert step() + annotate block", f"{inert_ns:.0f} ns", f"floor {floor_ns:.0f} ns", inert_ns / floor_ns, 1.5),
        ("trigger: true, no request", f"{idle_ns:.0f} ns", f"floor {floor_ns:.0f} ns", idle_ns / floor_ns, 1.5),
        ("enabled window, median step", f"{our_ms:.3f} ms", f"raw torch.profiler {raw_ms:.3f} ms", our_ms / raw_ms, 1.03),
    ]
    print(f"{'measure':32} {'distprof':>12} {'baseline':>28} {'ratio':>7} {'target':>7}")
    for name, ours_s, base_s, ratio, target in rows:
        flag = "ok" if ratio <= target else "MISSED"
        print(f"{name:32} {ours_s:>12} {base_s:>28} {ratio:>6.2f}x {target:>6.2f}x {flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
