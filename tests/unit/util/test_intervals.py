"""Interval sets and self times, checked against plain reference computations (hypothesis)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from distprof.analysis.summary import _self_times_stack, self_times
from distprof.util import intervals as iv

_spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=25)


def _grid(a):
    return {x for s, e in zip(*a) for x in range(int(s), int(e))}


def _set(spans):
    return iv.merge([s for s, _ in spans], [s + d for s, d in spans])


@settings(max_examples=300, derandomize=True)
@given(_spans, _spans, st.integers(0, 240), st.integers(0, 240))
def test_set_operations_match_a_unit_grid(a, b, lo, hi):
    ga = {x for s, d in a for x in range(s, s + d)}
    gb = {x for s, d in b for x in range(s, s + d)}
    sa, sb = _set(a), _set(b)
    assert _grid(sa) == ga and iv.length(sa) == len(ga)
    assert np.all(sa[0][1:] > sa[1][:-1])  # sorted, disjoint, not touching
    assert _grid(iv.intersect(sa, sb)) == ga & gb
    assert _grid(iv.subtract(sa, sb)) == ga - gb
    assert _grid(iv.union(sa, sb)) == ga | gb
    assert _grid(iv.clip(sa, lo, hi)) == {x for x in ga if lo <= x < hi}
    assert iv.union_length([(s, s + d) for s, d in a]) == len(ga)


@st.composite
def _nested(draw, lo=0, hi=1000, depth=0):
    """Ranges of one thread that nest, as a call stack makes them (zero-length ones included)."""
    out, t = [], lo
    for _ in range(draw(st.integers(0, 4))):
        s = t + draw(st.integers(0, 5))
        if s > hi:
            break
        d = draw(st.integers(0, hi - s))
        out.append((s, d))
        if depth < 4 and d > 1:
            out += draw(_nested(s, s + d, depth + 1))
        t = s + d
    return out


@settings(max_examples=300, derandomize=True)
@given(_nested())
def test_vectorised_self_times_match_a_stack(spans):
    ts = np.array([s for s, _ in spans], dtype=float)
    dur = np.array([d for _, d in spans], dtype=float)
    assert np.allclose(self_times(ts, dur), _self_times_stack(ts, dur))
