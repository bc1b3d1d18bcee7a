"""``distprof hang``'s analysis (analysis/hang.py) on small in-test evidence: matching by group and sequence
number, the Flight Recorder's numbers, a rank stuck in C code (only faulthandler's dump), slow ranks not called
hung, hostile evidence files (fuzzed) never a traceback, the CLI's exit codes and keys, the diagnose finding."""

import json
import os
import random

import pytest
from typer.testing import CliRunner

from distprof.analysis.analyze import diagnose_result
from distprof.analysis.hang import analyse, hang_result, parse_stacks, read_evidence
from distprof.analysis.records import to_json
from distprof.cli import app
from distprof.rundir.layout import HANG, HANG_STACKS

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")

T0 = 1_700_000_000.0


def group(name="0", entered=5, completed=5, entered_name="all_reduce"):
    recent = [{"seq": s, "name": "all_reduce", "entered_t": T0 + s, "completed_t": None if s > completed else T0 + s}
              for s in range(max(1, entered - 3), entered + 1)]
    return {"group": name, "entered": entered, "entered_name": entered_name, "entered_t": T0 + entered,
            "completed": completed, "completed_t": T0 + completed, "recent": recent}


def evidence(rank, state="stalled", step=7, phase="train/data", groups=(), stacks=None, world=4, **kw):
    frames = stacks if stacks is not None else [{"file": "/job/train.py", "line": 10 + rank, "func": f"fn{rank}"}]
    ev = {"hang": 1, "role": "train", "rank": rank, "world_size": world, "pid": 100 + rank, "host": "h",
          "state": state, "written_t": T0 + 100, "step": step, "last_progress_t": T0 + 50, "stalled_s": 50.0,
          "timeout_s": 30, "phase": phase, "phase_t": T0 + 51, "main_ident": 1,
          "in_collective": any(g["entered"] > g["completed"] for g in groups), "groups": list(groups)}
    if state == "stalled":
        ev["stacks"] = [{"thread": "MainThread", "ident": 1, "main": True, "frames": frames}]
    ev.update(kw)
    return ev


def write(root, rank, ev=None, stacks_text=None, role="train"):
    d = root / role / f"rank{rank:05d}"
    d.mkdir(parents=True, exist_ok=True)
    if ev is not None:
        (d / HANG).write_text(ev if isinstance(ev, str) else json.dumps(ev))
    if stacks_text is not None:
        (d / HANG_STACKS).write_text(stacks_text)
    return d


def hung_run(root):
    """Ranks 0, 1, 3 wait in all_reduce #6 of the default group; rank 2 never entered it (stuck in data)."""
    for r in (0, 1, 3):
        write(root, r, evidence(r, phase="train/allreduce", groups=[group(entered=6, completed=5)]))
    write(root, 2, evidence(2, groups=[group(entered=5, completed=5)],
                            stacks=[{"file": "/venv/lib/python3.11/site-packages/torch/x.py", "line": 1, "func": "a"},
                                    {"file": "/job/data.py", "line": 42, "func": "next_batch"},
                                    {"file": "/usr/lib/python3.11/threading.py", "line": 320, "func": "wait"}]))


def test_the_rank_that_never_entered_the_collective_is_named_with_where_it_is(tmp_path):
    hung_run(tmp_path)
    res = hang_result(str(tmp_path))
    doc = to_json(res)
    assert doc["hung"] is True and doc["stuck_ranks"] == [2]
    assert doc["collective"]["group"] == "0" and doc["collective"]["seq"] == 6
    assert doc["collective"]["name"] == "all_reduce" and doc["collective"]["waiting"] == [0, 1, 3]
    by = {r["rank"]: r for r in doc["ranks"]}
    for r in by.values():
        assert {"rank", "state", "step", "phase", "stack"} <= set(r)
    assert by[2]["state"] == "stuck" and by[2]["phase"] == "train/data" and by[2]["step"] == 7
    assert by[2]["frame"] == "next_batch (/job/data.py:42)"  # the job's own innermost frame, not the library's
    assert by[0]["state"] == "waiting" and by[0]["waiting_in"]["seq"] == 6
    assert "rank 2 never entered all_reduce #6 of group 0" in res.verdict and "next_batch" in res.verdict


def test_a_rank_without_any_evidence_is_a_stuck_rank_too(tmp_path):
    for r in (0, 1, 2):
        write(tmp_path, r, evidence(r, groups=[group(entered=3, completed=2)]))
    res = hang_result(str(tmp_path))
    assert res.stuck_ranks == [3]
    assert {r.rank: r.state for r in res.ranks}[3] == "no_evidence"


def test_the_flight_recorder_numbers_match_when_distprof_saw_no_collective(tmp_path):
    """DDP's bucket all-reduces come from C++: only the Flight Recorder has them."""
    def fr(n, pending):
        es = [{"collective_seq_id": s, "profiling_name": "gloo:all_reduce", "retired": not (pending and s == n),
               "state": "scheduled", "time_created_ns": int((T0 + s) * 1e9), "is_p2p": False} for s in range(1, n + 1)]
        return {"available": True, "groups": {"0": es}}
    write(tmp_path, 0, evidence(0, flight_recorder=fr(9, True)))
    write(tmp_path, 1, evidence(1, flight_recorder=fr(8, False)))
    res = hang_result(str(tmp_path / ""))
    assert res.collective is not None and res.collective.source == "flight_recorder"
    assert (res.collective.seq, res.collective.name, res.stuck_ranks) == (9, "all_reduce", [1, 2, 3])
    assert res.flight_recorder


def test_a_rank_stuck_in_c_code_holding_the_gil_is_told_by_its_faulthandler_dump(tmp_path):
    write(tmp_path, 0, evidence(0, world=2, groups=[group(entered=4, completed=3)]))
    d = write(tmp_path, 1, evidence(1, state="running", step=2, world=2, groups=[group(entered=2, completed=2)]),
              stacks_text="Timeout (0:00:01)!\nThread 0x00000000000000aa (most recent call first):\n"
                          '  File "/job/train.py", line 37 in stall\n  File "/job/train.py", line 60 in worker\n\n'
                          "Current thread 0x00000000000000bb (most recent call first):\n"
                          '  File "/x/threading.py", line 1 in wait\n')
    os.utime(d / HANG, (T0 + 100, T0 + 100))  # the dump is newer than the last write
    res = hang_result(str(tmp_path))
    assert res.stuck_ranks == [1]
    r1 = {r.rank: r for r in res.ranks}[1]
    assert r1.state == "stuck_in_c" and r1.frame == "stall (/job/train.py:37)"
    assert r1.stack == ["worker (/job/train.py:60)", "stall (/job/train.py:37)"]
    assert "holding the GIL" in res.verdict


def test_slow_or_stopped_ranks_are_not_called_hung(tmp_path):
    write(tmp_path, 0, evidence(0, state="running", world=2, groups=[group()]))
    write(tmp_path, 1, evidence(1, state="resumed", world=2, groups=[group()]))
    res = hang_result(str(tmp_path))
    assert not res.hung and res.stuck_ranks == [] and res.collective is None
    assert "slow, not hung" in res.verdict
    write(tmp_path, 1, evidence(1, state="stopped", world=2))
    assert not hang_result(str(tmp_path)).hung


def test_stuck_ranks_outside_any_collective(tmp_path):
    write(tmp_path, 0, evidence(0, world=1))
    res = hang_result(str(tmp_path))
    assert res.hung and res.stuck_ranks == [0] and res.collective is None


def test_parse_stacks_takes_the_last_dump_and_leaves_the_dumping_thread_out():
    text = ("Timeout (0:00:01)!\nThread 0x1 (most recent call first):\n  File \"a.py\", line 1 in old\n\n"
            "Timeout (0:00:02)!\nThread 0x2 (most recent call first):\n  File \"b.py\", line 2 in inner\n"
            "  File \"b.py\", line 9 in outer\n\nCurrent thread 0x3 (most recent call first):\n"
            "  File \"c.py\", line 3 in dumper\n")
    (s,) = parse_stacks(text)
    assert s.ident == 2 and [f.func for f in s.frames] == ["outer", "inner"]


HOSTILE = [b"", b"{", b"null", b"[]", b'{"hang": 1}', b'{"hang":1,"role":"train","rank":-1,"state":"x"}',
           b'{"hang":1,"role":"train","rank":0,"state":"stalled","groups":[{"group":1}]}',
           b'{"hang":1,"role":"train","rank":5,"state":"stalled"}', b"\xff\xfe" * 100]


@pytest.mark.parametrize("data", HOSTILE)
def test_hostile_evidence_is_an_error_never_a_traceback(tmp_path, data):
    write(tmp_path, 0, evidence(0, world=2, groups=[group(entered=3, completed=2)]))
    (write(tmp_path, 1) / HANG).write_bytes(data)
    res = hang_result(str(tmp_path))
    assert [e["path"] for e in res.errors] == [str(tmp_path / "train" / "rank00001" / HANG)]


def test_fuzzed_evidence_never_raises(tmp_path):
    rng = random.Random(25)
    good = json.dumps(evidence(1, groups=[group(entered=3, completed=2)],
                               flight_recorder={"available": True, "groups": {"0": [{"collective_seq_id": 1}]}}))
    write(tmp_path, 0, evidence(0, world=2, groups=[group(entered=3, completed=2)]))
    d = write(tmp_path, 1)
    stacks = "Timeout (0:00:01)!\nThread 0x00aa (most recent call first):\n  File \"/j.py\", line 3 in f\n"
    for _ in range(150):
        b = bytearray(good.encode())
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        (d / HANG).write_bytes(bytes(b[: rng.randint(0, len(b))] if rng.random() < 0.2 else b))
        s = bytearray(stacks.encode())
        s[rng.randrange(len(s))] = rng.randrange(256)
        (d / HANG_STACKS).write_bytes(bytes(s))
        to_json(analyse(read_evidence(str(tmp_path))))


def test_links_and_oversized_files_are_not_read(tmp_path):
    write(tmp_path, 0, evidence(0, world=2, groups=[group(entered=3, completed=2)]))
    outside = tmp_path.parent / f"{tmp_path.name}-secret.json"
    outside.write_text(json.dumps(evidence(1)))
    d = write(tmp_path, 1)
    os.symlink(outside, d / HANG)
    res = hang_result(str(tmp_path))
    assert "symbolic link" in res.errors[0]["message"]
    assert {r.rank: r.state for r in res.ranks}[1] == "no_evidence"


def test_no_evidence_at_all_is_bad_input(tmp_path):
    with pytest.raises(ValueError, match="holds no hang evidence"):
        hang_result(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        hang_result(str(tmp_path / "missing"))


class _Done:
    def __init__(self, res):
        self.returncode, self.stdout, self.stderr = res.exit_code, res.stdout, getattr(res, "stderr", "")


def cli(*args):
    return _Done(CliRunner().invoke(app, ["hang", *args]))


def test_cli_exit_codes_and_json_keys(tmp_path):
    hung_run(tmp_path / "run")
    p = cli(str(tmp_path / "run"), "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["stuck_ranks"] == [2] and doc["collective"] == {**doc["collective"], "group": "0", "seq": 6,
                                                              "name": "all_reduce"}
    assert doc["errors"] == []
    p = cli(str(tmp_path / "run"))
    assert p.returncode == 0 and "rank 2 never entered all_reduce #6" in " ".join(p.stdout.split())
    (tmp_path / "run" / "train" / "rank00001" / HANG).write_text("{")
    p = cli(str(tmp_path / "run"), "--json")
    assert p.returncode == 1 and json.loads(p.stdout)["errors"]
    p = cli(str(tmp_path / "empty"), "--json")
    assert p.returncode == 2 and json.loads(p.stdout)["errors"]


def test_diagnose_has_the_hang_finding_even_without_a_trace(tmp_path):
    hung_run(tmp_path)
    res = diagnose_result(str(tmp_path))
    (f,) = res.findings
    assert f.id == "hang" and f.evidence.ranks == [2] and f.evidence.role == "train"
    assert "all_reduce #6 (group 0)" in f.evidence.names and f.cost_us == 50e6


def test_the_report_carries_the_hang_finding_beside_the_traces(tmp_path):
    import shutil

    from distprof.report import write_report

    hung_run(tmp_path / "run")
    shutil.copy(os.path.join(DATA, "hta", "cpu_only_rank-34.pt.trace.json.gz"),
                tmp_path / "run" / "train" / "rank00000" / "step00000001-00000001.pt.trace.json.gz")
    r = write_report(str(tmp_path / "run"), str(tmp_path / "r.html"), workers=1)
    assert r["findings"][0]["id"] == "hang" and r["findings"][0]["evidence"]["ranks"] == [2]
    assert "all_reduce #6 (group 0)" in (tmp_path / "r.html").read_text()
