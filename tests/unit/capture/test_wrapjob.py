"""``distprof wrap``'s decisions (no process started): which rank this is, whether the config wraps it, how its
output is named, and what ``check`` makes of a wrapped run directory."""

import json
import os

import pytest
from tracekit import cli

from distprof import ProfilerConfig
from distprof.analysis.check import check_run
from distprof.capture.backends.process import WrapSpec, output_name, tool_command
from distprof.capture.wrapjob import _write_run_files, decide, default_role
from distprof.rundir.layout import is_process_output, process_output_name, rank_of_process_output
from distprof.rundir.store import RunDir
from distprof.util.runtime import launcher_rank


@pytest.mark.parametrize("env, expect", [
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "8"}, (3, 1, 8, "RANK")),  # torchrun, plain launches
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"}, (5, 1, 16, "SLURM_PROCID")),  # srun
    ({"RANK": "2", "WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, (2, None, 4, "RANK")),  # srun torchrun
    ({"RANK": "6"}, (6, None, 7, "RANK")),  # no world size: at least this rank's
    ({"RANK": "x", "SLURM_PROCID": ""}, None),
    ({}, None),
])
def test_launcher_rank(env, expect):
    assert launcher_rank(env) == expect


def _cfg(**kw):
    return ProfilerConfig.from_dict({"enable": True, "backend": "py_spy", "save_path": "/tmp/unused", **kw})


def test_decide_selects_by_rank_role_and_node():
    env = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
    assert decide(_cfg(ranks=[1]), environ=env).selected
    assert not decide(_cfg(ranks=[0, 2]), environ=env).selected
    assert decide(_cfg(ranks="all", per_node=2), environ=env).selected
    assert not decide(_cfg(ranks="all", per_node=1), environ=env).selected
    assert not decide(_cfg(ranks=[1], roles=["actor"]), "main", environ=env).selected
    d = decide(_cfg(ranks=[1], roles=["actor"]), environ=env)  # the one role named is the default
    assert (d.role, d.selected, d.world_size) == ("actor", True, 4)


def test_decide_without_launcher_variables_is_rank_0_of_1():
    d = decide(_cfg(ranks=[0]), environ={})
    assert (d.rank, d.world_size, d.source, d.selected) == (0, 1, None, True)


@pytest.mark.parametrize("cfg, words", [
    ({"enable": False}, "profiling is off"),
    ({"backend": "torch"}, "captures inside the process"),
])
def test_decide_leaves_alone_what_it_cannot_wrap(cfg, words):
    d = decide(_cfg(**cfg), environ={"RANK": "0", "WORLD_SIZE": "2"})
    assert not d.selected and words in d.why


def test_decide_refuses_what_it_cannot_judge():
    with pytest.raises(ValueError, match=r"mesh coordinates.*list of ranks"):
        decide(_cfg(ranks={"dp": [0]}), environ={"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"ranks \[5\] do not exist"):
        decide(_cfg(ranks=[5]), environ={"RANK": "0", "WORLD_SIZE": "2"})


def test_default_role():
    assert default_role(_cfg()) == "main"
    assert default_role(_cfg(roles=["actor"])) == "actor"
    assert default_role(_cfg(roles=["actor*"])) == "main"
    assert default_role(_cfg(roles=["a", "b"])) == "main"


def test_output_names_carry_the_rank_and_keep_the_ray_prefix():
    name = process_output_name("py_spy", 1234, ".speedscope.json", 3)
    assert name == "py_spy-pid1234.rank00003.speedscope.json"
    assert is_process_output(name, "py_spy") and rank_of_process_output(f"actor/{name}") == 3
    assert rank_of_process_output("nsys-pid9.rank00012.nsys-rep") == 12
    assert rank_of_process_output("rocprof_sys-pid9.rank00002") == 2
    assert rank_of_process_output("py_spy-pid1234.speedscope.json") is None  # a Ray worker's
    spec = WrapSpec("memray", "main", "/o", ["python"], None, rank=7)
    assert output_name(spec, 55) == "memray-pid55.rank00007.bin"
    assert WrapSpec.decode(spec.encode()) == spec


def test_py_spy_attaches_to_the_app_it_is_given():
    spec = WrapSpec("py_spy", "main", "/o", ["python"], "py-spy", extra={"rate": 50, "format": "speedscope"}, rank=0)
    argv, _ = tool_command(spec, 10, ["train.py"], attach_pid=11)
    assert argv[-2:] == ["--pid", "11"] and "train.py" not in argv and "--" not in argv


def test_check_names_the_selected_ranks_without_output(tmp_path):
    cfg = _cfg(ranks=[0, 2], save_path=str(tmp_path))
    d = decide(cfg, environ={"RANK": "0", "WORLD_SIZE": "4"})
    _write_run_files(cfg, RunDir(str(tmp_path)), d)
    assert json.loads((tmp_path / "main" / "role.json").read_text())["world_size"] == 4
    (tmp_path / "main" / process_output_name("py_spy", 77, ".speedscope.json", 0)).write_text(
        json.dumps({"$schema": "https://www.speedscope.app/file-format-schema.json", "profiles": []}))
    res = check_run(str(tmp_path))
    assert [(i.rank, i.status) for i in res.items] == [(0, "ok"), (2, "missing")]
    assert "distprof wrap" in res.items[1].detail


@pytest.mark.parametrize("args, words", [
    (["wrap"], "needs a command after --"),
    (["wrap", "--config", "/no/such/profile.yaml", "--", "true"], "cannot read the config file"),
])
def test_wrap_refuses_in_one_line_before_running_anything(args, words):
    code, _, err = cli(*args)
    assert code == 2 and words in err and "Traceback" not in err


def test_wrap_refuses_mesh_coordinates_in_one_line(tmp_path, monkeypatch):
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"enable: true\nbackend: py_spy\nsave_path: {tmp_path}\nranks: {{dp: [0]}}\n")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err = cli("wrap", "--config", cfg, "--", "true")
    assert code == 2 and "list of ranks" in err


def test_collect_lists_wrapped_outputs_like_the_ray_paths(tmp_path):
    """``distprof.integrations.ray.collect`` lists a node's save_path by the layout: the rank-named outputs with
    the rest, a hidden one still being written as pending."""
    from distprof.integrations.ray.collect import _node_list

    (tmp_path / "main").mkdir()
    done = process_output_name("memray", 5, ".bin", 1)
    (tmp_path / "main" / done).write_bytes(b"memray")
    me = os.getpid()  # a writer that is alive: its temporary is pending
    (tmp_path / "main" / f".tmp-{me}-{process_output_name('memray', me, '.bin', 2)}").write_bytes(b"")
    listing = _node_list(str(tmp_path), 0, [])
    assert [f["path"] for f in listing["files"]] == [f"main/{done}"] and len(listing["pending"]) == 1
