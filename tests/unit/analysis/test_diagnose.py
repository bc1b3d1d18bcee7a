"""distprof diagnose: findings ranked by the step time they cost, on real jobs and real traces.

Real inputs: the gloo DDP job with a slow rank (``ddp_run``), a gloo job with no slow rank made here, the
8-rank DLRM set and HTA's CPU-only rank. Small hand-written traces stand in where the data set holds no
case: the what-if on three ranks (where subtracting a phase's excess and the step's path disagree), roles,
outlier steps, and names that look like markup.
"""

import gzip
import json
import os
import shutil
import statistics

import pytest
from conftest import SLOW_S, gloo_run
from tracekit import DLRM, TRACES, X, cli, write

from distprof.analysis import analyze
from distprof.analysis.diagnose import STRAGGLER_WAIT_SHARE, THRESHOLDS, Plot, path_saving
from distprof.analysis.records import RankStep

DEVICE_RULES = {"exposed_communication", "launch_bound", "host_sync", "memcpy", "pageable_memcpy"}


def _one(findings, rule):
    hits = [f for f in findings if f["id"] == rule]
    assert len(hits) == 1, [f["id"] for f in findings]
    return hits[0]


# ---- real jobs --------------------------------------------------------------------------------------------
def test_gloo_job_names_the_slow_rank_and_its_phase(ddp_run):
    d = analyze.diagnose(ddp_run, workers=1)
    costs = [f["cost_us"] for f in d["findings"]]
    assert costs == sorted(costs, reverse=True)
    f = d["findings"][0]
    assert f["id"] == "straggler" and f["plot"] == Plot.WAITS
    ev = f["evidence"]
    assert ev["role"] == "train" and ev["ranks"] == [1, 0] and ev["names"][0] == "train/data"
    assert ev["steps"] == [2, 3, 5, 6]
    assert "rank 1" in f["claim"] and "train/data" in f["claim"]
    assert not DEVICE_RULES & {x["id"] for x in d["findings"]}  # a CPU-only job: host rules only
    # The what-if, computed here from the steps rows by the model's definition: rank 1's train/data cut to
    # rank 0's, and the step shortened only until rank 0 arrives last.
    inv = analyze.investigate(ddp_run, workers=1)
    expected = naive = 0.0
    for row in inv.steps.steps:
        by = {x.rank: x for x in row.ranks}
        cut = by[1].phases["train/data"] - by[0].phases.get("train/data", 0.0)
        arrive = {r: x.start_us + x.busy_us for r, x in by.items()}
        expected += arrive[1] - max(arrive[1] - cut, arrive[0])
        naive += cut
    w = f["what_if"]
    assert w["saves_us"] == pytest.approx(expected) and w["naive_us"] == pytest.approx(naive)
    assert f["cost_us"] == w["saves_us"] and 0 < w["saves_us"] <= w["naive_us"]
    # Rank 1 slept SLOW_S in train/data each step; rank 0's train/data is a random batch (well under 10%).
    assert 0.9 * SLOW_S * 1e6 < w["naive_us"] / 4 <= max(x.dur_us for row in inv.steps.steps for x in row.ranks)


def test_gloo_job_with_no_slow_rank_has_no_straggler(tmp_path):
    # Six profiled steps: a rank the busy 2-core machine happens to deschedule in one or two steps is not the
    # rank holding the others back in 2/3 of them (the rule's consistency threshold). Yet the suite's other worker
    # can slow one rank of this balanced job for all of its two seconds (seen: rank 0's DDP forward at 12.5 ms
    # against 3.07 ms in 5 of 6 steps while a Ray test ran beside it): that rank then really is the straggler, and
    # the rule is right to name it. So the job runs a second time when the first names a phase; a rule that names
    # one where there is none does so in both runs. (Naming a real slow rank: the tests above.)
    seen = []
    for attempt in range(2):
        out = str(tmp_path / f"run{attempt}")
        gloo_run(out, steps=9, world_size=2, config={"steps": "2-7"}, ddp=True)
        inv = analyze.investigate(out, workers=1)
        assert inv.stragglers.matched > 0  # the rule had collectives to judge: someone always arrives last
        d = analyze.diagnose(out, workers=1)
        assert d["analysed"] == {"roles": ["train"], "ranks": 2, "steps": 6, "device": False, "caveats": []}
        # A rank late with no one cause may be said (seen once: "no one cause explains the 9 ms ...; its CPU ops
        # take 1.2x the median rank's"); a phase or an op of the job named as the cause may not.
        strag = [f["claim"] for f in d["findings"] if f["id"] == "straggler"]
        if all("no one cause explains" in c for c in strag):
            return
        seen.append(strag)
    raise AssertionError(f"both runs of a balanced job named a cause: {seen}")


def _step_starts(folder):
    """Each rank's ProfilerStep start, read with the json module (an independent reading of the trace)."""
    starts = {}
    for name in os.listdir(folder):
        with gzip.open(os.path.join(folder, name), "rt") as fh:
            doc = json.load(fh)
        step = next(e for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
        starts[doc["distributedInfo"]["rank"]] = (step["name"], step["ts"])
    return starts


def test_dlrm_straggler_is_rank_7_which_starts_its_step_late():
    d = analyze.diagnose(DLRM, workers=1)
    f = _one(d["findings"], "straggler")
    ev = f["evidence"]
    # The culprit, its late group (below), and the three ranks that waited for them most: not all eight.
    inv = analyze.investigate(DLRM, workers=1)
    waited = {}
    for c in inv.stragglers.wait_matrix:
        if c.culprit in (7, 2, 6) and c.waiter not in (7, 2, 6):
            waited[c.waiter] = waited.get(c.waiter, 0.0) + c.wait_us
    assert ev["ranks"] == [7, 2, 6] + sorted(waited, key=lambda r: -waited[r])[:3]
    # The claim leads with the waiting it causes, not with its late arrivals (which every rank has some of).
    assert f["claim"].startswith("rank 7 (with ranks 2, 6") and "holds the other ranks back" in f["claim"]
    assert "arrives last" not in f["claim"] and "%" not in f["claim"]
    # Rank 7 is not slow inside the traced step: it enters ProfilerStep#10 after most ranks (its previous
    # step, not traced, ran long), and from there reaches the first SendRecv as fast as the others.
    starts = _step_starts(DLRM)
    late = starts[7][1] - statistics.median(ts for r, (_, ts) in starts.items() if r != 7)
    assert ev["names"][0] == starts[7][0] == "ProfilerStep#10"
    cause = ev["figures"]["cause"]
    assert cause["kind"] == "late_start" and cause["excess_us"] == pytest.approx(late) and late > 4000
    assert "rank 7" in f["claim"] and "starts the step" in f["claim"]
    # Ranks 2 and 6 start late too, by at least 80% as much (a late group): fixing rank 7 alone would save only
    # until they arrive last, so the what-if brings the whole group to the median start, and names it.
    assert ev["figures"]["late_together"] == [2, 6] and ev["ranks"][1:3] == [2, 6]
    assert "with ranks 2, 6" in f["claim"]
    w = f["what_if"]
    assert 0 < f["cost_us"] == w["saves_us"] <= w["naive_us"]
    row = inv.steps.steps[0]
    i7 = next(i for i, x in enumerate(row.ranks) if x.rank == 7)
    alone = path_saving(row.ranks, {i7: late})[0]
    assert alone < 0.5 * late and f["cost_us"] > 1.5 * alone
    assert ev["figures"]["wait_share"] >= STRAGGLER_WAIT_SHARE


def test_cpu_only_trace_applies_no_device_rule():
    d = analyze.diagnose(os.path.join(TRACES, "hta", "cpu_only_rank-34.pt.trace.json.gz"), workers=1)
    assert d["analysed"]["device"] is False
    assert not DEVICE_RULES & {f["id"] for f in d["findings"]}
    assert d["errors"] == [] and d["files_read"] == 1


# ---- the what-if on the step's path ----------------------------------------------------------------------
def _three_ranks(folder, slow_phase="train/data"):
    """Rank 1 spends 200 µs in ``slow_phase`` (the others 10); rank 2 computes 240 µs (rank 0: 90). All meet in
    one all-reduce, which ends at 310 µs; each step ends at 320 µs."""
    for rank, (data, compute) in enumerate([(10, 90), (200, 100), (10, 240)]):
        arrive = data + compute
        write(os.path.join(folder, f"rank-{rank}.json"), [
            X("ProfilerStep#1", 0, 320, cat="user_annotation"),
            X(slow_phase if rank == 1 else "train/data", 0, data, cat="user_annotation"),
            X("train/compute", data, compute, cat="user_annotation"),
            X("c10d::allreduce_", arrive, 310 - arrive)], distributedInfo={"rank": rank, "world_size": 3})
    return str(folder)


def test_what_if_follows_the_path_not_the_subtraction(tmp_path):
    d = analyze.diagnose(_three_ranks(tmp_path), workers=1)
    f = _one(d["findings"], "straggler")
    assert f["evidence"]["ranks"] == [1, 0, 2] and f["evidence"]["names"][0] == "train/data"
    w = f["what_if"]
    # Subtracting rank 1's extra 190 µs of train/data would promise 190 µs; rank 2 arrives 50 µs before
    # rank 1 and is then the last, so the step shortens by 50 µs.
    assert w["naive_us"] == pytest.approx(190.0) and w["saves_us"] == pytest.approx(50.0)
    assert w["then_last_rank"] == 2 and f["cost_us"] == pytest.approx(50.0)
    ranks = [RankStep(rank=r, path="", dur_us=b, waited_us=0.0, busy_us=b, wait_caused_us=0.0, sync_waiting_us=0.0,
                      phases={}, categories={}, source="ProfilerStep", start_us=0.0)
             for r, b in ((0, 120.0), (1, 320.0), (2, 270.0))]
    assert path_saving(ranks, {1: 190.0}) == (50.0, 1, 2)
    assert path_saving(ranks, {1: 30.0}) == (30.0, 1, 1)
    assert path_saving(ranks, {0: 100.0}) == (0.0, 1, 1)  # a rank off the path saves nothing


def test_trace_names_reach_the_terminal_as_text(tmp_path):
    name = "[red]x[/red]\x1b[2J"
    code, text, _ = cli("diagnose", _three_ranks(tmp_path, slow_phase=name))
    assert code == 0 and "straggler" in text
    assert "[red]x[/red]\\x1b[2J" in text and "\x1b" not in text


# ---- roles and outlier steps ------------------------------------------------------------------------------
def _run_dir(root, role, rank, steps):
    """A distprof run-directory entry: ``steps`` is [(step, [(phase, start offset, dur)])], 2000 µs apart."""
    folder = os.path.join(root, role, f"rank{rank:05d}")
    os.makedirs(folder, exist_ok=True)
    name = f"step{steps[0][0]:08d}-{steps[-1][0]:08d}.pt.trace.json"
    events = []
    for step, phases in steps:
        t0 = step * 2000
        events.append(X(f"ProfilerStep#{step}", t0, max(900, max(o + d for _, o, d in phases) + 10), cat="user_annotation"))
        events += [X(p, t0 + o, d, cat="user_annotation") for p, o, d in phases]
    write(os.path.join(folder, name), events)
    with open(os.path.join(folder, "manifest.jsonl"), "w") as fh:
        fh.write(json.dumps({"role": role, "rank": rank, "steps": [steps[0][0], steps[-1][0]],
                             "file": f"{role}/rank{rank:05d}/{name}"}) + "\n")


def test_role_that_bounds_the_step(tmp_path):
    _run_dir(tmp_path, "rollout", 0, [(s, [("rollout/generate", 0, 600)]) for s in (1, 2, 3)])
    _run_dir(tmp_path, "actor", 0, [(s, [("actor/update", 700, 100)]) for s in (1, 2, 3)])
    d = analyze.diagnose(str(tmp_path), workers=1)
    f = _one(d["findings"], "bounding_role")
    ev = f["evidence"]
    assert ev["role"] == "rollout" and ev["ranks"] == [0] and ev["steps"] == [1, 2, 3]
    assert ev["names"] == ["rollout/generate"] and f["plot"] == Plot.PHASES
    assert f["cost_us"] == pytest.approx(3 * 500.0)  # 600 µs of rollout work against the actor's 100, per step
    assert "role rollout bounds steps 1-3" in f["claim"]
    assert ev["figures"]["work_per_step_us"] == pytest.approx({"rollout": 600.0, "actor": 100.0})


def test_outlier_step_and_the_phase_that_grew(tmp_path):
    _run_dir(tmp_path, "train", 0, [(s, [("train/forward", 0, 100), ("train/backward", 100, 1500 if s == 3 else 200)])
                                    for s in (1, 2, 3, 4)])
    d = analyze.diagnose(str(tmp_path), workers=1)
    f = _one(d["findings"], "outlier_steps")
    assert f["evidence"]["steps"] == [3] and f["evidence"]["names"] == ["train/backward"]
    assert f["evidence"]["figures"]["steps"][0]["ratio"] > THRESHOLDS["outlier_steps"]["ratio_to_rank_median_step"]
    # One rank: the step is its own path, so taking the median step (900 µs) saves the whole excess.
    assert f["cost_us"] == pytest.approx(1610.0 - 900.0)


# ---- the command line -------------------------------------------------------------------------------------
def test_cli_json_keys_exit_codes_and_table(tmp_path):
    code, d, _ = cli("diagnose", DLRM, "--json")
    assert code == 0 and d["files_read"] == 8 and d["errors"] == [] and "scope" in d and "thresholds" in d
    assert [f["cost_us"] for f in d["findings"]] == sorted((f["cost_us"] for f in d["findings"]), reverse=True)
    for f in d["findings"]:
        assert {"id", "claim", "cost_us", "evidence", "fix"} <= set(f)
        assert {"role", "ranks", "steps", "names"} <= set(f["evidence"]) and f["plot"] in Plot.ALL
    assert _one(d["findings"], "straggler")["evidence"]["ranks"][0] == 7
    code, text, _ = cli("diagnose", DLRM)
    assert code == 0 and "straggler" in text and "rank 7" in text and "what-if:" in text and "fix:" in text
    src = tmp_path / "some"
    shutil.copytree(DLRM, src)
    (src / "rank-9.json").write_text("{not json")
    code, d, _ = cli("diagnose", src, "--json")
    assert code == 1 and [e["path"] for e in d["errors"]] == [str(src / "rank-9.json")] and d["files_read"] == 8
    bad = tmp_path / "none"
    bad.mkdir()
    (bad / "rank-0.json").write_text("{not json")
    code, _, err = cli("diagnose", bad)
    assert code == 2 and "rank-0.json" in err and "Traceback" not in err
    code, _, err = cli("diagnose", DLRM, "--ranks", "x")
    assert code == 2 and "Traceback" not in err
    code, text, _ = cli("diagnose", os.path.join(TRACES, "hta", "cpu_only_rank-34.pt.trace.json.gz"))
    assert code == 0 and "No problems found above the thresholds" in text


# ---- review findings: what a rule must not claim ------------------------------------------------------------
def test_a_sync_after_the_last_step_is_not_charged_to_the_steps():
    """HTA's ns-resolution trace ends with one 89 ms cudaDeviceSynchronize 76 us after ProfilerStep#105 (the
    profiler stopping). Whole-file totals over 5 steps made it an 18 ms-per-step host sync; inside the steps
    there is none."""
    d = analyze.diagnose(os.path.join(TRACES, "hta", "ns_resolution_rank-0.pt.trace.json.gz"), workers=1)
    assert "host_sync" not in {f["id"] for f in d["findings"]}


def test_a_partial_set_of_ranks_does_not_pass_waiting_off_as_communication():
    """DLRM rank 1 alone: its 11 ms of all-reduce is mostly waiting for rank 7, which is not here."""
    one = os.path.join(DLRM, sorted(n for n in os.listdir(DLRM) if n.startswith("worker1_"))[0])
    d = analyze.diagnose(one, workers=1)
    assert "exposed_communication" not in {f["id"] for f in d["findings"]}
    assert any("1 of 8 ranks are here" in w for w in d["warnings"])
    full = analyze.diagnose(DLRM, workers=1)
    assert not any("ranks are here" in w for w in full["warnings"])


def test_rank_less_files_are_ranks_of_their_own(tmp_path):
    """Two DLRM ranks with distributedInfo removed: two files, never one merged "rank ?"."""
    names = sorted(n for n in os.listdir(DLRM) if n.endswith(".json.gz"))[:2]
    for i, n in enumerate(names):
        with gzip.open(os.path.join(DLRM, n), "rt") as f:
            doc = json.load(f)
        doc.pop("distributedInfo", None)
        (tmp_path / f"host{i}").mkdir()
        write(tmp_path / f"host{i}" / "trace.json.gz", doc.pop("traceEvents"), **doc)
    d = analyze.diagnose(str(tmp_path), workers=1)
    assert d["analysed"]["ranks"] == 2
    for f in d["findings"]:
        assert None not in f["evidence"]["ranks"]
        assert all(r in ("? (host0/trace.json.gz)", "? (host1/trace.json.gz)") for r in f["evidence"]["ranks"])


def test_stream_wait_event_does_not_block_the_host():
    from distprof.trace.vocab import is_sync_runtime

    assert is_sync_runtime("cudaStreamSynchronize") and is_sync_runtime("hipDeviceSynchronize")
    assert not is_sync_runtime("cudaStreamWaitEvent") and not is_sync_runtime("hipStreamWaitEvent")


def test_bidi_controls_in_names_are_shown_as_escapes(tmp_path):
    """A right-to-left override in a phase name would make the rest of a claim render reversed."""
    from distprof.util.safetext import visible

    assert visible("data\u202eevil\u2066") == "data\\u202eevil\\u2066"
    evs = []
    for step in range(5):  # step 3 is an outlier, and the phase that grew is named in the claim
        t0 = step * 40_000
        long = step == 3
        evs += [X(f"ProfilerStep#{step}", t0, 30_000 if long else 9_000, cat="user_annotation"),
                X("data\u202e", t0, 25_000 if long else 100, cat="user_annotation")]
    write(tmp_path / "rank0.json", evs, distributedInfo={"rank": 0, "world_size": 1})
    code, out, _ = cli("diagnose", tmp_path)
    assert code == 0 and "\u202e" not in out and "data\\u202e" in out
    code, _, _ = cli("report", tmp_path, "-o", tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert code == 0 and "\u202e" not in page and "data\\u202e" in page


def _sync_calls(folder, name="cudaStreamSynchronize"):
    """Per rank: the summed duration of ``name`` calls inside its ProfilerStep, read with the json module."""
    out = {}
    for n in os.listdir(folder):
        with gzip.open(os.path.join(folder, n), "rt") as fh:
            doc = json.load(fh)
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        step = next(e for e in xs if e["name"].startswith("ProfilerStep#"))
        total = sum(e["dur"] for e in xs if e["name"] == name and step["ts"] <= e["ts"] < step["ts"] + step["dur"])
        if total:
            out[doc["distributedInfo"]["rank"]] = total
    return out


def test_dlrm_host_syncs_waiting_for_the_straggler_are_named_as_waiting():
    """Ranks 0, 1, 3, 4 and 5 sit in cudaStreamSynchronize (about 20 ms in all) while their SendRecv kernel spins
    waiting for rank 7: the sync is where they wait, the straggler is the cause. The straggler finding says so;
    host_sync does not blame the syncs."""
    syncs = _sync_calls(DLRM)
    long = {r: us for r, us in syncs.items() if us > 1000}
    assert sorted(long) == [0, 1, 3, 4, 5] and 19_000 < sum(long.values()) < 21_000
    inv = analyze.investigate(DLRM, workers=1)
    waiting = {r.rank: r.sync_waiting_us for r in inv.stragglers.ranks}
    for rank, us in long.items():  # each long sync is (almost) all waiting: it sits inside the blocked SendRecv
        assert 0.9 * us <= waiting[rank] <= syncs[rank] + 1e-6, rank
    assert all(waiting[r] < 100 for r in (2, 6, 7))  # their few µs of syncs are not waiting for anyone
    d = analyze.diagnose(DLRM, workers=1)
    f = _one(d["findings"], "straggler")
    assert "cudaStreamSynchronize" in f["claim"] and "the sync is where they wait, not a cause" in f["claim"]
    assert f["evidence"]["figures"]["sync_waiting_us"].keys() == {"0", "1", "3", "4", "5"}
    assert "host_sync" not in {x["id"] for x in d["findings"]}


# ---- a straggler whose cause is spread out (issue 18, item 5) --------------------------------------------------
_PHASES = (("train/a", "aten::mm"), ("train/b", "aten::convolution"), ("train/c", "aten::add"), ("train/d", "aten::copy_"))


def _spread(folder, late_in):
    """Two ranks, five 1 ms steps, four phases each running one op; the rank late in step s (``late_in[s]``)
    takes 160 µs a phase (its op 128 µs) against 100 (80): 240 µs late, 60 µs in each phase and 48 in each op,
    as a process sharing its core with busy ones would be (slow everywhere, no one cause). The ranks meet in one
    all-reduce that ends 990 µs into the step."""
    events = {0: [], 1: []}
    for s, late in enumerate(late_in, start=1):
        t0 = s * 2000
        for rank in (0, 1):
            phase, op = (160, 128) if rank == late else (100, 80)
            evs = events[rank]
            evs.append(X(f"ProfilerStep#{s}", t0, 1000, cat="user_annotation"))
            for i, (name, opname) in enumerate(_PHASES):
                evs += [X(name, t0 + i * phase, phase, cat="user_annotation"), X(opname, t0 + i * phase + 5, op)]
            arrive = t0 + 4 * phase
            evs.append(X("c10d::allreduce_", arrive, t0 + 990 - arrive))
    for rank, evs in events.items():
        write(os.path.join(folder, f"rank-{rank}.json"), evs, distributedInfo={"rank": rank, "world_size": 2})
    return str(folder)


def test_a_consistently_late_rank_with_no_one_cause_is_a_straggler(tmp_path):
    """Rank 1 costs rank 0 240 µs of its 1 ms step in every step, but its lateness is spread over four phases
    (25% each) and four ops (20% each): no single cause explains half of it, and diagnose used to say "No
    problems found". It is a finding that says so, lists the candidates and what would tell them apart."""
    d = analyze.diagnose(_spread(tmp_path, [1, 1, 1, 1, 1]), workers=1)
    f = _one(d["findings"], "straggler")
    ev, fig = f["evidence"], f["evidence"]["figures"]
    assert ev["ranks"] == [1, 0] and ev["steps"] == [1, 2, 3, 4, 5]
    assert fig["no_single_cause"] is True and fig["cause"] is None
    assert fig["lateness_us"] == pytest.approx(240.0) and fig["cause_explains"] == pytest.approx(0.25)
    assert ev["names"] == ["train/a", "train/b", "train/c"]  # the leading candidates, 60 µs each
    assert [c["share"] for c in fig["candidates"]] == pytest.approx([0.25] * 4 + [0.2])
    assert fig["op_ratio"] == pytest.approx(1.6)
    claim = f["claim"]
    assert claim.startswith("rank 1 holds the other ranks back in 5 of 5 steps")
    assert "the other rank waits 240 µs per step for it" in claim and "no one cause explains" in claim
    assert "phase train/a +60 µs" in claim and "1.6x the median rank's self time" in claim and "%" not in claim
    assert "CPU time" in f["fix"] and "wall time" in f["fix"] and "other processes on its cores" in f["fix"]
    # What-if: rank 1 arrives with rank 0 (240 µs earlier), every step.
    assert f["cost_us"] == pytest.approx(5 * 240.0) and f["cost_share"] == pytest.approx(5 * 240.0 / 5000.0)
    code, text, _ = cli("diagnose", tmp_path)
    assert code == 0 and "straggler" in text and "No problems found" not in text


@pytest.mark.parametrize("late_in", [[1, 0, 1, 0, 1], [1, 1, 0, 1, 1], [1, 1]])
def test_busy_machine_noise_with_no_one_cause_is_not_a_straggler(tmp_path, late_in):
    """The late rank changes between steps (a busy machine deschedules whichever process), or two steps cannot
    show consistency: without one cause, only a rank late in 90% of at least 3 steps is a straggler."""
    d = analyze.diagnose(_spread(tmp_path, late_in), workers=1)
    assert "straggler" not in {f["id"] for f in d["findings"]}, [f["claim"] for f in d["findings"]]
