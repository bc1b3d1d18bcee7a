"""Spike (issue 24, item 1): which decoder should write distprof's columns? Measured side by side in one run.

Inputs: the ~186-200 MB trace benchmarks/bench_analysis.py makes (its ``make_trace``, gzipped here at level 1) and
1,024 DLRM-derived ranks (benchmarks/bench_scale.py's ``make_set``). Every file is gunzipped with ISA-L (as the reader
does) inside each candidate's process, timed apart, so the decoders are compared on the same bytes. Each candidate
runs in a fresh process, one core, files one after the other, and decodes each whole file into what distprof
needs: the complete events' cat (as a kind), name id, ts, dur, track id (pid, tid), the args distprof reads for
device work and its launches (correlation, External id, stream; collective metadata and sizes; the input shapes
of the shaped ops) and thread names:

- ``msgspec``: the lean events (``distprof.trace.events.Lean``) and nothing else: today's floor, the 1.00x,
- ``msgspec+Columns``: the same, reduced by ``distprof.trace.columns.Columns`` (what reading does today),
- ``orjson``, ``simdjson`` (pysimdjson, ``recursive=True``: its lazy proxies cost more per field): Python objects,
  then the columns built from them in Python (comprehensions and map, as Columns does),
- ``duckdb``: ``read_json`` with a declared struct of the fields (it reads the Kineto layout: one document whose
  ``traceEvents`` is unnested), the args' ids pulled with json_extract, ``SET threads=1``,
- ``rust``: benchmarks/spike_rust, a zero-dependency ``cdylib`` with a C ABI, loaded with ctypes: one pass over the
  bytes writes typed buffers (f64 ts/dur, u32 name/cat/track ids, i64 correlation/External id) with strings
  interned (Python unescapes each unique string once), and the byte spans of the few args holding collective
  metadata or shapes, which msgspec decodes as distprof does.

orjson, pysimdjson and duckdb are installed from PyPI into a throwaway venv (``--venv``, default
/tmp/distprof-spike-venv; never the project's venv) that sees the project's packages through a .pth file.
Each row: time (gunzip apart), ratio to the msgspec floor, peak RSS, and whether the result matches the reference
(msgspec+Columns): per name, count and sums of ts and dur; over device work and launches, count and sum of the
correlation and External ids; counts of tracks, thread names, collective metadata and shaped ops.

Which to adopt (the measured table is in docs/benchmarks.md): the Rust scanner. On the 199 MB trace it took 1.01x
the msgspec floor with the columns written (its scanner alone 0.61x), where msgspec + Columns took 2.60x, orjson
8.9x, simdjson 15x and DuckDB 23x (these three hold every event as a Python object or a row: 1.5-2.3 GB for 199 MB).
It is the only candidate with no Python object per event, which is where the time goes. crates.io is not reachable
here, so it is built the way this spike builds it: a zero-dependency crate with a C ABI loaded through ctypes (no
pyo3), compiled by setuptools-rust with ``Binding.NoBinding`` and ``optional=True`` so that a machine without cargo
still installs and falls back to the msgspec path (which stays the oracle). Debian's packaged pyo3 (0.17) supports
Python up to 3.11 (the GPU host runs 3.12), and flat columns need nothing a C ABI does not give. Not reached yet:
issue 24's 0.35x; the Python around the scanner (unique strings, kinds, msgspec decoding the shaped ops' Input Dims)
costs as much again as the scanner on that trace, and is the next thing to move into it.

Run (the machine is shared: queue behind other heavy runs):
    flock /tmp/distprof-heavy.lock python benchmarks/spike_decode.py [--size-mb 200] [--ranks 1024] [--tile 4]
        [--rounds 1] [--only msgspec,rust,...]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import spike_columns
from spike_columns import (  # (this script's folder is on sys.path when it runs)
    Cols,
    _intern,
    _needs_args,
    _shape_and_comm,
    build_rust,
    compare,
    decode_msgspec,
    fingerprint,
    from_columns,
    load_rust,
    rust_cols,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CANDIDATES = ("msgspec", "msgspec+Columns", "orjson", "simdjson", "duckdb", "rust")
NEEDS_VENV = {"orjson": "orjson", "simdjson": "pysimdjson", "duckdb": "duckdb"}


def from_dicts(evs: list) -> Cols:
    """Columns from Python dicts (orjson, simdjson): comprehensions and map, as Columns does with structs."""
    import numpy as np

    from distprof.trace import columns
    from distprof.trace.vocab import KIND_OF_CATEGORY, Kind
    xs = [e for e in evs if e.get("ph") == "X"]
    names, name = _intern([e.get("name", "") for e in xs])
    kinds = np.fromiter(map(KIND_OF_CATEGORY.get, [e.get("cat", "") for e in xs], [Kind.UNKNOWN] * len(xs)),
                        dtype=np.int8, count=len(xs))
    ts = np.fromiter([e.get("ts", 0.0) for e in xs], dtype=np.float64, count=len(xs))
    dur = np.fromiter([e.get("dur", 0.0) for e in xs], dtype=np.float64, count=len(xs))
    tracks, track = _intern([(e.get("pid", 0), e.get("tid", 0)) for e in xs])
    need = np.flatnonzero(np.array(columns._NEEDS_ARGS, dtype=bool)[kinds])
    corr = np.full(len(xs), -1, dtype=np.int64)
    ext = corr.copy()
    args = [xs[i].get("args") or {} for i in need]
    corr[need] = [_int_or(a.get("correlation")) for a in args]
    ext[need] = [_int_or(a.get("External id")) for a in args]
    tn = {(e.get("pid", 0), e.get("tid", 0)): e["args"]["name"] for e in evs
          if e.get("ph") == "M" and e.get("name") == "thread_name" and isinstance(e.get("args"), dict)
          and e["args"].get("name")}
    name_idx = np.array(name, dtype=np.int64)
    wanted = ("Process Group Name", "Collective name", "Input Dims")
    meta, shapes = _shape_and_comm(names, name_idx, kinds, lambda: (
        (i, e["args"]) for i, e in enumerate(xs) if isinstance(e.get("args"), dict)
        and any(k in e["args"] for k in wanted)), decode_raw=False)
    return Cols(names, name_idx, kinds, ts, dur, np.array(track), tracks, corr, ext, tn, meta, shapes)


def _int_or(v) -> int:
    return v if type(v) is int and -(2**63) <= v < 2**63 else -1


def decode_orjson(data: bytes) -> Cols:
    import orjson
    return from_dicts(orjson.loads(data).get("traceEvents", []))


_SIMD = None


def decode_simdjson(data: bytes) -> Cols:
    global _SIMD
    import simdjson
    if _SIMD is None:
        _SIMD = simdjson.Parser()
    return from_dicts(_SIMD.parse(data, True).get("traceEvents", []))


_DUCK_TYPE = ("STRUCT(ph VARCHAR, cat VARCHAR, name VARCHAR, pid JSON, tid JSON, ts DOUBLE, dur DOUBLE, "
              "args JSON)[]")
_DUCK_SQL = """
SELECT e.ph, e.cat, e.name, e.pid, e.tid, e.ts, e.dur,
  TRY_CAST(json_extract_string(e.args, '$.correlation') AS BIGINT) AS corr,
  TRY_CAST(json_extract_string(e.args, '$."External id"') AS BIGINT) AS ext,
  CASE WHEN json_exists(e.args, '$."Process Group Name"') OR json_exists(e.args, '$."Collective name"')
       OR json_exists(e.args, '$."Input Dims"') THEN e.args END AS rare,
  CASE WHEN e.ph = 'M' AND e.name = 'thread_name' THEN json_extract_string(e.args, '$.name') END AS tn
FROM (SELECT unnest(traceEvents) AS e FROM read_json(?, maximum_object_size=2000000000, format='auto',
      columns={traceEvents: '%s'}))
""".replace("%s", _DUCK_TYPE)


def _filled(a, default):
    """A DuckDB column (masked where NULL) with ``default`` for NULL (np.ma.filled(a, None) would use '?')."""
    import numpy as np
    if not np.ma.isMaskedArray(a):
        return a
    out = np.ma.getdata(a).copy() if default is not None else np.ma.getdata(a).astype(object)
    out[np.ma.getmaskarray(a)] = default
    return out


def decode_duckdb(path: str) -> Cols:
    """DuckDB reads the file itself (gunzipped apart, as the others' bytes)."""
    import duckdb
    import numpy as np

    from distprof.trace.vocab import KIND_OF_CATEGORY, Kind
    con = duckdb.connect()
    con.execute("SET threads=1")
    r = con.execute(_DUCK_SQL, [path]).fetchnumpy()
    ph = r["ph"]
    x = np.flatnonzero(ph == "X")
    names_col = r["name"][x]
    names, name = _intern(names_col.tolist())
    kinds = np.fromiter(map(KIND_OF_CATEGORY.get, _filled(r["cat"][x], "").tolist(), [Kind.UNKNOWN] * len(x)),
                        dtype=np.int8, count=len(x))
    ts = _filled(r["ts"][x], 0.0).astype(np.float64)
    dur = _filled(r["dur"][x], 0.0).astype(np.float64)
    pid = [json.loads(v) if v is not None else 0 for v in _filled(r["pid"], None).tolist()]
    tid = [json.loads(v) if v is not None else 0 for v in _filled(r["tid"], None).tolist()]
    tracks, track = _intern([(pid[i], tid[i]) for i in x.tolist()])
    need = _needs_args()[kinds]
    corr = np.where(need, _filled(r["corr"][x], -1), -1).astype(np.int64)
    ext = np.where(need, _filled(r["ext"][x], -1), -1).astype(np.int64)
    tn_col = _filled(r["tn"], None)
    tn = {(pid[i], tid[i]): tn_col[i] for i in np.flatnonzero(tn_col != None).tolist() if tn_col[i]}  # noqa: E711
    rare = _filled(r["rare"][x], None)
    name_idx = np.array(name, dtype=np.int64)
    meta, shapes = _shape_and_comm(names, name_idx, kinds, lambda: (
        (i, rare[i].encode()) for i in np.flatnonzero(rare != None).tolist()), decode_raw=True)  # noqa: E711
    return Cols(names, name_idx, kinds, ts, dur, np.array(track), tracks, corr, ext, tn, meta, shapes)


# ---- one candidate in its own process -------------------------------------------------------------------
def prepare(cand: str) -> None:
    """Import what the candidate uses before the clock starts (start-up is in the process's wall time)."""
    import importlib

    import numpy  # noqa: F401

    import distprof.trace.columns
    import distprof.trace.vocab  # noqa: F401
    if cand in NEEDS_VENV:
        importlib.import_module(cand)


def _peak_rss_kb() -> int:
    """This process's peak RSS (VmHWM: unlike ru_maxrss it does not carry the parent's peak across fork and exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def worker(cand: str, files: list[str], out: str, lib_path: str | None) -> None:
    from isal import igzip
    prepare(cand)
    lib = load_rust(lib_path) if cand == "rust" and lib_path else None
    acc: dict = {}
    gunzip = decode = 0.0
    rss = 0
    tmp = tempfile.mkdtemp(prefix="spike-duck-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        for path in files:
            with open(path, "rb") as f:
                raw = f.read()
            t0 = time.perf_counter()
            data = igzip.decompress(raw) if path.endswith(".gz") else raw
            t1 = time.perf_counter()
            gunzip += t1 - t0
            if cand == "duckdb":  # DuckDB reads files: the gunzipped bytes are written to memory first (untimed)
                plain = os.path.join(tmp, "t.json")
                with open(plain, "wb") as f:
                    f.write(data)
                t1 = time.perf_counter()
                cols = decode_duckdb(plain)
            elif cand == "msgspec":
                evs = decode_msgspec(data, reduce=False)
            elif cand == "msgspec+Columns":
                cols = decode_msgspec(data, reduce=True)
            elif cand == "orjson":
                cols = decode_orjson(data)
            elif cand == "simdjson":
                cols = decode_simdjson(data)
            else:
                cols = rust_cols(lib, data)
            decode += time.perf_counter() - t1
            rss = _peak_rss_kb()
            if cand == "msgspec":  # the floor is the decode alone; its columns (untimed) only to check it
                cols = from_columns(evs)
                del evs
            del data
            fingerprint(cols, acc)
            del cols
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with open(out, "w") as f:
        json.dump({"gunzip": gunzip, "decode": decode, "rss_mb": rss / 1024, "fp": acc,
                   "scan": spike_columns.SCAN_S[0]}, f)


# ---- the driver ------------------------------------------------------------------------------------------
def ensure_venv(venv: str) -> str | None:
    """A throwaway venv with orjson, pysimdjson and duckdb from PyPI, seeing this interpreter's packages."""
    py = os.path.join(venv, "bin", "python")
    if not os.path.isfile(py):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages")]
    with open(os.path.join(site, "zz_distprof_parent.pth"), "w") as f:  # after the venv's own packages
        f.write("\n".join(ours) + "\n")
    missing = [pkg for mod, pkg in (("orjson", "orjson"), ("simdjson", "pysimdjson"), ("duckdb", "duckdb"))
               if subprocess.run([py, "-c", f"import {mod}"], capture_output=True).returncode != 0]
    if missing:
        proc = subprocess.run([py, "-m", "pip", "install", "-q", *missing], capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"venv: pip install {' '.join(missing)} failed: {proc.stderr.strip()[-300:]}")
    return py


def versions(py: str) -> str:
    code = ("import importlib.metadata as m\nfor p in ('msgspec','orjson','pysimdjson','duckdb','isal'):\n"
            " try: print(p, m.version(p))\n except Exception: pass")
    return ", ".join(subprocess.run([py, "-c", code], capture_output=True, text=True).stdout.split("\n")[:-1])


def run_one(py: str, cand: str, files: list[str], lib: str | None, timeout: int) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as lst:
        lst.write("\n".join(files))
    out = lst.name + ".out.json"
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([py, os.path.abspath(__file__), "--worker", cand, "--files", lst.name, "--out", out]
                              + (["--lib", lib] if lib else []), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout} s"}
    finally:
        os.unlink(lst.name)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:120]}
    with open(out) as f:
        got = json.load(f)
    os.unlink(out)
    got["wall"] = time.perf_counter() - t0
    return got


def measure(label: str, files: list[str], cands: list[str], pys: dict, lib: str | None, rounds: int,
            timeout: int) -> None:
    size = sum(os.path.getsize(p) for p in files) / 1e6
    print(f"\n{label}: {len(files)} file(s), {size:.0f} MB gzipped")
    best: dict[str, dict] = {}
    load0 = os.getloadavg()[0]
    for _ in range(rounds):  # interleaved rounds, best time each (the machine is shared)
        for cand in cands:
            got = run_one(pys[cand], cand, files, lib, timeout)
            old = best.get(cand)
            if old is None or "error" in old or ("error" not in got and got["decode"] < old["decode"]):
                best[cand] = got
    ref = best.get("msgspec+Columns", {}).get("fp")
    floor = best.get("msgspec", {}).get("decode")
    gun = min((b["gunzip"] for b in best.values() if "gunzip" in b), default=float("nan"))
    print(f"gunzip (ISA-L, timed apart, best of the candidates' processes): {gun:.2f} s; load average now "
          f"{os.getloadavg()[0]:.1f} (was {load0:.1f} at the start)")
    print(f"{'decoder':16} {'time':>8} {'vs floor':>9} {'peak RSS':>9}  matches msgspec+Columns")
    for cand in cands:
        b = best[cand]
        if "error" in b:
            print(f"{cand:16} {'-':>8} {'-':>9} {'-':>9}  failed: {b['error']}")
            continue
        ratio = f"{b['decode'] / floor:8.2f}x" if floor else "      -"
        match = compare(ref, b["fp"]) if ref else "(no reference)"
        print(f"{cand:16} {b['decode']:7.2f}s {ratio:>9} {b['rss_mb']:6.0f} MB  {match}")
    if "rust" in best and "error" not in best["rust"] and floor:
        sc = best["rust"]["scan"]
        print(f"  (rust: {sc:.2f} s, {sc / floor:.2f}x, in the scanner; the rest in Python: unique strings, kinds, "
              f"thread ids, the comm and shape args by msgspec)")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--files", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--lib", help=argparse.SUPPRESS)
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=1024, help="DLRM-derived ranks (0: skip)")
    ap.add_argument("--tile", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--timeout", type=int, default=600, help="seconds per candidate process")
    ap.add_argument("--only", default=",".join(CANDIDATES))
    ap.add_argument("--venv", default="/tmp/distprof-spike-venv")
    args = ap.parse_args()
    if args.worker:
        with open(args.files) as f:
            worker(args.worker, [p for p in f.read().split("\n") if p], args.out, args.lib)
        return 0
    sys.path.insert(0, HERE)
    import bench_analysis
    import bench_scale
    from isal import igzip
    cands = [c for c in args.only.split(",") if c]
    for c in cands:
        if c not in CANDIDATES:
            ap.error(f"--only: unknown decoder {c!r} (one of {', '.join(CANDIDATES)})")
    if "msgspec" not in cands or "msgspec+Columns" not in cands:
        cands = ["msgspec", "msgspec+Columns", *[c for c in cands if not c.startswith("msgspec")]]
    tmp = tempfile.mkdtemp(prefix="spike-decode-")
    try:
        lib = build_rust(os.path.join(tmp, "target")) if "rust" in cands else None
        if lib is None:
            cands = [c for c in cands if c != "rust"]
        pys = {c: sys.executable for c in cands}
        if any(c in NEEDS_VENV for c in cands):
            vpy = ensure_venv(args.venv)
            for c in cands:
                if c in NEEDS_VENV:
                    pys[c] = vpy
        print(f"python {sys.version.split()[0]}; {versions(pys.get('orjson', sys.executable))}; "
              f"{os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f})")
        big = bench_analysis.make_trace(args.size_mb, tmp)
        with open(big, "rb") as f:
            plain = f.read()
        with open(big + ".gz", "wb") as f:
            f.write(igzip.compress(plain, compresslevel=1))
        os.unlink(big)
        measure(f"one trace, {len(plain) / 1e6:.0f} MB (bench_analysis.make_trace)", [big + ".gz"], cands, pys, lib,
                args.rounds, args.timeout)
        del plain
        if args.ranks:
            files = bench_scale.make_set(args.ranks, args.tile, os.path.join(tmp, "ranks"))
            measure(f"{args.ranks} DLRM-derived ranks (bench_scale.make_set, tile {args.tile})", files, cands, pys,
                    lib, args.rounds, args.timeout)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
