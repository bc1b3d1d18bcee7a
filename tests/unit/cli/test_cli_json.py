"""Every verb with --json prints exactly one JSON object with `errors`, whatever its exit code (issue 18, item 7);
`report` without -o writes beside the traces (item 13)."""

import json
import os

import pytest
from tracekit import X, write
from typer.testing import CliRunner

from distprof.cli import app


def _garbage(folder):
    folder.mkdir()
    (folder / "a.json").write_text("{not json")
    (folder / "b.json.gz").write_bytes(b"xx")
    return {str(folder / "a.json"), str(folder / "b.json.gz")}


def _args(verb, path, out):
    return {"summary": ["summary", path, "--workers", "1"], "steps": ["steps", path, "--workers", "1"],
            "stragglers": ["stragglers", path, "--workers", "1"], "diagnose": ["diagnose", path, "--workers", "1"],
            "merge": ["merge", path, "-o", str(out / "m.json"), "--workers", "1"],
            "diff": ["diff", path, path, "--workers", "1"], "report": ["report", path, "-o", str(out / "r.html")],
            "check": ["check", path], "validate": ["validate", path], "trigger": ["trigger", path, "--status"]}[verb]


VERBS = ["summary", "steps", "stragglers", "diagnose", "merge", "diff", "report", "check", "validate", "trigger"]
# Verbs whose errors name each file that could not be read (the others name the path they were given).
PER_FILE = {"summary", "steps", "stragglers", "diagnose", "merge", "diff"}


def _one_object(stdout):
    doc, end = json.JSONDecoder().raw_decode(stdout)
    assert stdout[end:].strip() == "", "more than one JSON object on stdout"
    return doc


@pytest.mark.parametrize("case", ["missing", "garbage"])
@pytest.mark.parametrize("verb", VERBS)
def test_every_verb_prints_one_json_object_with_errors_when_nothing_can_be_read(tmp_path, verb, case):
    path = tmp_path / "in"
    files = _garbage(path) if case == "garbage" else set()
    res = CliRunner().invoke(app, [*_args(verb, str(path), tmp_path), "--json"])
    assert res.exit_code == 2, res.output
    doc = _one_object(res.stdout)
    assert doc["errors"] and all(set(e) >= {"path", "message"} and e["message"] for e in doc["errors"])
    if case == "garbage" and verb in PER_FILE:
        assert {e["path"] for e in doc["errors"]} == files
    else:
        assert doc["errors"][0]["path"] == str(path)
    if verb in PER_FILE | {"report"}:
        assert doc["files_read"] == 0 and doc["warnings"] == [] and doc["salvaged"] == []
    assert not (tmp_path / "m.json").exists() and not (tmp_path / "r.html").exists()


def test_a_bad_selection_and_an_internal_error_are_one_json_object_too(tmp_path, monkeypatch):
    p = write(tmp_path / "rank-0.json", [X("aten::mm", 0, 5)])
    res = CliRunner().invoke(app, ["summary", p, "--ranks", "x", "--json"])
    assert res.exit_code == 2
    assert _one_object(res.stdout)["errors"] == [{"path": None, "message": "--ranks: 'x' is not a number or a range "
                                                                          "such as 3-5"}]
    from distprof.analysis import analyze

    def boom(*a, **k):
        raise KeyError("bug")

    monkeypatch.setattr(analyze, "summary_result", boom)  # what `distprof summary` calls
    res = CliRunner().invoke(app, ["summary", p, "--json"])
    assert res.exit_code == 3
    doc = _one_object(res.stdout)
    assert doc["internal_error"] == "KeyError: 'bug'" and doc["errors"][0]["path"] is None
    assert doc["errors"][0]["message"].startswith("internal error: KeyError: 'bug'")


def test_report_without_o_writes_beside_the_traces(tmp_path):
    folder = tmp_path / "traces"
    folder.mkdir()
    events = [X("ProfilerStep#1", 0, 100, cat="user_annotation"), X("aten::mm", 10, 50)]
    single = write(folder / "rank-0.pt.trace.json", events, distributedInfo={"rank": 0})
    res = CliRunner().invoke(app, ["report", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    assert _one_object(res.stdout)["out"] == str(folder / "report.html") and (folder / "report.html").is_file()
    res = CliRunner().invoke(app, ["report", single])
    assert res.exit_code == 0 and (folder / "rank-0.pt.trace.report.html").is_file()
    assert f"writing {folder / 'rank-0.pt.trace.report.html'}" in res.stderr.replace("\n", "")
    # Where the default place must not be written, the refusal says how to choose another.
    os.remove(folder / "report.html")
    (folder / "report.html").mkdir()
    res = CliRunner().invoke(app, ["report", str(folder)])
    assert res.exit_code == 2 and "is a directory" in res.stderr and "give -o FILE" in res.stderr
