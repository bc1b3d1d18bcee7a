"""Fuzzing the snapshot reader: arbitrary bytes, mutated real snapshots and arbitrary pickled values never give a
traceback (a SnapshotError naming the file, or devices), and never import or call anything."""

from __future__ import annotations

import os
import pickle
import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distprof.analysis import memsnap
from distprof.analysis.memory import from_snapshot

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "jobs"))
from memsnap_standin import Builder, frame


def _good() -> bytes:
    b = Builder()
    b.segment(1 << 20)
    b.annotate("ProfilerStep#1", "START")
    a = b.alloc(512, [frame("/app/m.py", 3, "f")])
    b.alloc(1024)
    b.free(a)
    b.oom(1 << 40, device_free=10)
    b.annotate("ProfilerStep#1", "END")
    return pickle.dumps(b.snapshot(), protocol=4)


GOOD = _good()


def _answer(data: bytes) -> None:
    try:
        devices = memsnap.parse(memsnap.loads(data, "f.memory.pickle"), "f.memory.pickle")
    except memsnap.SnapshotError as e:
        assert str(e).startswith("f.memory.pickle: ") and "\n" not in str(e)
        return
    for h in devices:
        from_snapshot(h, [1, 2], True)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=300))
def test_arbitrary_bytes(data):
    _answer(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(0, 255)), min_size=1, max_size=6),
       cut=st.integers(1, len(GOOD)))
def test_mutated_snapshots(edits, cut):
    data = bytearray(GOOD)
    for at, byte in edits:
        data[at] = byte
    _answer(bytes(data[:cut]))


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=8))
_values = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=4), st.tuples(c, c),
                                                      st.dictionaries(st.sampled_from(
                                                          ["action", "addr", "size", "time_us", "frames", "device",
                                                           "blocks", "state", "total_size", "stage", "name",
                                                           "device_free", "filename", "line"]), c, max_size=6)),
                       max_leaves=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments=_values, traces=_values, notes=_values)
def test_wrong_shapes(segments, traces, notes):
    _answer(pickle.dumps({"segments": segments, "device_traces": traces, "external_annotations": notes}))


def test_nothing_is_imported():
    # protocol-0 pickles naming a global: os.system, and a module that would show in sys.modules once imported
    for data in (b"cos\nsystem\n(S'echo pwned'\ntR.", b"cdistprof_memsnap_canary\nx\n."):
        try:
            memsnap.loads(data, "f.memory.pickle")
            raise AssertionError("loaded")
        except memsnap.SnapshotError as e:
            assert "refers to " in str(e)
    assert "distprof_memsnap_canary" not in sys.modules
