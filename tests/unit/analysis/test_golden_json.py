"""``--json`` byte for byte: each verb's output on three real traces (two GPU runs written by distprof, one CPU-only
gloo rank from HTA) against the bytes the CLI printed before the combined results became typed records.

A change that renames, drops, reorders or recomputes a key fails here. When a figure is meant to change, write the
new golden file with the CLI from the repository root and say why in the commit:

    python -m distprof.cli VERB tests/data/PATH --json | sed "s#$PWD#<repo>#g" > tests/unit/analysis/golden/CASE.VERB.json

``diff`` compares two paths (``DIFFS``: both sides and their ``--rank-a/-b``): per step on HTA's trace-diff pair and
on two ranks of one run, with differing step and rank sets, and in totals (a side without steps).
"""

from pathlib import Path

import msgspec
import pytest

from distprof.analysis import analyze
from distprof.trace.selection import Selection

ROOT = Path(__file__).resolve().parents[3]
GOLDEN = Path(__file__).parent / "golden"
CASES = {"distprof-h100_ddp-gloo-cuda-slow-rank1": "tests/data/distprof-h100/ddp-gloo-cuda-slow-rank1",
         "distprof-h100_transformer-fp32": "tests/data/distprof-h100/transformer-fp32",
         "hta_cpu_only_rank-34": "tests/data/hta/cpu_only_rank-34.pt.trace.json.gz"}
# What each CLI verb calls, with the CLI's defaults (summary --top 15, stragglers --top 10).
VERBS = {"summary": lambda p: analyze.summary(p, top=15, workers=1),
         "steps": lambda p: analyze.steps(p, workers=1),
         "stragglers": lambda p: analyze.stragglers(p, top=10, workers=1),
         "diagnose": lambda p: analyze.diagnose(p, workers=1)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_json_is_byte_for_byte_the_golden_output(case, monkeypatch):
    monkeypatch.chdir(ROOT)  # the paths in the output are as given: relative to the repository root
    for verb, call in VERBS.items():
        got = msgspec.json.encode(call(CASES[case])).decode() + "\n"  # what cli_support.print_json writes
        got = got.replace(str(ROOT), "<repo>")  # a run directory's files are named by absolute path
        want = (GOLDEN / f"{case}.{verb}.json").read_text()
        assert got == want, f"{case} {verb}: --json differs from {GOLDEN.name}/{case}.{verb}.json"


# diff: (A, B, A's ranks, B's ranks), called as the CLI calls it (--top 20).
DIFFS = {"hta_trace-diff": ("tests/data/hta/trace-diff/control.json.gz", "tests/data/hta/trace-diff/test.json.gz",
                            None, None),
         "distprof-h100_ddp-gloo-rank0-vs-rank1": ("tests/data/distprof-h100/ddp-gloo-cuda-slow-rank1",
                                                   "tests/data/distprof-h100/ddp-gloo-cuda-slow-rank1", "0", "1"),
         "hta_cpu_only-vs-distprof-h100_transformer-fp32": ("tests/data/hta/cpu_only_rank-34.pt.trace.json.gz",
                                                            "tests/data/distprof-h100/transformer-fp32", None, None),
         "hta_simple_add-vs-amd_mi250_rocm": ("tests/data/hta/simple_add.json.gz",
                                              "tests/data/hta/amd_mi250_rocm.json.gz", None, None)}


@pytest.mark.parametrize("case", sorted(DIFFS))
def test_diff_json_is_byte_for_byte_the_golden_output(case, monkeypatch):
    monkeypatch.chdir(ROOT)
    a, b, ranks_a, ranks_b = DIFFS[case]
    d = analyze.diff(a, b, selection_a=Selection.of(ranks=ranks_a), selection_b=Selection.of(ranks=ranks_b), top=20,
                     workers=1)
    got = (msgspec.json.encode(d).decode() + "\n").replace(str(ROOT), "<repo>")
    assert got == (GOLDEN / f"{case}.diff.json").read_text(), f"{case} diff: --json differs from its golden"
