"""The watcher's rules (distprof.analysis.detect) on synthetic step series: a rank turning slow, a job slowing
down, a role taking over the RL step, and a healthy noisy job that must stay quiet."""

import random

from distprof.analysis.detect import Tracker, detect
from distprof.analysis.telemetry import RankSeries, StepRecord
from distprof.config.watch import DetectOptions

OPTS = DetectOptions()


def series(role, ranks, steps, phase_us, seed=0, noise=0.10, dur=None):
    """RankSeries of ``ranks`` over ``steps``; ``phase_us(rank, step) -> {phase: µs}`` before noise (±``noise``).
    The step time is every rank's slowest (a synchronous job), unless ``dur(rank, step, phases)`` says."""
    rng = random.Random(seed)
    out = {r: RankSeries(role, r) for r in ranks}
    for step in steps:
        per = {r: {k: int(v * rng.uniform(1 - noise, 1 + noise)) for k, v in phase_us(r, step).items()} for r in ranks}
        sync = max(sum(p.values()) for p in per.values()) + 500
        for r in ranks:
            d = dur(r, step, per[r]) if dur else sync
            out[r].steps.append(StepRecord(step, 1000.0 + step * 0.05, d, per[r]))
    return list(out.values())


def healthy(rank, step):
    return {"forward": 10_000, "backward": 20_000}


def test_a_rank_turning_slow_is_named_with_its_phase_within_slow_steps():
    def phases(rank, step):
        p = healthy(rank, step)
        if rank == 2 and step >= 40:
            p["forward"] = 40_000
        return p

    found = detect(series("actor", range(4), range(100), phases), OPTS)
    slow = [d for d in found if d.rule == "slow_rank"]
    assert len(slow) == 1, found  # once per episode
    d = slow[0]
    assert (d.role, d.rank, d.phase) == ("actor", 2, "forward")
    assert 40 <= d.step <= 40 + OPTS.slow_steps - 1
    assert d.value_us > 1.25 * d.reference_us
    assert d.peer in (0, 1, 3)
    assert "rank 2" in d.message and "forward" in d.message


def test_two_hundred_healthy_noisy_steps_detect_nothing():
    for seed in range(5):
        found = detect(series("actor", range(8), range(200), healthy, seed=seed), OPTS)
        assert found == [], found
    roles = series("actor", range(4), range(200), healthy, seed=7) + series(
        "rollout", range(2), range(200), lambda r, s: {"generate": 25_000}, seed=8)
    assert detect(roles, OPTS) == []


def test_slowdown_fires_once_and_names_the_role():
    def phases(rank, step):
        return {"forward": 10_000 if step < 120 else 20_000, "backward": 20_000}

    found = detect(series("actor", range(4), range(200), phases), OPTS)
    assert [d.rule for d in found] == ["slowdown"], found
    d = found[0]
    assert d.role == "actor" and 120 <= d.step < 120 + OPTS.slow_steps
    assert d.value_us > OPTS.slowdown_factor * d.reference_us


def test_episode_rearms_after_the_condition_clears():
    def phases(rank, step):
        p = healthy(rank, step)
        if rank == 1 and (40 <= step < 60 or 100 <= step < 120):
            p["backward"] = 60_000
        return p

    found = [d for d in detect(series("actor", range(4), range(150), phases), OPTS) if d.rule == "slow_rank"]
    assert [(d.rank, d.phase) for d in found] == [(1, "backward"), (1, "backward")]
    assert 40 <= found[0].step < 45 and 100 <= found[1].step < 105


def test_a_phase_only_one_rank_runs_is_not_judged():
    def phases(rank, step):
        p = healthy(rank, step)
        if rank == 0:
            p["log"] = 5_000  # rank-0-only work: no median to compare with
        return p

    assert detect(series("actor", range(4), range(100), phases), OPTS) == []


def test_bounding_role_between_roles():
    actor = series("actor", range(2), range(150), lambda r, s: {"update": 30_000}, seed=1)
    rollout = series("rollout", range(2), range(150),
                     lambda r, s: {"generate": 20_000 if s < 100 else (60_000 if r == 1 else 50_000)}, seed=2)
    found = [d for d in detect(actor + rollout, OPTS) if d.rule == "bounding_role"]
    assert len(found) == 1, found
    d = found[0]
    assert d.role == "rollout" and d.previous == "actor" and 100 <= d.step < 100 + OPTS.slow_steps
    assert d.rank == 1 and d.peer == 0


def test_bounding_role_from_the_drivers_phase_prefixes():
    def phases(rank, step):
        return {"rollout/generate": 20_000 if step < 100 else 70_000, "actor/update": 40_000, "actor/prep": 5_000}

    found = detect(series("driver", [0], range(150), phases), OPTS)
    bounding = [d for d in found if d.rule == "bounding_role"]
    assert len(bounding) == 1 and bounding[0].role == "rollout" and bounding[0].previous == "actor"


def test_tracker_waits_for_every_live_rank_and_not_for_a_dead_one():
    def phases(rank, step):
        p = healthy(rank, step)
        if rank == 3 and step >= 10:
            p["forward"] = 50_000
        return p

    full = series("actor", range(4), range(40), phases)
    t = Tracker(OPTS)
    partial = [RankSeries(s.role, s.rank, steps=s.steps[:20] if s.rank != 0 else s.steps[:12]) for s in full]
    assert t.update(partial) == []  # rank 0 reported up to step 11: steps 12+ wait for it
    assert t.next_step["actor"] == 12
    partial[0].steps = full[0].steps[:20]
    found = t.update(partial)
    assert [(d.rank, d.step) for d in found] == [(3, 14)]
    # rank 0 stops (its newest step ends long before the others'): the others go on being judged
    for s in partial:
        s.steps = full[s.rank].steps[:20] if s.rank == 0 else [
            StepRecord(r.step, r.t + 100, r.dur_us, r.phases) for r in full[s.rank].steps]
    t.update(partial)
    assert t.next_step["actor"] == 40


def test_the_rank_waiting_longest_in_a_collective_is_not_named_nor_a_tiny_phase_made_slow_by_a_busy_host():
    def phases(rank, step):
        p = {"forward": 10_000, "backward": 500, "train/allreduce": 1_000}
        if rank == 3:  # arrives first every step: waits longest in the all-reduce; no rank computes slower
            p["train/allreduce"] = 9_000
        if rank == 1 and step >= 30:  # a 0.5 ms phase taking 2 ms (4x) on a busy host: 1.5 ms of a 12 ms step
            p["backward"] = 2_000
        return p

    assert detect(series("actor", range(4), range(100), phases), OPTS) == []
    # The same job judged on every phase (wait_phases: []) and without the share floor names both: the reasons
    # the defaults are what they are.
    loose = DetectOptions(wait_phases=[], min_share=0)
    named = {(d.rank, d.phase) for d in detect(series("actor", range(4), range(100), phases), loose)}
    assert named == {(3, "train/allreduce"), (1, "backward")}
