"""The collective report (issue 23, item 3): nccl-tests' formulas per collective against a hand computation, the
report on the real 8-rank DLRM set and on HTA's NCCL trace against an independent oracle (TraceLens's definitions,
computed here with the json module; TraceLens itself is not on the package index), the ``--json`` keys, the
terminal table, and what an odd trace's metadata gives (None, never a traceback or a zero)."""

import gzip
import json
import os
import statistics
from collections import Counter

import pytest
from rich.console import Console
from tracekit import DLRM, TRACES, X, table, write

from distprof.analysis import analyze
from distprof.analysis import collectives as coll
from distprof.analysis.records import to_json
from distprof.report import termcoll
from distprof.trace.commargs import CommArgs, comm_args

NCCL = os.path.join(TRACES, "hta", "nccl_data.json.gz")
DESIGN_KEYS = ["group", "name", "count", "bytes", "min_dur_us", "skew_us", "algbw_gbps", "busbw_gbps", "last_rank",
               "last_share"]


def _args(kind, n_in, n_out, dtype="Float", n=8):
    return CommArgs(n_in, n_out, dtype, n, None, None, None)


# ---- the formulas, by hand --------------------------------------------------------------------------------
# (kind, In msg nelems, Out msg nelems, dtype, group size) -> S in bytes and busbw/algbw, worked out by hand from
# nccl-tests (doc/PERFORMANCE.md, src/*.cu): allreduce 2(n-1)/n, allgather and reducescatter (n-1)/n on the whole
# buffer, alltoall (n-1)/n, broadcast/reduce/sendrecv 1.
HAND = [
    ("allreduce", 1_000_000, 1_000_000, "Float", 8, 4_000_000, 1.75),
    ("allreduce", 1_000, 1_000, "BFloat16", 2, 2_000, 1.0),
    ("allgatherintotensorcoalesced", 1_000, 8_000, "BFloat16", 8, 16_000, 0.875),  # S: the gathered output
    ("allgather", 1_000, 4_000, "Float", 4, 16_000, 0.75),
    ("reducescatter", 8_000, 1_000, "Half", 8, 16_000, 0.875),  # S: the whole input
    ("reducescattertensorcoalesced", 4_000, 1_000, "Float", 4, 16_000, 0.75),
    ("alltoall", 6_144, 6_144, "Float", 8, 24_576, 0.875),
    ("alltoallbase", 100, 100, "Long", 4, 800, 0.75),
    ("broadcast", 53_120, 53_120, "Float", 2, 212_480, 1.0),
    ("reduce", 10, 10, "Double", 16, 80, 1.0),
    ("sendrecv", 10, 10, "Byte", 2, 10, 1.0),
    ("gather", 10, 40, "Int", 4, 160, 0.75),
]


@pytest.mark.parametrize("kind,n_in,n_out,dtype,n,want_bytes,want_factor", HAND)
def test_size_and_bus_factor_match_a_hand_computation(kind, n_in, n_out, dtype, n, want_bytes, want_factor):
    assert coll.size_bytes(kind, _args(kind, n_in, n_out, dtype, n)) == want_bytes
    assert coll.bus_factor(kind, n) == pytest.approx(want_factor)


def test_no_formula_or_no_metadata_gives_none():
    assert coll.bus_factor("barrier", 8) is None
    assert coll.bus_factor("alltoallv", 8) is None  # per-rank sizes differ: no busbw
    assert coll.bus_factor("allreduce", None) is None
    assert coll.size_bytes("allreduce", None) is None
    assert coll.size_bytes("allreduce", _args("allreduce", 10, 10, dtype="NoSuchType")) is None
    for f in coll.FORMULAS.values():
        assert f.source and f.message in ("in", "out", "max")


def test_recorded_values_are_checked_not_trusted():
    a = comm_args("12", -1, 5, True, "[0, 1, 2]", "default_pg", 7.0)
    assert a == CommArgs(None, None, None, None, (0, 1, 2), "default_pg", 7)
    assert comm_args(None, None, None, None, "[0, x]", None, None) is None
    assert comm_args(3, 3, "Float", 2, [0, "1"], None, None).group_ranks is None


def _kernel(name, ts, dur, rank, **meta):
    return X(name, ts, dur, cat="kernel", pid=rank, tid=7, correlation=ts, stream=7, **meta)


def _two_ranks(tmp_path):
    """Two ranks, NCCL kernels with recorded metadata (as torch >= 2.1 writes it on the kernel): an allreduce
    twice, an allgather once; rank 1 starts each later."""
    def meta(name, n_in, n_out):
        return {"Collective name": name, "In msg nelems": n_in, "Out msg nelems": n_out, "Group size": 2,
                "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": "[0, 1]"}

    for rank, late in ((0, 0), (1, 30)):
        evs = [{**_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", 1000 + late, 100 - late, rank),
                "args": {"correlation": 1, "stream": 7, **meta("allreduce", 5_000_000, 5_000_000)}},
               {**_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", 3000 + 2 * late, 200 - late, rank),
                "args": {"correlation": 2, "stream": 7, **meta("allreduce", 5_000_000, 5_000_000)}},
               {**_kernel("ncclDevKernel_AllGather_RING_LL(x)", 5000 + late, 50, rank),
                "args": {"correlation": 3, "stream": 7, **meta("all_gather_into_tensor", 1_000, 2_000)}}]
        write(tmp_path / f"rank{rank}.json", evs, distributedInfo={"rank": rank, "world_size": 2})
    return tmp_path


def test_two_ranks_by_hand(tmp_path):
    rows = {r["name"]: r for r in analyze.summary(str(_two_ranks(tmp_path)), workers=1)["collectives"]}
    ar = rows["allreduce"]
    # instance 1: rank 0 100 µs, rank 1 70 µs -> 70 µs; skew 30. instance 2: 200 and 170 -> 170; skew 60.
    assert ar["count"] == 2 and ar["min_dur_us"] == 240.0 and ar["skew_us"] == 45.0 and ar["skew_max_us"] == 60.0
    assert ar["bytes"] == 2 * 10_000_000 and ar["bytes_per_call"] == 10_000_000
    assert ar["algbw_gbps"] == pytest.approx(20e6 / 240 / 1e3)  # bytes / µs / 1e3 = GB/s
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * (2 - 1) / 2)
    assert (ar["last_rank"], ar["last_share"], ar["last_arrivals"]) == (1, 1.0, {"1": 2})
    assert (ar["group"], ar["group_desc"], ar["group_size"], ar["dtype"], ar["ranks"]) == \
        ("0", "default_pg", 2, "BFloat16", 2)
    ag = rows["allgatherintotensor"]
    assert ag["bytes"] == 4_000 and ag["min_dur_us"] == 50.0  # S = Out msg nelems x 2 bytes
    assert ag["busbw_gbps"] == pytest.approx(4_000 / 50 / 1e3 * 0.5)
    assert ag["note"] is None


def _oracle(paths):
    """TraceLens's collective report (TraceLens/NcclAnalyser/nccl_analyser.py: comm latency = the least duration
    among the ranks, skew = latest start - earliest, full message = Out for allgather else In), computed with the
    json module over the raw files: NCCL kernels per rank in time order, grouped by (process group, kind), the k-th
    of every rank matched. Bytes in decimal GB (TraceLens prints GiB: 1024**3)."""
    per_rank, outs = {}, {}
    for p in paths:
        with gzip.open(p, "rt") as f:
            doc = json.load(f)
        ks = []
        evs = doc["traceEvents"]
        launch = {e["args"]["correlation"]: e for e in evs if e.get("cat") == "cuda_runtime"}
        # The DLRM set (torch 2.0) records no metadata on its kernels: the nccl:* range the launch runs in records
        # the tensor sent (Input Dims, Input type), the c10d::alltoall_base_ around it (output, input).
        ranges = [e for e in evs if e.get("ph") == "X" and e["name"].startswith(("nccl:", "c10d::alltoall_base_"))]
        for e in evs:
            if e.get("ph") == "X" and e.get("cat") == "kernel" and e["name"].startswith("nccl"):
                a = dict(e.get("args", {}))
                rt = launch.get(a.get("correlation"))
                around = [r for r in ranges if rt is not None and (r["pid"], r["tid"]) == (rt["pid"], rt["tid"])
                          and r["ts"] <= rt["ts"] < r["ts"] + r["dur"]]
                for r in around:
                    dims, types = r["args"].get("Input Dims"), r["args"].get("Input type")
                    if not dims or not dims[0]:
                        continue
                    if r["name"].startswith("nccl:") and "dtype" not in a:
                        a["In msg nelems"] = dims[0][0]
                        a["dtype"] = {"float": "Float", "int": "Int", "long int": "Long"}[types[0]]
                    elif r["name"].startswith("c10d::"):
                        outs[(doc["distributedInfo"]["rank"], e["ts"])] = dims[0][0]
                a["out"] = outs.get((doc["distributedInfo"]["rank"], e["ts"]))
                kind = (a.get("Collective name") or e["name"].split("_")[1]).lower().replace("_", "")
                ks.append((float(e["ts"]), float(e["dur"]), a.get("Process Group Name", "default"), kind, a))
        per_rank[doc["distributedInfo"]["rank"]] = sorted(ks, key=lambda k: k[0])
    out = {}
    for key in {(k[2], k[3]) for ks in per_rank.values() for k in ks}:
        lists = {r: [k for k in ks if (k[2], k[3]) == key] for r, ks in per_rank.items()}
        n = min(len(v) for v in lists.values())
        lat, skews, last, nbytes, imbalance, tl_imbalance = [], [], Counter(), [], [], []
        for i in range(n):
            inst = {r: v[i] for r, v in lists.items()}
            ins = [k[4]["In msg nelems"] for k in inst.values() if "In msg nelems" in k[4]]
            outs_i = [k[4]["out"] for k in inst.values() if k[4].get("out") is not None]
            if key[1].startswith(("alltoall", "sendrecv")) and len(ins) > 1:
                tl_imbalance.append(max(ins) / statistics.fmean(ins))  # TraceLens: In msg sizes only
                imbalance.append(max([max(v) / statistics.fmean(v) for v in (ins, outs_i) if len(v) > 1]))
            lat.append(min(k[1] for k in inst.values()))
            starts = {r: k[0] for r, k in inst.items()}
            if len(inst) > 1:
                skews.append(max(starts.values()) - min(starts.values()))
                last[max(starts, key=lambda r: (starts[r], r))] += 1
            a = inst[min(inst)][4]
            if "dtype" in a:
                nelems = a["Out msg nelems"] if key[1].startswith("allgather") else a["In msg nelems"]
                nbytes.append(nelems * {"Float": 4, "BFloat16": 2, "Long": 8, "Int": 4}[a["dtype"]])
        out[key] = {"count": n, "min_dur_us": sum(lat), "skew_us": statistics.median(skews) if skews else None,
                    "last_arrivals": {str(r): c for r, c in sorted(last.items())},
                    "bytes": sum(nbytes) if nbytes else None,
                    "algbw_gbps": sum(nbytes) / 1e9 / (sum(lat) / 1e6) if nbytes else None,
                    "imbalance": max(imbalance) if imbalance else None,
                    "size_imbalance": max(tl_imbalance) if tl_imbalance else None}
    return out


@pytest.mark.parametrize("where", ["dlrm", "hta_nccl"])
def test_report_matches_the_independent_oracle(where):
    paths = [os.path.join(DLRM, f) for f in sorted(os.listdir(DLRM))] if where == "dlrm" else [NCCL]
    got = analyze.summary(DLRM if where == "dlrm" else NCCL, workers=1)["collectives"]
    want = _oracle(paths)
    assert {(r["group"], r["name"]) for r in got} == set(want)
    for r in got:
        w = want[(r["group"], r["name"])]
        for k in ("count", "min_dur_us", "skew_us", "last_arrivals", "bytes", "algbw_gbps"):
            assert r[k] == (pytest.approx(w[k]) if isinstance(w[k], float) else w[k]), (where, r["name"], k)
        assert r.get("imbalance") == (pytest.approx(w["imbalance"]) if w["imbalance"] else None)
    if where == "dlrm":  # sizes from the nccl:* ranges (torch 2.0); no group size recorded: no busbw, said so
        assert all(r["bytes"] and r["busbw_gbps"] is None and "group size not recorded" in r["note"] for r in got)
        # the 4th all-to-all is an all-to-all-v: every rank sends 3,392 ints and receives 768 to 13,312 (mean
        # 3,392): 3.92 by the out-messages, 1.0 by TraceLens's in-message size_imbalance
        s = next(r for r in got if r["name"] == "sendrecv")
        assert s["imbalance"] == pytest.approx(13312 / 3392) and want[("default", "sendrecv")]["size_imbalance"] == 1
        assert next(r for r in got if r["name"] == "allreduce").get("imbalance") is None
        assert [(r["name"], r["last_rank"], r["last_share"]) for r in got] == \
            [("allreduce", 4, pytest.approx(1 / 3)), ("sendrecv", 7, 0.8)]
    else:  # one rank of two traced: figures of the transfer, no skew
        ar = next(r for r in got if r["name"] == "allreduce")
        assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * 1 / 2) and ar["skew_us"] is None


def test_json_keys_and_terminal_table():
    s = analyze.summary_result(DLRM, workers=1)
    rows = to_json(s)["collectives"]
    for r in rows:
        assert list(r)[1:len(DESIGN_KEYS) + 1] == DESIGN_KEYS
    console = Console(width=80, record=True, force_terminal=True)
    termcoll.collectives(console, s.collectives)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "Rank 7 arrived last in 62.5% of 8 collectives." in text  # 4 of 5 sendrecv + 1 of 3 allreduce
    assert "group size not recorded" in text and "0 B" not in text
    for r in s.collectives:
        assert r.name in text and f"{r.count:,}" in text


def test_a_trace_without_collectives_has_no_key(tmp_path):
    write(tmp_path / "r.json", [X("aten::mm", 0, 10)], distributedInfo={"rank": 0, "world_size": 1})
    assert "collectives" not in analyze.summary(str(tmp_path / "r.json"), workers=1)


def test_kernel_takes_the_sizes_of_the_record_param_comms_that_launched_it(tmp_path):
    """Older Kineto puts the metadata on record_param_comms only; the kernel links to it by External id."""
    rpc = X("record_param_comms", 0, 50, **{"External id": 11, "Collective name": "allreduce",
                                           "In msg nelems": 256, "Out msg nelems": 256, "dtype": "Half",
                                           "Group size": 4, "Process Group Name": "3"})
    k = X("ncclKernel_AllReduce_RING_LL_Sum_half(x)", 100, 20, cat="kernel", pid=0, tid=7,
          **{"External id": 11, "correlation": 5, "stream": 7})
    write(tmp_path / "r.json", [rpc, k], distributedInfo={"rank": 0, "world_size": 4})
    part = coll.extract(table(tmp_path / "r.json"))
    assert [(c[0], c[1], c[5]) for c in part["collectives"]] == \
        [("3", "allreduce", CommArgs(256, 256, "Half", 4, None, None, None))]
    (row,) = coll.combine([(table(tmp_path / "r.json").info, part)])
    assert row.bytes == 512 and row.busbw_gbps == pytest.approx(512 / 20 / 1e3 * 1.5)


def test_gloo_host_collectives_say_why_there_is_no_bandwidth():
    rows = analyze.summary(os.path.join(TRACES, "distprof-h100", "ddp-gloo-cuda-slow-rank1"), workers=1)["collectives"]
    (r,) = rows
    assert (r["source"], r["min_dur_us"], r["algbw_gbps"], r["last_rank"], r["last_share"]) == \
        ("host", None, None, 1, 1.0)
    assert r["skew_us"] > 80_000 and "host-side" in r["note"]
