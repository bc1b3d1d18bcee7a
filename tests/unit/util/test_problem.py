"""One problem record for every layer (issue 21, item 2): a config error, a dialect's error, a trace file that
cannot be read, an entry ``find_traces`` refuses, a node or file ``collect`` could not bring are all
``distprof.util.problem.Problem``; the analysis ``--json`` still lists files as ``[{"path", "message"}]`` and
``validate --json`` still lists config problems as ``{"source", "value", "message", "text"}``."""

import ast
import copy
import pickle

import pytest
from tracekit import X, cli, write

from distprof.analysis import analyze
from distprof.analysis.merge import merge_traces
from distprof.config import errors as config_errors
from distprof.config.dialects import translate
from distprof.config.model import ConfigError, ProfilerConfig
from distprof.integrations.ray.collect import CollectReport
from distprof.trace.listing import find_traces
from distprof.trace.source import TraceError
from distprof.util import problem as problem_mod
from distprof.util.problem import MISSING, Problem, clip


def refused(fn):
    with pytest.raises(ConfigError) as e:
        fn()
    return e.value


def a_run(tmp_path):
    """A folder with one readable trace, one that is not JSON and a link leaving the folder."""
    run = tmp_path / "run"
    run.mkdir()
    good = write(run / "rank-0.json", [X("ProfilerStep#1", 0, 100), X("aten::mm", 10, 50)])
    bad = run / "rank-1.json"
    bad.write_bytes(b"\x00\x01 not a trace")
    outside = tmp_path / "outside.json"
    write(outside, [X("aten::mm", 0, 1)])
    (run / "rank-2.json").symlink_to(outside)
    return str(run), good, str(bad), str(run / "rank-2.json")


def test_the_config_layer_uses_the_ground_floor_record():
    assert config_errors.Problem is config_errors.ConfigProblem is Problem
    assert config_errors.MISSING is MISSING and config_errors.clip is clip and config_errors.show is problem_mod.show
    (p,) = refused(lambda: ProfilerConfig.from_dict({"enable": True, "save_path": "out", "steps": "x"})).problems
    assert type(p) is Problem and p.field == p.path == p.source == "steps" and str(p) == p.message
    assert set(p.to_dict()) == {"source", "value", "message", "text"} and p.to_dict()["source"] == "steps"
    verl = {"global_profiler": {"tool": "torch", "steps": [0], "save_path": "out"}}
    t = translate("verl", verl, env={}, config=ProfilerConfig)
    assert t.errors and all(type(e) is Problem for e in t.errors)


def test_a_file_or_node_problem_is_where_and_a_line():
    p = Problem.at("actor/rank00000/x.json.gz", "refused: a folder on the way is a symbolic link")
    assert p.path == p.field == "actor/rank00000/x.json.gz" and p.value is MISSING
    assert str(p) == "actor/rank00000/x.json.gz: refused: a folder on the way is a symbolic link"
    assert p.reason == "refused: a folder on the way is a symbolic link"
    assert p.file_dict() == {"path": "actor/rank00000/x.json.gz", "message": str(p)}
    assert p.to_dict()["value"] is None  # no value: validate's shape says null
    whole = Problem.at("/r/a.json", "empty file", text="/r/a.json: empty file")
    assert str(whole) == "/r/a.json: empty file" and whole.reason == "empty file"


def test_missing_stays_missing_through_pickle_and_copy():
    """A problem found on a Ray node or in a worker process comes back pickled: its MISSING is still MISSING."""
    p = Problem.at("/scratch/run on node 57d99f6b67f3 (10.0.0.7)", "the node could not be listed")
    back = pickle.loads(pickle.dumps(p))
    assert back == p and back.value is MISSING and copy.deepcopy(MISSING) is MISSING
    assert back.to_dict()["value"] is None and problem_mod.short(back.value) == "(not set)"


def test_find_traces_and_analyze_report_problems_and_json_keeps_path_message(tmp_path):
    run, good, bad, link = a_run(tmp_path)
    problems = []
    assert [f.path for f in find_traces(run, problems)] == [good, bad]  # bad is found, and fails when read
    (p,) = problems
    assert type(p) is Problem and p.path == link and str(p) == f"{link}: {p.reason}" and "outside" in p.reason

    got = analyze.read(run, ["summary"], workers=1)
    assert all(type(e) is Problem for e in got.errors)
    assert [e.path for e in got.errors] == [link, bad]
    unreadable = got.errors[1]
    assert str(unreadable).startswith(f"{bad}: ") and unreadable.reason == str(unreadable)[len(bad) + 2:]

    code, doc, _ = cli("summary", run, "--json")
    assert code == 1 and doc["files_read"] == 1
    assert doc["errors"] == [{"path": link, "message": str(got.errors[0])},
                             {"path": bad, "message": str(unreadable)}]
    out = tmp_path / "m.json"
    merged = merge_traces(run, str(out), workers=1)
    assert merged["errors"] == doc["errors"] and merged["files"] == 1


def test_nothing_read_lists_every_file_as_path_and_message(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "rank-0.json").symlink_to(tmp_path / "elsewhere.json")  # the only entry: a link leaving the folder
    line = f"{run / 'rank-0.json'}: symlink points outside {run}; not followed"
    expected = [{"path": str(run / "rank-0.json"), "message": line}]
    with pytest.raises(TraceError) as e:
        analyze.summary(str(run), workers=1)
    assert e.value.errors == expected and str(e.value) == f"{run}: no readable trace ({line})"
    with pytest.raises(TraceError) as e:
        merge_traces(str(run), str(tmp_path / "m.json"), workers=1)
    assert e.value.errors == expected
    code, doc, _ = cli("summary", run, "--json")
    assert code == 2 and doc["errors"] == expected


def test_a_collect_report_lists_problems_whose_line_is_what_it_always_was(tmp_path):
    report = CollectReport(dest=str(tmp_path))
    assert report.ok
    report.errors.append(Problem.at("actor/rank00000/manifest.jsonl", "UnsafePath: a link on the way"))
    report.errors.append(Problem.at("node 57d99f6b67f3 (10.0.0.7)", f"cannot list {tmp_path}: PermissionError"))
    assert not report.ok and all(type(e) is Problem for e in report.errors)
    assert [str(e) for e in report.errors] == ["actor/rank00000/manifest.jsonl: UnsafePath: a link on the way",
                                               f"node 57d99f6b67f3 (10.0.0.7): cannot list {tmp_path}: PermissionError"]
    assert [e.path for e in report.errors] == ["actor/rank00000/manifest.jsonl", "node 57d99f6b67f3 (10.0.0.7)"]


def test_the_record_is_on_the_ground_floor():
    """util/problem.py imports nothing else of distprof, and no pydantic: any layer may use it."""
    with open(problem_mod.__file__) as f:
        tree = ast.parse(f.read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "json", "reprlib", "collections.abc", "dataclasses", "typing"}
