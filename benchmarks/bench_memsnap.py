"""How to read a big CUDA memory snapshot: the C unpickler (restricted, as distprof.analysis.memsnap loads) against a
streaming walk (``pickletools.genops``), on a synthetic snapshot of about 200 MB in torch's format (built with the
tests' stand-in, tests/jobs/memsnap_standin.py). Prints one line per reader: seconds and peak RSS growth.

    PYTHONPATH=src python benchmarks/bench_memsnap.py [--mb 200] [--keep PATH]

Each reader runs in its own process so its peak memory is its own. docs/analysis.md ("Memory") has the figures.
"""

from __future__ import annotations

import argparse
import os
import pickletools
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "jobs"))


def build(path: str, mb: int) -> None:
    from memsnap_standin import Builder, frame, write

    stacks = [[frame(f"/src/model/layer{i % 40}.py", 10 + j, f"fn{j}") for j in range(12)] for i in range(2000)]
    b = Builder()
    b.segment(80 << 30)
    live: list[int] = []
    n = mb * 1_000_000 // 55  # about 55 bytes per pickled entry (frames and keys shared through the memo)
    for i in range(n // 3):
        live.append(b.alloc(4096 + (i % 977) * 512, stacks[i % len(stacks)]))
        if len(live) > 2000:
            b.free(live.pop(0))
    write(path, b.snapshot())


def peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def run_reader(kind: str, path: str) -> None:
    base = peak_kb()
    t = time.perf_counter()
    if kind == "c_unpickler":
        from distprof.analysis.memsnap import load, parse
        obj = load(path)
        t_load = time.perf_counter() - t
        n = sum(len(d.entries) for d in parse(obj, path))
        print(f"{'':12s} (load {t_load:.2f} s, parse into entries {time.perf_counter() - t - t_load:.2f} s)")
    else:
        n = 0
        with open(path, "rb") as f:
            for _op, _arg, _pos in pickletools.genops(f):
                n += 1
    dt = time.perf_counter() - t
    print(f"{kind:12s} {dt:7.2f} s  peak RSS +{(peak_kb() - base) / 1024:7.0f} MB  ({n} items)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--keep", default=None)
    ap.add_argument("--reader", default=None)
    a = ap.parse_args()
    if a.reader:
        run_reader(a.reader, a.keep)
        return
    path = a.keep or os.path.join(tempfile.mkdtemp(), "big.memory.pickle")
    if not os.path.exists(path):
        build(path, a.mb)
    print(f"snapshot: {os.path.getsize(path) / 1e6:.0f} MB")
    for kind in ("c_unpickler", "genops_walk"):
        subprocess.run([sys.executable, __file__, "--reader", kind, "--keep", path], check=True)


if __name__ == "__main__":
    main()
