"""Memory answers from allocator snapshots (built by the stand-in, torch's format) against hand computation."""

from __future__ import annotations

import os
import pickle
import sys

import pytest

from distprof.analysis import memory, memsnap
from distprof.analysis.memory import BEFORE, from_snapshot, oom_lines

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "jobs"))
from memsnap_standin import Builder, frame, write

TORCH = frame("/venv/lib/python3.11/site-packages/torch/nn/functional.py", 2000, "linear")
F1 = [TORCH, frame("/app/model.py", 42, "forward"), frame("/app/train.py", 9, "main")]
F2 = [frame("/app/loss.py", 7, "backward_hook")]


def _three_steps(b: Builder) -> None:
    """Step 1: +100 (forward), +200 (forward), -200; step 2: +300 (forward), +50 (backward), -50; step 3 starts."""
    b.segment(4096)
    b.annotate("ProfilerStep#1", "START")
    b.annotate("forward", "START")
    b.alloc(100, F1)
    a2 = b.alloc(200, F2)
    b.annotate("forward", "END")
    b.free(a2)
    b.annotate("ProfilerStep#1", "END")
    b.annotate("ProfilerStep#2", "START")
    b.annotate("forward", "START")
    b.alloc(300, F1)
    b.annotate("forward", "END")
    b.annotate("backward", "START")
    a4 = b.alloc(50, F2)
    b.free(a4)
    b.annotate("backward", "END")
    b.annotate("ProfilerStep#2", "END")
    b.annotate("ProfilerStep#3", "START")


def _one(snap: dict, **kw) -> dict:
    (h,) = memsnap.parse(snap)
    return from_snapshot(h, **kw)


def test_peak_moment_top_and_steps_by_hand():
    b = Builder()
    _three_steps(b)
    r = _one(b.snapshot(), steps=[1, 3])
    # 0 -> 100 -> 300 -> 100 -> 400 -> 450 -> 400: the peak is 450, reached at the backward allocation of step 2
    assert r["peak_allocated_bytes"] == 450
    assert r["peak_reserved_bytes"] == 4096
    assert (r["at"].step, r["at"].phase) == (2, "backward")
    tops = {(t.frame, t.phase): (t.bytes, t.blocks) for t in r["top"]}
    assert tops == {("app/model.py:42 forward", "forward"): (400, 2),
                    ("app/loss.py:7 backward_hook", "backward"): (50, 1)}
    assert [(s.step, s.allocated_bytes) for s in r["steps"]] == [(1, 0), (2, 100), (3, 400)]
    assert max(r["series"]["allocated"]) == 450


def test_history_that_starts_mid_run_counts_what_came_before():
    b = Builder()
    _three_steps(b)
    r = _one(b.snapshot(before={0x10: 1000}), steps=[1, 3])
    # the end state holds 1000 more bytes than the history allocated: they were there from the start
    assert r["peak_allocated_bytes"] == 1450
    assert r["top"][0].frame == BEFORE and r["top"][0].bytes == 1000
    assert [s.allocated_bytes for s in r["steps"]] == [1000, 1100, 1400]


def test_no_annotations_uses_the_window_step_and_no_phase():
    b = Builder()
    _three_steps(b)
    r = _one(b.snapshot(annotations=False), steps=[5, 5])
    assert (r["at"].step, r["at"].phase) == (5, None)
    assert r["steps"] == []
    r = _one(b.snapshot(annotations=False), steps=[5, 7])
    assert r["at"].step is None


def test_oom_explained_by_hand():
    b = Builder()
    b.segment(80_000_000_000)
    b.annotate("ProfilerStep#4", "START")
    b.annotate("train/forward", "START")
    b.alloc(38_000_000_000, F1)
    b.annotate("train/forward", "END")
    b.alloc(23_200_000_000, F2)
    b.oom(3_700_000_000_000, device_free=1_500_000_000, frames=F1)
    r = _one(b.snapshot(), steps=[3, 4], oom_file=True)
    o = r["oom"]
    assert (o.allocated_bytes, o.request_bytes, o.device_free_bytes) == (61_200_000_000, 3_700_000_000_000,
                                                                         1_500_000_000)
    assert o.by_phase == {"train/forward": 38_000_000_000, "(no phase)": 23_200_000_000}
    assert (o.at.step, o.at.phase) == (4, None)
    assert o.lines[0].startswith("at the OOM (step 4), 61.2 GB allocated (80.0 GB reserved), 38.0 GB of it in "
                                 "train/forward; the request was 3.7 TB (from app/model.py:42 forward); "
                                 "the device had 1.5 GB free")
    assert "60.5x all that was allocated" in o.lines[-1]
    assert oom_lines(o) == o.lines


def test_oom_step_without_annotations_is_the_windows_last():
    b = Builder()
    b.alloc(10, F1)
    b.oom(100, device_free=0)
    r = _one(b.snapshot(annotations=False), steps=[3, 6], oom_file=True)
    assert r["oom"].at.step == 6


def test_frame_of_skips_torch_and_handles_junk():
    assert memory.frame_of(F1) == "app/model.py:42 forward"
    assert memory.frame_of([TORCH]) == "nn/functional.py:2000 linear"
    assert memory.frame_of([]) == memory.NO_STACK
    assert memory.frame_of([1, "x"]) == memory.NO_STACK


def test_parse_skips_entries_of_the_wrong_shape():
    b = Builder()
    b.alloc(10, F1)
    snap = b.snapshot()
    snap["device_traces"][0] += [{"action": "alloc", "addr": "x", "size": 1}, 7, {"action": "bogus", "size": 1},
                                 {"action": "alloc", "addr": 1, "size": -5}]
    (h,) = memsnap.parse(snap)
    assert h.skipped == 4 and len(h.entries) == 1


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_load_refuses_globals_and_junk(tmp_path):
    p = tmp_path / "evil.memory.pickle"
    p.write_bytes(pickle.dumps({"segments": [Evil()]}))
    with pytest.raises(memsnap.SnapshotError, match=r"evil\.memory\.pickle: not a memory snapshot \(refers to "):
        memsnap.load(str(p))
    p.write_bytes(b"not a pickle at all")
    with pytest.raises(memsnap.SnapshotError, match="not a memory snapshot"):
        memsnap.load(str(p))
    p.write_bytes(pickle.dumps({"segments": []})[:-3])
    with pytest.raises(memsnap.SnapshotError):
        memsnap.load(str(p))
    p.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(memsnap.SnapshotError, match="no segments"):
        memsnap.read(str(p))
    write(str(p), Builder().snapshot())
    with pytest.raises(memsnap.SnapshotError, match="over the 10-byte limit"):
        memsnap.load(str(p), max_bytes=10)


def test_phases_at_is_the_innermost_open_annotation_by_hand():
    from types import SimpleNamespace

    import numpy as np

    from distprof.analysis.memtrace import phases_at
    from distprof.trace.vocab import Kind

    # outer [0, 100], inner [10, 20], later [30, 40] (inside outer), a kernel [5, 50] that is no annotation
    ts, end = np.array([0.0, 10.0, 30.0, 5.0]), np.array([100.0, 20.0, 40.0, 50.0])
    kind = np.array([Kind.ANNOTATION, Kind.ANNOTATION, Kind.ANNOTATION, Kind.KERNEL], dtype=np.int8)
    tb = SimpleNamespace(kind=kind, ts=ts, end=end, name=np.array([0, 1, 2, 3]), names=["outer", "inner", "later", "k"])
    got = phases_at(tb, np.array([-1.0, 0.0, 15.0, 20.0, 25.0, 35.0, 45.0, 100.0, 101.0]))
    assert got == [None, "outer", "inner", "inner", "outer", "later", "outer", "outer", None]


def test_series_thinning_keeps_each_buckets_largest_and_the_peak():
    import numpy as np

    times = np.arange(1000, dtype=np.float64)
    alloc = (np.arange(1000) % 7).astype(np.int64) * 10
    alloc[523] = 5000  # the peak, inside a bucket
    s = memory.series_points(times, alloc, alloc * 2, n=10)
    assert len(s["time_us"]) == 10 and 5000 in s["allocated"] and 523.0 in s["time_us"]
    # each bucket of 100 events gives the largest value in it, at its time
    assert s["allocated"][0] == 60 and s["time_us"][0] == 6.0 and s["reserved"][0] == 120
    short = memory.series_points(times[:5], alloc[:5], alloc[:5])
    assert short["allocated"] == [0, 10, 20, 30, 40]


def test_group_live_by_hand():
    live = [(100, "a.py:1 f", "fwd"), (50, "a.py:1 f", "fwd"), (70, "b.py:2 g", None), (10, "a.py:1 f", "bwd")]
    got = [(t.frame, t.phase, t.bytes, t.blocks) for t in memory.group_live(live, total=300, top=3)]
    # 300 - 230 = 70 bytes the blocks do not account for, a group of its own (ties by name)
    assert got == [("a.py:1 f", "fwd", 150, 2), (BEFORE, None, 70, 0), ("b.py:2 g", None, 70, 1)]
    assert memory.by_phase(live) == {"fwd": 150, "(no phase)": 70, "bwd": 10}


def test_fmt_bytes():
    assert [memory.fmt_bytes(v) for v in (None, 12, 1500, 61_200_000_000, 3.7e12)] == \
        ["?", "12 B", "1.5 kB", "61.2 GB", "3.7 TB"]


def _leak_findings(values: list[int]):
    from types import SimpleNamespace

    from distprof.analysis.diagnose.memory import memory_leak
    from distprof.analysis.records_mem import MemoryAt, MemoryRow, MemoryStep

    row = MemoryRow(role="r", rank=0, peak_allocated_bytes=max(values), peak_reserved_bytes=0,
                    at=MemoryAt(step=None, phase=None), top=[], source="trace", path="p",
                    steps=[MemoryStep(step=s, allocated_bytes=v) for s, v in enumerate(values, 1)])
    return memory_leak(SimpleNamespace(inv=SimpleNamespace(summary=SimpleNamespace(memory=[row]))))


def test_memory_leak_thresholds_by_hand():
    from distprof.analysis.diagnose.memory import LEAK_MIN_BYTES

    mib = 1 << 20
    (f,) = _leak_findings([100 * mib, 110 * mib, 120 * mib])  # 20 MiB over 2 steps, 20% of the first
    assert f.evidence.figures["per_step_bytes"] == 10 * mib and f.cost_us == 0
    assert not _leak_findings([100 * mib, 110 * mib])  # two boundaries only
    assert not _leak_findings([100 * mib, 130 * mib, 125 * mib, 140 * mib])  # falls once: it settles, no leak
    assert not _leak_findings([0, LEAK_MIN_BYTES // 2, LEAK_MIN_BYTES - 1])  # under 16 MiB in all
    assert not _leak_findings([1000 * mib, 1010 * mib, 1020 * mib])  # 20 MiB, but 2% of the first (< 5%)
    assert _leak_findings([0, 8 * mib, LEAK_MIN_BYTES])  # exactly the thresholds
