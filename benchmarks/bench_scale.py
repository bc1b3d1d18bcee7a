"""The per-rank verbs at 64, 256 and 1,024 ranks, against the time to merely decode the same files.

The N-rank sets are made from the real 8-rank DLRM traces in tests/data (rank r is a copy of rank r % 8,
renumbered to r of N, its events tiled ``--tile`` times in time, timings kept). Measured side by side in one
run, each in a fresh process:

- decode floor: every file gunzipped (ISA-L, as the reader does) and msgspec-decoded into the lean events the analyses read, one file per
  task over a process pool of ``--workers``; the target's floor is the per-file decode times summed, divided by
  the workers (no pool overhead in it),
- ``summary``, ``steps``, ``stragglers``, ``diagnose`` and ``merge`` as library calls (what the CLI verbs run), with
  ``--workers`` processes: wall time, peak RSS of the driver and the largest peak RSS among the workers, and the
  state one rank's result brings to the driver (its pickled size); with the native decoder built, each verb again
  with it switched off (``DISTPROF_NATIVE=0``, rows marked ``py``), side by side.

Run: python benchmarks/bench_scale.py [--ranks 64,256,1024] [--workers 2] [--tile 4] [--verbs summary,steps,...]
       [--decoders native,py]
``--workers 2,16`` measures each worker count on the same files, one after the other (floor included); the
``workers`` column says which. ``--decoders native`` leaves out the Python decoder's rows.
Targets (issue 12): the per-rank verbs within 1.5x of the floor; driver memory grows only by the compact
per-rank results. Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import subprocess
import sys
import tempfile

# The 8 real ranks (tests/data, vendored); --source names another folder of them.
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "dlrm-8rank-v100")
TARGET = 1.5
PER_RANK_VERBS = ("summary", "steps", "stragglers", "diagnose")

# One fresh process per measure: its own peak RSS (RUSAGE_SELF: the driver; RUSAGE_CHILDREN: the largest
# worker, the pool's processes being its children).
RUN_VERB = """
import json, resource, sys, time, os
verb, path, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
from distprof.analysis import analyze
u0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
if verb == "merge":
    from distprof.analysis.merge import merge_traces
    merge_traces(path, os.path.join(sys.argv[4], "merged.json.gz"), workers=workers)
else:
    getattr(analyze, verb)(path, workers=workers)
wall = time.perf_counter() - t0
u1 = resource.getrusage(resource.RUSAGE_SELF)
stats = {"wall": wall, "driver_cpu": u1.ru_utime + u1.ru_stime - u0.ru_utime - u0.ru_stime, "driver_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
         "worker_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}
if verb != "merge":  # what one rank's result weighs on its way to the driver (pickled), after the timing
    import pickle, glob
    from distprof.trace.listing import find_traces
    from distprof.trace.selection import Selection
    parts = {"summary": analyze.SUMMARY_PARTS, "steps": analyze.STEPS_PARTS, "stragglers": analyze.STRAGGLERS_PARTS,
             "diagnose": tuple(dict.fromkeys(analyze.SUMMARY_PARTS + analyze.STEPS_PARTS + analyze.STRAGGLERS_PARTS
                                             + ("step_names",)))}[verb]
    one = find_traces(path)[0]
    stats["state_kb"] = len(pickle.dumps(analyze.extract_file(one, None, parts, Selection()))) / 1024
print(json.dumps(stats))
"""
FLOOR = """
import gzip, json, resource, sys, time
from concurrent.futures import ProcessPoolExecutor
import msgspec
from isal import igzip
from distprof.trace.events import Lean

class Doc(msgspec.Struct, gc=False):
    traceEvents: list[Lean] = []

def decode(path):
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        doc = msgspec.json.decode(igzip.decompress(f.read()), type=Doc)
    return time.perf_counter() - t0, len(doc.traceEvents)

if __name__ == "__main__":
    files, workers = sys.argv[1].split("\\n"), int(sys.argv[2])
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        got = list(pool.map(decode, files, chunksize=4))
    wall = time.perf_counter() - t0
    print(json.dumps({"pool_wall": wall, "sum_s": sum(t for t, _ in got), "events": sum(n for _, n in got)}))
"""


def make_set(n: int, tile: int, out: str) -> list[str]:
    """N ranks from the 8 real ones: rank r copies rank r % 8, renumbered, tiled ``tile`` times in time."""
    sources = sorted(glob.glob(os.path.join(SOURCE, "*.json.gz")))
    docs = []
    for src in sources:
        with gzip.open(src, "rt") as f:
            doc = json.load(f)
        events = doc["traceEvents"]
        ts = [float(e["ts"]) for e in events if "ts" in e and e.get("ph") != "M"]
        span = max(ts) - min(ts) + 1000.0
        meta = [e for e in events if e.get("ph") == "M"]
        body = [e for e in events if e.get("ph") != "M"]
        tiled = meta + [dict(e, ts=float(e["ts"]) + k * span) if "ts" in e else e for k in range(tile) for e in body]
        docs.append(({k: v for k, v in doc.items() if k != "traceEvents"}, json.dumps(tiled)))
    os.makedirs(out, exist_ok=True)
    paths = []
    for r in range(n):
        head, events = docs[r % len(docs)]
        head = dict(head, distributedInfo={**head.get("distributedInfo", {}), "rank": r, "world_size": n})
        path = os.path.join(out, f"rank-{r}.json.gz")
        with gzip.open(path, "wt", compresslevel=1) as f:
            f.write(json.dumps(head)[:-1] + ', "traceEvents": ' + events + "}")
        paths.append(path)
    return paths


def run(code: str, *args: str, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    global SOURCE  # --source/--traces replaces the default
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--workers", default="2", help="worker counts, comma-separated (default: 2)")
    ap.add_argument("--decoders", default="native,py", help="native, py or both (default): the rows to measure")
    ap.add_argument("--tile", type=int, default=4)
    ap.add_argument("--verbs", default="summary,steps,stragglers,diagnose,merge")
    ap.add_argument("--source", default=SOURCE, help="folder of the 8 DLRM ranks (default: tests/data/dlrm-8rank-v100)")
    args = ap.parse_args()
    SOURCE = args.source
    if not glob.glob(os.path.join(SOURCE, "*.json.gz")):
        ap.error(f"no DLRM trace (*.json.gz) in {SOURCE}: pass --source FOLDER")
    verbs = args.verbs.split(",")
    missed = []
    from distprof.trace import nativelib
    print(nativelib.status_line())
    # With the native decoder, each verb runs twice side by side: with it, then with the Python decoder ("py").
    modes = [("", None), (" py", {"DISTPROF_NATIVE": "0"})] if nativelib.load() is not None else [("", None)]
    wanted = args.decoders.split(",")
    modes = [(tag, env) for tag, env in modes if ("py" if tag else "native") in wanted] or [("", None)]
    counts = [int(w) for w in args.workers.split(",")]
    # driver CPU: what the driver itself computes while the verb runs (pickles in, combine, its share of the reading
    # when there is one file): the serial part, which more workers do not shorten.
    print(f"{'ranks':>5} {'wk':>3} {'measure':12} {'time':>8} {'vs floor':>9} {'driver':>9} {'worker':>9} {'per rank':>9} "
          f"{'driver CPU':>10}")
    for n in (int(x) for x in args.ranks.split(",")):
        with tempfile.TemporaryDirectory(prefix=f"bench-scale-{n}-") as tmp:
            files = make_set(n, args.tile, os.path.join(tmp, "run"))
            size = sum(os.path.getsize(p) for p in files) / 1e6
            for workers in counts:
                floor = run(FLOOR, "\n".join(files), str(workers))
                target_floor = floor["sum_s"] / workers
                print(f"{n:>5} {workers:>3} {'floor':12} {target_floor:7.2f}s {1.0:8.2f}x {'':>9} {'':>9}   "
                      f"({size:.0f} MB gzipped, {floor['events']:,} events; pool of {workers}: {floor['pool_wall']:.2f}s)")
                for verb in verbs:
                    for tag, env in modes:
                        got = run(RUN_VERB, verb, os.path.join(tmp, "run"), str(workers), tmp, env=env)
                        ratio = got["wall"] / target_floor
                        state = f"{got['state_kb']:6.1f} KB" if "state_kb" in got else ""
                        print(f"{n:>5} {workers:>3} {verb + tag:12} {got['wall']:7.2f}s {ratio:8.2f}x "
                              f"{got['driver_mb']:6.0f} MB {got['worker_mb']:6.0f} MB {state:>9} {got['driver_cpu']:9.2f}s")
                        if verb in PER_RANK_VERBS and ratio > TARGET and not tag:
                            missed.append(f"{verb} at {n} ranks, {workers} workers: {ratio:.2f}x the floor "
                                          f"(target {TARGET}x)")
                        sys.stdout.flush()
            sys.stdout.flush()
    for m in missed:
        print(f"MISSED: {m}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
