"""Collection and analysis on a multi-node Ray cluster simulated on one machine (ray.cluster_utils.Cluster).

Every node has its own scratch folder, named by the environment its raylet starts with ($SCRATCH), as SLURM's
$TMPDIR is per node. Workers write there (save_path "$SCRATCH/run", expanded on each worker's node); nothing is
on a shared path unless a test puts it there. A node is killed mid-run (``Cluster.remove_node``) after its worker
wrote its first window. Loopback only.
"""

import ipaddress
import logging
import os
import shutil
from types import SimpleNamespace

import psutil
import pytest
from conftest import pythonpath_with

from distprof import ProfilerConfig
from distprof.analysis.check import check_run
from distprof.rundir.store import list_files

pytestmark = pytest.mark.xdist_group("ray")  # one Ray cluster at a time on a 2-core machine

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # read when Ray is imported: loopback, not the external address
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray_workers import Trainer, read_or_die, where_read  # noqa: E402  (tests/jobs: what the workers import)
from tracekit import cli  # noqa: E402

from distprof.analysis import analyze  # noqa: E402
from distprof.analysis.parallel import map_files  # noqa: E402
from distprof.analysis.rayfiles import find_traces_on_nodes  # noqa: E402
from distprof.integrations.ray import ProfiledGroup, collect  # noqa: E402
from distprof.util.problem import Problem  # noqa: E402

TESTS = os.path.dirname(os.path.abspath(__file__))
LOOPBACK = {"node_ip_address": "127.0.0.1"}
PLACEMENT = ["a", "a", "b", "c"]  # rank -> node: ranks 0 and 1 share node a's scratch; c dies mid-run
TRACE = ".pt.trace.json.gz"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = pythonpath_with(TESTS)  # workers import tests/jobs/ray_workers.py
    scratch_var = os.environ.pop("SCRATCH", None)  # the driver's node has no scratch folder
    base = tmp_path_factory.mktemp("nodes")
    ray.shutdown()  # the suite's shared local cluster (conftest.shared_ray), if up: its next user starts it again
    c = Cluster(initialize_head=True, head_node_args={**LOOPBACK, "num_cpus": 1, "include_dashboard": False})
    nodes, scratch = {}, {}
    for name in ("a", "b", "c"):
        scratch[name] = base / f"scratch-{name}"
        scratch[name].mkdir()
        # Node b has 1 CPU, a quarter of it held by its worker for the whole module: a read asking Ray for a
        # whole CPU there would wait for the job to end.
        nodes[name] = c.add_node(**LOOPBACK, num_cpus=1 if name == "b" else 2, resources={f"node_{name}": 1},
                                 env_vars={"SCRATCH": str(scratch[name])})
    ray.init(address=c.address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"} and len(ray.nodes()) == 4
        daemons = [i.process.pid for node in (c.head_node, *nodes.values()) for infos in node.all_processes.values()
                   for i in infos]
        assert len(daemons) >= 8  # the head's GCS and raylet, every node's raylet, ...
        for pid in daemons:  # nothing of this cluster listens beyond loopback
            for conn in psutil.Process(pid).net_connections(kind="inet"):
                ip = ipaddress.ip_address(conn.laddr.ip)
                ip = getattr(ip, "ipv4_mapped", None) or ip
                assert conn.status != psutil.CONN_LISTEN or ip.is_loopback, (pid, conn)
        yield SimpleNamespace(cluster=c, nodes=nodes, scratch=scratch, base=base, address=c.address)
    finally:
        ray.shutdown()
        daemons = [i.process.pid for node in (c.head_node, *c.worker_nodes) for infos in node.all_processes.values()
                   for i in infos]
        c.shutdown()
        # Every daemon of the cluster exits (they may still be on their way out when shutdown returns).
        alive = []
        for pid in daemons:
            try:
                alive.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _, left = psutil.wait_procs(alive, timeout=60)
        assert left == []
        if old is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = old
        if scratch_var is not None:
            os.environ["SCRATCH"] = scratch_var


@pytest.fixture(scope="module")
def run(cluster):
    """4 ranks of role "actor" on nodes a, a, b, c; windows 1-2 and 4-5; node c removed after step 3."""
    actor = ray.remote(num_cpus=0.25)(Trainer)
    ws = [actor.options(resources={f"node_{n}": 0.01}).remote() for n in PLACEMENT]
    config = ProfilerConfig(enable=True, save_path="$SCRATCH/run", ranks="all", steps=[1, 2, 4, 5],
                            torch={"activities": ["cpu"]})
    group = ProfiledGroup(ws, config, role="actor")
    assert [group.where[r]["node_id"] for r in range(4)] == [cluster.nodes[n].node_id for n in PLACEMENT]
    assert [group.where[r]["save_root"] for r in range(4)] == [str(cluster.scratch[n] / "run") for n in PLACEMENT]
    live = list(range(4))
    with group:
        for step in range(6):
            if step == 3:
                # c's worker has written window 1-2 on c's own disk: now the node goes, mid-run.
                assert any(f["path"].startswith("actor/rank00003/step00000001-00000002")
                           for f in list_files(str(cluster.scratch["c"] / "run")))
                cluster.cluster.remove_node(cluster.nodes["c"])
                live = [0, 1, 2]
            assert ray.get([ws[r].work.remote() for r in live]) == [cluster.nodes[PLACEMENT[r]].node_id for r in live]
            group.step()
    assert list(group.failed) == [3]
    return SimpleNamespace(group=group, workers=ws)


def sources(cluster, names):
    """Relative path -> sizes of that path in the named nodes' scratch folders."""
    out = {}
    for n in names:
        for f in list_files(str(cluster.scratch[n] / "run")):
            out.setdefault(f["path"], []).append(f["bytes"])
    return out


def test_collect_brings_every_live_file_once_and_names_the_dead_node(cluster, run, tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="distprof")
    dest = tmp_path / "dest"
    report = collect([run.group], str(dest))
    dead = cluster.nodes["c"].node_id
    live = sources(cluster, ("a", "b"))
    paths = [f["path"] for f in report.copied]
    assert len(paths) == len(set(paths)) and set(paths) == set(live)  # every reachable file, none twice
    for f in report.copied:  # sizes verified against the node's own copy
        assert os.path.getsize(dest / f["path"]) == f["bytes"] and f["bytes"] in live[f["path"]]
    assert {p for p in paths if p.endswith(TRACE)} == {
        f"actor/rank{r:05d}/step{a:08d}-{b:08d}{TRACE}" for r in (0, 1, 2) for a, b in ((1, 2), (4, 5))}
    assert not (dest / "actor" / "rank00003").exists()
    # Node a's folder, shared by ranks 0 and 1, is listed once; each node's run.json came from one node only.
    assert [(s["node_id"], s["ranks"]) for s in report.listed] == sorted(
        [(cluster.nodes["a"].node_id, [{"role": "actor", "rank": 0}, {"role": "actor", "rank": 1}]),
         (cluster.nodes["b"].node_id, [{"role": "actor", "rank": 2}])])
    assert len(live["run.json"]) == 2 and paths.count("run.json") == 1 and report.conflicts == []
    # The dead node is named: id, address, folder, the rank whose files stayed there.
    (u,) = report.unreachable_nodes
    assert (u["node_id"], u["address"], u["save_paths"], u["ranks"]) == (
        dead, "127.0.0.1", [str(cluster.scratch["c"] / "run")], [{"role": "actor", "rank": 3}])
    assert u["error"].startswith("the node is dead") and not report.ok and report.unreachable == []
    logged = (f"distprof: collect: node {dead[:12]} (127.0.0.1) is unreachable ({u['error']}); files of actor "
              f"rank 3 under {cluster.scratch['c'] / 'run'} not collected")
    assert [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()] == [logged]
    # A second collect into the same folder copies nothing (manifests compared by content, not only size).
    again = collect([run.group], str(dest))
    assert again.copied == [] and sorted(again.unchanged) == sorted(live)
    assert [x["node_id"] for x in again.unreachable_nodes] == [dead]
    # check: rank 3's windows are missing (the run reached step 6), every other rank's are ok; exit code 1.
    res = check_run(str(dest))
    status = {(i.rank, tuple(i.steps or ())): i.status for i in res.items}
    assert status == {**{(r, w): "ok" for r in (0, 1, 2) for w in ((1, 2), (4, 5))},
                      (3, (1, 2)): "missing", (3, (4, 5)): "missing"}
    # ... and say why, naming the node the last collect could not reach (its collect.json in the folder).
    why = f"not collected: node {dead[:12]} (127.0.0.1) was unreachable: {u['error']}"
    assert [i.detail for i in res.items if i.status == "missing"] == [f"no manifest line for this window; {why}"] * 2
    assert not any("collect.json" in n for n in res.notes)
    code, doc, _ = cli("check", dest, "--json")
    assert code == 1 and doc["ok"] is False and doc["error"] is None
    assert all(why in i["detail"] for i in doc["items"] if i["status"] == "missing")


def figures(result):
    """A verb's result without what names the folder it was read from."""
    drop = {"path", "file", "files"}

    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in drop}
        if isinstance(x, list):
            return [clean(v) for v in x]
        return x

    return clean(result)


def test_summary_over_ray_reads_node_local_files_on_their_nodes(cluster, run, tmp_path):
    local = tmp_path / "local"  # the same files in one local folder
    for n in ("a", "b"):
        shutil.copytree(cluster.scratch[n] / "run", local, dirs_exist_ok=True)
    here = analyze.summary(str(local), workers=1)
    # First through the CLI (a subprocess with a time limit: reads queued behind node b's busy CPU would fail
    # here, not hang): --ray joins the cluster from another process, lists on every node, reads on each.
    code, doc, err = cli("summary", "$SCRATCH/run", "--ray", cluster.address, "--json")
    assert code == 0, err[-2000:]
    assert figures(doc) == figures(here)
    # Each file is found on the node whose $SCRATCH holds it, and its task runs there.
    problems = []
    files = find_traces_on_nodes("$SCRATCH/run", problems)
    assert problems == []
    where = {cluster.nodes[n].node_id: str(cluster.scratch[n]) for n in ("a", "b")}
    assert len(files) == 6 and all(f.path.startswith(where[f.node] + "/") for f in files)
    assert map_files(where_read, files, ray_address=cluster.address) == [f.node for f in files]
    # The same figures as reading the same files from one local folder in this process.
    over_ray = analyze.summary("$SCRATCH/run", ray_address=cluster.address)
    assert over_ray["files_read"] == here["files_read"] == 6 and over_ray["errors"] == []
    assert figures(over_ray) == figures(here)
    # Every other verb reads the node-local files over Ray too (each: one Ray session for listing and reading).
    # Through the library in this process, already joined (each CLI process joining the cluster costs 10-20 s on
    # 2 cores): the CLI's --ray option is one shared path, exercised above and by report below.
    for verb in (analyze.steps, analyze.stragglers, analyze.diagnose):
        doc = verb("$SCRATCH/run", ray_address=cluster.address)
        assert doc["files_read"] == 6 and doc["errors"] == [], verb.__name__
    doc = analyze.diff("$SCRATCH/run", str(local), ray_address=cluster.address)
    assert doc["files_read"] == 12 and doc["errors"] == []
    code, doc, err = cli("report", "$SCRATCH/run", "-o", tmp_path / "r.html", "--ray", cluster.address, "--json")
    assert code == 0 and doc["files_read"] == 6 and (tmp_path / "r.html").stat().st_size > 10_000, err[-2000:]


def test_a_shared_folder_is_read_once_not_once_per_node(cluster, run, tmp_path):
    shared = tmp_path / "shared"
    shutil.copytree(cluster.scratch["a"] / "run", shared)  # one folder every node sees at the same path
    files = find_traces_on_nodes(str(shared), [])
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(alive) == 3 and len(files) == len({f.path for f in files}) == 4
    assert {f.node for f in files} <= alive and len({f.node for f in files}) > 1  # spread over the nodes
    assert figures(analyze.summary(str(shared), ray_address=cluster.address)) == \
        figures(analyze.summary(str(shared), workers=1))


def test_a_node_lost_between_listing_and_reading_is_one_error_per_file(cluster, run, tmp_path):
    d = tmp_path / "scratch-d"
    (d / "run").mkdir(parents=True)
    shutil.copytree(cluster.scratch["b"] / "run" / "actor", d / "run" / "actor")
    node = cluster.cluster.add_node(**LOOPBACK, num_cpus=1, env_vars={"SCRATCH": str(d)})
    files = find_traces_on_nodes("$SCRATCH/run", [])
    on_d = [f for f in files if f.node == node.node_id]
    assert len(on_d) == 2 and len(files) == 8
    cluster.cluster.remove_node(node)
    got = map_files(where_read, files, ray_address=cluster.address)
    for f, r in zip(files, got):
        if f.node == node.node_id:
            assert isinstance(r, Problem) and r.path == f.path
            assert r.message == (f"{f.path}: node {node.node_id[:12]} (127.0.0.1), which holds this file, is gone "
                                 "(TaskUnschedulableError); not read")
        else:
            assert r == f.node
    # After the loss, listing no longer sees the dead node's folder: the verb reads the rest, exit 0.
    assert analyze.summary("$SCRATCH/run", ray_address=cluster.address)["files_read"] == 6


def test_unset_variable_in_save_path_names_the_node(cluster):
    from distprof.integrations.ray.workers import _save_path_on_this_node

    @ray.remote(num_cpus=0)
    def expand(path):
        try:
            return _save_path_on_this_node({"enable": True, "save_path": path}).save_path
        except ValueError as e:
            return str(e)

    head = ray.get_runtime_context().get_node_id()
    from distprof.util.raynodes import pinned

    got = ray.get(expand.options(scheduling_strategy=pinned(head)).remote("$SCRATCH/run"))
    assert got.startswith("save_path '$SCRATCH/run' names $SCRATCH, which is not set on this node (node "
                          f"{head[:12]}, 127.0.0.1)")
    a = cluster.nodes["a"].node_id
    assert ray.get(expand.options(scheduling_strategy=pinned(a)).remote("${SCRATCH}/run")) == \
        str(cluster.scratch["a"] / "run")


def test_shared_folder_is_collected_once_and_two_writers_of_one_path_are_a_conflict(cluster, run, tmp_path):
    from distprof.integrations.ray import profiling, step_all

    actor = ray.remote(num_cpus=0.25)(Trainer)
    on = {n: actor.options(resources={f"node_{n}": 0.01}) for n in ("a", "b")}
    shared = tmp_path / "shared-run"  # one folder both nodes write to (a shared filesystem)
    both = [on["a"].remote(), on["b"].remote()]
    twins = [on["a"].remote(), on["b"].remote()]  # two groups whose rank 0 write the same relative paths
    kw = {"enable": True, "ranks": "all", "steps": [1, 2], "torch": {"activities": ["cpu"]}}
    groups = [ProfiledGroup(both, ProfilerConfig(save_path=str(shared), **kw), "shared"),
              ProfiledGroup(twins[:1], ProfilerConfig(save_path="$SCRATCH/twin", **kw), "twin"),
              ProfiledGroup(twins[1:], ProfilerConfig(save_path="$SCRATCH/twin", **kw), "twin")]
    with profiling(groups):
        for _ in range(3):
            ray.get([w.work.remote() for w in both + twins])
            step_all(groups)
    report = collect(groups, str(tmp_path / "dest"))
    paths = [f["path"] for f in report.copied]
    # The shared folder, listed from both nodes, comes once: each file copied once, no conflict.
    assert {(x["node_id"], x["save_path"]) for x in report.listed if x["save_path"] == str(shared)} == {
        (cluster.nodes["a"].node_id, str(shared)), (cluster.nodes["b"].node_id, str(shared))}
    assert len(paths) == len(set(paths)) and {f["path"] for f in list_files(str(shared))} <= set(paths)
    # Node a's and node b's "twin" rank 0 are different files at one path: the first node's kept, the other named.
    first, second = sorted([cluster.nodes["a"].node_id, cluster.nodes["b"].node_id])
    conflicted = {c["path"] for c in report.conflicts}
    assert "twin/rank00000/manifest.jsonl" in conflicted and conflicted <= {
        "twin/rank00000/manifest.jsonl", f"twin/rank00000/step00000001-00000002{TRACE}"}
    assert all((c["node_id"], c["kept_from"]) == (second, first) for c in report.conflicts) and not report.ok
    kept = "a" if first == cluster.nodes["a"].node_id else "b"
    assert (tmp_path / "dest" / "twin/rank00000/manifest.jsonl").read_bytes() == \
        (cluster.scratch[kept] / "twin/twin/rank00000/manifest.jsonl").read_bytes()


def test_process_backends_refuse_a_per_node_save_path():
    from distprof.integrations.ray import runtime_env

    config = ProfilerConfig(enable=True, backend="py_spy", save_path="$SCRATCH/run")
    with pytest.raises(ValueError, match=r"save_path '\$SCRATCH/run' names an environment variable, but py_spy's "
                                         r"output folder is fixed on the driver; give a plain path"):
        runtime_env(config, group="rollout")
    assert runtime_env(config.model_copy(update={"backend": "torch"}), group="rollout") == {}  # torch: per node


def test_a_node_lost_mid_copy_is_named_with_the_files_it_kept(cluster, tmp_path, monkeypatch):
    import importlib

    collect_module = importlib.import_module("distprof.integrations.ray.collect")  # the package's `collect` is the function

    d = tmp_path / "scratch-e"
    d.mkdir()
    node = cluster.cluster.add_node(**LOOPBACK, num_cpus=1, resources={"node_e": 1}, env_vars={"SCRATCH": str(d)})
    w = ray.remote(num_cpus=0.25)(Trainer).options(resources={"node_e": 0.01}).remote()
    g = ProfiledGroup([w], ProfilerConfig(enable=True, save_path="$SCRATCH/run", ranks="all", steps=[1],
                                          torch={"activities": ["cpu"]}), role="late")
    with g:
        for _ in range(2):  # steps 0 and 1: window 1 is written
            assert ray.get(w.work.remote()) == node.node_id
            g.step()
    monkeypatch.setattr(collect_module, "_node_read", read_or_die)
    report = collect([g], str(tmp_path / "dest"))
    (u,) = report.unreachable_nodes
    assert (u["node_id"], u["ranks"], u["not_copied"]) == (node.node_id, [{"role": "late", "rank": 0}], 1)
    assert u["error"].startswith(f"lost while copying late/rank00000/step00000001-00000001{TRACE}: ")
    assert {f["path"] for f in report.copied} == {"run.json", "late/role.json", "late/rank00000/manifest.jsonl"}
    assert not [p for p in (tmp_path / "dest").rglob("*") if p.name.startswith(".")]  # no temporary left
    assert [n["Alive"] for n in ray.nodes() if n["NodeID"] == node.node_id] == [False]


def test_a_path_no_node_holds_is_one_line_naming_the_variable(cluster):
    from distprof.trace.source import TraceError

    with pytest.raises(TraceError) as e:
        analyze.summary("$DISTPROF_NO_SUCH_VAR/run", ray_address=cluster.address)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("$DISTPROF_NO_SUCH_VAR/run: no trace files on any of the ")
    assert "path '$DISTPROF_NO_SUCH_VAR/run' names $DISTPROF_NO_SUCH_VAR, which is not set on this node" in msg
    # The CLI in this process, which has joined the cluster already (a process of its own joining it costs 10-20 s
    # on 2 cores; test_summary_over_ray_reads_node_local_files_on_their_nodes runs `summary --ray` in one).
    code, _, err = cli("summary", "$DISTPROF_NO_SUCH_VAR/run", "--ray", cluster.address, joined=True)
    assert code == 2 and "names $DISTPROF_NO_SUCH_VAR, which is not set" in err and "Traceback" not in err
