"""Step telemetry in ``distprof steps`` (``analysis.telemetry_steps``, ``report.telemetry_view``): per rank its step
time figures and phase shares, per role a coarse timeline over the whole run; a run directory with telemetry and
no trace is answered from the telemetry (exit 0); a run with traces keeps its ``steps`` output unchanged."""

import io
import json
import os
import shutil
import time

import msgspec
from conftest import REPO
from rich.cells import cell_len
from rich.console import Console
from tracekit import cli

import distprof
from distprof.analysis import analyze
from distprof.analysis.records import StepsResult
from distprof.analysis.telemetry_steps import MAX_BUCKETS, MAX_PHASES
from distprof.report.telemetry_view import telemetry

GLOO = os.path.join(REPO, "tests", "data", "distprof-h100", "ddp-gloo-cuda-slow-rank1")  # traces of 2 ranks


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def profiled_run(root, ranks=4, steps=60, slow_rank=2, slow_from=30):
    """A run directory written by real Profilers (telemetry: true, nothing captured), one rank after the other in
    this process: each step a ``forward`` and a ``backward`` phase; ``slow_rank``'s forward ten times longer from
    step ``slow_from`` on."""
    cfg = distprof.ProfilerConfig(enable=True, save_path=str(root), steps=[10**7], telemetry=True)
    for rank in range(ranks):
        with distprof.Profiler(cfg, role="actor", global_step=0, rank=rank, world_size=ranks) as p:
            for step in range(steps):
                with distprof.annotate("forward"):
                    busy(0.003 if rank == slow_rank and step >= slow_from else 0.0003)
                with distprof.annotate("backward"):
                    busy(0.0003)
                p.step()
    return str(root)


def stream(root, role, rank, records):
    d = os.path.join(root, role, f"rank{rank:05d}")
    os.makedirs(d, exist_ok=True)
    lines = [{"telemetry": 1, "role": role, "rank": rank, "world_size": 2, "pid": 1, "host": "h", "start": 0.0}]
    lines += [{"step": s, "t": 1.0 + s, "dur_us": dur, "phases": ph} for s, dur, ph in records]
    with open(os.path.join(d, "telemetry.jsonl"), "wb") as f:
        f.write(b"".join(msgspec.json.encode(x) + b"\n" for x in lines))


def test_steps_json_on_a_run_directory_of_real_profilers_with_telemetry_and_no_trace(tmp_path):
    root = profiled_run(tmp_path)
    code, doc, err = cli("steps", root, "--json")
    assert code == 0, err
    assert doc["steps"] == [] and doc["errors"] == [] and doc["files_read"] == 0 and doc["telemetry_read"] == 4
    rows = doc["telemetry"]
    assert [(r["role"], r["rank"]) for r in rows] == [("actor", r) for r in range(4)]
    for r in rows:
        assert set(r) == {"role", "rank", "steps", "first_step", "last_step", "median_us", "p90_us", "max_us",
                          "slowest_step", "phases", "skipped"}
        assert (r["steps"], r["first_step"], r["last_step"], r["skipped"]) == (60, 0, 59, 0)
        assert r["median_us"] <= r["p90_us"] <= r["max_us"]
        assert [p["name"] for p in r["phases"]] == ["forward", "backward"] if r["rank"] == 2 else \
            {p["name"] for p in r["phases"]} == {"forward", "backward"}
        assert all(set(p) == {"name", "share", "median_us"} and 0 < p["share"] <= 1 for p in r["phases"])
        assert sum(p["share"] for p in r["phases"]) <= 1
    # rank 2's forward is ten times longer in half the steps: the slowest median, its forward the largest share
    assert max(rows, key=lambda r: r["median_us"])["rank"] == 2
    slow_fwd = next(p for p in rows[2]["phases"] if p["name"] == "forward")
    assert all(slow_fwd["share"] > next(p for p in r["phases"] if p["name"] == "forward")["share"]
               for r in rows if r["rank"] != 2)
    [tl] = doc["telemetry_timeline"]
    assert tl["role"] == "actor" and len(tl["buckets"]) == 30  # 60 steps in at most 50 buckets: 2 steps each
    assert [(b["first_step"], b["last_step"]) for b in tl["buckets"]] == [(s, s + 1) for s in range(0, 60, 2)]
    assert all(set(b["median_us"]) == {"0", "1", "2", "3"} for b in tl["buckets"])


def test_the_figures_of_hand_written_streams(tmp_path):
    durs = [100, 300, 200, 1000, 400, 500, 600, 700, 800, 900]
    stream(tmp_path, "actor", 0, [(s, d, {"fwd": d // 2, "bwd": d // 4}) for s, d in enumerate(durs, start=10)])
    stream(tmp_path, "actor", 1, [(s, 50, {}) for s in range(12, 15)])
    stream(tmp_path, "rollout", 0, [(s, 10, {"gen": 10}) for s in range(3)])
    d = analyze.steps(str(tmp_path), workers=1)
    r0, r1, r2 = d["telemetry"]
    assert r0 == {"role": "actor", "rank": 0, "steps": 10, "first_step": 10, "last_step": 19, "median_us": 550.0,
                  "p90_us": 900.0, "max_us": 1000.0, "slowest_step": 13, "skipped": 0,
                  "phases": [{"name": "fwd", "share": sum(x // 2 for x in durs) / sum(durs), "median_us": 275.0},
                             {"name": "bwd", "share": sum(x // 4 for x in durs) / sum(durs), "median_us": 137.5}]}
    assert (r1["rank"], r1["median_us"], r1["phases"]) == (1, 50.0, [])
    assert (r2["role"], r2["phases"][0]["share"]) == ("rollout", 1.0)
    actor, rollout = d["telemetry_timeline"]
    assert actor["role"] == "actor" and [b["first_step"] for b in actor["buckets"]] == list(range(10, 20))
    assert actor["buckets"][2] == {"first_step": 12, "last_step": 12, "median_us": {0: 200.0, 1: 50.0}}
    assert rollout["buckets"][0]["median_us"] == {0: 10.0}


def test_a_hundred_thousand_steps_stay_a_small_object(tmp_path):
    for rank in range(2):
        stream(tmp_path, "actor", rank, [(s, 1000 + (s % 7) + 500 * (rank == 1 and s > 60_000), {"fwd": 10})
                                         for s in range(100_000)])
    code, doc, _ = cli("steps", tmp_path, "--json")
    assert code == 0
    [tl] = doc["telemetry_timeline"]
    assert len(tl["buckets"]) == MAX_BUCKETS
    assert tl["buckets"][0] == {"first_step": 0, "last_step": 1999, "median_us": {"0": 1003.0, "1": 1003.0}}
    assert tl["buckets"][-1]["last_step"] == 99_999 and tl["buckets"][-1]["median_us"]["1"] == 1503.0
    assert len(json.dumps(doc)) < 20_000


def test_selection_applies_to_telemetry(tmp_path):
    for rank in range(3):
        stream(tmp_path, "actor", rank, [(s, 100 * (rank + 1), {}) for s in range(10)])
    stream(tmp_path, "ref", 0, [(s, 5, {}) for s in range(10)])
    code, doc, _ = cli("steps", tmp_path, "--json", "--ranks", "1,2", "--roles", "actor", "--steps", "3-5")
    assert code == 0
    assert [(r["role"], r["rank"], r["steps"], r["first_step"], r["last_step"]) for r in doc["telemetry"]] == \
        [("actor", 1, 3, 3, 5), ("actor", 2, 3, 3, 5)]


def test_an_unreadable_stream_is_an_error_beside_the_readable_ones(tmp_path):
    stream(tmp_path, "actor", 0, [(s, 100, {}) for s in range(5)])
    d = os.path.join(tmp_path, "actor", "rank00001")
    os.makedirs(d)
    os.symlink("/dev/zero", os.path.join(d, "telemetry.jsonl"))
    code, doc, _ = cli("steps", tmp_path, "--json")
    assert code == 1  # some files could not be read
    assert [e["path"] for e in doc["errors"]] == [os.path.join(d, "telemetry.jsonl")]
    assert [r["rank"] for r in doc["telemetry"]] == [0]


def test_a_folder_without_traces_or_telemetry_still_exits_2(tmp_path):
    (tmp_path / "actor" / "rank00000").mkdir(parents=True)
    code, doc, _ = cli("steps", tmp_path, "--json")
    assert code == 2 and "telemetry" not in doc


def test_traces_and_telemetry_keep_the_steps_output_and_add_telemetry(tmp_path):
    root = tmp_path / "run"
    shutil.copytree(GLOO, root)
    before = analyze.steps(str(root), workers=1)
    assert "telemetry" not in before
    for rank in range(2):
        stream(str(root), "trainer", rank, [(s, 1000 * (rank + 1), {"forward": 300}) for s in range(100)])
    after = analyze.steps(str(root), workers=1)
    added = {k: after.pop(k) for k in ("telemetry", "telemetry_timeline", "telemetry_read")}
    assert msgspec.json.encode(after) == msgspec.json.encode(before)  # every key, its value and its place
    assert [(r["role"], r["rank"], r["median_us"]) for r in added["telemetry"]] == \
        [("trainer", 0, 1000.0), ("trainer", 1, 2000.0)]
    assert added["telemetry_read"] == 2
    code, text, _ = cli("steps", root)
    assert code == 0
    assert "Step telemetry: trainer, 2 ranks, steps 0-99" in text and "Steps: per rank" in text


def _render(d: StepsResult, width: int) -> list[str]:
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=True, color_system=None, legacy_windows=False)
    telemetry(console, d)
    return out.getvalue().splitlines()


def test_the_terminal_view_fits_80_columns(tmp_path):
    role = "actor/micro_step/" + "x" * 60  # a long role name
    for rank in range(20):
        stream(tmp_path, role, rank, [(s, 10_000_000 * (1 + (rank == 7 and s >= 300)) + s,
                                       {f"phase_{i}_{'y' * 30}": 1000 * i for i in range(MAX_PHASES + 4)})
                                      for s in range(1000)])
    d = analyze.steps_result(str(tmp_path), workers=1)
    lines = _render(d, 80)
    assert max(cell_len(x) for x in lines) <= 80, "\n".join(lines)
    text = "\n".join(lines)
    assert "Step telemetry" in text and "median rank" in text and "slowest rank" in text
    assert "7 *" in text  # the slowest median is marked
    assert "4 more ranks, faster" in text  # 16 of 20 ranks shown
    spark = next(x for x in lines if "slowest rank" in x)
    assert spark.strip().endswith("█") and "▁" in spark  # rank 7 turned slow at step 300


def test_the_cli_table_on_real_profilers(tmp_path):
    root = profiled_run(tmp_path, ranks=2, steps=20, slow_rank=1, slow_from=10)
    code, text, err = cli("steps", root)
    assert code == 0, err
    assert "Step telemetry: actor, 2 ranks, steps 0-19" in text
    assert "forward" in text and "backward" in text and "median rank" in text
