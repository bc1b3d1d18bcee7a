"""distprof steps on the real 8-rank set and on run directories distprof wrote."""

import gzip
import json
import re

import pytest
from helpers import run
from tracekit import DLRM, cli, table

from distprof import Profiler, ProfilerConfig
from distprof.analysis import analyze, find_traces
from distprof.analysis import steps as steps_mod


def test_dlrm_step_durations_match_the_trace():
    d = analyze.steps(DLRM, workers=1)
    expected = {}
    for f in find_traces(DLRM):
        with gzip.open(f.path, "rt") as fh:
            doc = json.load(fh)
        for e in doc["traceEvents"]:
            if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#"):
                expected[(doc["distributedInfo"]["rank"], int(e["name"].split("#")[1]))] = float(e["dur"])
    got = {(x["rank"], row["step"]): x["dur_us"] for row in d["steps"] for x in row["ranks"]}
    assert got == expected and len({s for _, s in got}) >= 1
    for row in d["steps"]:
        assert row["max_us"] == max(x["dur_us"] for x in row["ranks"])
        assert row["longest_rank"] == max(row["ranks"], key=lambda x: x["dur_us"])["rank"]
        # The rank holding the others back: rank 7 starts the step ~7 ms after the others (its previous step
        # ran long), so its own step is among the shortest, yet the others wait for it at the collectives.
        assert row["slowest_rank"] == max(row["ranks"], key=lambda x: x["wait_caused_us"])["rank"] == 7
        assert row["longest_rank"] != 7
        for x in row["ranks"]:
            assert x["busy_us"] == pytest.approx(x["dur_us"] - x["waited_us"])
            assert 0 <= x["waited_us"] <= x["dur_us"]


def test_phases_and_steps_of_a_distprof_run(tmp_path):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all", steps=[2, 3], torch={"activities": ["cpu"]})
    for rank in (0, 1):
        run(Profiler(cfg, role="actor", rank=rank, world_size=2), 5)
    d = analyze.steps(str(tmp_path / "r"), workers=1)
    assert [(row["role"], row["step"], len(row["ranks"])) for row in d["steps"]] == [("actor", 2, 2), ("actor", 3, 2)]
    for row in d["steps"]:
        for x in row["ranks"]:
            assert {"train/forward", "train/backward"} <= set(x["phases"])
            assert sum(x["phases"].values()) <= x["dur_us"]
            b = x["breakdown"]  # TensorBoard-style: every instant of the step in exactly one category
            assert sum(b[k] for k in ("kernel", "memcpy", "memset", "communication", "runtime", "dataloader",
                                      "cpu_exec", "other")) == pytest.approx(b["dur_us"])
            assert b["kernel"] == b["memcpy"] == b["runtime"] == 0.0 and b["cpu_exec"] > 0


def test_cli_steps_json():
    code, d, _ = cli("steps", DLRM, "--json")
    assert code == 0 and d["steps"] and {"step", "ranks", "slowest_rank", "max_us"} <= set(d["steps"][0])
    assert len(d["steps"][0]["ranks"]) == 8 and {"rank", "dur_us", "phases"} <= set(d["steps"][0]["ranks"][0])
    assert d["errors"] == [] and d["salvaged"] == []


def test_a_trace_without_step_markers_is_reported_by_its_manifest_window(tmp_path):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "r"), ranks="all", steps=[2, 3], torch={"activities": ["cpu"]})
    run(Profiler(cfg, role="actor", rank=0, world_size=1), 5)
    (f,) = find_traces(str(tmp_path / "r"))
    assert f.window.steps == [2, 3] and f.role == "actor"
    # Strip the ProfilerStep ranges, as a trace from another tool or an older exporter would lack them.
    with gzip.open(f.path, "rt") as fh:
        doc = json.load(fh)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")]
    with gzip.open(f.path, "wt") as fh:
        json.dump(doc, fh)
    d = steps_mod.combine([(tb.info, {"steps": steps_mod.extract(tb)})
                           for tb in [table(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window)]])
    (row,) = d.steps
    assert row.step == 2 and row.window == [2, 3] and row.ranks[0].source == "manifest"
    assert row.max_us == (f.window.end_time - f.window.start_time) * 1e6
    forward = [e for e in doc["traceEvents"] if e.get("name") == "train/forward" and e.get("cat") == "user_annotation"]
    expected = sum(float(e["dur"]) for e in forward)
    assert expected > 0 and row.ranks[0].phases["train/forward"] == pytest.approx(expected)


def test_steps_table_shows_each_steps_breakdown_and_overlap():
    code, text, _ = cli("steps", DLRM)
    assert code == 0
    table = text[text.index("TensorBoard-style breakdown"):].splitlines()
    head = next(line for line in table if line.startswith("step "))
    row = next(line for line in table if line.startswith("10 "))
    cols, cells = re.split(r"\s{2,}", head.strip()), re.split(r"\s{2,}", row.strip())
    # step, duration, the category shares, overlap (a category at 0% on every step is named under the table
    # instead): the shares of one step add up to about 100%
    assert cells[0] == "10" and len(cells) == len(cols) and cols[-1] == "comm overlapped" and len(cols) >= 5
    assert 97 <= sum(int(c.rstrip("%")) for c in cells[2:-1]) <= 103 and cells[-1].endswith("%")
    note = next(line for line in table if line.startswith("Not shown:"))
    assert len(cols) - 3 + note.count(",") + 1 == 8  # every category is either a column or named as 0%
