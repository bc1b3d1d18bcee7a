"""Analysis speed and memory on a ~200 MB GPU trace, measured side by side in one run.

The trace is made by tiling a real GPU trace from tests/data in time (each copy shifted past the
previous one). Each measurement runs in a fresh process, so peak RSS is its own:

- floor: read the file and msgspec-decode it into the reader's typed events (nothing else),
- lean floor: the same into the lean events the analyses read (complete and metadata events in full, every
  other phase an empty placeholder): the decoding distprof itself cannot avoid,
- distprof summary: `analyze.summary` in one process (``workers=1``), what `distprof summary` computes: the trace
  streamed batch by batch into compact columns, then kernel/op/phase tables with self times, device busy time,
  temporal breakdown, comm/compute overlap and the step breakdown,
- distprof summary, 2 workers: the same with the file's events list cut into runs that 2 worker processes decode
  and reduce (``--workers 2,16`` adds a row per count, side by side) (what `distprof summary` does by default with one file on a 2-core machine); target (issue 12):
  <= 0.7x the floor, >= 15x faster than HTA, peak RSS (the largest of the three processes) below the trace's size,
- with the native decoder built (README: "The native decoder"), the two distprof rows again with it switched off
  (``DISTPROF_NATIVE=0``): the Python decoder, side by side,
- HolisticTraceAnalysis 0.5.0: `TraceAnalysis(trace_dir)` + `get_gpu_kernel_breakdown()`, when an
  interpreter with it is given (`--hta-python`); it is not a dependency of distprof.

Run: python benchmarks/bench_analysis.py [--size-mb 200] [--rounds 3] [--workers 2] [--hta-python /path/to/venv/bin/python]
An HTA run that fails (its dependencies) is reported on its row; the other rows stand.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

# HTA's trace_diff control (tests/data holds the first 3 of its 6 steps); --source names another trace.
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hta", "trace-diff",
                      "control.json.gz")

FLOOR = """
import sys, msgspec
from distprof.trace.reader import Event
class Doc(msgspec.Struct, gc=False):
    traceEvents: list[Event] = []
data = open(sys.argv[1], 'rb').read()
doc = msgspec.json.decode(data, type=Doc)
print(len(doc.traceEvents))
"""
FLOOR_LEAN = """
import sys, msgspec
from distprof.trace.events import Lean
class Doc(msgspec.Struct, gc=False):
    traceEvents: list[Lean] = []
data = open(sys.argv[1], 'rb').read()
doc = msgspec.json.decode(data, type=Doc)
print(len(doc.traceEvents))
"""
OURS = """
import sys
from distprof.analysis import analyze
s = analyze.summary(sys.argv[1], top=10, workers=1)
print(len(s['kernels']))
"""
# The same on N cores (argv[2]): the file's events list cut into runs that N pool workers decode and reduce. Peak RSS is the
# largest of this process and its workers (RUSAGE_CHILDREN), each of which holds a run or two, not the trace.
OURS_SPLIT = """
import sys, resource
from distprof.analysis import analyze
s = analyze.summary(sys.argv[1], top=10, workers=int(sys.argv[2]))
print(len(s['kernels']), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""
HTA = """
import sys, logging
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
df = ta.get_gpu_kernel_breakdown(visualize=False)
print(len(df[0]) if isinstance(df, tuple) else len(df))
"""


def make_trace(size_mb: int, out_dir: str) -> str:
    with gzip.open(SOURCE, "rt") as f:
        doc = json.load(f)
    events = [e for e in doc["traceEvents"] if e.get("ph") != "M"]
    meta = [e for e in doc["traceEvents"] if e.get("ph") == "M"]
    ts = [float(e["ts"]) for e in events if "ts" in e]
    span = max(ts) - min(ts) + 1000.0
    one = len(json.dumps(events))
    copies = max(1, round(size_mb * 1_000_000 / one))
    path = os.path.join(out_dir, "rank-0.json")
    with open(path, "w") as f:
        head = {k: v for k, v in doc.items() if k != "traceEvents"}
        head.setdefault("distributedInfo", {"rank": 0, "world_size": 1})
        f.write(json.dumps(head)[:-1] + ', "traceEvents": [')
        first = True
        for k in range(copies):
            for e in (meta if k == 0 else []) + events:
                if "ts" in e:
                    e = dict(e, ts=float(e["ts"]) + k * span)
                f.write(("" if first else ",") + json.dumps(e))
                first = False
        f.write("]}")
    return path


PYTHON_DECODER = {"DISTPROF_NATIVE": "0"}  # the rows that read with the Python decoder (msgspec, then Columns)


# Runs one measured process and reports its wall time and its own peak RSS. A process forked from this one starts
# with this one's high-water RSS (Linux keeps it across exec), so it is started from this small launcher instead
# (what /usr/bin/time does; that tool is not on every machine).
LAUNCH = """
import os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(p.pid, 0)
sys.stderr.write(f"\\n{time.perf_counter() - t0} {usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def measure(python: str, code: str, args: tuple[str, ...], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall seconds and peak RSS (MB) of one fresh process."""
    proc = subprocess.run([sys.executable, "-S", "-c", LAUNCH, python, "-c", code, *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})})
    said = proc.stderr.strip().splitlines()
    if proc.returncode != 0 or not said:
        raise RuntimeError(proc.stderr[-2000:])
    wall, rss_kb = said[-1].split()
    return float(wall), int(rss_kb) / 1024, proc.stdout.strip()


def main() -> int:
    global SOURCE  # --source/--traces replaces the default
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--hta-python", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="2", help="worker counts of the split rows, comma-separated (default: 2)")
    ap.add_argument("--source", default=SOURCE, help="the real trace to tile (default: tests/data trace-diff control)")
    args = ap.parse_args()
    SOURCE = args.source
    if not os.path.isfile(SOURCE):
        ap.error(f"no trace at {SOURCE}: pass --source FILE")
    tmp = tempfile.mkdtemp(prefix="bench-analysis-")
    path = make_trace(args.size_mb, tmp)
    size = os.path.getsize(path) / 1e6
    print(f"trace: {size:.0f} MB, tiled from {os.path.basename(SOURCE)}")
    from distprof.trace import nativelib
    print(nativelib.status_line())
    native = nativelib.load() is not None
    counts = [int(w) for w in args.workers.split(",")]
    split = [(f"distprof summary, {w} workers", sys.executable, OURS_SPLIT, (path, str(w)), None) for w in counts]
    base = [("floor (msgspec typed decode)", sys.executable, FLOOR, (path,), None),
            ("distprof summary", sys.executable, OURS, (path,), None), *split]
    if native:  # the same with the Python decoder, side by side
        base += [("  the same, Python decoder", sys.executable, OURS, (path,), PYTHON_DECODER)]
        base += [(f"  {w} workers, Python decoder", sys.executable, OURS_SPLIT, (path, str(w)), PYTHON_DECODER)
                 for w in counts]
    base.append(("lean floor (what analyses decode)", sys.executable, FLOOR_LEAN, (path,), None))
    if args.hta_python:
        base.append(("HolisticTraceAnalysis 0.5.0", args.hta_python, HTA, (tmp,), None))
    with open(path, "rb") as f:  # warm the page cache so the first measurement is not penalised
        while f.read(1 << 24):
            pass
    # Interleaved rounds (this machine's speed drifts): every measure runs once per round and keeps its
    # best time; HTA, at ~25 s a run, runs in the first and last round only.
    best: dict[str, tuple[float, float]] = {}
    for r in range(args.rounds):
        for name, py, code, arg, env in base:
            if "Holistic" in name and r not in (0, args.rounds - 1):
                continue
            try:
                wall, rss, out = measure(py, code, arg, env)
            except RuntimeError as e:  # HTA's own dependencies; every other row stands
                if "Holistic" not in name:
                    raise
                said = [ln for ln in str(e).strip().splitlines() if ln and not ln.startswith(("\t", " "))]  # not the launcher's
                print(f"{name} failed: {(said[:-1] or ['?'])[-1]}")
                base = [b for b in base if b[0] != name]
                continue
            if code is OURS_SPLIT:  # the workers' peak too: RSS here is the largest process of the three
                rss = max(rss, int(out.split()[-1]) / 1024)
            if name not in best or wall < best[name][0]:
                best[name] = (wall, rss)
    rows = [(name, *best[name]) for name, *_ in base if name in best]
    floor = rows[0][1]
    print(f"{'measure':32} {'time':>9} {'vs floor':>9} {'peak RSS':>10} {'RSS/trace':>10}")
    for name, wall, rss in rows:
        print(f"{name:32} {wall:8.2f}s {wall / floor:8.2f}x {rss:8.0f} MB {rss / size:9.2f}x")
    if "HolisticTraceAnalysis 0.5.0" in best:
        hta = best["HolisticTraceAnalysis 0.5.0"][0]
        for name in ["distprof summary"] + [s[0] for s in split]:
            print(f"{name} is {hta / best[name][0]:.1f}x faster than HolisticTraceAnalysis")
    return 0


if __name__ == "__main__":
    sys.exit(main())
