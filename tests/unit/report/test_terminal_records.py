"""The terminal tables read the typed records (issue 21, item 3): ``analyze.summary_result`` / ``steps_result`` /
``stragglers_result`` / ``diagnose_result`` / ``diff_result`` give the records their ``--json`` objects encode, and the
CLI's tables (and the problems under them) are what ``report.terminal`` prints from those records, read as
attributes."""

import io
import json
import os
import shutil
import types

import msgspec
import pytest
from rich.console import Console
from tracekit import TRACES, X, cli, write

from distprof.analysis import analyze
from distprof.analysis.records import Envelope, StepsResult, StragglersResult, SummaryResult, to_json
from distprof.analysis.records_diag import DiagnoseResult, DiffResult, DiffRow, Finding, FindingEvidence, WhatIf
from distprof.report import terminal as render
from distprof.trace.selection import Selection

RUN = os.path.join(TRACES, "distprof-h100", "ddp-gloo-cuda-slow-rank1")  # 2 ranks, a straggler, GPU figures


def _rl_run(root):
    """A run directory of three roles working one after another in steps 1-2 (rollout, ref, actor): an RL job."""
    for role, at, dur in (("rollout", 0, 3000), ("ref", 3100, 1000), ("actor", 4200, 1500)):
        folder = os.path.join(root, role, "rank00000")
        os.makedirs(folder)
        events = [e for step in (1, 2) for e in (X(f"ProfilerStep#{step}", step * 10_000, 6300, cat="user_annotation"),
                                                 X(f"{role}/work", step * 10_000 + at, dur, cat="user_annotation"))]
        path = write(os.path.join(folder, "step00000001-00000002.pt.trace.json"), events)
        with open(os.path.join(folder, "manifest.jsonl"), "w") as fh:
            fh.write(json.dumps({"role": role, "rank": 0, "steps": [1, 2], "world_size": 1, "complete": True,
                                 "backend": "torch", "files": [{"path": f"{role}/rank00000/{os.path.basename(path)}",
                                                               "bytes": os.path.getsize(path)}]}) + "\n")


RANK_0, RANK_1 = Selection.of(ranks="0"), Selection.of(ranks="1")


@pytest.fixture(scope="module")
def records():
    return {"summary": analyze.summary_result(RUN, top=15, workers=1),
            "steps": analyze.steps_result(RUN, workers=1),
            "stragglers": analyze.stragglers_result(RUN, workers=1),
            "diagnose": analyze.diagnose_result(RUN, workers=1),
            "diff": analyze.diff_result(RUN, RUN, RANK_0, RANK_1, top=20, workers=1)}


def test_the_record_calls_encode_to_the_json_objects(records):
    assert isinstance(records["summary"], SummaryResult) and isinstance(records["steps"], StepsResult)
    assert isinstance(records["stragglers"], StragglersResult)
    assert to_json(records["summary"]) == analyze.summary(RUN, top=15, workers=1)
    assert to_json(records["steps"]) == analyze.steps(RUN, workers=1)
    assert to_json(records["stragglers"]) == analyze.stragglers(RUN, workers=1)


def test_diagnose_and_diff_are_records_down_to_their_rows(records):
    d = records["diagnose"]
    assert isinstance(d, DiagnoseResult) and d.findings and d.analysed.ranks == 2 and d.files_read == 2
    f = d.findings[0]
    assert isinstance(f, Finding) and isinstance(f.evidence, FindingEvidence) and isinstance(f.what_if, WhatIf)
    assert f.id == "straggler" and f.evidence.ranks[0] == 1 and f.cost_us == f.what_if.saves_us
    assert to_json(d) == analyze.diagnose(RUN, workers=1)
    c = records["diff"]
    assert isinstance(c, DiffResult) and all(isinstance(r, DiffRow) for r in c.rows) and c.compares == "per_step"
    assert (c.steps.a, c.steps.b) == (4, 4) and set(c.scope) == {"a", "b"} and c.files_read == 2
    assert to_json(c) == analyze.diff(RUN, RUN, RANK_0, RANK_1, top=20, workers=1)


def _printed(draw):
    out, err = io.StringIO(), io.StringIO()
    draw(Console(file=out, width=200), Console(file=err, width=200))
    return out.getvalue()


@pytest.mark.parametrize("verb, draw", [
    ("summary", lambda r, out, err: render.summary(out, r)),
    ("steps", lambda r, out, err: render.steps(out, r)),
    ("stragglers", lambda r, out, err: render.stragglers(out, err, r)),
    ("diagnose", lambda r, out, err: render.diagnose(out, r)),
    ("diff", lambda r, out, err: render.diff(out, r)),
])
def test_the_cli_prints_what_the_terminal_renders_from_the_record(records, verb, draw):
    text = _printed(lambda out, err: draw(records[verb], out, err))
    args = (RUN, RUN, "--rank-a", "0", "--rank-b", "1") if verb == "diff" else (RUN,)
    code, stdout, _ = cli(verb, *args, "--workers", "1")
    assert code == 0 and text.strip() and text == stdout
    # the figures the tables show are the records' own
    if verb == "summary":
        r = records[verb]
        assert "Per rank: device time" in text and "Per rank: kernel launches" in text
        assert render.us(r.ranks[0].temporal.device.span_us) in text
        assert "Profiling's own cost, trainer rank 0" in text
    elif verb == "steps":
        assert "Per step, mean over its ranks" in text and " *" in text  # the rank holding the others back
    elif verb == "diagnose":
        f = records[verb].findings[0]
        assert "1. straggler" in text and render.us(f.cost_us) in text and "what-if: " in text
    elif verb == "diff":
        row = records[verb].rows[0]
        assert "B vs A, mean per step and rank (4 vs 4 steps)" in text and render.us(row.b_per_step_us) in text
    else:
        assert f"Stragglers: {records[verb].matched} collectives matched" in text


def test_steps_renders_the_rl_step_view_from_the_record(tmp_path):
    """Roles one after another: the RL steps table and each step's path come from the ``rl_steps`` records."""
    _rl_run(tmp_path)
    d = analyze.steps_result(str(tmp_path), workers=1)
    text = _printed(lambda out, err: render.steps(out, d))
    assert d.rl_steps and "RL steps: per role" in text
    assert f"step 1: path {' > '.join(d.rl_steps[0].critical_path)}" in text


def test_demo_prints_the_rl_steps_and_findings_of_the_run(tmp_path, monkeypatch):
    """The demo's tail, without Ray: its run read once through the analysis handle (records, findings)."""
    from typer.testing import CliRunner

    from distprof import cli as cli_module
    from distprof.demo import rl_job

    src = tmp_path / "made"
    _rl_run(src)

    def fake_run(out, **kw):
        shutil.copytree(src, out, dirs_exist_ok=True)
        return types.SimpleNamespace(run_dir=out, rewards=[0.5], check=types.SimpleNamespace(ok=True),
                                     files=[{"role": "actor", "rank": 0, "steps": [1, 1], "file": "trace.json",
                                             "bytes": 1}])

    monkeypatch.setattr(rl_job, "run", fake_run)
    out = tmp_path / "demo"
    result = CliRunner().invoke(cli_module.app, ["demo", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.stdout
    assert "RL steps: per role" in result.stdout and "step 1: path" in result.stdout
    assert "Diagnosis (" in result.stdout and f"Report: {out / 'report.html'}" in result.stdout
    assert (out / "report.html").exists()


def test_problems_reads_the_envelope_of_a_record_or_of_a_json_object():
    """One way in: ``problems`` reads attributes; a verb whose result is a dict (merge) passes its Envelope."""
    doc = {"files": 1, "errors": [{"path": "a.json", "message": "a.json: not JSON"}],
           "salvaged": [{"path": "b.json.gz", "notes": ["truncated at byte 10"]}],
           "conflicts": [{"path": "c.json", "reason": "rank 0 is already b.json.gz"}], "warnings": ["w: odd"],
           "skipped": 0, "files_read": 2}
    diff = analyze.diff_result(RUN, RUN, RANK_0, RANK_1, workers=1)
    for k in ("errors", "salvaged", "conflicts", "warnings"):
        setattr(diff, k, doc[k])

    def lines(result):
        err = io.StringIO()
        render.problems(Console(file=err, width=200), result)
        return err.getvalue().splitlines()

    want = ["cannot read a.json: not JSON",
            "salvaged b.json.gz: read in part (truncated at byte 10); its figures cover only what could be read",
            "conflict c.json: rank 0 is already b.json.gz", "warning w: odd"]
    assert lines(diff) == lines(Envelope.of(doc)) == want
    assert Envelope.of({"out": "x"}).files_read is msgspec.UNSET and lines(Envelope.of({"out": "x"})) == []
