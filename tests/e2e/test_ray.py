"""distprof.integrations.ray on a real local Ray cluster, loopback only."""

import json
import logging
import os
import shutil
import stat
import subprocess
import sys
from functools import partial

import pytest
from conftest import config as base_config
from conftest import pythonpath_with, shared_ray

from distprof.analysis.check import check_run

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time on a 2-core machine

# Ray reads this when it is imported: without it, it binds the machine's external address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray  # noqa: E402
from ray_workers import BrokenRPC, Worker  # noqa: E402  (tests/jobs: what the workers import, and no more)

from distprof.integrations.ray import ProfiledGroup, collect, profiling, runtime_env, step_all  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def cluster():
    """The suite's shared local Ray cluster (conftest.shared_ray: started once, kept for the "ray" group)."""
    shared_ray()


def make(cls=Worker, n=1, runtime_env=None):
    actor = ray.remote(num_cpus=0.25)(cls)
    return [actor.options(runtime_env=runtime_env or {}).remote() for _ in range(n)]


def train(workers, group, steps):
    with group:
        for _ in range(steps):
            assert sum(ray.get([w.work.remote() for w in workers])) == len(workers)  # training never fails
            group.step()


cfg = partial(base_config, run="scratch", ranks="all", steps=[1, 2])


def test_group_rpcs_capture_every_rank_and_collect_through_ray(cluster, tmp_path):
    ws = make(n=2)
    g = ProfiledGroup(ws, cfg(tmp_path), role="actor")
    train(ws, g, 4)
    summaries = g.summary()
    assert [(s["rank"], s["windows"], s["global_step"]) for s in summaries] == [(0, 1, 4), (1, 1, 4)]
    assert summaries[0]["annotations"]["w/work"]["count"] == 2
    report = collect([g], str(tmp_path / "dest"))
    assert report.ok and {f["path"] for f in report.copied} >= {
        "actor/rank00000/step00000001-00000002.pt.trace.json.gz", "actor/rank00001/step00000001-00000002.pt.trace.json.gz",
        "actor/rank00000/manifest.jsonl", "run.json", "actor/role.json"}
    for f in report.copied:
        assert os.path.getsize(tmp_path / "dest" / f["path"]) == f["bytes"] == os.path.getsize(tmp_path / "scratch" / f["path"])
    assert check_run(str(tmp_path / "dest")).ok
    again = collect([g], str(tmp_path / "dest"))  # idempotent: unchanged files are not copied again
    assert {f["path"] for f in again.copied} <= {"actor/rank00000/manifest.jsonl", "actor/rank00001/manifest.jsonl"}


def written_times(run_dir):
    """role -> ``written_time`` of each window's manifest line: when that worker had written its trace."""
    out = {}
    for d, _, names in os.walk(run_dir):
        if "manifest.jsonl" in names:
            with open(os.path.join(d, "manifest.jsonl")) as f:
                for line in f:
                    rec = json.loads(line)
                    out.setdefault(rec["role"], []).append(rec["written_time"])
    return out


def assert_no_export_inside_another_groups_step(step_ends, export_ends):
    """Each role's last profiled ProfilerStep (every rank) ended before any other role finished exporting.

    Both ways round this is causal, not a race: step_all writes traces only in a second round, sent after
    every worker's step has ended; stepping groups one after another sends the next group's step only
    after the previous group's call, export included, returned.
    """
    assert set(step_ends) == set(export_ends) and len(step_ends) >= 2
    for role, ends in step_ends.items():
        for other, exports in export_ends.items():
            if other != role:
                assert max(ends) < min(exports), (
                    f"{role}'s last profiled step ended at {max(ends):.6f}, after {other} finished exporting "
                    f"at {min(exports):.6f}: {other}'s export is inside {role}'s step")


def test_groups_step_together_so_no_export_lands_in_another_groups_step(cluster, tmp_path):
    from conftest import load_trace

    config = cfg(tmp_path)  # window 1-2: it closes, and each worker exports, in the step() that ends step 2
    workers = {"rollout": make(n=1), "ref": make(n=1), "actor": make(n=2)}
    groups = [ProfiledGroup(ws, config, role) for role, ws in workers.items()]
    everyone = [w for ws in workers.values() for w in ws]
    with profiling(groups):
        for step in range(4):
            assert sum(ray.get([w.work.remote() for w in everyone])) == len(everyone)
            assert step_all(groups) == [{0: step + 1}, {0: step + 1}, {0: step + 1, 1: step + 1}]
    assert not any(g.failed for g in groups)
    step_ends = {}
    for d, _, names in os.walk(tmp_path / "scratch"):
        for n in names:
            if n.endswith(".pt.trace.json.gz"):
                trace = load_trace(os.path.join(d, n))
                base_us = trace.get("baseTimeNanoseconds", 0) / 1e3  # newer Kineto: ts relative to it
                (last,) = [e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#2"]
                step_ends.setdefault(trace["distprof"]["role"], []).append((base_us + last["ts"] + last["dur"]) / 1e6)
    assert {k: len(v) for k, v in step_ends.items()} == {"rollout": 1, "ref": 1, "actor": 2}
    assert_no_export_inside_another_groups_step(step_ends, written_times(tmp_path / "scratch"))


def test_dead_worker_in_one_group_does_not_stop_the_other_groups(cluster, tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="distprof")
    rollout, actor = make(n=1), make(n=2)
    groups = [ProfiledGroup(rollout, cfg(tmp_path), "rollout"), ProfiledGroup(actor, cfg(tmp_path), "actor")]
    with profiling(groups):
        for step in range(4):
            if step == 1:  # actor rank 1 dies with the window open; its next RPC fails
                with pytest.raises(ray.exceptions.RayActorError):
                    ray.get(actor[1].exit.remote())
            assert sum(ray.get([w.work.remote() for w in rollout + actor[:1]])) == 2
            assert step_all(groups) == [{0: step + 1}, {0: step + 1} if step else {0: 1, 1: 1}]
    assert groups[0].failed == {} and list(groups[1].failed) == [1]
    assert [r.message for r in caplog.records if "rank 1 failed" in r.message] == [
        "distprof: profile_step on actor rank 1 failed; profiling of that worker is off from now on: "
        + groups[1].failed[1]]
    s = [g.summary() for g in groups]
    assert [(x["role"], x["rank"], x["windows"], x["global_step"]) for x in s[0] + s[1]] == [
        ("rollout", 0, 1, 4), ("actor", 0, 1, 4)]


def test_multi_group_calls_reject_what_is_not_a_list_of_groups(tmp_path):
    off = ProfiledGroup([object()], cfg(tmp_path, enable=False), "rollout")  # off: no RPC, no Ray needed
    assert step_all([off]) == [{}]
    with pytest.raises(ValueError, match=r"got one ProfiledGroup \(role 'rollout'\); pass \[group\]"):
        step_all(off)
    with pytest.raises(ValueError, match="same ProfiledGroup more than once"):
        step_all([off, off])
    with pytest.raises(ValueError, match="must hold ProfiledGroup objects, got list"):
        step_all([[object()]])


def test_only_selected_ranks_and_roles_get_rpcs(cluster, tmp_path):
    ws = make(n=2)
    g = ProfiledGroup(ws, cfg(tmp_path, ranks=[1]), role="actor")
    train(ws, g, 3)
    assert ray.get([w.has_profiler.remote() for w in ws]) == [False, True]
    for config in (cfg(tmp_path, roles=["actor"]), cfg(tmp_path, enable=False)):
        g2 = ProfiledGroup(ws[:1], config, role="rollout")
        assert g2.active == {} and g2.step() == {} and g2.summary() == []
    with pytest.raises(ValueError, match=r"ranks \[3\] do not exist: world size is 2"):
        ProfiledGroup(ws, cfg(tmp_path, ranks=[3]), role="actor")


def test_failing_worker_never_fails_the_step(cluster, tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="distprof")
    ws = make(Worker, 1) + make(BrokenRPC, 1)
    g = ProfiledGroup(ws, cfg(tmp_path), role="actor")
    ray.get(ws[0].break_profiler_backend.remote())  # and rank 0's own backend faults inside the worker
    train(ws, g, 4)
    assert list(g.failed) == [1] and "profile_step is broken" in g.failed[1]
    assert sum("profile_step on actor rank 1 failed" in r.message for r in caplog.records) == 1
    s = g.summary()
    assert len(s) == 1 and s[0]["rank"] == 0 and s[0]["enabled"] is False and s[0]["global_step"] == 4


@pytest.mark.parametrize("backend, end", [("py_spy", "kill"), ("memray", "kill"), ("py_spy", "exit")])
def test_process_backend_wraps_one_group_not_another(cluster, tmp_path, backend, end):
    config = cfg(tmp_path, backend=backend, roles=["rollout"], steps=None)
    rollout_env, actor_env = runtime_env(config, group="rollout"), runtime_env(config, group="actor")
    assert "py_executable" in rollout_env and actor_env == {}
    rollout, actor = make(runtime_env=rollout_env), make(runtime_env=actor_env)
    groups = [ProfiledGroup(rollout, config, "rollout"), ProfiledGroup(actor, config, "actor")]
    assert groups[1].active == {}
    train(rollout, groups[0], 3)
    where = groups[0].where[0]
    assert where["wrapped_by"].startswith(f"{backend}:")
    assert ray.get(actor[0].env.remote("DISTPROF_WRAPPED_BY")) is None
    if end == "kill":
        ray.kill(rollout[0])  # the worker ends; the wrapper finalizes the tool's output
    else:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(rollout[0].exit.remote())  # the actor exits by itself
    report = collect(groups, str(tmp_path / "dest"))
    wrapper_pid = where["wrapped_by"].split(":")[1]
    outputs = [f["path"] for f in report.copied if f["path"].startswith(f"rollout/{backend}-pid{wrapper_pid}")]
    assert len(outputs) == 1 and report.ok, report
    assert not any(f["path"].startswith("actor/") for f in report.copied)
    res = check_run(str(tmp_path / "dest"))
    assert res.ok and [i.file for i in res.items] == outputs


def test_existing_py_executable_is_preserved(cluster, tmp_path):
    script = tmp_path / "venv-python"
    script.write_text(f"#!/bin/bash\nexport BASE_INTERPRETER_USED=yes\nexec {sys.executable} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    config = cfg(tmp_path, backend="py_spy", steps=None)
    env = runtime_env(config, group="rollout", base={"py_executable": str(script), "env_vars": {"FROM_BASE": "1"}})
    assert env["py_executable"].startswith(str(script)) and env["env_vars"] == {"FROM_BASE": "1"}
    (w,) = make(runtime_env=env)
    g = ProfiledGroup([w], config, "rollout")
    assert ray.get(w.env.remote("BASE_INTERPRETER_USED")) == "yes"
    assert ray.get(w.env.remote("FROM_BASE")) == "1"
    assert g.where[0]["wrapped_by"].startswith("py_spy:")
    ray.kill(w)
    report = collect([g], str(tmp_path / "dest"))
    assert report.ok and any(f["path"].startswith("rollout/py_spy-pid") for f in report.copied)


def test_unreachable_worker_is_reported_not_fatal(cluster, tmp_path):
    ws = make(n=2)
    ray.kill(ws[1])
    g = ProfiledGroup(ws, cfg(tmp_path), role="actor")
    assert list(g.failed) == [1]
    train(ws[:1], g, 3)
    report = collect([g], str(tmp_path / "dest"))
    assert report.unreachable == [{"role": "actor", "rank": 1, "error": g.failed[1]}] and not report.ok
    assert any(f["path"] == "actor/rank00000/step00000001-00000002.pt.trace.json.gz" for f in report.copied)


def test_a_file_collect_cannot_bring_is_one_problem_whose_line_names_it(cluster, tmp_path):
    """A folder under dest that is a symbolic link: each file bound there is refused, one Problem each (where: the
    file's path under dest; str(): the line CollectReport.errors always held); nothing is written outside."""
    from distprof.util.problem import MISSING, Problem

    ws = make(n=1)
    g = ProfiledGroup(ws, cfg(tmp_path), role="actor")
    train(ws, g, 3)
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    (dest / "actor").symlink_to(outside)
    report = collect([g], str(dest))
    assert not report.ok and report.errors and list(outside.iterdir()) == []
    assert all(type(e) is Problem and e.value is MISSING and e.path.startswith("actor/") for e in report.errors)
    assert all(str(e) == f"{e.path}: {e.reason}" and e.reason for e in report.errors), report.errors
    assert "actor/rank00000/step00000001-00000002.pt.trace.json.gz" in {e.path for e in report.errors}
    assert [f["path"] for f in report.copied] == ["run.json"]


def test_an_entry_listed_on_a_node_that_is_not_a_trace_comes_back_as_a_problem(cluster, tmp_path):
    """`--ray`: what find_traces refuses on a node is a Problem pickled back to the driver (MISSING still MISSING),
    and the verbs' --json lists it as {"path", "message"}, as without Ray."""
    from conftest import DATA

    from distprof.analysis import analyze
    from distprof.analysis.rayfiles import find_traces_on_nodes
    from distprof.util.problem import MISSING, Problem

    dlrm = os.path.join(DATA, "dlrm-8rank-v100")
    src = sorted(f for f in os.listdir(dlrm) if ".json" in f)[0]
    run = tmp_path / "run"
    run.mkdir()
    (run / src).symlink_to(os.path.join(dlrm, src))  # leaves the folder: refused, not read
    shutil.copy(os.path.join(dlrm, src), run / ("copy-" + src))
    problems = []
    files = find_traces_on_nodes(str(run), problems)
    assert [f.path for f in files] == [str(run / ("copy-" + src))]
    (p,) = problems
    line = f"{run / src}: symlink points outside {run}; not followed"
    assert type(p) is Problem and p.value is MISSING and p.path == str(run / src) and str(p) == line
    doc = analyze.summary(str(run), ray_address="local")  # this process's cluster (joined already) is used
    assert doc["files_read"] == 1 and doc["errors"] == [{"path": str(run / src), "message": line}]


def test_files_of_a_worker_that_died_are_still_collected(cluster, tmp_path):
    ws = make(n=1)
    g = ProfiledGroup(ws, cfg(tmp_path), role="actor")
    train(ws, g, 3)
    ray.kill(ws[0])
    report = collect([g], str(tmp_path / "dest"))
    assert report.ok and any(f["path"].endswith("step00000001-00000002.pt.trace.json.gz") for f in report.copied)


SHUTDOWN_SCRIPT = """
import json, os, sys
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
import ray, distprof
from distprof.integrations.ray import ProfiledGroup, runtime_env
from distprof.integrations.ray.collect import _node_list
from ray_workers import Worker
ray.init(address="local", _node_ip_address="127.0.0.1", num_cpus=2, include_dashboard=False, log_to_driver=False)
pids = []
try:
    for backend in ("py_spy", "memray"):
        config = distprof.ProfilerConfig(enable=True, backend=backend, save_path={out!r})
        actor = ray.remote(num_cpus=0.25)(Worker).options(runtime_env=runtime_env(config, group=backend)).remote()
        g = ProfiledGroup([actor], config, backend)
        with g:
            ray.get(actor.work.remote())
            g.step()
        pids.append(int(g.where[0]["wrapped_by"].split(":")[1]))
finally:
    ray.shutdown()  # no ray.kill: the cluster goes away under the wrapped workers
print(json.dumps(_node_list({out!r}, 60, pids)))
"""


def test_outputs_finalized_after_ray_shutdown(tmp_path):
    out = str(tmp_path / "run")
    code = SHUTDOWN_SCRIPT.format(out=out)
    env = {**os.environ, "PYTHONPATH": pythonpath_with(TESTS)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    listing = json.loads(proc.stdout.strip().splitlines()[-1])
    assert listing["pending"] == []
    names = [f["path"] for f in listing["files"]]
    assert any(n.startswith("py_spy/py_spy-pid") and n.endswith(".speedscope.json") for n in names), names
    assert any(n.startswith("memray/memray-pid") and n.endswith(".bin") for n in names), names
    assert check_run(out).ok


def _raylets():
    """Ray's daemons by process name (-f would also match workers, whose command lines name the raylet)."""
    found = set()
    for name in ("raylet", "gcs_server"):
        found |= set(subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split())
    return found


def trace_names_of(rank_dir):
    from conftest import trace_names

    (path,) = rank_dir.glob("*.pt.trace.json.gz")
    return set(trace_names(path))


def test_demo_end_to_end(tmp_path):
    before = _raylets()
    out = tmp_path / "demo"
    # The demo's deliberate straggler (actor rank 1's slow batch preparation) made longer than its default, so
    # a loaded 2-core machine slowing rank 0 cannot hide it: the test asserts the diagnosis, not the speed.
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", "demo", "--out", str(out), "--steps", "4",
                           "--slow-ms", "300"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "distprof check passed" in proc.stdout and f"distprof check {out}" in proc.stdout
    assert f"distprof stragglers {out}" in proc.stdout
    res = check_run(str(out))
    assert res.ok and {r["role"] for r in res.roles} == {"driver", "rollout", "rollout/engine", "ref", "actor"}
    # The driver (the RL loop's process) holds its own trace and Ray's task timeline of the window; the rollout's
    # (stand-in) engine its two TP ranks' traces.
    assert sorted((i.role, i.rank, (i.file or "").split(".", 1)[-1]) for i in res.items) == [
        ("actor", 0, "pt.trace.json.gz"), ("actor", 1, "pt.trace.json.gz"), ("driver", 0, "pt.trace.json.gz"),
        ("driver", 0, "ray_timeline.json.gz"), ("ref", 0, "pt.trace.json.gz"), ("rollout", 0, "pt.trace.json.gz"),
        ("rollout/engine", 0, "pt.trace.json.gz"), ("rollout/engine", 1, "pt.trace.json.gz")]
    assert "execute_model" in trace_names_of(out / "rollout" / "engine" / "rank00001")
    # The demo shows the RL step view: each profiled step's roles, the engine's among them.
    assert "RL steps" in proc.stdout and "rollout/engine" in proc.stdout and "path rollout" in proc.stdout
    from conftest import trace_names

    names = set(trace_names(out / "actor" / "rank00001" / "step00000001-00000002.pt.trace.json.gz"))
    assert {"actor/update", "actor/allreduce", "c10d::allreduce_"} <= names
    assert "rollout/generate" in trace_names(out / "rollout" / "rank00000" / "step00000001-00000002.pt.trace.json.gz")
    assert "ref/log_probs" in trace_names(out / "ref" / "rank00000" / "step00000001-00000002.pt.trace.json.gz")
    # No Ray daemons left behind: any that appeared must exit (they may still be on their way out when
    # the demo returns on a loaded machine; the demo itself waits for its own).
    from distprof.demo.rl_job import _wait_gone

    left = _raylets() - before
    _wait_gone([int(p) for p in left], timeout_s=60)
    assert _raylets() - before == set()
    # The suggested next commands work on what the demo wrote. steps and stragglers: the real CLI in this process
    # (`steps --json` and `stragglers --json` also run as `python -m distprof.cli` in test_analysis_cloud);
    # diagnose below in a process of its own, as a user runs it.
    from tracekit import cli

    code, steps, err = cli("steps", out, "--json", "--workers", "1")
    assert code == 0, err[-3000:]
    rows = steps["steps"]
    assert {(r["role"], r["step"]) for r in rows} == {(role, s) for role in ("actor", "driver", "ref", "rollout")
                                                      for s in (1, 2)} | {("rollout/engine", 1)}  # one window row
    actor = next(r for r in rows if r["role"] == "actor")
    assert len(actor["ranks"]) == 2 and "actor/update" in actor["mean_phases"]
    # The groups are stepped together: no group's last profiled step holds another group's export.
    last = {r["role"]: [(k["start_us"] + k["dur_us"]) / 1e6 for k in r["ranks"]] for r in rows if r["step"] == 2}
    # (The engine writes its traces in its own processes, off every group's path: not a group's export.)
    assert_no_export_inside_another_groups_step(last, {r: t for r, t in written_times(out).items() if r in last})
    code, doc, err = cli("stragglers", out, "--json", "--workers", "1")
    assert code == 0, err[-3000:]
    assert doc["matched"] > 0  # the actor ranks' gloo all-reduces
    # The demo's deliberate straggler: actor rank 1 prepares its batch slowly; rank 0 waits for it.
    actor_ranks = [r for r in doc["ranks"] if r["role"] == "actor"]
    assert actor_ranks[0]["rank"] == 1 and actor_ranks[0]["wait_caused_us"] > actor_ranks[1]["wait_caused_us"]
    # The demo ends with the diagnosis and the report beside the traces; the diagnosis names the straggler's cause.
    assert f"Report: {out}/report.html" in proc.stdout and (out / "report.html").stat().st_size > 1_000_000
    diag = subprocess.run([sys.executable, "-m", "distprof.cli", "diagnose", str(out), "--json", "--workers", "1"],
                          capture_output=True, text=True, check=True)
    findings = json.loads(diag.stdout)["findings"]
    (f,) = [f for f in findings if f["id"] == "straggler"]
    assert f["evidence"]["role"] == "actor" and f["evidence"]["ranks"][0] == 1
    # The straggler's excess is not counted again as the actor role bounding the step (it was, at the same cost).
    # (On failure: every finding's claim and figures, and each rank-step's waiting, to tell which measure moved.)
    assert all(g["cost_us"] < f["cost_us"] / 2 for g in findings if g["id"] == "bounding_role"), json.dumps(
        {"findings": [{k: g[k] for k in ("id", "claim", "cost_us")} | {"figures": g["evidence"].get("figures")}
                      for g in findings], "waits": doc.get("waits"), "mismatched": doc.get("mismatched")})[:6000]
    assert f["evidence"]["names"][0] == "actor/prepare" and "actor/prepare" in proc.stdout


def test_analysis_over_ray_matches_process_pool():
    """`--ray local`: per-rank reading as Ray tasks gives the same answer as the process pool."""
    from conftest import DATA
    from tracekit import cli

    dlrm = os.path.join(DATA, "dlrm-8rank-v100")
    outs = []
    # The process pool's answer: the CLI in this process (its pool's processes are the same either way); `--ray
    # local` starts a cluster, so tracekit.cli runs that one as `python -m distprof.cli`, as users do.
    for extra in ([], ["--ray", "local"]):
        code, doc, err = cli("stragglers", dlrm, "--json", *extra)
        assert code == 0, err[-2000:]
        outs.append(doc)
    assert outs[0]["ranks"] == outs[1]["ranks"] and outs[1]["matched"] == 8
