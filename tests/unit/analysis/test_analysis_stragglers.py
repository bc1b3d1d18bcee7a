"""distprof stragglers on the real 8-rank NCCL set and on real gloo jobs with a deliberately slow rank."""

import gzip
import json
import os
import shutil
from collections import defaultdict

import pytest
from conftest import SLOW_S, gloo_run
from tracekit import DLRM, TRACES, X, cli, table, write

from distprof.analysis import analyze, find_traces
from distprof.analysis.records import to_json
from distprof.analysis import stragglers as strag


def _independent(folder):
    """The definition, computed another way: NCCL kernels per rank (json module), the k-th of each kind matched,
    each rank blocked from its arrival to the last arrival (or its kernel's end); then, on a 1 µs grid, each
    blocked instant charged to the last arrival of the earliest-started collective blocking it."""
    kernels = {}
    for name in os.listdir(folder):
        with gzip.open(os.path.join(folder, name), "rt") as f:
            doc = json.load(f)
        ks = sorted((float(e["ts"]), float(e["ts"]) + float(e["dur"]), e["name"].split("_")[1])
                    for e in doc["traceEvents"]
                    if e.get("ph") == "X" and e.get("cat") == "kernel" and e["name"].startswith("nccl"))
        kernels[doc["distributedInfo"]["rank"]] = ks
    spans = defaultdict(list)  # rank -> (start, stop, last rank)
    for kind in {k for ks in kernels.values() for *_, k in ks}:
        per = {r: [k for k in ks if k[2] == kind] for r, ks in kernels.items()}
        for i in range(min(len(v) for v in per.values())):
            arrivals = {r: v[i][0] for r, v in per.items()}
            last = max(arrivals, key=lambda r: (arrivals[r], r))
            for r, v in per.items():
                stop = min(arrivals[last], v[i][1])
                if stop > v[i][0]:
                    spans[r].append((v[i][0], stop, last))
    caused, waited = defaultdict(float), defaultdict(float)
    for r, ss in spans.items():
        ss.sort()
        for t in range(int(min(s for s, _, _ in ss)), int(max(e for _, e, _ in ss))):
            covering = [s for s in ss if s[0] <= t < s[1]]
            if covering:
                waited[r] += 1
                caused[min(covering)[2]] += 1
    return caused, waited


def test_dlrm_stragglers_match_independent_computation():
    r = analyze.stragglers(DLRM, workers=1, top=None)
    caused, waited = _independent(DLRM)
    assert r["sources"] == ["gpu"] and r["matched"] == 8 and r["mismatched"] == []
    got = {row["rank"]: (row["wait_caused_us"], row["waited_us"]) for row in r["ranks"]}
    assert got == {rank: (caused.get(rank, 0.0), waited.get(rank, 0.0)) for rank in range(8)}
    assert [row["wait_caused_us"] for row in r["ranks"]] == sorted((v[0] for v in got.values()), reverse=True)
    assert r["ranks"][0]["rank"] == 7 and r["steps"][0]["slowest_rank"] == 7
    # Every blocked instant is charged once: the waits caused add up to the time all ranks waited.
    assert sum(v[0] for v in got.values()) == sum(v[1] for v in got.values()) == r["steps"][0]["wait_us"]


def _rank_spans(run_dir):
    """Per rank: traced span (µs) and each step's duration, from the traces (json module)."""
    span, steps = {}, defaultdict(dict)
    for f in find_traces(run_dir):
        with gzip.open(f.path, "rt") as fh:
            ev = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
        span[f.manifest_rank] = span.get(f.manifest_rank, 0.0) + max(e["ts"] + e["dur"] for e in ev) - min(e["ts"] for e in ev)
        for e in ev:
            if e["name"].startswith("ProfilerStep#"):
                steps[int(e["name"][13:])][f.manifest_rank] = e["dur"]
    return span, steps


def test_overlapping_collectives_are_not_counted_twice(ddp_run):
    """DDP's bucket all-reduces overlap: summing each collective's waits counted rank 0's blocked time several
    times (wait caused above the whole window). Waits are now unions, charged once."""
    r = analyze.stragglers(ddp_run, workers=1, top=None)
    span, steps = _rank_spans(ddp_run)
    by_rank = {row["rank"]: row for row in r["ranks"]}
    assert r["sources"] == ["cpu"] and r["ranks"][0]["rank"] == 1 and by_rank[1]["late_arrivals"] >= 4
    raw = sum(w["max_wait_us"] for w in r["worst"] if w["last_rank"] == 1)
    assert raw > 1.5 * by_rank[0]["waited_us"]  # the collectives overlap: the old sum would double count
    for rank, row in by_rank.items():
        assert row["waited_us"] <= span[rank]
    assert sum(row["wait_caused_us"] for row in r["ranks"]) == sum(row["waited_us"] for row in r["ranks"])
    assert {s["step"] for s in r["steps"]} == {2, 3, 5, 6}  # both windows of every rank count
    for s in r["steps"]:
        assert s["slowest_rank"] == 1
        assert s["wait_us"] <= max(steps[s["step"]].values()) * (2 - 1)
    # Rank 1 sleeps SLOW_S per step: rank 0 waits about that long per step, not several times it.
    assert 4 * SLOW_S * 1e6 / 2 < by_rank[0]["waited_us"] < 4 * SLOW_S * 1e6 * 2


def test_output_does_not_depend_on_workers(ddp_run, tmp_path):
    outs = [cli("stragglers", ddp_run, "--json", "--workers", w)[1] for w in (1, 2, 3)]
    assert outs[0] == outs[1] == outs[2] and outs[0]["matched"] >= 4 * 2
    # Two jobs claiming the same rank: the second copy is reported, not silently merged or dropped.
    src = tmp_path / "two"
    shutil.copytree(ddp_run, src / "a")
    shutil.copytree(ddp_run, src / "b")
    code, doc, err = cli("stragglers", src, "--json")
    assert code == 0 and len(doc["conflicts"]) == 4  # two windows of two ranks, claimed twice
    assert all("/b/" in c["path"] and "/a/" in c["kept"] for c in doc["conflicts"])
    assert doc["ranks"] == outs[0]["ranks"]
    code, text, err = cli("stragglers", src)
    assert code == 0 and "conflict" in err and "claims train rank 0" in err
    lines = err.strip().splitlines()  # one line per conflict, printed once (not also as a log record)
    assert len(lines) == 4 and all(line.startswith("conflict ") for line in lines), err


def test_kernel_metadata_names_group_and_collective():
    """nccl_data.json.gz records ``Process Group Name`` and ``Collective name`` on each NCCL kernel."""
    path = os.path.join(TRACES, "hta", "nccl_data.json.gz")
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    expected = defaultdict(int)
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel" and "nccl" in e["name"].lower():
            expected[(e["args"]["Process Group Name"], e["args"]["Collective name"])] += 1
    got = defaultdict(int)
    for g, k, *_ in strag.extract(table(path))["collectives"]:
        got[(g, k)] += 1
    assert dict(got) == dict(expected) and set(expected) == {("0", "allreduce"), ("0", "broadcast")}


def _rank_trace(tmp_path, rank, starts):
    """A GPU trace whose NCCL kernels carry no group; the launching record_param_comms op names it."""
    events = []
    for i, (group, ts) in enumerate(starts):
        events.append(X("record_param_comms", ts - 5, 3, External_id=100 + i, Process_Group_Name=group,
                        Collective_name="all_reduce"))
        events.append(X("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ts, 10, cat="kernel", pid=0, tid=7,
                        External_id=100 + i))
    return write(tmp_path / f"rank-{rank}.json", events, distributedInfo={"rank": rank})


def test_groups_from_the_launching_op_are_matched_separately(tmp_path):
    # Rank 1 is late in group "tp" only; group "dp" collectives interleave differently on the two ranks,
    # which would pair the wrong collectives if groups were not told apart.
    _rank_trace(tmp_path, 0, [("tp", 100), ("dp", 200), ("tp", 300)])
    _rank_trace(tmp_path, 1, [("dp", 150), ("tp", 160), ("tp", 360)])
    r = analyze.stragglers(str(tmp_path), workers=1, top=None)
    assert r["matched"] == 3 and r["mismatched"] == []
    by = {(w["group"], w["index"]): (w["last_rank"], w["wait_caused_us"]) for w in r["worst"]}
    # Each rank waits until the last arrival or until its own kernel (10 µs) ends, whichever is first.
    assert by == {("tp", 0): (1, 10.0), ("tp", 1): (1, 10.0), ("dp", 0): (0, 10.0)}


@pytest.mark.slow
def test_plain_torch_profiler_traces_of_a_gloo_job(tmp_path):
    """No distprof in the job: torch.profiler + tensorboard_trace_handler, rank only in distributedInfo."""
    out = str(tmp_path / "tb")
    gloo_run(out, steps=5, world_size=2, config={"steps": [2, 3]}, slow_rank=0, slow_s=SLOW_S, plain_torch=True)
    files = find_traces(out)
    assert len(files) == 2 and all(f.path.endswith(".pt.trace.json") and f.manifest_rank is None for f in files)
    r = analyze.stragglers(out, workers=1)
    assert r["sources"] == ["cpu"] and sorted(x["rank"] for x in r["ranks"]) == [0, 1]
    assert r["ranks"][0]["rank"] == 0 and r["ranks"][0]["wait_caused_us"] > 100_000
    assert {s["step"] for s in r["steps"]} == {2, 3} and all(s["slowest_rank"] == 0 for s in r["steps"])


def test_cli_stragglers_json_keys_and_top():
    code, doc, _ = cli("stragglers", DLRM, "--json", "--top", "30")
    assert code == 0 and [set(r) >= {"rank", "wait_caused_us", "late_arrivals"} for r in doc["ranks"]] == [True] * 8
    caused = [r["wait_caused_us"] for r in doc["ranks"]]
    assert caused == sorted(caused, reverse=True)
    assert len(doc["worst"]) == 8  # every late collective, not capped at 20 or at the default 10
    code, text, _ = cli("stragglers", DLRM)
    assert code == 0 and "Stragglers: 8 collectives matched" in text


def test_wait_matrix_splits_each_ranks_waiting_by_the_rank_it_waited_for():
    r = analyze.stragglers(DLRM, workers=1)
    waited, caused = defaultdict(float), defaultdict(float)
    for c in r["wait_matrix"]:
        assert c["waiter"] != c["culprit"] and c["wait_us"] > 0
        waited[c["waiter"]] += c["wait_us"]
        caused[c["culprit"]] += c["wait_us"]
    assert dict(waited) == pytest.approx({row["rank"]: row["waited_us"] for row in r["ranks"] if row["waited_us"]})
    assert dict(caused) == pytest.approx({row["rank"]: row["wait_caused_us"] for row in r["ranks"] if row["wait_caused_us"]})


def test_investigate_gives_every_verbs_answer_from_one_read():
    inv = analyze.investigate(DLRM, workers=1)
    assert to_json(inv.summary) == analyze.summary(DLRM, workers=1)  # the verbs print the records' encoding
    assert to_json(inv.steps) == analyze.steps(DLRM, workers=1)
    assert to_json(inv.stragglers) == analyze.stragglers(DLRM, workers=1, top=None)
    assert inv.envelope()["files_read"] == 8 and inv.run.files and len(inv.run.files) == 8
