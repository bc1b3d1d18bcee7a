"""Issue 19, items 1-3: nothing distprof writes ever lands outside the folder it must stay in, on a shared scratch
file system where anyone may plant symbolic links. The attacks are real: links planted at the temporary names a
process would have used (``.tmp-{pid}-...`` and ``.NAME.tmp-{pid}`` for this process's pid and the next ones) and
at destination folders, then the real operation (a real Profiler with real torch.profiler answering a trigger
request, ``distprof merge -o`` / ``report -o`` through the CLI, collect's copy and note functions on real files),
and every file outside compared byte for byte and by mtime afterwards."""

import os

import msgspec
import pytest
import torch
from tracekit import X, cli, load, write

import distprof
from distprof import Profiler
from distprof.capture.trigger import RequestStore, make_request
from distprof.integrations.ray.collect import CollectReport, _fetch, _unchanged, _write_note
from distprof.rundir.safefile import UnsafePath, write_bytes
from distprof.rundir.store import manifest_records

PIDS = 64  # this process's pid and the next ones: the names a later process would use


def victims(outside, n=6):
    """Files outside the run directory that an attack aims at; returns a snapshot to compare with."""
    outside.mkdir(exist_ok=True)
    for i in range(n):
        (outside / f"victim{i}").write_bytes(b"precious %d\n" % i)
    return snapshot(outside)


def snapshot(folder):
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def plant(folder, names, outside):
    """A symbolic link at each of ``names`` in ``folder``, each to its own file outside."""
    targets = sorted(outside.iterdir())
    for k, name in enumerate(names):
        os.symlink(targets[k % len(targets)], folder / name)


def pids():
    return range(os.getpid(), os.getpid() + PIDS)


def run_to(prof, step):
    while prof.global_step < step:
        for _ in range(10):
            torch.randn(8, 8) @ torch.randn(8, 8)
        prof.step()


# ---- 1. trigger ------------------------------------------------------------------------------------------------
def test_trigger_request_claim_and_acks_never_write_through_links_at_their_temporaries(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    before = victims(outside)
    cfg = {"save_path": str(run), "trigger": True, "trigger_poll_s": 0, "ranks": "all",
           "torch": {"activities": ["cpu"]}}
    p = Profiler(cfg, rank=0, world_size=1).start()
    run_to(p, 2)
    rid = make_request(2).id
    req_dir = run / ".requests"
    (req_dir / f"{rid}.acks").mkdir(parents=True)
    # Every temporary name the old writer used: the request, the agreed start, this rank's acknowledgement.
    plant(req_dir, [f".tmp-{pid}-{rid}.{ext}" for pid in pids() for ext in ("json", "start")], outside)
    plant(req_dir / f"{rid}.acks", [f".tmp-{pid}-main%2Frank00000.json" for pid in pids()], outside)
    assert distprof.trigger(str(run), steps=2) == rid  # the sender: writes .requests/{rid}.json
    run_to(p, 14)  # the job: claims {rid}.start, acknowledges (accepted, then captured)
    p.stop()
    assert snapshot(outside) == before  # not a byte written outside, no file touched
    (rec,) = manifest_records(str(run))
    assert rec.trigger == rid and rec.complete
    (ack,) = RequestStore(str(run)).acks(rid)
    assert ack.state == "captured" and ack.file == rec.file
    assert msgspec.json.decode((req_dir / f"{rid}.start").read_bytes())["start"] == rec.steps[0]
    # the temporaries this run used are gone; only the planted links stay (never followed, never removed)
    left = [n for n in os.listdir(req_dir) + os.listdir(req_dir / f"{rid}.acks") if n.startswith(".tmp-")]
    assert len(left) == 3 * PIDS and all(os.path.islink(req_dir / n) or os.path.islink(req_dir / f"{rid}.acks" / n)
                                          for n in left)


def test_trigger_acks_folder_that_is_a_link_is_refused_in_one_line(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    before = victims(outside)
    Profiler({"save_path": str(run), "trigger": True}, rank=0, world_size=1).start().stop()  # writes run.json
    rid = make_request(2).id
    (run / ".requests").mkdir()
    os.symlink(outside, run / ".requests" / f"{rid}.acks")
    store = RequestStore(str(run))
    with pytest.raises(UnsafePath, match=r"\.acks is a symbolic link") as e:
        store._replace(store._path(f"{rid}.acks", "main%2Frank00000.json"), b"{}")
    assert "\n" not in str(e.value)
    assert snapshot(outside) == before


# ---- 2. merge -o / report -o -----------------------------------------------------------------------------------
def small_run(folder):
    folder.mkdir()
    for r in range(2):
        evs = [X(f"ProfilerStep#{s}", 1000 * s, 900, cat="user_annotation") for s in (1, 2)]
        evs += [X("aten::mm", 1000 * s + 100, 500 + 50 * r) for s in (1, 2)]
        write(folder / f"rank{r}.pt.trace.json", evs, distributedInfo={"rank": r, "world_size": 2})
    return folder


@pytest.mark.parametrize("verb,name", [("merge", "merged.json"), ("report", "page.html")])
def test_merge_and_report_output_never_written_through_links_at_their_temporaries(tmp_path, verb, name):
    src = small_run(tmp_path / "traces")
    outdir, outside = tmp_path / "out", tmp_path / "outside"
    outdir.mkdir()
    before = victims(outside)
    # the old temporary: .NAME.tmp-PID beside the output, for this process and the next pids
    plant(outdir, [f".{name}.tmp-{pid}" for pid in pids()], outside)
    code, _, err = cli(verb, src, "-o", outdir / name)
    assert code == 0, err
    assert snapshot(outside) == before
    out = outdir / name
    assert not out.is_symlink() and out.stat().st_size > 0
    if verb == "merge":
        assert sum(e["name"] == "aten::mm" for e in load(out)["traceEvents"]) == 4
    else:
        assert out.read_text().rstrip().endswith("</html>")
    assert sorted(n for n in os.listdir(outdir) if not (outdir / n).is_symlink()) == [name]  # no temporary left


# ---- 3. collect ------------------------------------------------------------------------------------------------
def reader(path):
    data = path.read_bytes()
    return lambda offset, n: data[offset:offset + n]


def test_collect_copy_refuses_a_dest_folder_that_is_a_link_and_writes_nothing_outside(tmp_path):
    node, dest, outside = tmp_path / "node", tmp_path / "dest", tmp_path / "outside"
    (node / "actor" / "rank00000").mkdir(parents=True)
    trace = node / "actor" / "rank00000" / "step00000001-00000002.pt.trace.json.gz"
    trace.write_bytes(b"x" * 5000)
    before = victims(outside)
    dest.mkdir()
    os.symlink(outside, dest / "actor")  # dest/actor -> a folder outside
    rel = "actor/rank00000/step00000001-00000002.pt.trace.json.gz"
    assert not _unchanged(str(dest), rel, 5000, None)  # never judged through the link
    with pytest.raises(UnsafePath, match=r"dest/actor is a symbolic link") as e:
        _fetch(reader(trace), 5000, str(dest), rel)
    assert "\n" not in str(e.value)
    assert snapshot(outside) == before  # no rank00000 created there, nothing written


def test_collect_copy_and_note_never_write_through_links_at_their_temporaries(tmp_path):
    node, dest, outside = tmp_path / "node", tmp_path / "dest", tmp_path / "outside"
    files = {"run.json": b'{"a": 1}', "actor/role.json": b'{"world_size": 1}',
             "actor/rank00000/manifest.jsonl": b"{}\n",
             "actor/rank00000/step00000001-00000002.pt.trace.json.gz": os.urandom(70000)}
    for rel, data in files.items():
        (node / rel).parent.mkdir(parents=True, exist_ok=True)
        (node / rel).write_bytes(data)
    before = victims(outside, n=8)
    for rel in [*files, "collect.json"]:
        folder = dest / os.path.dirname(rel)
        folder.mkdir(parents=True, exist_ok=True)
        plant(folder, [f".tmp-{pid}-{os.path.basename(rel)}" for pid in pids()], outside)
    for rel, data in files.items():
        _fetch(reader(node / rel), len(data), str(dest), rel)
    report = CollectReport(dest=str(dest))
    report.unreachable_nodes.append({"node_id": "n1", "address": "10.0.0.2", "ranks": [{"role": "actor", "rank": 1}],
                                     "error": "the node is dead", "not_copied": None})
    _write_note(str(dest), report)
    assert snapshot(outside) == before
    for rel, data in files.items():
        assert (dest / rel).read_bytes() == data and not (dest / rel).is_symlink()
    assert msgspec.json.decode((dest / "collect.json").read_bytes())["unreachable_nodes"][0]["node_id"] == "n1"
    fresh = tmp_path / "new" / "dest"  # a dest that does not exist yet is made, as before
    _fetch(reader(node / "run.json"), 8, str(fresh), "actor/rank00000/x.json")
    assert (fresh / "actor" / "rank00000" / "x.json").read_bytes() == files["run.json"]


def test_the_writer_refuses_leaving_its_root_and_keeps_the_first_writer(tmp_path):
    outside = tmp_path / "outside"
    before = victims(outside)
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(UnsafePath):
        write_bytes(str(root), "../outside/victim0", b"no")
    assert write_bytes(str(root), "a/b.json", b"1", exclusive=True)
    assert not write_bytes(str(root), "a/b.json", b"2", exclusive=True)  # first writer wins
    os.symlink(outside / "victim1", root / "a" / "c.json")
    assert not write_bytes(str(root), "a/c.json", b"3", exclusive=True)  # a link there counts as taken
    write_bytes(str(root), "a/c.json", b"4")  # a replace renames over the link itself
    assert (root / "a" / "b.json").read_bytes() == b"1" and (root / "a" / "c.json").read_bytes() == b"4"
    write_bytes(str(root), "a\\b.json", b"5")  # a backslash is part of a POSIX name, not a separator
    assert (root / "a\\b.json").read_bytes() == b"5"
    assert snapshot(outside) == before
