"""distprof's temporal breakdown, comm/compute overlap, kernel breakdown, idle time breakdown and kernel
launch statistics side by side with HolisticTraceAnalysis (HTA) 0.5.0's, per rank, on the real traces in
tests/data (or --traces FOLDER).

HTA is not a distprof dependency: it runs in its own interpreter (``--hta-python``), in a subprocess that
runs this same file with ``--hta-worker`` (that mode imports only the standard library and ``hta``), and
prints its figures as JSON. distprof's figures come from ``distprof.analysis.analyze.summary`` in this
process. Each row is one figure of one rank: distprof's value, HTA's, and their ratio (distprof / HTA).

Scope. HTA keeps only the GPU work launched by CPU events that start before its "last" step, and only
when the job has at least two ``ProfilerStep`` names; this script asks for HTA's
``include_last_profiler_step=True`` (HTA then keeps what is launched up to the end of the last step) and
runs distprof with ``Selection(steps_only=True)`` when HTA filters, the whole trace when it does not
(one step: DLRM, cpu_only). ``--drop-last`` compares HTA's default instead (the last step dropped)
against distprof's ``Selection(steps=<every step but the last>)``.

ns-resolution traces. HTA rounds the timestamps of a trace whose ``ts`` are fractional to whole µs,
inwards (``ts = ceil(ts)``, ``end = floor(ts + dur)``); distprof keeps them as written. For such a job
HTA runs twice, as shipped and with ``HTA_DISABLE_NS_ROUNDING=1``; the second pair of columns is the
like-for-like comparison.

Figures (distprof name = HTA name):

- temporal: ``span_us`` (device span = HTA ``kernel_time``), ``idle_us``, ``compute_us``,
  ``non_compute_us`` (distprof ``communication_us + memory_us`` = HTA ``non_compute_time``);
- overlap: ``share_pct`` (distprof ``overlap.device.share * 100`` = HTA ``comp_comm_overlap_pctg``,
  which HTA rounds to 0.01);
- kernel types: ``COMP/COMM/MEM sum_us``, each type's summed durations (distprof ``categories``:
  compute, communication, memcpy + memset = HTA's per-rank kernel table summed by ``kernel_type``);
- kernel type time, all ranks (rank ``all``): HTA's kernel-type pie, where overlapping types go to the
  first of COMPUTATION, COMMUNICATION, MEMORY running (HTA truncates each piece to whole µs) = the sum over
  ranks of distprof's temporal ``compute_us``, ``communication_us``, ``memory_us``;
- kernels: the 5 largest kernels of each rank on either side, by summed duration;
- idle: per stream, ``stream S host_wait_us``, ``kernel_wait_us``, ``other_us`` and ``idle_us`` (distprof
  ``ranks[i].idle.streams`` = HTA ``get_idle_time_breakdown(ranks=[every rank], consecutive_kernel_delay=30)``,
  whose ``idle_time`` per ``idle_category`` HTA rounds to 0.01; a category HTA does not list is 0; ``idle_us``
  is the sum). HTA joins a device event whose launch call is not in the trace (``index_correlation`` 0) to
  the trace's first event (index 0) and calls its gap host wait when that event starts after the gap does;
  distprof never does (DLRM ranks 1 and 3, stream 7: 93 and 83 µs of kernel wait HTA calls host wait);
- launch: ``launches``, ``delay_mean_us``, ``delay_max_us``, ``short``, ``runtime_outliers``,
  ``delay_outliers``, ``cpu_us``, ``device_us`` (distprof ``ranks[i].launch`` = HTA
  ``get_cuda_kernel_launch_stats(ranks=[every rank], runtime_cutoff=50, launch_delay_cutoff=100)``: its
  rows counted and summed; short = ``cpu_duration <= 50 and gpu_duration < cpu_duration``, outliers
  ``> cutoff``, as its plots select them). HTA joins only ``cudaLaunchKernel(ExC)``, ``cudaMemcpyAsync``,
  ``cudaMemsetAsync``: on ROCm (amd_mi250) it finds 0 launches.

Where a side cannot compute a figure (no device events: cpu_only; HTA's 0 launches on ROCm) the cell reads
"n/a" and a row under the rank's figures gives the reason. ``--drop-last`` on nccl_data is HTA's default
scope against distprof ``--steps 4,5 --steps-only`` (the figures tests/unit/analysis/test_analysis_idle_launch.py records).

A new analysis is one more :class:`Analysis` entry in ``ANALYSES``: a function of HTA's
``TraceAnalysis`` (run in the HTA worker) and a function of distprof's ``summary`` output, both giving
``{rank: {figure: value}}`` (``{rank: {NA: reason}}`` where a rank has no such figure).

Jobs: the 8-rank DLRM set, the HTA samples (two-rank-sampled, nccl_data, simple_add, trace-diff/control,
ns_resolution, amd_mi250) and a CPU-only rank (HTA's temporal breakdown fails on it: IndexError).

Run (about 15 s on 2 cores):

    python benchmarks/crosscheck_hta.py --hta-python /work/hta-venv/bin/python [--drop-last]
        [--job dlrm-8rank ...] [--json figures.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

# The vendored traces (tests/data; its README says what was cut); --traces names another copy of the same layout.
TRACES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")

# name -> a folder of one job's files, or one file (copied into a folder of its own: HTA reads a folder).
JOBS = {
    "dlrm-8rank": "dlrm-8rank-v100",
    "two-rank-sampled": "hta/two-rank-sampled",
    "nccl_data": "hta/nccl_data.json.gz",
    "simple_add": "hta/simple_add.json.gz",
    "trace-diff/control": "hta/trace-diff/control.json.gz",
    "ns_resolution": "hta/ns_resolution_rank-0.pt.trace.json.gz",
    "cpu_only": "hta/cpu_only_rank-34.pt.trace.json.gz",
    "amd_mi250": "hta/amd_mi250_rocm.json.gz",
}

# rank (as text, or "all") -> figure -> value; the figure ``NA`` ("n/a") holds why this rank's figures are
# missing (each missing figure then prints "n/a", and the reason prints on a row of its own).
Figures = dict[str, dict[str, float | str | None]]


# ---- HTA side (runs under --hta-python; imports hta, never distprof) -----------------------------------
def _hta_kernel_tables(ta, memo):
    if "kernels" not in memo:
        # num_kernels above any count and duration_ratio 1: no kernel is folded into "others".
        memo["kernels"] = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True,
                                                      num_kernels=10**9, duration_ratio=1.0)
    return memo["kernels"]


def hta_temporal(ta, memo) -> Figures:
    df = ta.get_temporal_breakdown(visualize=False)
    return {str(int(r["rank"])): {"span_us": float(r["kernel_time(us)"]), "idle_us": float(r["idle_time(us)"]),
                                  "compute_us": float(r["compute_time(us)"]),
                                  "non_compute_us": float(r["non_compute_time(us)"])}
            for _, r in df.iterrows()}


def hta_overlap(ta, memo) -> Figures:
    df = ta.get_comm_comp_overlap(visualize=False)
    return {str(int(r["rank"])): {"share_pct": None if math.isnan(r["comp_comm_overlap_pctg"])
                                  else float(r["comp_comm_overlap_pctg"])} for _, r in df.iterrows()}


_HTA_TYPE = {"COMPUTATION": "COMP", "COMMUNICATION": "COMM", "MEMORY": "MEM"}


def hta_kernel_types(ta, memo) -> Figures:
    pie, per_kernel = _hta_kernel_tables(ta, memo)
    out: Figures = {}
    for (rank, kind), total in per_kernel.groupby(["rank", "kernel_type"])["sum (us)"].sum().items():
        out.setdefault(str(int(rank)), {})[f"{_HTA_TYPE[kind]} sum_us"] = float(total)
    # The pie: time by the set of types running, named "A overlapping B ..." with A the first running of
    # COMPUTATION, COMMUNICATION, MEMORY; the first name is the type the time is charged to.
    charged: dict[str, float] = {}
    for _, r in pie.iterrows():
        first = _HTA_TYPE[r["kernel_type"].split(" overlapping ")[0]]
        charged[first] = charged.get(first, 0.0) + float(r["sum"])
    out["all"] = {f"{k} exclusive_us": v for k, v in charged.items()}
    return out


def hta_kernels(ta, memo) -> Figures:
    _, per_kernel = _hta_kernel_tables(ta, memo)
    out: Figures = {}
    for _, r in per_kernel.iterrows():
        out.setdefault(str(int(r["rank"])), {})[f"kernel {r['name']}"] = float(r["sum (us)"])
    return out


NA = "n/a"  # a figure key: every figure of this analysis on this rank is n/a; the value is the reason

RUNTIME_CUTOFF_US, LAUNCH_DELAY_CUTOFF_US = 50, 100  # HTA's defaults, passed explicitly (distprof's too)


def _hta_ranks(ta) -> list[int]:
    return sorted(ta.t.traces)


def _hta_no_device_events(ta, rank: int) -> bool:
    return not ta.t.get_trace(rank)["stream"].ne(-1).any()


def hta_idle(ta, memo) -> Figures:
    # HTA's default is rank 0 only; every rank, one call each (what HTA's own loop over ``ranks`` does), so a
    # rank HTA cannot analyse (no device events: "No objects to concatenate") spoils only its own row.
    out: Figures = {}
    for rank in _hta_ranks(ta):
        try:
            df, _ = ta.get_idle_time_breakdown(ranks=[rank], visualize=False, consecutive_kernel_delay=30)
        except Exception as e:  # noqa: BLE001  (a failure is a result: printed as n/a with its reason)
            why = f"{type(e).__name__}: {e}"
            out[str(rank)] = {NA: f"no device events (HTA: {why})" if _hta_no_device_events(ta, rank) else why}
            continue
        figs: dict[str, float | str | None] = {}
        # HTA lists only the categories a stream has; one absent counts 0 (as distprof prints it).
        for stream in sorted(int(x) for x in df["stream"].unique()):
            per = df[df["stream"] == stream].set_index("idle_category")["idle_time"]
            for cat in ("host_wait", "kernel_wait", "other"):
                figs[f"stream {stream} {cat}_us"] = float(per.get(cat, 0.0))
            figs[f"stream {stream} idle_us"] = float(per.sum())
        out[str(rank)] = figs
    return out


def _hta_launch_na(ta, rank: int) -> str:
    """Why HTA found no launch on a rank that has device work: its launch calls have names HTA does not join."""
    df = ta.t.get_trace(rank)
    gpu = df[df["stream"].ne(-1)]
    # index_correlation > 0 is the linked call's index (0: its call is not in the trace, -1: no link).
    calls = df[df["index"].isin(gpu["index_correlation"][gpu["index_correlation"] > 0])]["name"].unique()
    sym = ta.t.symbol_table.get_sym_table()
    names = ", ".join(sorted({str(sym[int(i)]) for i in calls})) or "none in the trace"
    return (f"HTA joins only cudaLaunchKernel(ExC), cudaMemcpyAsync, cudaMemsetAsync; "
            f"this rank launches with {names}")


def hta_launch(ta, memo) -> Figures:
    per_rank = ta.get_cuda_kernel_launch_stats(ranks=_hta_ranks(ta), runtime_cutoff=RUNTIME_CUTOFF_US,
                                               launch_delay_cutoff=LAUNCH_DELAY_CUTOFF_US, visualize=False)
    out: Figures = {}
    for rank, df in per_rank.items():
        if df.empty:
            # No device work: nothing to count. Device work but no row: HTA missed the launches (0 found).
            out[str(rank)] = ({NA: "no device events"} if _hta_no_device_events(ta, rank)
                              else {"launches": 0.0, NA: _hta_launch_na(ta, rank)})
            continue
        cpu, gpu, delay = df["cpu_duration"], df["gpu_duration"], df["launch_delay"]
        # HTA returns one row per (call, device event); its plots select short kernels, runtime and delay
        # outliers from those rows with these rules (visualize_cuda_launch_kernel_info).
        out[str(rank)] = {"launches": float(len(df)), "delay_mean_us": float(delay.mean()),
                          "delay_max_us": float(delay.max()),
                          "short": float(((cpu <= RUNTIME_CUTOFF_US) & (gpu < cpu)).sum()),
                          "runtime_outliers": float((cpu > RUNTIME_CUTOFF_US).sum()),
                          "delay_outliers": float((delay > LAUNCH_DELAY_CUTOFF_US).sum()),
                          "cpu_us": float(cpu.sum()), "device_us": float(gpu.sum())}
    return out


def hta_worker(folder: str, include_last: bool) -> None:
    """Print HTA's figures for one job folder as JSON (the ``--hta-worker`` mode)."""
    import logging
    import warnings

    logging.disable(logging.WARNING)  # HTA logs every parse at WARNING
    warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=folder, include_last_profiler_step=include_last)
    names = ta.t.symbol_table.get_sym_table()
    steps = sorted({int(m.group(1)) for n in names if (m := re.fullmatch(r"ProfilerStep\s*#\s*(\d+)", str(n)))})
    # HTA filters by steps only when it finds at least two names containing "ProfilerStep" (trace.py).
    filtered = sum("ProfilerStep" in str(n) for n in names) >= 2
    out: dict[str, Any] = {"steps": steps, "filtered": filtered, "figures": {}, "errors": {}}
    memo: dict[str, Any] = {}
    for a in ANALYSES:
        try:
            out["figures"][a.name] = a.hta(ta, memo)
        except Exception as e:  # noqa: BLE001  (an HTA failure is a result: it is printed, not raised)
            out["errors"][a.name] = f"{type(e).__name__}: {e}"
    json.dump(out, sys.stdout)


# ---- distprof side ---------------------------------------------------------------------------------------
def _ranks(s: dict) -> list[tuple[str, dict]]:
    return [(str(r["rank"]), r) for r in s["ranks"]]


def ours_temporal(s: dict) -> Figures:
    out: Figures = {}
    for rank, r in _ranks(s):
        d = r.get("temporal", {}).get("device")
        if d:
            out[rank] = {"span_us": d["span_us"], "idle_us": d["idle_us"], "compute_us": d["compute_us"],
                         "non_compute_us": d["communication_us"] + d["memory_us"]}
    return out


def ours_overlap(s: dict) -> Figures:
    out: Figures = {}
    for rank, r in _ranks(s):
        d = r.get("overlap", {}).get("device")
        if r.get("temporal", {}).get("device"):
            # Rounded as HTA rounds its percentage (to 0.01), so equal figures print a ratio of 1.
            out[rank] = {"share_pct": round(d["share"] * 100, 2) if d else None}
    return out


def ours_kernel_types(s: dict) -> Figures:
    out: Figures = {}
    total = {"COMP": 0.0, "COMM": 0.0, "MEM": 0.0}
    for rank, r in _ranks(s):
        c = r["categories"]
        if not c:
            continue
        out[rank] = {"COMP sum_us": c.get("compute", 0.0), "COMM sum_us": c.get("communication", 0.0),
                     "MEM sum_us": c.get("memcpy", 0.0) + c.get("memset", 0.0)}
        out[rank] = {k: v for k, v in out[rank].items() if v}
        d = r["temporal"]["device"]
        total["COMP"] += d["compute_us"]
        total["COMM"] += d["communication_us"]
        total["MEM"] += d["memory_us"]
    if out:
        out["all"] = {f"{k} exclusive_us": v for k, v in total.items() if v}
    return out


def ours_kernels(s: dict) -> Figures:
    return {rank: {f"kernel {k['name']}": k["total_us"] for k in r["top_kernels"]} for rank, r in _ranks(s)}


def ours_idle(s: dict) -> Figures:
    out: Figures = {}
    for rank, r in _ranks(s):
        i = r.get("idle") or {}
        if not i.get("applicable"):
            out[rank] = {NA: i.get("reason", "no idle figure")}
            continue
        out[rank] = {f"stream {x['stream']} {k}": x[k] for x in i["streams"]
                     for k in ("host_wait_us", "kernel_wait_us", "other_us", "idle_us")}
    return out


def ours_launch(s: dict) -> Figures:
    out: Figures = {}
    for rank, r in _ranks(s):
        lf = r.get("launch") or {}
        if not lf.get("applicable"):
            out[rank] = {NA: lf.get("reason", "no launch figure")}
            continue
        out[rank] = {"launches": lf["launches"], "delay_mean_us": lf["delay_us"]["mean"],
                     "delay_max_us": lf["delay_us"]["max"], "short": lf["short"],
                     "runtime_outliers": lf["runtime_outliers"], "delay_outliers": lf["delay_outliers"],
                     "cpu_us": lf["cpu_us"]["total"], "device_us": lf["device_us"]["total"]}
    return out


def _top_kernels(ours: dict, hta: dict) -> list[str]:
    """distprof's top 5 of the rank and HTA's 5 largest (a kernel on one list only shows as a difference)."""
    biggest = sorted((k for k, v in hta.items() if v is not None), key=lambda k: -hta[k])[:5]
    return list(dict.fromkeys([*ours, *biggest]))


@dataclass(frozen=True)
class Analysis:
    name: str
    hta: Callable[[Any, dict], Figures]  # (TraceAnalysis, memo shared by the analyses) -> figures
    ours: Callable[[dict], Figures]  # analyze.summary output -> figures
    rows: Callable[[dict, dict], list[str]] = lambda ours, hta: list(dict.fromkeys([*ours, *hta]))


ANALYSES = [
    Analysis("temporal", hta_temporal, ours_temporal),
    Analysis("overlap", hta_overlap, ours_overlap),
    Analysis("kernel types", hta_kernel_types, ours_kernel_types),
    Analysis("kernels", hta_kernels, ours_kernels, rows=_top_kernels),
    Analysis("idle", hta_idle, ours_idle),
    Analysis("launch", hta_launch, ours_launch),
]


# ---- driver ----------------------------------------------------------------------------------------------
def _fractional_ts(files: list[str]) -> bool:
    """Whether HTA will round this job (it does when its ``ts`` column is float: any fractional ts)."""
    for f in files:
        with (gzip.open if f.endswith(".gz") else open)(f, "rt") as fh:
            if any(isinstance(e.get("ts"), float) and not float(e["ts"]).is_integer()
                   for e in json.load(fh).get("traceEvents", [])):
                return True
    return False


def stage(name: str, rel: str, tmp: str) -> tuple[str, list[str]]:
    """A folder holding only this job's files (HTA analyses every trace file in a folder)."""
    src = os.path.normpath(os.path.join(TRACES, rel))
    if not os.path.exists(src):
        sys.exit(f"crosscheck_hta: no {rel} under {TRACES} (pass --traces FOLDER)")
    if os.path.isdir(src):
        return src, sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith((".json", ".gz")))
    folder = os.path.join(tmp, name.replace("/", "_"))
    os.makedirs(folder, exist_ok=True)
    dst = os.path.join(folder, os.path.basename(src))
    shutil.copyfile(src, dst)
    return folder, [dst]


def run_hta(python: str, folder: str, include_last: bool, rounding: bool) -> dict:
    env = dict(os.environ)
    if not rounding:
        env["HTA_DISABLE_NS_ROUNDING"] = "1"
    cmd = [python, os.path.abspath(__file__), "--hta-worker", folder] + (["--include-last"] if include_last else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"steps": [], "filtered": False, "figures": {}, "errors": {"HTA": last}}
    return json.loads(proc.stdout)


def run_ours(folder: str, hta: dict, drop_last: bool):
    from distprof.analysis import analyze
    from distprof.trace.selection import Selection

    if not hta["filtered"]:
        sel, scope = Selection(), "whole trace"
    elif drop_last:
        keep = hta["steps"][:-1]
        sel, scope = Selection(steps=frozenset(keep)), f"Selection(steps={keep})"
    else:
        sel, scope = Selection(steps_only=True), "Selection(steps_only=True)"
    s = analyze.summary(folder, selection=sel, workers=1, top=None)
    figures = {}
    for a in ANALYSES:
        figures[a.name] = a.ours(s)
    return figures, scope


def _pair_single_rank(ours: dict, hta: dict) -> None:
    """A job of one file that names no rank: distprof reports rank None, HTA rank 0. Pair them."""
    def ranks(figs):
        return {r for per in figs.values() for r in per if r != "all"}
    mine, theirs = ranks(ours), ranks(hta["figures"])
    if len(mine) == 1 and len(theirs) == 1 and mine != theirs:
        (old,), (new,) = mine, theirs
        for per in ours.values():
            if old in per:
                per[new] = per.pop(old)


def _fmt(v: float | None, na: bool = False) -> str:
    if v is None:
        return NA if na else "—"
    # Whole numbers (counts, HTA's µs-rounded figures) without decimals; the rest to HTA's 0.01.
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "—"
    if b == 0:
        return "1.0000" if a == 0 else "inf"
    return f"{a / b:.4f}"


def compare(name: str, ours: dict, hta: dict, hta_raw: dict | None) -> list[list[str]]:
    rows = []
    for a in ANALYSES:
        mine, theirs = ours.get(a.name, {}), hta["figures"].get(a.name, {})
        raw = (hta_raw or {}).get("figures", {}).get(a.name, {})
        if a.name in hta["errors"]:
            rows.append([f"      {a.name}: HTA failed: {hta['errors'][a.name]}"])
        ranks = sorted(set(mine) | set(theirs), key=lambda r: (r == "all", int(r) if r.lstrip("-").isdigit() else 0))
        for rank in ranks:
            m, t, w = mine.get(rank, {}), theirs.get(rank, {}), raw.get(rank, {})
            figs = {k: v for k, v in m.items() if k != NA}, {k: v for k, v in t.items() if k != NA}
            for fig in a.rows(*figs):
                label = fig if len(fig) <= 58 else fig[:55] + "..."
                row = [rank, f"{a.name}: {label}", _fmt(m.get(fig), NA in m), _fmt(t.get(fig), NA in t),
                       _ratio(m.get(fig), t.get(fig))]
                if hta_raw is not None:
                    row += [_fmt(w.get(fig), NA in w), _ratio(m.get(fig), w.get(fig))]
                rows.append(row)
            for side, figures in (("distprof", m), ("HTA", t)):
                if NA in figures:
                    rows.append([f"{rank:<6}{a.name}: {NA} on {side}: {figures[NA]}"])
    return rows


def _print_table(header: list[str], rows: list[list[str]]) -> None:
    """Columns fit their widest cell; a row of one cell is a note, printed whole (widths ignore it)."""
    widths = [max(len(str(x)) for x in col) for col in zip(header, *(r for r in rows if len(r) > 1))]
    for i, r in enumerate([header, *rows]):
        if len(r) == 1:
            print(r[0])
            continue
        print("  ".join(str(x).rjust(w) if j >= 2 else str(x).ljust(w) for j, (x, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main(argv: list[str] | None = None) -> int:
    global TRACES  # --source/--traces replaces the default
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hta-python", help="interpreter with HolisticTraceAnalysis 0.5.0 installed")
    p.add_argument("--drop-last", action="store_true", help="HTA's default scope (last step dropped)")
    p.add_argument("--job", action="append", choices=sorted(JOBS), help="only these jobs (repeatable)")
    p.add_argument("--json", help="also write every figure to this file")
    p.add_argument("--traces", default=TRACES, help="folder holding the traces (default: tests/data)")
    p.add_argument("--hta-worker", help=argparse.SUPPRESS)
    p.add_argument("--include-last", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    TRACES = args.traces
    if args.hta_worker:
        hta_worker(args.hta_worker, args.include_last)
        return 0
    if not args.hta_python:
        p.error("--hta-python is required (an interpreter with HolisticTraceAnalysis 0.5.0)")
    include_last = not args.drop_last
    everything = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.job or list(JOBS):
            folder, files = stage(name, JOBS[name], tmp)
            hta = run_hta(args.hta_python, folder, include_last, rounding=True)
            hta_raw = run_hta(args.hta_python, folder, include_last, rounding=False) if _fractional_ts(files) else None
            ours, scope = run_ours(folder, hta, args.drop_last)
            _pair_single_rank(ours, hta)
            print(f"\n== {name}: {len(files)} file(s); HTA include_last_profiler_step={include_last}"
                  f"{', filters by steps ' + str(hta['steps']) if hta['filtered'] else ', no step filter'}; "
                  f"distprof {scope}")
            header = ["rank", "figure", "distprof", "HTA", "ratio"]
            if hta_raw is not None:
                header += ["HTA no-ns-rounding", "ratio"]
            _print_table(header, compare(name, ours, hta, hta_raw))
            everything[name] = {"distprof": ours, "distprof_scope": scope, "hta": hta, "hta_no_ns_rounding": hta_raw}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(everything, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
