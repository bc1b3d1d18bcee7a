"""The RL step view (``steps --json``'s ``rl_steps``, :mod:`distprof.analysis.rlsteps`): synthetic multi-role run
directories written here, synchronous and asynchronous RL steps, with critical paths and what-ifs computed by
hand; the engine role; busy intervals from outside the traces (Ray's task timeline); diagnose, the terminal
table and the report; and one real run of the demo (real Ray)."""

import json
import os

import pytest
from tracekit import X, cli, write

from distprof.analysis import analyze
from distprof.analysis.rlsteps import Segment, critical_path, what_if

T = 10_000  # µs between steps


def _rank(root, role, rank, steps, span):
    """A run-directory entry: ``steps`` is {step: [(phase, start offset, dur)]}; each ``ProfilerStep#N`` spans
    ``span`` µs from ``N * T`` (every role's step ends together, as ``step_all`` makes them)."""
    first, last = min(steps), max(steps)
    name = f"step{first:08d}-{last:08d}.pt.trace.json"
    events = []
    for step, phases in steps.items():
        t0 = step * T
        events.append(X(f"ProfilerStep#{step}", t0, span[step] if isinstance(span, dict) else span,
                        cat="user_annotation"))
        events += [X(p, t0 + o, d, cat="user_annotation") for p, o, d in phases]
    _publish(root, role, rank, name, events, [first, last])


def _publish(root, role, rank, name, events, steps):
    """The trace file and its manifest line (what distprof's writer leaves: the role may nest, rollout/engine)."""
    folder = os.path.join(root, role, f"rank{rank:05d}")
    os.makedirs(folder, exist_ok=True)
    path = write(os.path.join(folder, name), events)
    with open(os.path.join(folder, "manifest.jsonl"), "w") as fh:
        fh.write(json.dumps({"role": role, "rank": rank, "steps": steps, "world_size": 1, "complete": True,
                             "backend": "torch", "files": [{"path": f"{role}/rank{rank:05d}/{name}",
                                                           "bytes": os.path.getsize(path)}]}) + "\n")


def _sync(root):
    """Rollout generates (3000 µs in step 1, 2000 after), ref scores, actor updates and syncs weights, rollout
    loads them: one role after another."""
    gen = {1: 3000, 2: 2000, 3: 2000}
    _rank(root, "rollout", 0, {s: [("rollout/generate", 0, gen[s]), ("rollout/load_weights", 6000, 200)]
                               for s in gen}, 6300)
    _rank(root, "ref", 0, {s: [("ref/log_probs", 3100, 1000)] for s in gen}, 6300)
    _rank(root, "actor", 0, {s: [("actor/update", 4200, 1400), ("actor/sync_weights", 5850, 100)] for s in gen}, 6300)


def _by(items, key="role"):
    return {x[key]: x for x in items}


def test_synchronous_steps_path_and_what_if(tmp_path):
    _sync(tmp_path)
    d = analyze.steps(str(tmp_path), workers=1)
    rl = d["rl_steps"]
    assert [s["step"] for s in rl] == [1, 2, 3]
    s1 = rl[0]
    assert s1["duration_us"] == pytest.approx(6300.0)
    roles = _by(s1["roles"])
    assert set(roles) == {"rollout", "ref", "actor"}
    assert roles["rollout"]["busy_us"] == pytest.approx(3200.0) and roles["rollout"]["idle_us"] == pytest.approx(3100.0)
    assert roles["ref"]["busy_us"] == pytest.approx(1000.0) and roles["actor"]["busy_us"] == pytest.approx(1500.0)
    for r in roles.values():
        assert r["busy_us"] + r["idle_us"] == pytest.approx(s1["duration_us"])
        assert r["overlapped_us"] == 0.0  # one role after another
        assert r["on_path_us"] == pytest.approx(r["busy_us"])  # every role's work is on the path
    # Walked back from the end: rollout loads the weights the actor synced after the ref pass on the rollout.
    assert s1["critical_path"] == ["rollout", "ref", "actor", "rollout"]
    # Rollout's median busy time is 2200 µs: shrinking its 3000 µs of generation by 2200/3200 moves every later
    # segment earlier; the chain is one after another, so the step is 3200 - 2200 = 1000 µs shorter.
    w = _by(s1["what_if"])
    assert w["rollout"]["saves_us"] == pytest.approx(1000.0)
    assert w["ref"]["saves_us"] == 0.0 and w["actor"]["saves_us"] == 0.0  # at their median already
    assert s1["what_if"][0]["role"] == "rollout"
    assert _by(rl[1]["what_if"])["rollout"]["saves_us"] == 0.0  # step 2 is the median


def _async(root):
    """Asynchronous RL: the actor trains (3000 µs) while the rollout generates the next batch (4000 µs in step 1,
    2000 and 2500 after); then the actor syncs weights, which waits for both."""
    gen = {1: 4000, 2: 2000, 3: 2500}
    _rank(root, "rollout", 0, {s: [("rollout/generate", 0, gen[s])] for s in gen}, 4500)
    for rank in (0, 1):
        _rank(root, "actor", rank, {s: [("actor/update", 0, 3000), ("actor/sync_weights", max(gen[s], 3000) + 100, 300)]
                                    for s in gen}, 4500)


def test_asynchronous_steps_overlap_and_what_if_on_the_path(tmp_path):
    _async(tmp_path)
    d = analyze.steps(str(tmp_path), workers=1)
    s1 = d["rl_steps"][0]
    assert s1["step"] == 1 and s1["duration_us"] == pytest.approx(4500.0)
    roles = _by(s1["roles"])
    assert roles["rollout"]["busy_us"] == pytest.approx(4000.0) and roles["actor"]["busy_us"] == pytest.approx(3300.0)
    assert roles["actor"]["ranks"] == [0, 1]
    # Both work at once for 3000 µs.
    assert roles["rollout"]["overlapped_us"] == pytest.approx(3000.0)
    assert roles["actor"]["overlapped_us"] == pytest.approx(3000.0)
    # The sync waits for the rollout (ends last before it starts), not for the actor's own update.
    assert s1["critical_path"] == ["rollout", "actor"]
    assert roles["rollout"]["on_path_us"] == pytest.approx(4000.0) and roles["actor"]["on_path_us"] == pytest.approx(300.0)
    # Rollout at its median (2500 µs) would let the sync start at 2600, but the actor's update ends at 3000:
    # the sync then starts at 3000 and ends at 3300 instead of 4400. Saves 1100 µs, not the 1500 a subtraction
    # promises: the actor then bounds the step.
    w = _by(s1["what_if"])
    assert w["rollout"]["saves_us"] == pytest.approx(1100.0)
    assert w["rollout"]["then_path"] == ["actor"]
    assert w["actor"]["saves_us"] == 0.0


def test_path_and_what_if_on_segments_by_hand():
    # a works 0-100 while b works 0-60; b's next segment starts at 110, 10 µs after a ends.
    segs = [Segment("a", 0, 100, 100), Segment("b", 0, 60, 60), Segment("b", 110, 130, 20)]
    assert critical_path(segs) == [0, 2]
    # a at half its time ends at 50; b's second segment keeps its 10 µs after a but cannot start before b's own
    # first segment ends (60): it runs 60-80, 50 µs earlier, and b alone bounds the step then.
    assert what_if(segs, "a", 0.5) == (pytest.approx(50.0), ["b"])
    assert what_if(segs, "a", 0.2) == (pytest.approx(50.0), ["b"])  # a faster still: b bounds it, no more saved
    assert what_if(segs, "b", 0.5)[0] == pytest.approx(10.0)  # b's last segment on the path shrinks by 10


def test_one_role_has_no_rl_steps(tmp_path):
    _rank(tmp_path, "actor", 0, {1: [("actor/update", 0, 100)], 2: [("actor/update", 0, 100)]}, 500)
    assert analyze.steps(str(tmp_path), workers=1)["rl_steps"] == []


def test_engine_role_iterations_and_stages(tmp_path):
    _sync(tmp_path)
    # The rollout's engine: 6 iterations (vLLM's execute_model) inside each generate, 1 prefill + 5 decode.
    events = []
    for step in (1, 2, 3):
        t0 = step * T + 100
        for i in range(6):
            events.append(X("execute_model", t0 + i * 300, 250, cat="user_annotation"))
            events.append(X("prefill" if i == 0 else "decode", t0 + i * 300, 200, cat="user_annotation"))
    _publish(tmp_path, "rollout/engine", 0, "step00000001-00000003.pt.trace.json", events, [1, 3])
    d = analyze.steps(str(tmp_path), workers=1)
    s1 = d["rl_steps"][0]
    roles = _by(s1["roles"])
    assert roles["rollout/engine"]["busy_us"] == pytest.approx(6 * 250.0)
    assert roles["rollout/engine"]["overlapped_us"] == pytest.approx(6 * 250.0)
    assert roles["rollout/engine"]["busy_us"] + roles["rollout/engine"]["idle_us"] == pytest.approx(6300.0)  # inside the rollout's generate
    eng = _by(s1["engine"])["rollout/engine"]
    assert eng["engine_iterations"] == 6
    assert eng["prefill_us"] == pytest.approx(200.0) and eng["decode_us"] == pytest.approx(5 * 200.0)
    # diagnose names the engine-level cause of the bounding role.
    f = next(f for f in analyze.diagnose(str(tmp_path), workers=1)["findings"] if f["id"] == "bounding_role")
    assert f["evidence"]["role"] == "rollout"
    assert f["what_if"]["engine"] == {"role": "rollout/engine", "iterations_per_step": 6.0,
                                      "prefill_us_per_step": pytest.approx(200.0),
                                      "decode_us_per_step": pytest.approx(1000.0)}
    assert "rollout/engine" in f["claim"] and "decode bounds the generation" in f["claim"]


def test_engine_iterations_numbered_as_profiler_steps_are_kept_and_are_not_global_steps(tmp_path):
    """An engine that steps its own torch.profiler once per iteration (vLLM's iteration-bounded profiling)
    numbers its ProfilerStep ranges by iteration (1-18 here), not by the trainer's global steps (1-3): none is
    dropped as "past the window", and ``steps`` gives the engine one row for its window, not 18 steps."""
    _sync(tmp_path)
    events, n = [], 0
    for step in (1, 2, 3):
        t0 = step * T + 100
        for i in range(6):
            n += 1
            events.append(X(f"ProfilerStep#{n}", t0 + i * 300, 250, cat="user_annotation"))
            events.append(X("prefill" if i == 0 else "decode", t0 + i * 300, 200, cat="user_annotation"))
    _publish(tmp_path, "rollout/engine", 0, "step00000001-00000003.pt.trace.json", events, [1, 3])
    d = analyze.steps(str(tmp_path), workers=1)
    assert [_by(s["engine"])["rollout/engine"]["engine_iterations"] for s in d["rl_steps"]] == [6, 6, 6]
    (row,) = [r for r in d["steps"] if r["role"] == "rollout/engine"]
    assert row["window"] == [1, 3]


def test_busy_intervals_from_outside_the_traces(tmp_path):
    _sync(tmp_path)
    # The driver has no trace: Ray's task timeline says it was busy 300 µs at the start and 400 µs at the end,
    # past the traced roles' end (6300).
    tasks = [{"role": "driver", "rank": 0, "name": "driver/log", "start_us": s * T + 6100, "dur_us": 400}
             for s in (1, 2, 3)]
    tasks += [{"role": "driver", "rank": 0, "name": "driver/prepare", "start_us": s * T + 10, "dur_us": 300}
              for s in (1, 2, 3)]
    tasks.append({"role": "driver", "start_us": "x"})  # untrusted input: skipped, no traceback
    d = analyze.steps(str(tmp_path), workers=1, tasks=tasks)
    s1 = d["rl_steps"][0]
    driver = _by(s1["roles"])["driver"]
    assert s1["duration_us"] == pytest.approx(6500.0)  # the driver's work after the step stretches it
    assert driver["busy_us"] == pytest.approx(700.0) and driver["idle_us"] == pytest.approx(5800.0)
    assert s1["critical_path"] == ["rollout", "ref", "actor", "driver"]
    lane = next(x for x in s1["lanes"] if x["role"] == "driver")
    assert [p[0] for p in lane["phases"]] == ["driver/prepare", "driver/log"]


def test_terminal_table_json_and_diagnose(tmp_path):
    from test_terminal_width import cli_in_pty

    _sync(tmp_path)
    code, lines = cli_in_pty(80, "steps", tmp_path)
    assert code == 0 and any(line.startswith("RL steps") for line in lines)
    assert any("step 1: path rollout > ref > actor > rollout" in line for line in lines)
    assert max(len(line) for line in lines) <= 80
    code, d, _ = cli("steps", str(tmp_path), "--json")
    assert code == 0 and {"step", "duration_us", "critical_path", "roles", "what_if"} <= set(d["rl_steps"][0])
    assert {"role", "busy_us", "idle_us", "on_path_us", "overlapped_us"} <= set(d["rl_steps"][0]["roles"][0])
    d = analyze.diagnose(str(tmp_path), workers=1)
    f = next(f for f in d["findings"] if f["id"] == "bounding_role")
    w = f["what_if"]
    assert f["evidence"]["role"] == "rollout" and w["roles_then_bounding"] == "actor"  # the keys it had stay
    assert w["critical_path"] == ["rollout", "ref", "actor", "rollout"]
    assert w["rl_saves_us"] == pytest.approx(1000.0)  # step 1 only: steps 2 and 3 are the median
    assert w["rl_steps"][0] == {"step": 1, "critical_path": ["rollout", "ref", "actor", "rollout"],
                                "saves_us": pytest.approx(1000.0)}


@pytest.mark.xdist_group("browser")
def test_report_draws_the_worst_and_the_median_rl_step(tmp_path):
    from playwright.sync_api import sync_playwright
    from test_report import ARGS, CHROMIUM, open_report
    from test_report_views import PLOTS, _plots

    from distprof.analysis.diagnose import Plot
    from distprof.report import write_report

    _sync(tmp_path / "run")
    r = write_report(str(tmp_path / "run"), str(tmp_path / "r.html"))
    assert {p["id"]: p for p in r["plots"]}[Plot.RL_STEPS] == {"id": Plot.RL_STEPS, "figures": 2, "note": None}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            got = open_report(b, tmp_path / "r.html", tmp_path / "r.png", extra=PLOTS)
        finally:
            b.close()
    figs = {v["layout"]["title"]: v for v in _plots(got, Plot.RL_STEPS).values()}
    worst = figs["RL step 1 (worst: 6.3 ms), path rollout &gt; ref &gt; actor &gt; rollout"]
    assert any(t.startswith("RL step 2 (median") for t in figs)
    traces = {t["name"]: t for t in worst["data"]}
    # A lane per role and rank, the idle rest of the step shaded under the busy bars, phases on them, the path.
    assert traces["waiting (idle)"]["y"] == ["actor 0", "ref 0", "rollout 0"]
    assert sorted(zip(traces["busy"]["y"], traces["busy"]["base"], traces["busy"]["x"])) == [
        ("actor 0", 4.2, 1.4), ("actor 0", 5.85, 0.1), ("ref 0", 3.1, 1.0), ("rollout 0", 0.0, 3.0),
        ("rollout 0", 6.0, 0.2)]
    assert traces["rollout/generate"]["x"] == [3.0]
    # The path's segments: the actor's update and its weight sync are two (250 µs apart).
    assert traces["critical path"]["customdata"] == ["rollout", "ref", "actor", "actor", "rollout"]
    assert "rollout/generate" in worst["legend"]


@pytest.mark.xdist_group("ray")  # one Ray cluster at a time on a 2-core machine
def test_the_demo_rl_step_view(slow_rollout_demo):
    """The demo's real run (real Ray, rollout with its stand-in engine, ref, a 2-rank actor over gloo, the driver;
    rollout's generate 300 ms slow): its RL steps, and the diagnosis naming rollout."""
    d = analyze.steps(slow_rollout_demo.run_dir, workers=1)
    assert d["errors"] == [] and len(d["rl_steps"]) == 2  # the demo profiles two steps
    for s in d["rl_steps"]:
        roles = _by(s["roles"])
        assert {"rollout", "rollout/engine", "ref", "actor", "driver"} == set(roles)
        assert roles["actor"]["ranks"] == [0, 1]
        for name, r in roles.items():
            # The driver's phases are its waits on the others (distprof.integrations.ray.driver): it works little itself.
            assert r["busy_us"] > 0 or name == "driver"
            assert r["busy_us"] + r["idle_us"] == pytest.approx(s["duration_us"])
        assert roles["driver"]["busy_us"] < roles["actor"]["busy_us"]
        assert roles["actor"]["overlapped_us"] == 0  # synchronous: the roles take turns (async: test_driver)
        assert roles["rollout"]["on_path_us"] >= 300_000  # the slow generate is on the path, whole
        assert s["critical_path"][0] == "rollout" and set(s["critical_path"]) <= {"rollout", "rollout/engine", "ref", "actor"}
        assert {w["role"] for w in s["what_if"]} == set(roles)
        (eng,) = s["engine"]
        assert eng["role"] == "rollout/engine" and eng["engine_iterations"] == 4  # the demo's per generation
    f = next(f for f in analyze.diagnose(slow_rollout_demo.run_dir, workers=1)["findings"] if f["id"] == "bounding_role")
    assert f["evidence"]["role"] == "rollout" and f["evidence"]["names"][0] == "rollout/generate"
