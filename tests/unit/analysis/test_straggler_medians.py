"""The straggler rule's medians over the other ranks come from one matrix per step (numpy, built once for every
candidate rank); the rule they replace, written here per phase and step with ``median_of``, is the oracle: the
same candidates, figures bit for bit, on hypothesis-built steps (odd and even rank counts, phases some ranks lack,
ties)."""

import importlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from distprof.analysis.diagnose.common import Job, LeaveOneOut, median_of
from distprof.analysis.records import RankStep, StepRow

straggler = importlib.import_module("distprof.analysis.diagnose.straggler")  # (the package exports the rule)
PHASES = ["train/data", "train/fwd", "train/bwd", "rollout"]
TIMES = st.one_of(st.sampled_from([0.0, 1.0, 2.5, 100.0]), st.floats(0, 1e6, allow_nan=False))


def _reference(mine, others, n_steps):
    cands = []
    names = {n for x in mine for n in x.phases} | {n for os_ in others for o in os_ for n in o.phases}
    for name in names:
        ex = [x.phases.get(name, 0.0) - median_of(o.phases.get(name, 0.0) for o in os_)
              for x, os_ in zip(mine, others, strict=False)]
        cands.append({"kind": "phase", "name": name, "per_step": ex,
                      "rank_us": sum(x.phases.get(name, 0.0) for x in mine) / n_steps,
                      "median_us": sum(median_of(o.phases.get(name, 0.0) for o in os_) for os_ in others) / n_steps})
    return sorted(cands, key=lambda c: c["name"])


@given(st.integers(1, 9), st.integers(1, 3),
       st.lists(st.dictionaries(st.sampled_from(PHASES), TIMES, max_size=4), min_size=27, max_size=27),
       st.integers(0, 8))
def test_phase_medians_from_the_matrix_are_the_per_phase_rule(n_ranks, n_steps, phases, pick):
    rows = [StepRow(role=None, step=s, window=None, max_us=0.0, ranks=[
        RankStep(rank=r, path="", dur_us=1.0, waited_us=0.0, busy_us=1.0, wait_caused_us=0.0, sync_waiting_us=0.0,
                 phases=phases[(s * n_ranks + r) % len(phases)], categories={}, source="ProfilerStep", start_us=0.0)
        for r in range(n_ranks)]) for s in range(n_steps)]
    rank = pick % n_ranks
    mine = [next(x for x in row.ranks if x.rank == rank) for row in rows]
    others = [[x for x in row.ranks if x.rank != rank] for row in rows]
    job = Job.__new__(Job)
    job._phase_rows = {}
    job._loo = {}
    got = sorted(straggler._phase_causes(job, rank, rows, mine, n_steps), key=lambda c: c["name"])
    assert [{**c, "per_step": [repr(v) for v in c["per_step"]], "median_us": repr(c["median_us"])} for c in got] == \
        [{**c, "per_step": [repr(v) for v in c["per_step"]], "median_us": repr(c["median_us"])}
         for c in _reference(mine, others, n_steps)]


@given(st.integers(1, 6), st.integers(2, 12), st.lists(TIMES, min_size=72, max_size=72), st.integers(0, 11))
def test_leave_one_out_medians_are_numpys_over_the_other_columns(n_rows, n_cols, values, pick):
    """LeaveOneOut (each row sorted once; the straggler rule's medians of every name over the other ranks, for each
    candidate rank) gives np.median's floats over the other columns, bit for bit: odd and even counts, ties, zeros."""
    m = np.array(values[:n_rows * n_cols]).reshape(n_rows, n_cols)
    col = pick % n_cols
    loo = LeaveOneOut(m)
    want = np.median(np.delete(m, col, axis=1), axis=1)
    got = loo.medians(np.arange(n_rows), col)
    assert [repr(float(v)) for v in got] == [repr(float(v)) for v in want]
    assert [repr(float(v)) for v in got] == [repr(median_of(np.delete(m[i], col).tolist())) for i in range(n_rows)]
    rows = np.array([n_rows - 1, 0], dtype=np.int64)  # any rows, in any order
    assert loo.medians(rows, col).tolist() == want[rows].tolist()
