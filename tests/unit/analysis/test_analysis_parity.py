"""The temporal breakdown, comm/compute overlap, kernel-type totals and TensorBoard-style step breakdown, proved
two ways on real traces:

- against an independent computation written here: the json module (fractional times as Decimal, so exact)
  and one sorted sweep over every event's start and end, with the definitions restated from the README, none
  of distprof's interval code;
- against what HolisticTraceAnalysis 0.5.0 computes on the same traces (recorded below), with every
  difference traced to the events and microseconds that make it.
"""

import decimal
import gzip
import json
import math
import os
import re
from collections import Counter, defaultdict

import pytest
from tracekit import DLRM, TRACES

from distprof.analysis import analyze
from distprof.trace.selection import Selection

NCCL = os.path.join(TRACES, "hta", "nccl_data.json.gz")
TWO_RANK = os.path.join(TRACES, "hta", "two-rank-sampled")
SIMPLE_ADD = os.path.join(TRACES, "hta", "simple_add.json.gz")
CPU_ONLY = os.path.join(TRACES, "hta", "cpu_only_rank-34.pt.trace.json.gz")


# ---- the independent computation ---------------------------------------------------------------------------
def _doc(path):
    """The json module's reading, fractional times as Decimal. distprof reads times as float64: on traces whose
    times are ~4e12 µs each carries up to ±0.0005 µs, so figures summed from thousands of pieces are compared
    to 1e-6 relative (or a few ns), the integer-µs traces' exactly."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
        return json.load(f, parse_float=decimal.Decimal)


def _complete(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and "dur" in e]


def _sweep(spans):
    """{label: [(start, end)]} -> {frozenset of the labels running: time}, walking every edge in time order."""
    edges = sorted(((t, d, k) for k, v in spans.items() for s, e in v if e > s for t, d in ((s, 1), (e, -1))),
                   key=lambda x: x[0])
    running, out, prev = Counter(), defaultdict(int), None
    for t, d, k in edges:
        if prev is not None and t > prev:
            now = frozenset(x for x, n in running.items() if n)
            if now:
                out[now] += t - prev
        running[k] += d
        prev = t
    return out


def _time(combos, pred):
    return float(sum(v for k, v in combos.items() if pred(k)))


DEVICE = {"kernel": "compute", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
RUNTIME = ("cuda_runtime", "cuda_driver")
HOST = ("cpu_op", "user_annotation", "python_function", *RUNTIME)
PRIORITY = ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader", "cpu_exec")


def _device_kind(e):
    """compute | comm | memcpy | memset | None. Every collective kernel of these traces is NCCL's."""
    k = DEVICE.get(e["cat"])
    return "comm" if k == "compute" and e["name"].startswith("nccl") else k


def _host_comm(name):
    return name.startswith(("nccl:", "gloo:")) or name == "record_param_comms" or (
        name.startswith("c10d::") and not name.startswith(("c10d::wait", "c10d::_wait", "c10d::monitored_barrier")))


def _device_figures(events):
    """Device span, compute, communication not under compute, memory under neither, idle; comm/compute overlap."""
    spans = defaultdict(list)
    for e in events:
        k = _device_kind(e)
        if k:
            spans["memory" if k in ("memcpy", "memset") else k].append((e["ts"], e["ts"] + e["dur"]))
    every = [x for v in spans.values() for x in v]
    span = float(max(e for _, e in every) - min(s for s, _ in every))
    c = _sweep(spans)
    comm = _time(c, lambda k: "comm" in k)
    return {"span_us": span, "compute_us": _time(c, lambda k: "compute" in k),
            "communication_us": _time(c, lambda k: "comm" in k and "compute" not in k),
            "memory_us": _time(c, lambda k: k == {"memory"}), "idle_us": span - _time(c, bool),
            "overlap": _time(c, lambda k: {"comm", "compute"} <= k) / comm if comm else None}


def _step_breakdown(events):
    """Per ProfilerStep: each instant to the first category running (PRIORITY), else other. Device work belongs to
    the step its launching runtime call starts in (same correlation) and stretches the step; host work to the
    step it starts in, cut at the step's end."""
    launch = {e["args"]["correlation"]: e["ts"] for e in events if e["cat"] in RUNTIME and "correlation" in e.get("args", {})}
    out = {}
    for step in [e for e in events if e["name"].startswith("ProfilerStep#")]:
        lo, end = step["ts"], step["ts"] + step["dur"]
        spans, hi = defaultdict(list), end
        for e in events:
            k = _device_kind(e)
            if k:
                if lo <= launch.get(e.get("args", {}).get("correlation"), e["ts"]) < end:
                    spans[{"compute": "kernel", "comm": "communication"}.get(k, k)].append((e["ts"], e["ts"] + e["dur"]))
                    hi = max(hi, e["ts"] + e["dur"])
            elif e["cat"] in HOST and not e["name"].startswith("ProfilerStep#") and lo <= e["ts"] < end:
                piece = (e["ts"], min(e["ts"] + e["dur"], end))
                if e["cat"] in RUNTIME:
                    spans["runtime"].append(piece)
                elif e["cat"] != "python_function" and _host_comm(e["name"]):
                    spans["communication"].append(piece)
                else:
                    if e["name"].startswith("enumerate(DataLoader)#") and e["name"].endswith(".__next__"):
                        spans["dataloader"].append(piece)
                    spans["cpu_exec"].append(piece)
        spans["window"] = [(lo, hi)]
        row = dict.fromkeys(PRIORITY + ("other",), 0.0)
        for labels, t in _sweep(spans).items():
            if "window" in labels:
                row[next((k for k in PRIORITY if k in labels), "other")] += float(t)
        row["dur_us"] = float(hi - lo)
        out[int(step["name"].split("#")[1])] = row
    return out


def _host_figures(doc):
    """Host span (first to last host event), compute (CPU ops, not collectives, off communication threads),
    collectives not under compute, idle; the collectives' overlap with compute."""
    events = _complete(doc)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    by_thread = defaultdict(list)
    for e in events:
        if e["cat"] in ("cpu_op", "user_annotation"):
            by_thread[(e["pid"], e["tid"])].append(e)

    def comm_thread(key):
        if any(w in names.get(key, "").lower() for w in ("gloo", "nccl", "c10d")):
            return True
        evs = by_thread[key]
        return not any(e["name"].startswith("ProfilerStep#") for e in evs) and all(_host_comm(e["name"]) for e in evs)

    host = [e for e in events if e["cat"] in HOST]
    span = float(max(e["ts"] + e["dur"] for e in host) - min(e["ts"] for e in host))
    spans = defaultdict(list)
    for e in host:
        if e["cat"] in ("cpu_op", "user_annotation") and _host_comm(e["name"]):
            spans["comm"].append((e["ts"], e["ts"] + e["dur"]))
        elif e["cat"] == "cpu_op" and not comm_thread((e["pid"], e["tid"])):
            spans["compute"].append((e["ts"], e["ts"] + e["dur"]))
    c = _sweep(spans)
    compute, comm = _time(c, lambda k: "compute" in k), _time(c, lambda k: k == {"comm"})
    return {"span_us": span, "compute_us": compute, "communication_us": comm, "idle_us": span - compute - comm,
            "overlap": {"communication_us": _time(c, lambda k: "comm" in k), "overlapped_us": _time(c, lambda k: len(k) == 2)}}


def _by_rank(out):
    return {r["rank"]: r for r in out["ranks"]}


@pytest.fixture(scope="module")
def dlrm():
    docs = {}
    for name in sorted(os.listdir(DLRM)):
        doc = _doc(os.path.join(DLRM, name))
        docs[doc["distributedInfo"]["rank"]] = doc
    return docs, analyze.summary(DLRM, workers=1, top=None), analyze.steps(DLRM, workers=1)


@pytest.fixture(scope="module")
def nccl():
    return _doc(NCCL), analyze.summary(NCCL, workers=1, top=None), analyze.steps(NCCL, workers=1)


def _gpu_cases(dlrm, nccl):
    docs, summary, steps = dlrm
    for rank, doc in docs.items():
        yield doc, _by_rank(summary)[rank], {row["step"]: x for row in steps["steps"] for x in row["ranks"] if x["rank"] == rank}
    doc, summary, steps = nccl
    yield doc, summary["ranks"][0], {row["step"]: x for row in steps["steps"] for x in row["ranks"]}


def test_device_temporal_and_overlap_match_a_plain_sweep(dlrm, nccl):
    cases = list(_gpu_cases(dlrm, nccl))
    assert len(cases) == 9
    for doc, rank, _ in cases:
        mine = _device_figures(_complete(doc))
        got = rank["temporal"]["device"]
        for key in ("span_us", "compute_us", "communication_us", "memory_us", "idle_us"):
            assert got[key] == pytest.approx(mine[key], rel=1e-6, abs=1e-3), (rank["rank"], key)
        assert got["compute_us"] + got["communication_us"] + got["memory_us"] + got["idle_us"] == pytest.approx(got["span_us"])
        assert rank["overlap"]["device"]["share"] == pytest.approx(mine["overlap"], rel=1e-6)
        assert 0 < rank["overlap"]["device"]["share"] < 1 and got["communication_us"] > 0


def test_step_breakdown_matches_a_plain_sweep(dlrm, nccl):
    seen = 0
    for doc, rank, rows in _gpu_cases(dlrm, nccl):
        mine = _step_breakdown(_complete(doc))
        assert sorted(rows) == sorted(mine)
        for step, row in rows.items():
            got = row["breakdown"]
            assert got == pytest.approx(mine[step], rel=1e-6, abs=1e-3), (rank["rank"], step)
            assert sum(got[k] for k in PRIORITY + ("other",)) == pytest.approx(got["dur_us"])
            assert got["dur_us"] >= row["dur_us"]  # stretched to the end of the device work the step launched
            seen += 1
        # The rank's step_breakdown in `summary` is the mean of its steps, and the breakdown is not empty.
        avg = rank["step_breakdown"]
        assert avg == pytest.approx({k: sum(r["breakdown"][k] for r in rows.values()) / len(rows) for k in avg})
        assert avg["kernel"] > 0 and avg["communication"] > 0 and avg["runtime"] > 0 and avg["cpu_exec"] > 0
    assert seen == 8 + 3


# ---- host-side figures: CPU-only jobs ---------------------------------------------------------------------
def _rank_docs(root):
    out = defaultdict(list)
    for d, _, names in sorted(os.walk(root)):
        for n in sorted(names):
            if n.endswith(".pt.trace.json.gz"):
                doc = _doc(os.path.join(d, n))
                out[doc["distributedInfo"]["rank"]].append(doc)
    return out


def _check_host(got, docs, steps_rows):
    """A rank's host figures against the sweep of each of its files, summed (its files are different windows)."""
    figs = [_host_figures(d) for d in docs]
    h = got["temporal"]["host"]
    total = {k: sum(f[k] for f in figs) for k in ("span_us", "compute_us", "communication_us", "idle_us")}
    assert {k: h[k] for k in total} == pytest.approx(total, rel=1e-9, abs=0.01)
    for key in ("compute", "communication", "idle"):  # shares of the summed span, not means of per-file shares
        assert h[f"{key}_share"] == pytest.approx(h[f"{key}_us"] / h["span_us"], rel=1e-12)
    o = got["overlap"]["host"]
    comm = sum(f["overlap"]["communication_us"] for f in figs)
    both = sum(f["overlap"]["overlapped_us"] for f in figs)
    assert (o["communication_us"], o["overlapped_us"]) == pytest.approx((comm, both), rel=1e-9, abs=0.01)
    assert o["share"] == pytest.approx(o["overlapped_us"] / o["communication_us"], rel=1e-12)
    assert got["temporal"]["device"] is None and got["overlap"]["device"] is None
    mine = {}
    for d in docs:
        mine.update(_step_breakdown(_complete(d)))
    assert sorted(steps_rows) == sorted(mine)
    for step, x in steps_rows.items():
        b = x["breakdown"]
        assert b == pytest.approx(mine[step], rel=1e-9, abs=0.01)
        assert b["kernel"] == b["memcpy"] == b["memset"] == b["runtime"] == 0.0 and b["dur_us"] == pytest.approx(x["dur_us"])
    avg = got["step_breakdown"]
    assert avg == pytest.approx({k: sum(x["breakdown"][k] for x in steps_rows.values()) / len(steps_rows) for k in avg})
    return total, (comm, both)


@pytest.fixture(scope="module")
def ddp(ddp_run):
    return ddp_run, analyze.summary(ddp_run, workers=1, top=None), analyze.steps(ddp_run, workers=1)


def test_host_figures_of_a_gloo_job_match_a_plain_sweep_and_a_ranks_files_add_up(ddp):
    ddp_run, s, d = ddp
    docs = _rank_docs(ddp_run)
    assert {r: len(v) for r, v in docs.items()} == {0: 2, 1: 2}  # two capture windows per rank
    for rank, rank_docs in docs.items():
        rows = {row["step"]: x for row in d["steps"] for x in row["ranks"] if x["rank"] == rank}
        assert sorted(rows) == [2, 3, 5, 6]
        total, (comm, both) = _check_host(_by_rank(s)[rank], rank_docs, rows)
        assert total["compute_us"] > 0 and comm > 0 and both > 0
    # Rank 0 waits for rank 1 (it sleeps in train/data) inside the all-reduces, so its collectives are mostly
    # not hidden behind compute; rank 1's all-reduces run on gloo's threads during its own backward.
    by = _by_rank(s)
    assert by[0]["overlap"]["host"]["share"] < by[1]["overlap"]["host"]["share"]
    assert by[0]["temporal"]["host"]["communication_share"] > by[1]["temporal"]["host"]["communication_share"]


def test_host_figures_of_a_cpu_only_trace_match_a_plain_sweep():
    s = analyze.summary(CPU_ONLY, workers=1, top=None)
    d = analyze.steps(CPU_ONLY, workers=1)
    (rank,) = s["ranks"]
    assert rank["rank"] == 34
    total, (comm, both) = _check_host(rank, [_doc(CPU_ONLY)], {row["step"]: row["ranks"][0] for row in d["steps"]})
    # gloo ran its all-reduces on two threads of their own (named pt_main_thread, recognised by what they run),
    # while the main thread ran four aten::empty ops after the step.
    assert comm > 0.8 * total["span_us"] and total["compute_us"] == pytest.approx(2.503 + 0.473 + 0.401 + 0.587)
    assert rank["temporal"]["host"]["compute_us"] == pytest.approx(total["compute_us"], abs=1e-3)
    assert both == 0.0


# ---- HolisticTraceAnalysis 0.5.0 ------------------------------------------------------------------------
# Recorded with HolisticTraceAnalysis 0.5.0 (pandas 3.1.1, numpy 2.4.6) on the unchanged files, each job in a
# folder of its own: TraceAnalysis(trace_dir=FOLDER, include_last_profiler_step=True) ("drop_last": False),
# then per rank get_temporal_breakdown(visualize=False) -> kernel_time, idle_time, compute_time,
# non_compute_time (us); get_comm_comp_overlap(visualize=False) -> comp_comm_overlap_pctg; and
# get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True, num_kernels=10**9, duration_ratio=1.0)
# -> its per-kernel table's "sum (us)" summed per rank by kernel_type. "no_rounding": the same with
# HTA_DISABLE_NS_ROUNDING=1 in the environment. Printed side by side with distprof's by
#   python benchmarks/crosscheck_hta.py --hta-python /work/hta-venv/bin/python [--drop-last] --json figures.json
FIGURES = ("span_us", "idle_us", "compute_us", "non_compute_us", "overlap_pct", "COMP", "COMM", "MEM")
HTA_DLRM = {  # one ProfilerStep name in the job: HTA filters nothing, so the whole trace
    0: (13009.0, 6419.0, 1034.0, 5556.0, 4.5, 1034.0, 5798.0, 19.0),
    1: (18749.0, 6428.0, 1246.0, 11075.0, 2.47, 1246.0, 11336.0, 19.0),
    2: (11350.0, 7046.0, 1068.0, 3236.0, 7.88, 1068.0, 3492.0, 19.0),
    3: (18853.0, 8145.0, 1240.0, 9468.0, 3.31, 1240.0, 9774.0, 28.0),
    4: (16589.0, 8887.0, 1126.0, 6576.0, 0.56, 1126.0, 6587.0, 26.0),
    5: (16392.0, 9121.0, 1041.0, 6230.0, 0.64, 1041.0, 6251.0, 19.0),
    6: (11410.0, 7051.0, 1051.0, 3308.0, 7.56, 1051.0, 3558.0, 19.0),
    7: (10967.0, 8308.0, 1059.0, 1600.0, 9.51, 1059.0, 1746.0, 20.0),
}
HTA_TWO_RANK = {
    "include_last": {0: (1222847.0, 675191.0, 210320.0, 337336.0, 14.95, 210320.0, 396199.0, 1325.0),
                     1: (1231186.0, 651136.0, 271973.0, 308077.0, 19.93, 271973.0, 379053.0, 16504.0)},
    "drop_last": {0: (600058.0, 321378.0, 106252.0, 172428.0, 11.81, 106252.0, 195327.0, 662.0),
                  1: (600674.0, 328671.0, 135548.0, 136455.0, 20.05, 135548.0, 168027.0, 2667.0)},
}
HTA_NCCL = {
    "include_last": {0: (660550.0, 506512.0, 113012.0, 41026.0, 15.14, 113012.0, 46858.0, 1565.0)},
    "include_last_no_rounding": {0: (660551.0056328125, 503050.9914063759, 115655.84700000286, 41844.167226433754,
                                     15.61, 115655.847, 46876.493, 2653.498)},
    "drop_last": {0: (435586.0, 338781.0, 75169.0, 21636.0, 14.31, 75169.0, 24278.0, 1015.0)},
    "drop_last_no_rounding": {0: (435587.5616796875, 336419.7146875525, 76935.82800000906, 22232.018992125988,
                                  14.76, 76935.828, 24289.05, 1753.0030000000002)},
}
HTA_SIMPLE_ADD = {0: (16464339.0, 16414376.0, 10676.0, 39287.0, None, 10736.0, 0.0, 39088.0)}  # no steps: no filter


def _as_hta(out):
    """distprof's summary in HTA's terms: non-compute = communication not under compute + memory under neither;
    the overlap percentage rounded to 0.01 as HTA rounds it; kernel types by summed duration."""
    rows = {}
    for r in out["ranks"]:
        d, o, c = r["temporal"]["device"], r["overlap"]["device"], r["categories"]
        rows[r["rank"] if r["rank"] is not None else 0] = (
            d["span_us"], d["idle_us"], d["compute_us"], d["communication_us"] + d["memory_us"],
            round(o["share"] * 100, 2) if o else None, c.get("compute", 0.0), c.get("communication", 0.0),
            c.get("memcpy", 0.0) + c.get("memset", 0.0))
    return rows


def test_hta_gives_the_same_figures_on_microsecond_traces():
    """Integer-µs traces, in both of HTA's scopes: every figure equal, not close."""
    assert _as_hta(analyze.summary(DLRM, workers=1)) == HTA_DLRM
    # HTA keeps the GPU work launched up to the end of the last step (include_last) or before the last step
    # starts (its default); distprof's steps selection is the same here (nothing is launched before step 551).
    assert _as_hta(analyze.summary(TWO_RANK, workers=1, selection=Selection(steps_only=True))) == HTA_TWO_RANK["include_last"]
    assert _as_hta(analyze.summary(TWO_RANK, workers=1, selection=Selection.of(steps="551"))) == HTA_TWO_RANK["drop_last"]


def _rounded_like_hta(src, dst):
    """HTA's round_down_time_stamps on a copy: on a trace with fractional ts, ts = ceil(ts), end = floor(ts + dur),
    in float64 as pandas computes them."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    changed = negative = 0
    for e in doc["traceEvents"]:
        if isinstance(e.get("ts"), float) and isinstance(e.get("dur"), (int, float)):
            start, end = math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])
            changed += (start, end - start) != (e["ts"], e["dur"])
            negative += end < start
            e["ts"], e["dur"] = start, end - start
    with open(dst, "w") as f:
        json.dump(doc, f)
    return changed, negative


def test_ns_rounding_is_the_whole_difference_with_hta_on_nccl_data(tmp_path):
    scopes = {"include_last": Selection(steps_only=True), "drop_last": Selection.of(steps="4,5")}
    for scope, sel in scopes.items():
        assert _as_hta(analyze.summary(NCCL, workers=1, selection=sel)) == {
            0: pytest.approx(HTA_NCCL[f"{scope}_no_rounding"][0], rel=1e-9)}, scope
    # HTA as shipped rounds every event inwards to whole µs: on a copy rounded the same way distprof gives HTA's
    # figures exactly, so the rounding is all that differs.
    changed, negative = _rounded_like_hta(NCCL, tmp_path / "nccl_rounded.json")
    assert negative == 837  # sub-µs CPU events that end before they start once rounded
    for scope, sel in scopes.items():
        assert _as_hta(analyze.summary(str(tmp_path / "nccl_rounded.json"), workers=1, selection=sel)) == HTA_NCCL[scope]
    # What the rounding costs: every device event loses about 1 µs (3,774 events, 3,750.838 µs), a third of the
    # short memcpy/memset time, and idle time grows by as much as the busy time shrinks.
    device = [e for e in _complete(_doc(NCCL)) if e["cat"] in DEVICE]
    lost = sum(e["dur"] - (math.floor(e["ts"] + e["dur"]) - math.ceil(e["ts"])) for e in device)
    assert (len(device), float(lost)) == (3774, 3750.838)
    ours, hta = HTA_NCCL["include_last_no_rounding"][0], HTA_NCCL["include_last"][0]
    assert hta[1] - ours[1] == pytest.approx(3461.0, abs=0.01) and hta[4] < ours[4]


def _hta_model(doc):
    """HTA 0.5.0's temporal breakdown and kernel-type totals restated (hta/analyzers/breakdown_analysis.py,
    hta/utils/utils.py): every complete event with an integer args.stream is GPU work, typed by its name."""
    def kind(name):
        if re.match(r"^nccl.*Kernel", name):
            return "comm"
        if re.match(r"(^Memcpy)|(^Memset)|(^dma)", name):
            return "memory"
        if re.match(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)", name):
            return "other"  # busy, but neither compute nor a type of its own
        return "compute"

    gpu = [e for e in _complete(doc) if e.get("cat") not in (None, "Trace") and isinstance(e.get("args", {}).get("stream"), int)]
    spans = defaultdict(list)
    for e in gpu:
        spans[kind(e["name"])].append((e["ts"], e["ts"] + e["dur"]))
    c = _sweep(spans)
    span = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    busy, compute = _time(c, bool), _time(c, lambda k: "compute" in k)
    sums = {k: float(sum(e["dur"] for e in gpu if kind(e["name"]) == k)) for k in ("compute", "comm", "memory")}
    return {0: (float(span), span - busy, compute, busy - compute, None, sums["compute"], sums["comm"], sums["memory"])}


def test_cuda_sync_events_are_the_whole_difference_with_hta_on_simple_add():
    doc = _doc(SIMPLE_ADD)
    ours = _as_hta(analyze.summary(SIMPLE_ADD, workers=1))
    assert _hta_model(doc) == HTA_SIMPLE_ADD  # the restatement reproduces HTA to the µs
    mine = _device_figures(_complete(doc))
    assert ours == {0: (mine["span_us"], mine["idle_us"], mine["compute_us"], mine["memory_us"], None, 10728.0, 0.0, 39088.0)}
    # The difference: 41 cuda_sync events carry args.stream, so HTA takes them for GPU work.
    sync = [e for e in _complete(doc) if e["cat"] == "cuda_sync"]
    assert Counter(e["name"] for e in sync) == {"Stream Wait Event": 20, "Stream Sync": 16, "Context Sync": 5}
    assert all(isinstance(e["args"]["stream"], int) for e in sync)
    # The last Context Sync ends 438,764 µs after the last kernel or copy: HTA's span (and idle time) is that longer.
    last_work = max(e["ts"] + e["dur"] for e in _complete(doc) if e["cat"] in DEVICE)
    last_sync = max(e["ts"] + e["dur"] for e in sync)
    hta = HTA_SIMPLE_ADD[0]
    assert hta[0] - ours[0][0] == last_sync - last_work == 438_764
    # "Stream Wait Event" does not match HTA's .*Sync rule: HTA counts its 8 µs as compute kernels.
    wait = sum(e["dur"] for e in sync if e["name"] == "Stream Wait Event")
    assert hta[5] - ours[0][5] == wait == 8


# ---- every share fits, every breakdown adds up ----------------------------------------------------------
def _walk(o, path=""):
    if isinstance(o, dict):
        yield path, o
        for k, v in o.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(o, list):
        for i, v in enumerate(o):
            yield from _walk(v, f"{path}[{i}]")


def test_every_share_fits_and_every_breakdown_adds_up(dlrm, nccl, ddp):
    outputs = [dlrm[1], dlrm[2], nccl[1], nccl[2], ddp[1], ddp[2],
               analyze.summary(NCCL, workers=1, top=None, selection=Selection(steps_only=True)),
               analyze.summary(CPU_ONLY, workers=1, top=None), analyze.steps(CPU_ONLY, workers=1)]
    counts = Counter()
    for out in outputs:
        for path, d in _walk(out):
            for k, v in d.items():
                if "share" in k and v is not None:
                    assert 0.0 <= v <= 1.0, (path, k, v)
                    counts["share"] += 1
            if path.endswith((".temporal.device", ".temporal.host")) and d:  # its parts are the span
                parts = d["compute_us"] + d["communication_us"] + d.get("memory_us", 0.0) + d["idle_us"]
                assert parts == pytest.approx(d["span_us"], rel=1e-9, abs=1e-6), path
                assert min(d["compute_us"], d["communication_us"], d.get("memory_us", 0.0), d["idle_us"]) >= 0, path
                counts["temporal"] += 1
            if path.endswith("breakdown") and d:  # a step breakdown: its categories are the step
                assert sum(d[k] for k in PRIORITY + ("other",)) == pytest.approx(d["dur_us"], rel=1e-9), path
                assert min(d[k] for k in PRIORITY + ("other",)) >= 0, path
                counts["breakdown"] += 1
            if path.endswith((".overlap.device", ".overlap.host")) and d:
                assert 0 <= d["overlapped_us"] <= d["communication_us"] * (1 + 1e-12), path
                counts["overlap"] += 1
        if "kernels" in out and out["kernels"]:  # summary with every row (top=None): shares of a whole
            assert sum(r["share"] for r in out["kernels"]) == pytest.approx(1.0)
            assert sum(r["share"] for r in out["ops"]) == pytest.approx(1.0)
            for r in out["ranks"]:
                assert r["idle_share"] == pytest.approx(r["temporal"]["device"]["idle_share"])
                assert r["kernel_total_us"] == pytest.approx(sum(r["categories"].values()))
    assert counts["share"] > 150 and counts["temporal"] > 40 and counts["breakdown"] > 20 and counts["overlap"] > 20, counts


# ---- one meaning of communication: gloo on a GPU rank (issue 18, item 15) ------------------------------------
def _host_collective_device_figures(doc):
    """A GPU rank with no collective kernels (DDP over gloo with CUDA tensors): its collectives are its host
    collective ranges (c10d ops, gloo: ranges, any thread), within its device span, where the device waits for
    them as it would for a spinning NCCL kernel."""
    events = _complete(doc)
    dev = [e for e in events if _device_kind(e)]
    assert not any(_device_kind(e) == "comm" for e in dev)
    lo, hi = min(e["ts"] for e in dev), max(e["ts"] + e["dur"] for e in dev)
    spans = defaultdict(list)
    for e in dev:
        k = _device_kind(e)
        spans["memory" if k in ("memcpy", "memset") else k].append((e["ts"], e["ts"] + e["dur"]))
    for e in events:
        if e["cat"] in ("cpu_op", "user_annotation") and _host_comm(e["name"]):
            spans["comm"].append((max(e["ts"], lo), min(e["ts"] + e["dur"], hi)))
    c = _sweep(spans)
    comm = _time(c, lambda k: "comm" in k)
    return {"span_us": float(hi - lo), "communication_us": _time(c, lambda k: "comm" in k and "compute" not in k),
            "idle_us": float(hi - lo) - _time(c, bool),
            "overlap": _time(c, lambda k: {"comm", "compute"} <= k) / comm}


def test_gloo_collectives_on_a_gpu_rank_are_communication_everywhere():
    """H100, DDP over gloo with CUDA tensors: the straggler finding counted 8 collectives per rank while the
    device breakdown said 0% communication and the overlap had no figure ("no collective kernels and no host
    collectives"). Every analysis now counts the same collectives: the host's, where they run."""
    run = os.path.join(TRACES, "distprof-h100", "ddp-gloo-cuda-slow-rank1")
    docs = {}
    for d, _, names in os.walk(run):
        for n in names:
            if n.endswith(".pt.trace.json.gz"):
                doc = _doc(os.path.join(d, n))
                docs[doc["distributedInfo"]["rank"]] = doc
    s = analyze.summary(run, workers=1)
    st = analyze.stragglers(run, workers=1)
    counted = {r["rank"]: r["collectives"] for r in st["ranks"]}
    for rank, doc in docs.items():
        calls = sum(1 for e in _complete(doc) if e["name"] == "c10d::allreduce_")
        assert calls == counted[rank] == 8  # what stragglers matches: the c10d calls, 2 buckets x 4 steps
        mine = _host_collective_device_figures(doc)
        r = _by_rank(s)[rank]
        got = r["temporal"]["device"]
        for key in ("span_us", "communication_us", "idle_us"):
            assert got[key] == pytest.approx(mine[key], rel=1e-6, abs=1e-3), (rank, key)
        assert got["communication_share"] > 0.25  # the all-reduces (and rank 0's wait in them) are most of it
        assert r["overlap"]["device"]["share"] == pytest.approx(mine["overlap"], rel=1e-6)
        assert r["step_breakdown"]["communication"] > 0
    d = analyze.diagnose(run, workers=1)
    f = next(f for f in d["findings"] if f["id"] == "straggler")
    assert f["evidence"]["figures"]["collectives"] == 8
