"""The analysis handle (``distprof.analysis.open``): one read of the files for every question, and the same
figures as the verbs."""

import os
from collections import Counter

import pytest
from tracekit import TRACES

import distprof.analysis
from distprof.analysis import analyze
from distprof.analysis.records import StepsResult, StragglersResult, SummaryResult, to_json

SAMPLED = os.path.join(TRACES, "hta", "two-rank-sampled")


@pytest.fixture
def reads(monkeypatch):
    """Counts how often each trace file is opened for decoding (reads run in this process with workers=1)."""
    seen: Counter = Counter()
    real = analyze.open_trace

    def counting(path, *a, **kw):
        seen[path] += 1
        return real(path, *a, **kw)

    monkeypatch.setattr(analyze, "open_trace", counting)
    return seen


def test_the_handle_reads_each_file_once_for_every_question(reads, tmp_path):
    run = distprof.analysis.open(SAMPLED, workers=1)
    assert not reads  # nothing is read before the first question
    assert isinstance(run.summary(), SummaryResult) and isinstance(run.steps(), StepsResult)
    assert isinstance(run.stragglers(), StragglersResult)
    findings = run.diagnose()
    out = run.report(str(tmp_path / "r.html"))
    assert out == str(tmp_path / "r.html") and os.path.getsize(out) > 0
    assert len(reads) == 2 and set(reads.values()) == {1}, reads  # two files, each decoded once
    assert run.diagnose() is findings  # answered from the same read, not diagnosed again
    # the verbs, for contrast, read the files once each
    analyze.summary(SAMPLED, workers=1)
    assert set(reads.values()) == {2}


def test_the_handle_gives_the_verbs_figures():
    run = distprof.analysis.open(SAMPLED, workers=1)
    assert to_json(run.summary()) == analyze.summary(SAMPLED, workers=1)
    assert to_json(run.steps()) == analyze.steps(SAMPLED, workers=1)
    assert to_json(run.stragglers()) == analyze.stragglers(SAMPLED, workers=1, top=None)  # worst uncapped
    verb = analyze.diagnose(SAMPLED, workers=1)
    assert [f.to_dict() for f in run.diagnose()] == verb["findings"] and run.diagnosis() == verb
    assert run.stragglers().matched > 0 and run.steps().steps  # (the sample has both to compare)


def test_the_handle_selects_as_the_cli_does():
    run = distprof.analysis.open(SAMPLED, ranks="1", workers=1)
    sel = analyze.Selection.of(ranks="1")
    assert [r.rank for r in run.summary().ranks] == [1]
    assert to_json(run.summary()) == analyze.summary(SAMPLED, selection=sel, workers=1)


def test_records_are_read_as_attributes_only():
    """A record has no ``record["key"]`` or ``record.get("key")``: a misspelled key would read as a silent None,
    where an attribute is followed by the type checker (and fails loudly at run time)."""
    steps = distprof.analysis.open(SAMPLED, workers=1).steps()
    row = steps.steps[0]
    assert row.ranks[0].busy_us >= 0 and to_json(row)["ranks"][0]["busy_us"] == row.ranks[0].busy_us
    for rec in (steps, row, row.ranks[0]):
        with pytest.raises(TypeError):
            rec["steps"]
        assert not hasattr(rec, "get")
    with pytest.raises(AttributeError):
        row.slowset_rank  # noqa: B018  (misspelled on purpose)
