"""``distprof hang`` on hostile evidence found by the red-team pass: timestamps the platform cannot show, names
that look like rich markup, a world size that would list billions of ranks; the view folds ranks without
evidence into ranges and names an unreadable file once."""

import io
import json

from rich.console import Console
from tests.unit.analysis.test_hang import evidence, group, write
from typer.testing import CliRunner

from distprof.analysis.hang import clock_text, hang_result
from distprof.cli import app
from distprof.report import hangview


def cli(*args):
    return CliRunner().invoke(app, ["hang", *args], env={"COLUMNS": "80"})


def render(res):
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(hangview.view(res))
    return console.export_text()


def test_timestamps_out_of_the_platforms_range_are_a_question_mark_not_an_internal_error(tmp_path):
    for r in (0, 1):
        g = group(entered=6, completed=5)
        g["entered_t"] = 1e300
        write(tmp_path, r, evidence(r, groups=[g], last_progress_t=1e300))
    write(tmp_path, 2, evidence(2, groups=[group(entered=5, completed=5)], last_progress_t=2.0**62))
    assert clock_text(1e300) == "?" and clock_text(None) == "" and clock_text(2.0**62) == "?"
    p = cli(str(tmp_path), "--json")
    assert p.exit_code == 0, p.stdout
    assert json.loads(p.stdout)["stuck_ranks"] == [2, 3]
    p = cli(str(tmp_path))
    assert p.exit_code == 0, p.stdout
    assert "since ?" in " ".join(p.stdout.split())


def test_names_from_the_evidence_are_never_read_as_markup(tmp_path):
    write(tmp_path, 0, evidence(0, phase="[/]", groups=[group(entered=6, completed=5)]), role="[/x]")
    write(tmp_path, 1, evidence(1, phase="[bold]p", groups=[group(entered=5, completed=5)]), role="[/x]")
    p = cli(str(tmp_path))
    assert p.exit_code == 0, p.stdout
    assert "[/]" in p.stdout and "[bold]p" in p.stdout and "role [/x]" in p.stdout


def test_a_world_size_past_the_bound_is_an_unreadable_file_not_a_hang(tmp_path):
    write(tmp_path, 0, evidence(0, world=2**31 - 1, groups=[group(entered=6, completed=5)]))
    write(tmp_path, 1, evidence(1, groups=[group(entered=5, completed=5)]))
    res = hang_result(str(tmp_path))
    assert len(res.ranks) == 4 and [e["path"] for e in res.errors] == [
        str(tmp_path / "train" / "rank00000" / "hang.json")]
    p = cli(str(tmp_path), "--json")
    assert p.exit_code == 1 and "world_size" in json.loads(p.stdout)["errors"][0]["message"]


def test_ranks_without_evidence_fold_into_ranges_and_an_error_names_its_file_once(tmp_path):
    write(tmp_path, 0, evidence(0, world=5000, groups=[group(entered=6, completed=5)]))
    write(tmp_path, 7, evidence(7, world=5000, groups=[group(entered=5, completed=5)]))
    write(tmp_path, 9, "{")
    text = render(hang_result(str(tmp_path)))
    assert "1-6 " in text and "8-4999 " in text and len(text.splitlines()) < 30
    bad = str(tmp_path / "train" / "rank00009" / "hang.json")
    assert text.replace("\n", "").count(bad) == 1
    assert max(len(line) for line in text.splitlines()) <= 80


def test_diagnose_with_hang_evidence_but_no_readable_trace_exits_1_as_documented(tmp_path):
    """docs/hang.md: the hang finding is there even when no trace was read, "then the exit code is 1" (was 0
    with no trace at all, 2 with only unreadable ones)."""
    write(tmp_path, 0, evidence(0, groups=[group(entered=6, completed=5)]))
    write(tmp_path, 1, evidence(1, groups=[group(entered=5, completed=5)]))
    res = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and [f["id"] for f in doc["findings"]] == ["hang"]
    assert doc["errors"][0]["path"] == str(tmp_path) and doc["files_read"] == 2
    (tmp_path / "train" / "rank00000" / "t.pt.trace.json").write_text('{"traceEvents": [')
    res = CliRunner().invoke(app, ["diagnose", str(tmp_path), "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and [f["id"] for f in doc["findings"]] == ["hang"] and doc["errors"]
