"""Memory snapshots and their folders as the red-team pass sent them: a manifest that is a FIFO (was a hang) or a
link out of the run (was followed), sizes and times past 64 bits (were an internal error)."""

from __future__ import annotations

import json
import os

from memsnap_standin import Builder, frame, write
from typer.testing import CliRunner

from distprof.analysis import memsnap
from distprof.analysis.memory import file_rows, find_snapshots
from distprof.cli import app


def _snapshot() -> dict:
    b = Builder()
    b.segment(1 << 30)
    b.alloc(1 << 20, [frame("/job/x.py", 3, "f")])
    b.alloc(5 << 20, [frame("/job/y.py", 4, "g")])
    return b.snapshot()


def _rank(tmp_path, name="run"):
    d = tmp_path / name / "train" / "rank00000"
    d.mkdir(parents=True)
    write(str(d / "step1-2.memory.pickle"), _snapshot())
    return d


def test_a_manifest_that_is_a_fifo_is_a_problem_not_a_wait(tmp_path):
    d = _rank(tmp_path)
    os.mkfifo(d / "manifest.jsonl")
    problems: list = []
    files = find_snapshots(str(tmp_path / "run"), problems=problems)  # opening the FIFO to read would block
    assert [f.path for f in files] == [str(d / "step1-2.memory.pickle")]
    assert len(problems) == 1 and "not a regular file" in str(problems[0].message)


def test_a_manifest_linked_out_of_the_run_is_not_followed(tmp_path):
    outside = tmp_path / "outside.jsonl"
    outside.write_text('{"v": 1}\n')
    d = _rank(tmp_path)
    os.symlink(outside, d / "manifest.jsonl")
    os.chmod(outside, 0)  # were it followed (as root: read anyway), the problem would not name the link
    problems: list = []
    files = find_snapshots(str(tmp_path / "run"), problems=problems)
    assert len(files) == 1 and len(problems) == 1 and "symbolic link" in str(problems[0].message)


def test_sizes_and_times_past_64_bits_are_entries_of_the_wrong_shape(tmp_path):
    s = _snapshot()
    trace = s["device_traces"][0]
    trace[0]["size"], trace[1]["time_us"], trace[2]["addr"] = 10**400, float("inf"), -(2**70)
    s["segments"][0]["total_size"] = 10**500
    d = tmp_path / "rank00000"
    d.mkdir()
    write(str(d / "step1-2.memory.pickle"), s)
    (h,) = memsnap.read(str(d / "step1-2.memory.pickle"))
    assert h.skipped == 3 and h.reserved_end == 0
    (f,) = find_snapshots(str(d))
    assert file_rows(f)  # numpy never sees an int past 64 bits (was OverflowError: an internal error)


def test_a_report_of_snapshots_alone_says_where_it_wrote(tmp_path):
    """A run holding only memory snapshots: the report is written with their answers, and the CLI says so (it
    printed nothing: ``files_read`` counted traces only, and the verbs draw nothing for a run of nothing read)."""
    _rank(tmp_path)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "-o", str(out), "--json"])
    assert res.exit_code == 0 and out.is_file()
    assert json.loads(res.stdout)["files_read"] == 1
    res = CliRunner().invoke(app, ["report", str(tmp_path / "run"), "-o", str(out)])
    assert res.exit_code == 0 and f"report: {out}" in " ".join(res.stdout.split())
