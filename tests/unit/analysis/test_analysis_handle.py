"""The analysis handle (``distprof.analysis.open``): one read of the files for every question, and the same
figures as the verbs."""

import os
from collections import Counter

import msgspec
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
    assert [f.to_dict() for f in run.diagnose()] == verb["findings"] and to_json(run.diagnosis()) == verb
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


def test_the_figures_inside_the_records_are_records_too():
    """Every figure a row carries (idle, launch, temporal, overlap, step breakdown, profiling cost) is a typed record
    read by attribute, per rank, over all ranks and per step; and ``to_json`` of it is the verb's --json."""
    from distprof.analysis.records import (
        IdleFigure,
        LaunchFigure,
        LaunchStep,
        NotApplicable,
        Overlap,
        ProfilingCost,
        StepBreakdown,
        Temporal,
    )

    path = os.path.join(TRACES, "distprof-h100", "ddp-gloo-cuda-slow-rank1")
    run = distprof.analysis.open(path, workers=1)
    s, st = run.summary(), run.steps()
    for r in s.ranks:
        assert isinstance(r.idle, IdleFigure) and r.idle.host_wait and r.idle.streams
        assert r.idle.idle_us == pytest.approx(r.idle.host_wait_us + r.idle.kernel_wait_us + r.idle.other_us)
        assert isinstance(r.launch, LaunchFigure) and r.launch.delay_us.p50 <= r.launch.delay_us.p95
        assert isinstance(r.temporal, Temporal) and r.temporal.device and r.temporal.device.idle_share is not None
        assert isinstance(r.overlap, Overlap) and r.overlap.device and 0 <= r.overlap.device.share <= 1
        assert isinstance(r.step_breakdown, StepBreakdown)
    assert isinstance(s.idle, IdleFigure) and s.idle.ranks == 2 and s.idle.kernel_wait_below_us == 30.0
    assert isinstance(s.launch, LaunchFigure) and s.launch.thresholds and not s.launch.launch_bound_steps
    assert all(isinstance(c, ProfilingCost) for c in s.profiling_cost + st.profiling_cost) and s.profiling_cost
    for x in (x for row in st.steps for x in row.ranks):
        assert isinstance(x.idle, (IdleFigure, NotApplicable)) and isinstance(x.launch, (LaunchStep, NotApplicable))
        assert isinstance(x.breakdown, StepBreakdown) and isinstance(x.temporal, Temporal)
        assert x.temporal.device is None or x.temporal.device.idle_share is msgspec.UNSET  # a step's: no shares
    assert to_json(s) == analyze.summary(path, workers=1)
    assert to_json(st) == analyze.steps(path, workers=1)
