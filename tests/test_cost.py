"""Profiling's own cost: windows record the wall time of their steps and of unprofiled steps before their warm-up,
and ``summary`` / ``steps`` report the inflation per rank. Real torch.profiler runs with the heavy flags."""

import msgspec
import torch

from distprof import Profiler, ProfilerConfig
from distprof.profiler import BASELINE_STEPS

from tracekit import X, cli, write

HEAVY = {"activities": ["cpu"], "profile_memory": True, "record_shapes": True, "with_stack": True}


class SmallOps:
    def __init__(self):
        torch.manual_seed(0)
        self.x, self.w = torch.randn(8, 8), torch.randn(8, 8)

    def step(self):
        y = self.x
        for _ in range(60):
            y = torch.tanh(y @ self.w)
        return float(y.sum())


def profile(tmp_path, steps, n, start=0, **torch_opts):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=steps, torch=torch_opts or HEAVY)
    prof = Profiler(cfg, global_step=start)
    loop = SmallOps()
    with prof:
        for _ in range(n):
            loop.step()
            prof.step()
    p = tmp_path / "run" / "main" / "rank00000" / "manifest.jsonl"
    return prof, [msgspec.json.decode(line) for line in p.read_bytes().splitlines()]


def test_window_records_its_step_times_and_the_unprofiled_steps_before_warmup(tmp_path):
    _, (a, b) = profile(tmp_path, [4, 5, 6, 10, 11], 13)
    # Window 4-6 warms up on 3: steps 1 and 2 ran unprofiled; window 10-11 warms up on 9: steps 7 and 8.
    assert len(a["baseline_times_s"]) == len(b["baseline_times_s"]) == BASELINE_STEPS == 2
    assert len(a["step_times_s"]) == 3 and len(b["step_times_s"]) == 2
    assert all(0 < t < 60 for r in (a, b) for t in r["baseline_times_s"] + r["step_times_s"])
    # Every timed step lies inside its window's wall time (warm-up included) or just before it.
    for r in (a, b):
        assert sum(r["step_times_s"]) <= r["end_time"] - r["start_time"]


def test_baseline_is_never_a_profiled_step(tmp_path):
    # Window 5-6 warms up on 4, right after window 2-3 closed: steps 2 and 3 were profiled, so no baseline.
    # Window 1-1 starts at the run's first step: nothing ran before it.
    _, recs = profile(tmp_path, [1, 3, 4, 6, 7], 9)
    by_steps = {tuple(r["steps"]): r for r in recs}
    assert set(by_steps) == {(1, 1), (3, 4), (6, 7)}
    assert "baseline_times_s" not in by_steps[(1, 1)]  # step 0 is its warm-up
    assert "baseline_times_s" not in by_steps[(3, 4)]  # step 2 is its warm-up, step 1 profiled, 0 warm-up
    assert "baseline_times_s" not in by_steps[(6, 7)]  # steps 3-4 profiled, 5 its warm-up
    assert [len(r["step_times_s"]) for r in recs] == [1, 2, 2]


def test_resumed_run_times_the_same_steps(tmp_path):
    _, (r,) = profile(tmp_path, [104, 105], 10, start=100)
    assert len(r["baseline_times_s"]) == 2 and len(r["step_times_s"]) == 2


def test_steps_and_summary_report_the_inflation_per_rank(tmp_path):
    _, recs = profile(tmp_path, [4, 5, 6, 10, 11], 13)
    base = [t for r in recs for t in r["baseline_times_s"]]
    prof = [t for r in recs for t in r["step_times_s"]]
    for verb in ("steps", "summary"):
        code, out, err = cli(verb, str(tmp_path / "run"), "--json")
        assert code == 0, err
        (c,) = out["profiling_cost"]
        assert (c["role"], c["rank"], c["windows"]) == ("main", 0, 2)
        assert (c["baseline_steps"], c["profiled_steps"]) == (len(base), len(prof)) == (4, 5)
        assert abs(c["baseline_s"] - sum(base) / 4) < 1e-9 and abs(c["profiled_s"] - sum(prof) / 5) < 1e-9
        assert c["baseline_s"] > 0 and c["profiled_s"] > 0
        assert abs(c["inflation"] - (c["profiled_s"] / c["baseline_s"] - 1)) < 1e-9
        code, text, _ = cli(verb, str(tmp_path / "run"))
        assert code == 0
        line = next(ln for ln in text.splitlines() if ln.startswith("Profiling's own cost, main rank 0"))
        pct = abs(c["inflation"])
        assert f"{pct:.0%} {'slower' if c['inflation'] >= 0 else 'faster'} than the 4 unprofiled steps" in line


def test_no_cost_line_without_the_numbers(tmp_path):
    """Traces from elsewhere (no manifest), and windows with no unprofiled step before them: nothing reported."""
    (tmp_path / "foreign").mkdir()
    write(tmp_path / "foreign" / "rank-0.json", [X("ProfilerStep#1", 0, 100, cat="user_annotation"), X("aten::mm", 10, 20)])
    for verb in ("summary", "steps"):
        code, out, _ = cli(verb, str(tmp_path / "foreign"), "--json")
        assert code == 0 and out["profiling_cost"] == []
    profile(tmp_path, [0, 1], 3)  # starts at step 0: no baseline
    code, out, _ = cli("steps", str(tmp_path / "run"), "--json")
    assert code == 0 and out["profiling_cost"] == []
    code, text, _ = cli("steps", str(tmp_path / "run"))
    assert "Profiling's own cost" not in text


def test_hand_edited_manifest_values_are_not_trusted(tmp_path):
    """Negative or absurd times in a manifest line (another job's, hand-edited) are dropped, not averaged."""
    profile(tmp_path, [3, 4], 6)
    p = tmp_path / "run" / "main" / "rank00000" / "manifest.jsonl"
    rec = msgspec.json.decode(p.read_bytes())
    rec["baseline_times_s"] = [-5.0, rec["baseline_times_s"][1]]
    p.write_bytes(msgspec.json.encode(rec) + b"\n")
    code, out, _ = cli("steps", str(tmp_path / "run"), "--json")
    (c,) = out["profiling_cost"]
    assert code == 0 and c["baseline_steps"] == 1 and c["baseline_s"] == rec["baseline_times_s"][1]


def test_held_exports_time_the_same_steps(tmp_path):
    """A driver ending every group's step first (step(export=False), then export(), as ProfiledGroup does): the
    export is not counted in any step, and the next window still gets its unprofiled baseline."""
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[3, 4, 8], torch=HEAVY)
    prof = Profiler(cfg)
    loop = SmallOps()
    with prof:
        for _ in range(10):
            loop.step()
            prof.step(export=False)
            prof.export()
    p = tmp_path / "run" / "main" / "rank00000" / "manifest.jsonl"
    a, b = [msgspec.json.decode(line) for line in p.read_bytes().splitlines()]
    assert (a["steps"], b["steps"]) == ([3, 4], [8, 8])
    assert len(a["baseline_times_s"]) == 2 and len(a["step_times_s"]) == 2  # steps 0, 1 before warm-up on 2
    assert len(b["baseline_times_s"]) == 2 and len(b["step_times_s"]) == 1  # steps 5, 6 before warm-up on 7
