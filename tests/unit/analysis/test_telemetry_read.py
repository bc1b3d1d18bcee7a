"""The telemetry reader (``distprof.analysis.telemetry``) on streams that are untrusted input.

Whatever a rank folder holds (torn lines from a kill -9, a rotation between two reads, a restarted rank, lines of
the wrong types, huge lines, binary garbage, a FIFO, a link to /dev/zero, a linked rank folder, a folder that
cannot be listed, a file that shrinks), reading gives every intact line and reports the rest as ``skipped`` or a
``Problem``: no exception, memory bounded, nothing read outside the run directory.
"""

import json
import os
import random
import tracemalloc

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import distprof
from distprof.analysis import telemetry as tm
from distprof.analysis.telemetry import MAX_LINE, StreamReader, read_run

HEADER = {"telemetry": 1, "role": "actor", "rank": 0, "world_size": 2, "pid": 11, "host": "node0", "start": 1.0}


def line(step, dur=1000, phases=None, t=None):
    d = {"step": step, "t": 1700000000.0 + step if t is None else t, "dur_us": dur,
         "phases": {"fwd": dur // 2} if phases is None else phases}
    return json.dumps(d).encode() + b"\n"


def header(**kw):
    return json.dumps({**HEADER, **kw}).encode() + b"\n"


def rank_folder(root, role="actor", rank=0):
    d = os.path.join(root, role, f"rank{rank:05d}")
    os.makedirs(d, exist_ok=True)
    return d


def write(root, data, role="actor", rank=0, name="telemetry.jsonl", mode="wb"):
    d = rank_folder(root, role, rank)
    with open(os.path.join(d, name), mode) as f:
        f.write(data)
    return d


def steps_of(run, role="actor", rank=0):
    return [r.step for r in run.series[(role, rank)].steps]


def real_stream(root, steps=20):
    """A stream written by a real Profiler (rank 0 of 2), phases timed by annotate."""
    cfg = distprof.ProfilerConfig(enable=True, save_path=str(root), steps=[10**6], telemetry=True)
    with distprof.Profiler(cfg, role="actor", global_step=0, rank=0, world_size=2) as p:
        for _ in range(steps):
            with distprof.annotate("forward"):
                pass
            with distprof.annotate("backward"):
                pass
            p.step()
    return os.path.join(root, "actor", "rank00000", "telemetry.jsonl")


# ---- what a healthy writer leaves --------------------------------------------------------------------------------
def test_a_real_profilers_stream_is_read_whole(tmp_path):
    path = real_stream(tmp_path, steps=30)
    run = read_run(str(tmp_path))
    assert run.errors == []
    s = run.series[("actor", 0)]
    assert [r.step for r in s.steps] == list(range(30))
    assert s.world_size == 2 and s.pids == [os.getpid()] and s.skipped == 0
    assert all(set(r.phases) == {"forward", "backward"} for r in s.steps)
    with open(path, "rb") as f:
        assert len(f.read().splitlines()) == 31  # the header and one line per step


def test_a_torn_last_line_is_skipped_then_completed_when_the_rest_arrives(tmp_path):
    d = write(tmp_path, header() + line(1) + line(2) + line(3)[:20])  # kill -9 mid-write
    run = read_run(str(tmp_path))
    assert steps_of(run) == [1, 2] and run.errors == []
    reader = StreamReader(d)
    assert [r.step for r in reader.read()] == [1, 2]
    write(tmp_path, line(3)[20:] + line(4), mode="ab")  # a writer still alive finishes the line
    assert [r.step for r in reader.read()] == [3, 4]
    assert reader.skipped == 0


def test_a_torn_line_in_the_older_segment_is_skipped(tmp_path):
    write(tmp_path, header() + line(1) + line(2)[:-9], name="telemetry.1.jsonl")
    write(tmp_path, header() + line(3))
    run = read_run(str(tmp_path))
    assert steps_of(run) == [1, 3] and run.series[("actor", 0)].skipped == 1


def test_rotation_between_two_reads_loses_nothing(tmp_path):
    d = write(tmp_path, header() + line(1) + line(2))
    reader = StreamReader(d)
    assert [r.step for r in reader.read()] == [1, 2]
    write(tmp_path, line(3) + line(4)[:10], mode="ab")  # appended, the last line unfinished at the next look
    assert [r.step for r in reader.read()] == [3]
    write(tmp_path, line(4)[10:] + line(5), mode="ab")
    os.replace(os.path.join(d, "telemetry.jsonl"), os.path.join(d, "telemetry.1.jsonl"))  # the writer rotates
    assert [r.step for r in reader.read()] == [4, 5]  # the new file is not there yet: the old segment's rest
    write(tmp_path, header() + line(6))
    assert [r.step for r in reader.read()] == [6]
    write(tmp_path, line(7), mode="ab")
    os.replace(os.path.join(d, "telemetry.jsonl"), os.path.join(d, "telemetry.1.jsonl"))
    write(tmp_path, header() + line(8))
    assert [r.step for r in reader.read()] == [7, 8]
    assert reader.skipped == 0


def test_two_rotations_between_reads_keep_the_newest_segments(tmp_path):
    d = write(tmp_path, header() + line(1))
    reader = StreamReader(d)
    assert [r.step for r in reader.read()] == [1]
    for step in (2, 3):
        write(tmp_path, line(step), mode="ab")
        os.replace(os.path.join(d, "telemetry.jsonl"), os.path.join(d, "telemetry.1.jsonl"))
        write(tmp_path, header())
    write(tmp_path, line(4), mode="ab")
    assert [r.step for r in reader.read()] == [4]  # 2 went with the segment rotated away; 3's segment is not ours


def test_a_file_that_shrinks_is_read_again_from_its_start(tmp_path):
    d = write(tmp_path, header() + line(1) + line(2) + line(3))
    reader = StreamReader(d)
    assert len(reader.read()) == 3
    write(tmp_path, header() + line(9))  # truncated in place (same inode), shorter than what was read
    assert [r.step for r in reader.read()] == [9]


def test_a_restarted_rank_keeps_the_latest_line_of_each_step_in_step_order(tmp_path):
    # Steps 1-5, then the rank restarts from its checkpoint at step 3 (a new header), in one read.
    data = header(pid=1) + b"".join(line(s, dur=100) for s in range(1, 6))
    data += header(pid=2) + b"".join(line(s, dur=200) for s in range(3, 8))
    write(tmp_path, data)
    s = read_run(str(tmp_path)).series[("actor", 0)]
    assert [r.step for r in s.steps] == list(range(1, 8))
    assert [r.dur_us for r in s.steps] == [100, 100, 200, 200, 200, 200, 200]
    assert s.pids == [2]  # the last header; an incremental reader meets both (below)


def test_a_restart_seen_by_a_following_reader(tmp_path):
    write(tmp_path, header(pid=1) + line(1) + line(2) + line(3))
    run = read_run(str(tmp_path))
    write(tmp_path, header(pid=2) + line(2, dur=7) + line(3, dur=7) + line(4), mode="ab")
    assert run.refresh(str(tmp_path)) == 3
    s = run.series[("actor", 0)]
    assert [(r.step, r.dur_us) for r in s.steps] == [(1, 1000), (2, 7), (3, 7), (4, 1000)]
    assert s.pids == [1, 2]


BAD_LINES = [
    b'{"step": "3", "t": 1, "dur_us": 5}',  # wrong types
    b'{"step": 3.5, "t": 1, "dur_us": 5}',
    b'{"step": true, "t": 1, "dur_us": 5}',
    b'{"step": 3, "t": 1, "dur_us": -5}',  # a negative duration
    b'{"step": 3, "t": 1e999, "dur_us": 5}',  # out of range
    b'{"step": 99999999999999999999999, "t": 1, "dur_us": 5}',
    b'{"step": 3, "t": 1, "dur_us": 5, "phases": {"a": "x"}}',
    b'{"step": 3, "t": 1, "dur_us": 5, "phases": [1]}',
    b'{"step": 3, "t": 1, "dur_us": 5, "phases": {"\xff\xfe": 1}}',  # not UTF-8
    b'{"step": ' + b"[" * 100_000,  # nested deeper than the C stack
    b'{"telemetry": ' + b"{" * 100_000,
    b"[1, 2, 3]",
    b"null",
    b"\x00\x01\x02\xff" * 100,  # binary garbage
    b"x" * (MAX_LINE + 10),  # a huge line
]


def test_lines_of_the_wrong_shape_are_skipped_and_counted(tmp_path):
    data = header() + line(1)
    for i, bad in enumerate(BAD_LINES):
        data += bad + b"\n" + line(i + 2)
    write(tmp_path, data)
    run = read_run(str(tmp_path))
    assert run.errors == []
    s = run.series[("actor", 0)]
    assert [r.step for r in s.steps] == list(range(1, len(BAD_LINES) + 2))
    assert s.skipped == len(BAD_LINES)


def test_a_huge_line_across_reads_is_dropped_and_the_next_line_kept(tmp_path):
    d = write(tmp_path, header() + line(1) + b'{"step": 2, ' + b" " * (3 * MAX_LINE))
    reader = StreamReader(d)
    assert [r.step for r in reader.read()] == [1]
    write(tmp_path, b" " * MAX_LINE + b', "t": 1, "dur_us": 1}\n' + line(3), mode="ab")  # its end: not a line
    assert [r.step for r in reader.read()] == [3]
    assert reader.skipped == 1


# ---- what is not a stream --------------------------------------------------------------------------------------
def test_a_fifo_in_place_of_the_stream_is_a_problem_and_never_opened_for_long(tmp_path):
    d = rank_folder(tmp_path)
    os.mkfifo(os.path.join(d, "telemetry.jsonl"))  # opening it for reading would wait for a writer
    run = read_run(str(tmp_path))
    assert run.series == {}
    assert [p.path for p in run.errors] == [os.path.join(d, "telemetry.jsonl")]
    os.unlink(os.path.join(d, "telemetry.jsonl"))
    os.mkfifo(os.path.join(d, "telemetry.1.jsonl"))
    write(tmp_path, header() + line(1))
    run = read_run(str(tmp_path))  # the older segment a FIFO: the current one is still read
    assert steps_of(run) == [1]
    assert [p.path for p in run.errors] == [os.path.join(d, "telemetry.1.jsonl")]


def test_a_stream_replaced_by_a_fifo_after_it_was_found_is_not_read(tmp_path):
    d = write(tmp_path, header() + line(1))
    reader = StreamReader(d)
    reader.read()
    os.unlink(os.path.join(d, "telemetry.jsonl"))
    os.mkfifo(os.path.join(d, "telemetry.jsonl"))
    with pytest.raises(OSError, match="not a regular file"):
        reader.read()


def test_links_are_never_followed(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "elsewhere"
    write(outside, header() + line(1))
    d = rank_folder(root, rank=0)
    os.symlink("/dev/zero", os.path.join(d, "telemetry.jsonl"))  # endless bytes
    os.symlink(os.path.join(outside, "actor", "rank00000"), os.path.join(root, "actor", "rank00001"))
    d2 = rank_folder(root, rank=2)
    os.symlink(os.path.join(outside, "actor", "rank00000", "telemetry.jsonl"), os.path.join(d2, "telemetry.jsonl"))
    run = read_run(str(root))
    assert run.series == {}
    assert sorted(p.path for p in run.errors) == [os.path.join(d, "telemetry.jsonl"),
                                                   os.path.join(d2, "telemetry.jsonl")]
    assert all("symbolic link" in p.message for p in run.errors)


def test_a_rank_folder_swapped_for_a_link_after_it_was_found_is_not_followed(tmp_path):
    root, outside = tmp_path / "run", tmp_path / "elsewhere"
    write(outside, header() + line(5) + line(6))
    write(root, header() + line(1))
    run = read_run(str(root))
    d = os.path.join(root, "actor", "rank00000")
    os.rename(d, d + ".gone")
    os.symlink(os.path.join(outside, "actor", "rank00000"), d)
    reader = run.readers[("actor", 0)]
    with pytest.raises(OSError):
        reader.read()
    assert steps_of(run) == [1]


def test_a_folder_that_cannot_be_listed_is_one_problem_however_often_refreshed(tmp_path, monkeypatch):
    write(tmp_path, header() + line(1), rank=0)
    blocked = rank_folder(tmp_path, rank=1)
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == blocked:
            raise PermissionError(13, "Permission denied", blocked)
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    run = read_run(str(tmp_path))
    for _ in range(5):
        run.refresh(str(tmp_path))  # a watcher's loop: the problem is kept once, not once per look
    assert steps_of(run) == [1]
    assert [p.path for p in run.errors] == [blocked]


def test_an_unreadable_stream_is_one_problem_however_often_refreshed(tmp_path):
    d = write(tmp_path, header() + line(1))
    run = read_run(str(tmp_path))
    os.unlink(os.path.join(d, "telemetry.jsonl"))
    os.mkdir(os.path.join(d, "telemetry.jsonl"))  # a folder where the stream was
    for _ in range(3):
        run.refresh(str(tmp_path))
    assert len(run.errors) == 1 and steps_of(run) == [1]


def test_a_run_directory_that_is_not_there_or_not_a_folder_is_a_problem(tmp_path):
    assert [p.path for p in read_run(str(tmp_path / "missing")).errors] == [str(tmp_path / "missing")]
    (tmp_path / "file").write_bytes(b"x")
    assert len(read_run(str(tmp_path / "file")).errors) == 1


# ---- memory ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["newlines", "short garbage lines", "one endless line"])
def test_memory_is_bounded_by_what_is_kept_not_by_the_bytes(tmp_path, content):
    size = 2 * 1024 * 1024  # read whole and split, as before: 2 MB of bytes and up to 16 MB of line references
    data = {"newlines": b"\n" * size, "short garbage lines": b"x\n" * (size // 2),
            "one endless line": b"y" * size + b"\n"}[content]
    write(tmp_path, header() + data + line(7))
    tracemalloc.start()
    try:
        run = read_run(str(tmp_path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert steps_of(run) == [7]
    # The reader's own working set (a 256 KiB chunk and its lines) is about 2.6 MB whatever the size; reading the
    # file whole and splitting it took 18 MB here.
    assert peak < 4 * 1024 * 1024, f"peak {peak / 1e6:.2f} MB reading {size / 1e6:.0f} MB of {content}"


# ---- fuzz -------------------------------------------------------------------------------------------------------
def _intact_steps(data: bytes) -> set[int]:
    """Steps of the intact lines: a step line whole between two newlines (or the start of the file)."""
    out = set()
    for raw in data.split(b"\n")[:-1]:  # the last piece has no newline: still being written
        try:
            out.add(msgspec.json.decode(raw, type=tm.StepRecord).step)
        except (msgspec.DecodeError, ValueError, RecursionError):
            continue
    return out


def _original():
    lines = [header()] + [line(s, dur=1000 + s, phases={"fwd": s, "bwd": 2 * s}) for s in range(40)]
    lines.insert(20, header(pid=12))
    return b"".join(lines)


ORIGINAL = _original()

_mutation = st.tuples(st.sampled_from(["flip", "insert", "delete", "cut", "dup"]),
                      st.integers(0, len(ORIGINAL) - 1), st.binary(min_size=1, max_size=40))


def _mutate(data: bytes, ops) -> bytes:
    b = bytearray(data)
    for op, at, junk in ops:
        at = at % (len(b) or 1)
        if op == "flip" and b:
            b[at] ^= junk[0] or 1
        elif op == "insert":
            b[at:at] = junk
        elif op == "delete":
            del b[at:at + len(junk)]
        elif op == "cut":
            del b[at:]
        elif op == "dup":
            b[at:at] = b[max(0, at - 200):at]
    return bytes(b)


def _check(root, data: bytes, split: int) -> None:
    """Read ``data`` whole, and in two reads split at ``split``: no exception, every intact line read."""
    d = write(root, data)
    run = read_run(str(root))
    assert run.errors == []
    got = {r.step for r in run.series[("actor", 0)].steps}
    assert _intact_steps(data) <= got
    write(root, data[:split])
    reader = StreamReader(d)
    first = reader.read()
    write(root, data[split:], mode="ab")
    both = {r.step for r in first + reader.read()}
    assert _intact_steps(data) <= both


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(_mutation, max_size=8), split=st.integers(0, len(ORIGINAL)))
def test_fuzz_mutated_real_streams_never_raise_and_keep_every_intact_line(tmp_path_factory, ops, split):
    _check(tmp_path_factory.mktemp("fuzz"), _mutate(ORIGINAL, ops), split)


def test_fuzz_seeded_random_bytes_around_real_lines(tmp_path):
    rnd = random.Random(22)
    for i in range(200):
        parts = []
        for s in range(rnd.randrange(1, 30)):
            parts.append(line(s) if rnd.random() < 0.6 else bytes(rnd.randrange(256) for _ in range(rnd.randrange(80))))
        data = b"".join(parts)
        _check(tmp_path / str(i), data, rnd.randrange(len(data) + 1))
