"""analysis/timeline.py: a step's timeline per rank stays within its cap whatever the trace holds, and keeps
what matters (where each phase, compute and collective runs) to within its resolution."""

import numpy as np
import pytest
from tracekit import X, table, write

from distprof.analysis import timeline

ANN = "user_annotation"


def test_a_busy_step_is_capped_and_coarsened(tmp_path):
    """One 100 ms step with 200 top-level phases of 200 names (nested ones inside), 5,000 CPU ops and 1,000
    all-reduces: at most CAP intervals, each lane within its own cap, covering what ran."""
    ev = [X("ProfilerStep#7", 0, 100_000, cat=ANN)]
    for k in range(200):
        ev.append(X(f"phase/{k}", k * 500, 400, cat=ANN))
        ev.append(X("nested", k * 500 + 10, 100, cat=ANN))
    ev += [X("aten::mm", 5 + i * 20, 8) for i in range(5000)]
    ev += [X("c10d::allreduce_", 13 + i * 100, 2) for i in range(1000)]
    tl = timeline.extract(table(write(tmp_path / "t.json", ev)))
    row = tl["steps"][7]
    sizes = {lane: row[lane][0].size for lane in ("phase", "compute", "collective")}
    assert all(sizes[lane] <= timeline.LANE_CAP[lane] for lane in sizes) and sum(sizes.values()) <= timeline.CAP
    assert sizes["phase"] == timeline.LANE_CAP["phase"]  # 200 names, each merged whole: the longest kept
    names = [tl["names"][k] for k in row["phase"][2].tolist()]
    assert "nested" not in names and all(n.startswith("phase/") for n in names)
    # Compute: 5,000 ops 12 µs apart, merged into runs that still start and end where the ops do.
    cs, ce = row["compute"][0], row["compute"][1]
    assert cs.min() == pytest.approx(5) and ce.max() == pytest.approx(5 + 4999 * 20 + 8)
    assert row["collective"][0].size >= 1 and {tl["names"][k] for k in row["collective"][2].tolist()} == {"allreduce"}
    assert row["phase"][0].dtype == np.float32  # compact: µs from the step's start


def test_waiting_names_the_rank_waited_for(tmp_path):
    """Two ranks: rank 1 arrives 300 µs late at the all-reduce; rank 0 is drawn blocked until it arrives."""
    from distprof.analysis.analyze import investigate

    for rank, late in ((0, 0), (1, 300)):
        events = [X("ProfilerStep#1", 0, 1000, cat=ANN), X("train/data", 10, 100 + late, cat=ANN),
                  X("c10d::allreduce_", 200 + late, 50)]
        write(tmp_path / f"rank-{rank}.json", events, distributedInfo={"rank": rank, "world_size": 2})
    inv = investigate(str(tmp_path), parts=("timeline",))
    tl = timeline.combine([(f.info, f.parts) for f in inv.run.files], None, 1, [1, 0])
    assert [r.rank for r in tl.ranks] == [1, 0]
    (w,) = tl.ranks[1].waiting
    assert w[0] == 1 and w[2] - w[1] == pytest.approx(300)
    assert tl.ranks[0].waiting == [] and [p[0] for p in tl.ranks[0].phases] == ["train/data"]


def test_the_investigation_gives_a_steps_timeline_typed(tmp_path):
    """The report reads worst-step timelines through the Investigation, not the per-file parts: ``step_timeline``
    gives the same StepTimeline as combining the parts, and None without the timeline extract."""
    from distprof.analysis.analyze import investigate

    for rank, late in ((0, 0), (1, 300)):
        events = [X("ProfilerStep#1", 0, 1000, cat=ANN), X("c10d::allreduce_", 200 + late, 50)]
        write(tmp_path / f"rank-{rank}.json", events, distributedInfo={"rank": rank, "world_size": 2})
    inv = investigate(str(tmp_path), parts=("timeline",))
    assert inv.has_timelines
    tl = inv.step_timeline(None, 1, [0, 1])
    assert isinstance(tl, timeline.StepTimeline)
    assert tl == timeline.combine([(f.info, f.parts) for f in inv.run.files], None, 1, [0, 1])
    assert [r.rank for r in tl.ranks] == [0, 1] and tl.ranks[0].waiting[0][0] == 1
    assert inv.step_timeline(None, 2, [0, 1]) is None  # no such step
    plain = investigate(str(tmp_path))
    assert not plain.has_timelines and plain.step_timeline(None, 1, [0, 1]) is None
