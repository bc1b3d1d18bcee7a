"""Step telemetry (telemetry: true), capture side: what each rank's stream holds, which ranges are phases, its
bounds, and that it never troubles the job. Real Profilers in this process (rank and world size given), the real
writer thread, the real files; the stream is read back with the analysis reader."""

import json
import logging
import os
import signal
import threading
import time

import pytest

import distprof
from distprof import Profiler, ProfilerConfig
from distprof.analysis.telemetry import read_run
from distprof.capture import annotate as annotate_mod
from distprof.capture import telemetry as telemetry_mod
from distprof.rundir.layout import TELEMETRY, TELEMETRY_OLD


def tcfg(path, **fields):
    opts = fields.pop("telemetry_options", {})
    return ProfilerConfig(save_path=str(path), telemetry=True, telemetry_options={"flush_s": 300, **opts}, **fields)


def lines(path, role="main", rank=0):
    with open(os.path.join(path, role, f"rank{rank:05d}", TELEMETRY)) as f:
        return [json.loads(x) for x in f]


def busy(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_every_rank_keeps_its_steps_and_outermost_phases_whether_or_not_it_captures(tmp_path):
    for rank in range(3):  # ranks: [0] by default: ranks 1 and 2 do not capture, but keep telemetry
        p = Profiler(tcfg(tmp_path), rank=rank, world_size=3, global_step=10)
        with p:
            for _ in range(4):
                with distprof.annotate("forward"):
                    with distprof.annotate("inner"):  # nested: part of forward, never a phase of its own
                        busy(0.002)
                with distprof.annotate("backward"):
                    busy(0.001)
                p.step()
        assert p.global_step == 14
        head, *steps = lines(tmp_path, rank=rank)
        assert head["telemetry"] == 1 and head["rank"] == rank and head["world_size"] == 3
        assert head["pid"] == os.getpid()
        assert [s["step"] for s in steps] == [10, 11, 12, 13]
        for s in steps:
            assert set(s["phases"]) == {"forward", "backward"}
            assert s["phases"]["forward"] >= 2000 and s["phases"]["backward"] >= 1000
            assert s["dur_us"] >= s["phases"]["forward"] + s["phases"]["backward"]
        assert [s["t"] for s in steps] == sorted(s["t"] for s in steps)
        assert abs(steps[-1]["t"] - time.time()) < 60  # wall-clock seconds, not a perf counter
    run = read_run(str(tmp_path))
    assert sorted(run.series) == [("main", 0), ("main", 1), ("main", 2)] and not run.errors


def test_a_range_of_another_thread_is_no_phase_and_recursion_counts_once(tmp_path):
    p = Profiler(tcfg(tmp_path), rank=0, world_size=1, global_step=0).start()
    stop = threading.Event()

    def other():
        while not stop.is_set():
            with distprof.annotate("loader"):
                pass

    t = threading.Thread(target=other)
    t.start()
    try:
        @distprof.annotate("recurse")
        def recurse(n):
            busy(0.0005)
            return recurse(n - 1) if n else 0

        for _ in range(3):
            recurse(3)
            p.step()
    finally:
        stop.set()
        t.join()
    p.stop()
    _, *steps = lines(tmp_path)
    assert [sorted(s["phases"]) for s in steps] == [["recurse"]] * 3
    assert all(2000 <= s["phases"]["recurse"] <= s["dur_us"] for s in steps)  # 4 calls of >= 0.5 ms, counted once


def test_telemetry_costs_nothing_once_stopped_the_inert_methods_are_back(tmp_path):
    plain = annotate_mod.Annotation.__enter__
    p = Profiler(tcfg(tmp_path), rank=0, world_size=1).start()
    assert annotate_mod.Annotation.__enter__ is not plain and annotate_mod._STATE.live
    p.stop()
    assert annotate_mod.Annotation.__enter__ is plain and annotate_mod.Annotation.__exit__ is annotate_mod.Annotation._plain_exit
    assert not annotate_mod._STATE.live
    q = Profiler(ProfilerConfig(), rank=0, world_size=1)  # no telemetry: the inert step is one increment
    assert q._fast and q._telemetry is None


def test_the_stream_rotates_and_stays_within_its_bound(tmp_path):
    p = Profiler(tcfg(tmp_path, telemetry_options={"max_mb": 0.02}), rank=0, world_size=1).start()
    for i in range(3000):
        p.step()
        if i % 50 == 49:
            p._telemetry.flush()
    p.stop()
    folder = tmp_path / "main" / "rank00000"
    sizes = {n: os.path.getsize(folder / n) for n in os.listdir(folder)}
    assert set(sizes) == {TELEMETRY, TELEMETRY_OLD}
    assert sum(sizes.values()) <= 20_000 + 6_000  # max_mb, plus at most one write past the half
    steps = [r.step for r in read_run(str(tmp_path)).series[("main", 0)].steps]
    assert steps[-1] == 2999 and steps == list(range(steps[0], 3000))  # the newest steps, none missing


def test_a_stalled_writer_bounds_the_buffer_not_the_job(tmp_path):
    p = Profiler(tcfg(tmp_path, telemetry_options={"buffer_steps": 1000}), rank=0, world_size=1).start()
    for _ in range(5000):
        p.step()
    assert len(p._telemetry._buf) == 1000  # the oldest steps dropped
    p.stop()
    _, *steps = lines(tmp_path)
    assert [s["step"] for s in steps] == list(range(4000, 5000))


def test_a_stream_that_cannot_be_written_is_logged_once_and_turns_telemetry_off(tmp_path, caplog):
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "rank00000").write_text("a file where the rank folder goes")
    p = Profiler(tcfg(tmp_path), rank=0, world_size=1).start()
    with caplog.at_level(logging.WARNING, logger="distprof"):
        for _ in range(3):
            with distprof.annotate("forward"):
                pass
            p.step()
            p._telemetry.flush()
    p.stop()
    warned = [r for r in caplog.records if "telemetry" in r.getMessage()]
    assert len(warned) == 1 and "rank00000" in warned[0].getMessage()
    assert p._telemetry._dead and annotate_mod.Annotation.__enter__ is annotate_mod.Annotation._plain_enter
    assert p.global_step == 3  # training went on


def test_a_link_in_the_run_directory_is_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    os.symlink(outside, run / "main")
    p = Profiler(tcfg(run), rank=0, world_size=1).start()
    p.step()
    p.stop()
    assert os.listdir(outside) == [] and p._telemetry._dead


def test_steps_written_before_a_kill_stay_readable_and_a_restart_appends(tmp_path):
    p = Profiler(tcfg(tmp_path), rank=0, world_size=1).start()
    for _ in range(5):
        p.step()
    p._telemetry.flush()
    with open(tmp_path / "main" / "rank00000" / TELEMETRY, "ab") as f:
        f.write(b'{"step":5,"t":17')  # the torn line a kill -9 mid-write leaves
    p._telemetry._dead = True  # the process is gone: nothing more from it
    q = Profiler(tcfg(tmp_path), rank=0, world_size=1, global_step=5).start()  # the job restarted from step 5
    for _ in range(3):
        q.step()
    q.stop()
    s = read_run(str(tmp_path)).series[("main", 0)]
    assert [r.step for r in s.steps] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_a_forked_child_writes_nothing_of_its_parents_stream(tmp_path):
    p = Profiler(tcfg(tmp_path), rank=0, world_size=1).start()
    p.step()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a DataLoader worker, the export child
        try:
            os.close(r)
            dead = all(t._dead for t in [p._telemetry])
            telemetry_mod._flush_all()
            os.write(w, b"1" if dead else b"0")
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.waitpid(pid, 0)
    os.close(r)
    p.step()
    p.stop()
    _, *steps = lines(tmp_path)
    assert [s["step"] for s in steps] == [0, 1]  # written once, by the parent


def test_telemetry_needs_a_local_save_path_and_detect_needs_telemetry():
    with pytest.raises(ValueError, match="save_path"):
        ProfilerConfig(telemetry=True)
    with pytest.raises(ValueError, match="object store"):
        ProfilerConfig(telemetry=True, save_path="s3://bucket/run")
    with pytest.raises(ValueError, match="telemetry: true"):
        ProfilerConfig(detect=True, save_path="/tmp/x")
    with pytest.raises(ValueError, match="flush_s"):
        ProfilerConfig(telemetry=True, save_path="/tmp/x", telemetry_options={"flush_s": 0})
    with pytest.raises(ValueError, match="slow_factor"):
        ProfilerConfig(detection={"slow_factor": 1.0})


def test_telemetry_beside_a_capturing_profiler_keeps_the_windows(tmp_path):
    from conftest import config

    p = Profiler(config(tmp_path, run=None, steps=[2, 3], telemetry=True), rank=0, world_size=1).start()
    for _ in range(6):
        with distprof.annotate("forward"):
            busy(0.001)
        p.step()
    p.stop()
    assert p.windows_closed == 1
    _, *steps = lines(tmp_path)
    assert [s["step"] for s in steps] == list(range(6)) and all("forward" in s["phases"] for s in steps)


def test_ranges_of_a_job_that_never_ends_a_step_do_not_grow_memory(tmp_path):
    p = Profiler(tcfg(tmp_path), rank=0, world_size=1).start()
    for _ in range(3000):
        with distprof.annotate("forward"):
            pass
    assert len(annotate_mod._STATE.log) == 6000  # range, ns per outermost range
    annotate_mod.trim_phases(1000)  # what the writer thread does at each flush
    assert annotate_mod._STATE.log == []
    with distprof.annotate("forward"):
        pass
    log = annotate_mod.take_phases()
    # A record cut in two by a trim from the writer thread is skipped, never misread.
    assert annotate_mod.phase_times([5, *log, log[0]]) == {"forward": log[1]}
    p.stop()


def in_child(fn):
    """Run ``fn()`` in a forked child (from this, the training thread); its one-byte answer, or b"" when it hung
    (killed after 60 s: a lock the parent's writer thread held at the fork)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            signal.alarm(60)
            os.write(w, fn())
        finally:
            os._exit(0)
    os.close(w)
    try:
        return os.read(r, 1)
    finally:
        os.waitpid(pid, 0)
        os.close(r)


def test_a_forked_childs_ranges_are_not_kept_for_its_parents_telemetry(tmp_path):
    """A DataLoader worker forked from the training thread runs annotated code: the parent's telemetry never takes
    those ranges (its writer thread, which trims them, is not in the child); the child must not keep them."""
    p = Profiler(tcfg(tmp_path), rank=1, world_size=2).start()  # rank 1: telemetry only (inert for capture)

    def child():
        for _ in range(5000):
            with distprof.annotate("data/load"):
                pass
        plain = annotate_mod.Annotation.__enter__ is annotate_mod.Annotation._plain_enter
        return b"1" if plain and len(annotate_mod._STATE.log) == 0 else b"0"

    try:
        assert in_child(child) == b"1"
    finally:
        p.stop()


def test_a_forked_child_stops_its_inherited_profiler_even_if_the_writer_held_its_lock(tmp_path):
    """Forked while the parent's writer thread held the stream's lock (writing to a slow filesystem): the child's
    ``with prof:`` ends without waiting on a lock no thread of the child will release."""
    p = Profiler(tcfg(tmp_path), rank=1, world_size=2).start()
    p.step()

    def child():
        p.stop()
        return b"1"

    try:
        with p._telemetry._lock:  # what the writer thread holds while it writes
            got = in_child(child)
        assert got == b"1"
    finally:
        p.stop()
    _, *steps = lines(tmp_path, rank=1)
    assert [s["step"] for s in steps] == [0]


def test_a_profiler_dropped_without_stop_ends_its_writer_and_the_next_one_gets_the_phases(tmp_path):
    import gc

    p = Profiler(tcfg(tmp_path), rank=1, world_size=2).start()
    p.step()
    writer = p._telemetry._thread
    del p
    gc.collect()
    writer.join(timeout=30)  # flush_s is 300: only its release ends it now
    assert not writer.is_alive()
    _, *steps = lines(tmp_path, rank=1)
    assert [s["step"] for s in steps] == [0]  # what it buffered is written
    q = Profiler(tcfg(tmp_path / "next"), rank=0, world_size=1).start()
    with distprof.annotate("forward"):
        pass
    q.step()
    q.stop()
    _, *steps = lines(tmp_path / "next")
    assert "forward" in steps[0]["phases"]  # not kept for the dropped profiler's telemetry
