"""Hang evidence in the job (config/hang.py, capture/collrec.py, capture/hang.py), in one process: the options'
checks, the collective record on a real one-rank gloo group, and the watchdog's states (running, stalled with
stacks and the open window's manifest line, resumed, stopped) on a training thread the test holds and releases."""

import json
import os
import threading
import time

import pytest

import distprof
from distprof.capture import collrec
from distprof.capture.hang import thread_stacks
from distprof.rundir.layout import HANG, HANG_STACKS, MANIFEST


def test_hang_is_off_by_default_and_free():
    cfg = distprof.ProfilerConfig()
    assert cfg.hang.enabled is False
    prof = distprof.Profiler(cfg, role="train", rank=0, world_size=1)
    assert prof._hang is None


@pytest.mark.parametrize(("hang", "words"), [
    ({"enabled": True, "timeout_s": 0}, ["hang.timeout_s", "0", "timeout_s: 600"]),
    ({"enabled": "yes"}, ["hang.enabled", "'yes'", "enabled: true"]),
    ({"history": 0}, ["hang.history", "0", "history: 32"]),
    ({"enabled": True, "bogus": 1}, ["bogus"]),
])
def test_bad_options_name_field_value_and_fix(hang, words):
    with pytest.raises(ValueError) as e:
        distprof.ProfilerConfig.from_dict({"save_path": "/tmp/x", "hang": hang})
    for w in words:
        assert w in str(e.value)


def test_hang_needs_a_local_save_path():
    with pytest.raises(ValueError, match=r"hang\.enabled"):
        distprof.ProfilerConfig(hang=True)
    with pytest.raises(ValueError, match=r"hang\.enabled"):
        distprof.ProfilerConfig(hang=True, save_path="s3://bucket/run")
    assert distprof.ProfilerConfig(hang=True, save_path="/tmp/x").hang.enabled


def test_the_record_numbers_each_groups_collectives_without_adding_one(tmp_path):
    import torch
    import torch.distributed as dist

    bare = dist.all_reduce
    assert collrec.install(8)
    try:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdzv'}", rank=0, world_size=1)
        try:
            for _ in range(3):
                dist.all_reduce(torch.ones(2))
            dist.barrier()
            (g,) = collrec.snapshot()
            assert g["group"] == "0" and g["entered"] == g["completed"] == 4 and g["entered_name"] == "barrier"
            assert [r["seq"] for r in g["recent"]] == [1, 2, 3, 4]
            assert all(r["completed_t"] >= r["entered_t"] for r in g["recent"])
        finally:
            dist.destroy_process_group()
    finally:
        collrec.uninstall()
    assert dist.all_reduce is bare


def test_thread_stacks_have_every_thread_the_training_thread_first():
    release, got = threading.Event(), []
    t = threading.Thread(target=release.wait, name="parked", daemon=True)
    t.start()
    try:
        w = threading.Thread(target=lambda: got.append(thread_stacks()), name="watchdog")  # as the watchdog calls it
        w.start()
        w.join(30)
    finally:
        release.set()
    (stacks,) = got
    assert stacks[0]["main"] and stacks[0]["thread"] == "MainThread"
    assert "watchdog" not in [s["thread"] for s in stacks]  # the caller is left out
    parked = next(s for s in stacks if s["thread"] == "parked")
    assert parked["frames"][-1]["func"] == "wait"


def read(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def wait_for(cond, what, deadline_s=60):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(0.02)  # polling a file the watchdog writes, with a deadline
    raise AssertionError(f"no {what} within {deadline_s} s")


def test_the_watchdog_writes_stalled_evidence_and_takes_it_back_when_steps_go_on(tmp_path):
    out = tmp_path / "run"
    cfg = distprof.ProfilerConfig.from_dict({"enable": True, "save_path": str(out), "steps": [2],
                                             "torch": {"activities": ["cpu"]},
                                             "hang": {"enabled": True, "timeout_s": 1}})
    evidence = out / "train" / "rank00000" / HANG
    stall, release, done = threading.Event(), threading.Event(), threading.Event()

    def train():  # the training thread: profiler started here, so its annotate ranges are the phases
        prof = distprof.Profiler(cfg, role="train", rank=0, world_size=1)
        with prof:
            for step in range(4):
                with distprof.annotate("train/data"):
                    if step == 2:
                        stall.set()
                        release.wait(60)
                prof.step()
        done.set()

    t = threading.Thread(target=train, name="trainer")
    t.start()
    try:
        ev = wait_for(lambda: (e := read(evidence)) and e["state"] == "stalled" and e, "stalled evidence")
        assert ev["step"] == 2 and ev["phase"] == "train/data" and ev["stalled_s"] >= 1
        main = next(s for s in ev["stacks"] if s["main"])
        assert main["thread"] == "trainer" and main["frames"][-1]["func"] == "wait"
        assert "flight_recorder" in ev
        lines = [json.loads(x) for x in (out / "train" / "rank00000" / MANIFEST).read_text().splitlines()]
        (hung,) = [x for x in lines if x.get("stopped_by") == "hang"]
        assert hung["complete"] is False and hung["steps"] == [2, 2] and hung.get("files", []) == []
    finally:
        release.set()
        t.join(60)
    assert done.is_set()
    assert read(evidence)["state"] in ("resumed", "stopped")
    assert os.path.exists(out / "train" / "rank00000" / HANG_STACKS)


def test_stalled_evidence_follows_a_rank_that_moves_into_its_collective(tmp_path):
    """A step slow enough to fire the watchdog (here: stuck in ``train/data``), that then reaches its collective
    and hangs there: the evidence says where the rank is now, not where the watchdog first saw it (CI caught the
    first version naming the collective only through the Flight Recorder)."""
    out = tmp_path / "run"
    cfg = distprof.ProfilerConfig.from_dict({"enable": True, "save_path": str(out), "steps": [50],
                                             "torch": {"activities": ["cpu"]},
                                             "hang": {"enabled": True, "timeout_s": 1}})
    evidence = out / "train" / "rank00000" / HANG
    go_on, release = threading.Event(), threading.Event()
    # collrec's own wrapper around a collective that blocks until the test releases it (one process cannot
    # hang a real gloo collective: a world of one completes at once).
    hung_all_reduce = collrec._wrap("all_reduce", lambda tensor, op=None, group=None, async_op=False: release.wait(60))

    def train():
        prof = distprof.Profiler(cfg, role="train", rank=0, world_size=1)
        with prof:
            for step in range(3):
                with distprof.annotate("train/data"):
                    if step == 1:
                        go_on.wait(60)
                with distprof.annotate("train/allreduce"):
                    if step == 1:
                        hung_all_reduce(None)
                prof.step()

    t = threading.Thread(target=train, name="trainer")
    t.start()
    try:
        ev = wait_for(lambda: (e := read(evidence)) and e["state"] == "stalled" and e, "stalled evidence")
        assert ev["phase"] == "train/data" and not ev["in_collective"]
        go_on.set()
        ev = wait_for(lambda: (e := read(evidence)) and e["in_collective"] and e, "evidence in the collective")
        assert ev["state"] == "stalled" and ev["step"] == 1 and ev["phase"] == "train/allreduce"
        (g,) = [g for g in ev["groups"] if g["entered"] > g["completed"]]
        assert g["entered_name"] == "all_reduce"
        main = next(s for s in ev["stacks"] if s["main"])
        assert main["frames"][-1]["func"] == "wait"
    finally:
        go_on.set()
        release.set()
        t.join(60)
        collrec.uninstall()
    assert read(evidence)["state"] in ("resumed", "stopped")


def test_telemetry_keeps_its_phases_beside_hang_evidence(tmp_path):
    cfg = distprof.ProfilerConfig.from_dict({"save_path": str(tmp_path), "telemetry": True,
                                             "hang": {"enabled": True, "timeout_s": 60}})
    prof = distprof.Profiler(cfg, role="train", rank=0, world_size=1)
    with prof:
        for _ in range(3):
            with distprof.annotate("train/forward"):
                pass
            prof.step()
    lines = [json.loads(x) for x in (tmp_path / "train" / "rank00000" / "telemetry.jsonl").read_text().splitlines()]
    assert [sorted(x["phases"]) for x in lines if "step" in x] == [["train/forward"]] * 3
    assert read(tmp_path / "train" / "rank00000" / HANG)["state"] == "stopped"
