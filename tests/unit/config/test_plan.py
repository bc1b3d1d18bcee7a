"""Selection logic, checked exhaustively and against torch.profiler.schedule as an oracle."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distprof.config.plan import Plan, Schedule, Window, rank_selected, role_selected, steps_to_windows

steps_lists = st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=40)
schedules = st.builds(
    Schedule,
    skip_first=st.integers(0, 12),
    wait=st.integers(0, 4),
    warmup=st.integers(0, 3),
    active=st.integers(1, 4),
    repeat=st.integers(0, 4),
)


@given(steps_lists)
def test_windows_cover_exactly_the_steps_and_merge_consecutive(steps):
    windows = steps_to_windows(steps)
    covered = [s for w in windows for s in w.steps]
    assert covered == sorted(set(steps))
    for a, b in zip(windows, windows[1:]):
        assert b.start > a.end + 1, "consecutive steps must merge into one window"
        assert b.warmup_start > a.end, "a warm-up step is never one the previous window records"
    for w in windows:
        assert w.warmup_start in (w.start, w.start - 1)
        assert w.warmup_start >= 0


def test_explicit_examples():
    assert steps_to_windows([10, 3, 4, 5, 11]) == [Window(3, 5, 2), Window(10, 11, 9)]
    assert steps_to_windows([0]) == [Window(0, 0, 0)]
    assert steps_to_windows([2, 4]) == [Window(2, 2, 1), Window(4, 4, 3)]
    assert steps_to_windows([2, 3, 5]) == [Window(2, 3, 1), Window(5, 5, 4)]


@settings(max_examples=300)
@given(schedules, st.integers(0, 80))
def test_schedule_matches_torch_schedule(sch, step):
    from torch.profiler import ProfilerAction, schedule

    oracle = schedule(skip_first=sch.skip_first, wait=sch.wait, warmup=sch.warmup, active=sch.active, repeat=sch.repeat)
    plan = Plan.from_schedule(sch)
    action = oracle(step)
    assert plan.recorded(step) == (action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE))
    w = plan.next_window(0)
    warming = False
    s = 0
    while w is not None and w.warmup_start <= step:
        if w.warmup_start <= step < w.start:
            warming = True
        s = w.end + 1
        w = plan.next_window(s)
    assert warming == (action == ProfilerAction.WARMUP)


@given(st.one_of(steps_lists.map(Plan.from_steps), schedules.map(Plan.from_schedule)), st.integers(0, 100))
def test_resume_profiles_the_same_steps_as_a_fresh_run(plan, resume):
    last = 150
    fresh = {s for w in plan.windows_until(last) for s in w.steps if s >= resume}
    resumed = {s for w in plan.windows_until(last, first_step=resume) for s in w.steps}
    # A window cut by the resume point records its remaining steps only.
    assert resumed == fresh
    for w in plan.windows_until(last, first_step=resume):
        assert w.warmup_start >= resume


def test_repeat_zero_repeats_forever():
    plan = Plan.from_schedule(Schedule(skip_first=0, wait=1, warmup=1, active=1, repeat=0))
    assert [w.start for w in plan.windows_until(30)] == list(range(2, 31, 3))


def test_skip_first_defers_the_first_window():
    plan = Plan.from_schedule(Schedule(skip_first=5, wait=0, warmup=1, active=2, repeat=1))
    assert plan.windows_until(100) == [Window(6, 7, 5)]
    assert plan.next_window(8) is None


def test_late_start_clips_warmup_and_records_rest_of_window():
    plan = Plan.from_steps([5, 6, 7])
    assert plan.next_window(5) == Window(5, 7, 5)
    assert plan.next_window(6) == Window(6, 7, 6)
    assert plan.next_window(8) is None


def test_rank_and_role_selection():
    assert rank_selected("all", 7)
    assert rank_selected([0, 3], 3) and not rank_selected([0, 3], 1)
    assert role_selected(None, "anything")
    assert role_selected(["actor"], "actor") and not role_selected(["actor"], "actor/micro_step")
    assert role_selected(["actor*"], "actor/micro_step")
    assert not role_selected(["rollout"], "actor")


@pytest.mark.parametrize("steps,text", [([3, 10], "3, 10"), ([3, 4, 5], "3-5")])
def test_describe(steps, text):
    assert Plan.from_steps(steps).describe() == text
