"""Profiling's own cost: windows record the wall time of their steps, of the steady-state unprofiled steps before
their warm-up (with their step numbers) and of their closing (``export_s``); ``summary`` / ``steps`` give a figure
per rank only when the baseline is reliable, and say why not otherwise. Real torch.profiler runs with the heavy
flags; the verdict's rules are checked on manifest lines edited to known figures (no timing assertions)."""

import io
import shutil
import statistics

import msgspec
import pytest
import torch
from rich.console import Console
from tracekit import X, cli, write

from distprof import Profiler, ProfilerConfig
from distprof.analysis import analyze
from distprof.analysis.records import ProfilingCost
from distprof.capture.backends.torch_backend import TorchBackend
from distprof.capture.profiler import BASELINE_STEPS, SETTLING_STEPS
from distprof.report import terminal as render

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


def manifest_path(run):
    return run / "main" / "rank00000" / "manifest.jsonl"


def records(run):
    return [msgspec.json.decode(line) for line in manifest_path(run).read_bytes().splitlines()]


def profile(tmp_path, steps, n, start=0, name="run", **torch_opts):
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / name), steps=steps, torch=torch_opts or HEAVY)
    prof = Profiler(cfg, global_step=start)
    loop = SmallOps()
    with prof:
        for _ in range(n):
            loop.step()
            prof.step()
    return prof, records(tmp_path / name)


def cost_text(rows):
    """What ``summary`` and ``steps`` print for these records, on one line."""
    out = io.StringIO()
    render.profiling_cost(Console(file=out, width=80), rows)
    return " ".join(out.getvalue().split())


def test_constants_are_what_the_readme_says():
    assert (BASELINE_STEPS, SETTLING_STEPS) == (8, 3)


def test_baseline_is_steady_state_steps_with_their_numbers(tmp_path):
    _, (a, b) = profile(tmp_path, [4, 5, 6, 16, 17], 19)
    # Window 4-6 warms up on 3: steps 0-2 are the process's warm-up, so nothing before it is a baseline.
    assert a["first_step"] == b["first_step"] == 0
    assert "baseline_times_s" not in a and "baseline_step_numbers" not in a
    # Window 16-17 warms up on 15; window 4-6 closed after 6, so 7 follows its export: 8-14 (at most 8 steps).
    assert b["baseline_step_numbers"] == list(range(8, 15)) and len(b["baseline_times_s"]) == 7
    assert len(a["step_times_s"]) == 3 and len(b["step_times_s"]) == 2
    assert all(0 < t < 60 for r in (a, b) for t in r.get("baseline_times_s", []) + r["step_times_s"])
    assert all(r["export_s"] > 0 for r in (a, b))
    for r in (a, b):  # every timed step lies inside its window's wall time (warm-up included)
        assert sum(r["step_times_s"]) <= r["end_time"] - r["start_time"]


def test_baseline_takes_at_most_the_steps_just_before_the_warmup(tmp_path):
    _, (r,) = profile(tmp_path, [30], 31, activities=["cpu"])
    assert r["baseline_step_numbers"] == list(range(29 - BASELINE_STEPS, 29))


def test_baseline_is_never_a_warmup_profiled_or_post_export_step(tmp_path):
    _, recs = profile(tmp_path, [1, 3, 4, 6, 7, 12, 13], 15)
    by_steps = {tuple(r["steps"]): r for r in recs}
    assert set(by_steps) == {(1, 1), (3, 4), (6, 7), (12, 13)}
    for steps in ((1, 1), (3, 4), (6, 7)):  # warm-up of the process, or right after the window before
        assert "baseline_step_numbers" not in by_steps[steps]
    assert by_steps[(12, 13)]["baseline_step_numbers"] == [9, 10]  # 8 follows window 6-7's export; 11 warms up
    assert [len(r["step_times_s"]) for r in recs] == [1, 2, 2, 2]


def test_resumed_run_skips_its_own_first_steps(tmp_path):
    _, (a, b) = profile(tmp_path, [104, 105, 115, 116], 18, start=100)
    assert a["first_step"] == 100 and "baseline_step_numbers" not in a  # 100-102 are this process's warm-up
    assert b["baseline_step_numbers"] == list(range(107, 114))


def test_held_exports_time_the_same_steps_and_count_the_export(tmp_path, monkeypatch):
    """A driver ending every group's step first (step(export=False), then export(), as ProfiledGroup does): the
    export is in no step and the step after it is no baseline (it used to be timed from the export's end, near 0);
    export_s counts the closing work of both calls."""
    inner = []  # closing work inside the profiler, timed around torch's calls

    def timed(fn):
        def run(self, *args, **kw):
            t0 = torch_time()
            try:
                return fn(self, *args, **kw)
            finally:
                inner.append((fn.__name__, args, torch_time() - t0))
        return run

    from time import perf_counter as torch_time

    monkeypatch.setattr(TorchBackend, "advance", timed(TorchBackend.advance))
    # The closing step's part (torch stops tracing); the files are written in the background (capture/closing.py).
    monkeypatch.setattr(TorchBackend, "detach", timed(TorchBackend.detach))
    cfg = ProfilerConfig(enable=True, save_path=str(tmp_path / "run"), steps=[3, 4, 12], torch=HEAVY)
    prof = Profiler(cfg)
    loop = SmallOps()
    outer = {}
    with prof:
        for i in range(14):
            loop.step()
            t0 = torch_time()
            prof.step(export=False)
            prof.export()
            outer[i] = torch_time() - t0
    a, b = records(tmp_path / "run")
    assert (a["steps"], b["steps"]) == ([3, 4], [12, 12])
    assert "baseline_step_numbers" not in a and len(a["step_times_s"]) == 2
    assert b["baseline_step_numbers"] == [6, 7, 8, 9, 10] and len(b["step_times_s"]) == 1
    for rec, last in ((a, 4), (b, 12)):
        closing = [d for name, args, d in inner if (name, args) in (("advance", (last + 1,)), ("detach", (rec["steps"][0], last)))]
        assert len(closing) == 2
        assert sum(closing) <= rec["export_s"] <= outer[last]


@pytest.fixture(scope="module")
def timed_run(tmp_path_factory):
    """One real run with windows 10-11 and 20-21: two windows with steady-state baselines (3-8, 13-18)."""
    tmp = tmp_path_factory.mktemp("cost")
    _, recs = profile(tmp, [10, 11, 20, 21], 23)
    return tmp / "run", recs


def test_reliable_verdict_follows_the_spread_of_the_real_baseline(timed_run):
    run, recs = timed_run
    assert [r["baseline_step_numbers"] for r in recs] == [list(range(3, 9)), list(range(13, 19))]
    base = sorted(t for r in recs for t in r["baseline_times_s"])
    prof = [t for r in recs for t in r["step_times_s"]]
    spread = base[-2] / base[0]  # 12 steps: the single slowest set aside
    for out in (analyze.steps(str(run)), analyze.summary(str(run))):
        (c,) = out["profiling_cost"]
        assert (c["role"], c["rank"], c["windows"], c["baseline_steps"], c["profiled_steps"]) == ("main", 0, 2, 12, 4)
        assert c["baseline_s"] == statistics.median(base) and c["profiled_s"] == statistics.median(prof)
        assert c["reliable"] is (spread <= 1.5) and abs(c["baseline_spread"] - spread) < 1e-9
        assert c["export_s"] == max(r["export_s"] for r in recs)
        assert abs(c["export_total_s"] - sum(r["export_s"] for r in recs)) < 1e-9 and c["export_windows"] == 2
        if c["reliable"]:
            assert abs(c["inflation"] - (c["profiled_s"] / c["baseline_s"] - 1)) < 1e-9
            assert c["reason"].startswith("median of 12 unprofiled steps in steady state (steps 3-8, 13-18)")
        else:
            assert c["inflation"] is None and c["reason"].startswith("unprofiled steps vary ")


def edited(timed_run, tmp_path, edit):
    """The timed run with its manifest lines edited by ``edit(lines)``."""
    run = tmp_path / "run"
    shutil.copytree(timed_run[0], run)
    lines = edit(records(run))
    manifest_path(run).write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in lines))
    (c,) = analyze.steps_result(str(run)).profiling_cost
    return c


def set_times(base, prof, export=(0.5, 1.5)):
    def edit(lines):
        for r, e in zip(lines, export):
            r["baseline_times_s"], r["step_times_s"], r["export_s"] = base[:6], prof, e
            base[:6] = []
        return lines
    return edit


def test_steady_baseline_gives_the_figure_and_the_export_stall(timed_run, tmp_path):
    # One slow step among 12 (a garbage collection) does not void the figure.
    c = edited(timed_run, tmp_path, set_times([0.010] * 11 + [0.5], [0.011, 0.011], export=(4.86, 1.25)))
    assert c.reliable is True and abs(c.inflation - 0.1) < 1e-9 and c.baseline_s == 0.010
    assert (c.export_s, c.export_total_s) == (4.86, 4.86 + 1.25)
    assert cost_text([c]) == (
        "Profiling's own cost, main rank 0: profiled steps ran 10% slower than the 12 unprofiled steps in steady "
        "state before them (median 11.00 ms vs 10.00 ms, 2 windows). Closing its 2 windows held main rank 0 for up "
        "to 4.86 s each, 6.11 s in all (no step time includes it).")


def test_noisy_baseline_gives_no_figure(timed_run, tmp_path):
    base = [0.012, 0.023, 0.012, 0.013, 0.012, 0.023, 0.012, 0.016, 0.013, 0.012, 0.013, 0.023]
    c = edited(timed_run, tmp_path, set_times(base, [0.011, 0.011]))
    assert c.reliable is False and c.inflation is None
    assert c.reason == "unprofiled steps vary 1.9x (12 ms-23 ms): too noisy to compare"
    assert cost_text([c]).startswith("Profiling's own cost, main rank 0: no reliable baseline: unprofiled steps vary "
                                     "1.9x (12 ms-23 ms): too noisy to compare. Closing its 2 windows held main rank "
                                     "0 for up to 1.50 s each")


def test_older_distprof_lines_give_no_figure(timed_run, tmp_path):
    def old(lines):  # what distprof wrote before it recorded step numbers: 2 steps right before the warm-up
        for r in lines:
            for k in ("baseline_step_numbers", "first_step", "export_s"):
                r.pop(k)
            r["baseline_times_s"] = r["baseline_times_s"][-2:]
        return lines
    c = edited(timed_run, tmp_path, old)
    assert c.reliable is False and c.inflation is None and c.baseline_steps == 4
    assert c.reason.startswith("recorded by an older distprof")
    assert c.export_s is None and "Closing" not in cost_text([c])


def test_hand_edited_manifest_values_are_not_trusted(timed_run, tmp_path):
    """Negative or absurd times in a manifest line (another job's, hand-edited) are dropped with their step."""
    def bad(lines):
        lines[0]["baseline_times_s"][0] = -5.0
        lines[0]["export_s"] = -1
        return lines
    run = tmp_path / "run"
    shutil.copytree(timed_run[0], run)
    lines = bad(records(run))
    manifest_path(run).write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in lines))
    out = analyze.steps(str(run))
    # export_s < 0 breaks the line's schema: that line is skipped (and named), the other window still counts
    (c,) = out["profiling_cost"]
    assert c["windows"] == 1 and c["baseline_steps"] == 6
    lines[0]["export_s"] = 0.5
    manifest_path(run).write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in lines))
    (c,) = analyze.steps(str(run))["profiling_cost"]
    assert c["windows"] == 2 and c["baseline_steps"] == 11 and c["baseline_s"] > 0


def test_warmup_baseline_is_refused_with_what_to_do(tmp_path):
    """The issue's case: a window on steps 3-4 has only the process's first steps before it."""
    profile(tmp_path, [3, 4], 6)
    want = ("the 2 unprofiled steps before the window (steps 0-1) are the process's first steps (warm-up); profile "
            "later steps, e.g. steps: [12, 13]")
    for verb in ("steps", "summary"):
        code, out, err = cli(verb, str(tmp_path / "run"), "--json")
        assert code == 0, err
        (c,) = out["profiling_cost"]
        assert (c["reliable"], c["inflation"], c["baseline_steps"], c["profiled_steps"]) == (False, None, 0, 2)
        assert c["reason"] == want and c["export_s"] > 0
        code, text, _ = cli(verb, str(tmp_path / "run"))
        assert code == 0
        text = " ".join(text.split())
        assert f"Profiling's own cost, main rank 0: no reliable baseline: {want}. Closing the window held main rank 0 for" in text


@pytest.mark.parametrize("steps, n, start, reason", [
    ([0, 1], 3, 0, "no unprofiled step ran before the window in this process (it starts at its first step, 0); "
                   "profile later steps, e.g. steps: [12, 13]"),
    ([101, 102], 104, 100, "no unprofiled step ran before the window in this process (it warms up on its first "
                           "step, 100); profile later steps, e.g. steps: [112, 113]"),
    ([5], 6, 0, "only 1 of the 4 unprofiled steps before the window came after the process's first 3 (warm-up); "
                "profile later steps, e.g. steps: [12]"),
    ([5, 9], 10, 0, "only 2 steady-state unprofiled steps before its 2 windows; the first: only 1 of the 4 "
                    "unprofiled steps before the window came after the process's first 3 (warm-up); profile later "
                    "steps, e.g. steps: [12]"),
    ([102, 103, 104, 105], 106, 100, "the unprofiled step before the window (step 100) is the process's first step "
                                     "(warm-up); profile later steps, e.g. steps: \"112-115\""),
])
def test_each_short_baseline_says_why(tmp_path, steps, n, start, reason):
    profile(tmp_path, steps, n - start, start=start, activities=["cpu"])
    (c,) = analyze.steps(str(tmp_path / "run"))["profiling_cost"]
    assert c["reliable"] is False and c["reason"] == reason


def test_no_cost_line_for_traces_without_a_manifest(tmp_path):
    (tmp_path / "foreign").mkdir()
    write(tmp_path / "foreign" / "rank-0.json", [X("ProfilerStep#1", 0, 100, cat="user_annotation"), X("aten::mm", 10, 20)])
    for fn in (analyze.summary, analyze.steps):
        assert fn(str(tmp_path / "foreign"))["profiling_cost"] == []


def test_many_ranks_print_eight_paragraphs_and_point_to_the_json():
    rows = [ProfilingCost(role="actor", rank=r, baseline_s=None, profiled_s=None, inflation=None, baseline_steps=0,
                          profiled_steps=2, windows=1, reliable=False, reason="x", baseline_spread=None, export_s=None,
                          export_total_s=None, export_windows=0) for r in range(10)]
    text = cost_text(rows)
    assert text.count("Profiling's own cost, actor rank") == 8 and "actor rank 8" not in text
    assert text.endswith("Profiling's own cost of 2 more ranks: in --json (profiling_cost).")
