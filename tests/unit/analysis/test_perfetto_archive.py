"""merge --format perfetto: a TAR of the per-rank traces' bytes and a perfetto_manifest, checked against the format
as google/perfetto defines it (docs/reference/perfetto-manifest.md; tar_trace_reader.cc reads the archive)."""

import gzip
import json
import os
import tarfile

import pytest
from tracekit import DLRM, X, cli, write

from distprof.analysis import perfetto_archive
from distprof.analysis.perfetto_archive import MANIFEST_NAME, archive_traces, member_name

CLOCKS = {"REALTIME", "REALTIME_COARSE", "MONOTONIC", "MONOTONIC_COARSE", "MONOTONIC_RAW", "BOOTTIME"}


def read_archive(path):
    """The members as Perfetto's TAR reader sees them, checking what it needs: GNU or ustar headers (no PAX, whose
    names it ignores), regular files, names under 100 characters and not hidden; two zero blocks at the end."""
    data = open(path, "rb").read()
    assert len(data) % 512 == 0 and data[-1024:] == b"\0" * 1024
    members = {}
    with tarfile.open(path) as t:
        for m in t.getmembers():
            assert m.isreg() and not m.pax_headers and len(m.name) < 100
            assert not any(part.startswith(".") for part in m.name.split("/"))
            members[m.name] = t.extractfile(m).read()
    pos = 0
    while data[pos:pos + 512] != b"\0" * 512:  # every header is GNU's ("ustar  \0" at 257), a regular file
        head = data[pos:pos + 512]
        assert head[257:265] == b"ustar  \0" and head[156:157] == b"0"
        size = int(head[124:136].rstrip(b"\0 ") or b"0", 8)
        pos += 512 + -(-size // 512) * 512
    return members


def check_manifest(doc, names):
    """The manifest's rules (docs/reference/perfetto-manifest.md): version 1; each entry names a member; machine
    names non-empty; a clock override has sync_to.file naming an entry, an integer offset_ns, and (a pin: the
    files are clockless JSON) no clock; attributes strings or integers under non-empty keys."""
    m = doc["perfetto_manifest"]
    assert set(m) <= {"version", "trace_time", "files", "attributes"} and m["version"] == 1
    paths = [f["path"] for f in m["files"]]
    assert len(set(paths)) == len(paths) and set(paths) <= names
    for f in m["files"]:
        assert set(f) <= {"path", "machine", "clocks"} and f["machine"]["name"]
        if "clocks" in f:
            c = f["clocks"]
            assert c["sync_to"]["file"] in paths and c["sync_to"]["file"] != f["path"]
            assert "clock" not in c and "clock" not in c["sync_to"] and isinstance(c["offset_ns"], int)
    assert all(k and isinstance(v, (str, int)) for k, v in m.get("attributes", {}).items())
    return m


def test_dlrm_archive_holds_every_rank_byte_for_byte_with_a_valid_manifest(tmp_path):
    out = str(tmp_path / "merged.tar")
    r = archive_traces(DLRM, out, workers=1)
    members = read_archive(out)
    raw = members.pop(MANIFEST_NAME)
    assert raw.startswith(b'{"perfetto_manifest"')  # how Trace Processor finds it (by content)
    m = check_manifest(json.loads(raw), set(members))
    assert r["files"] == len(members) == len(m["files"]) == 8 and r["errors"] == [] and r["format"] == "perfetto"
    for info in r["members"]:  # each member is exactly the JSON its .gz holds (nothing decoded or written again)
        with gzip.open(info["path"], "rb") as f:
            assert members[info["name"]] == f.read()
    assert sorted(e["machine"]["name"] for e in m["files"]) == [f"rank {k}" for k in range(8)]
    # The first member by name is the reference (it claims the trace's clock): the file that starts earliest.
    first = min(members)
    ref = {"path": first, "machine": {"name": r["members"][0]["label"]}}
    assert [e for e in m["files"] if "clocks" not in e] == [ref]
    assert r["members"][0]["name"] == first and r["json_bytes"] == sum(map(len, members.values()))


def test_clocks_relate_each_file_to_the_earliest_so_events_keep_their_absolute_time(tmp_path):
    """Kineto's relative ts (baseTimeNanoseconds, ignored by Perfetto) and an old trace's epoch-µs ts: each file is
    pinned to the earliest one at the difference of their time bases, so ts + offset is the event's absolute time."""
    src = tmp_path / "in"
    src.mkdir()
    base = 1_700_000_000_000_000  # µs
    write(src / "rank-0.json", [X("a", 500.0, 10)], baseTimeNanoseconds=(base + 1000) * 1000)
    write(src / "rank-1.json.gz", [X("b", 100.0, 10)], baseTimeNanoseconds=base * 1000)
    write(src / "rank-2.json", [X("c", base + 2000.0, 10)])  # absolute µs, no base
    r = archive_traces(str(src), str(tmp_path / "m.tar"), workers=1)
    by_rank = {x["rank"]: x for x in r["members"]}
    assert r["members"][0]["rank"] == 1  # starts earliest (base + 100 µs)
    m = check_manifest(json.loads(read_archive(tmp_path / "m.tar")[MANIFEST_NAME]), {x["name"] for x in r["members"]})
    offsets = {e["path"]: e.get("clocks", {}).get("offset_ns", 0) for e in m["files"]}
    first_ts = {0: 500.0, 1: 100.0, 2: base + 2000.0}
    # On the reference's timeline (µs): ts + offset; absolute = that + the reference's base.
    placed = {k: first_ts[k] + offsets[by_rank[k]["name"]] / 1000 + base for k in first_ts}
    assert placed == {0: base + 1500.0, 1: base + 100.0, 2: base + 2000.0}
    assert r["base_time_us"] == base + 100.0


def test_selection_picks_ranks_roles_and_the_files_holding_the_steps(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for k in range(4):
        step = 1 if k < 2 else 3
        write(src / f"rank-{k}.json", [X(f"ProfilerStep#{step}", 10.0, 100), X("op", 20.0, 5)])
    code, doc, err = cli("merge", src, "-o", tmp_path / "r.tar", "--ranks", "1,3", "--json")
    assert code == 0, err
    assert doc["format"] == "perfetto" and sorted(x["rank"] for x in doc["members"]) == [1, 3]
    assert doc["skipped"] == 2 and doc["scope"]["ranks"] == [1, 3]
    code, doc, err = cli("merge", src, "-o", tmp_path / "s.json.tar", "--format", "perfetto", "--steps", "3", "--json")
    assert code == 0, err
    assert sorted(x["rank"] for x in doc["members"]) == [2, 3]
    members = read_archive(tmp_path / "s.json.tar")
    for x in doc["members"]:  # whole files: the bytes as they are
        assert members[x["name"]] == open(x["path"], "rb").read()


def test_roles_name_the_machines_and_select_files(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    for role, world in (("actor", 2), ("rollout", 1)):
        for k in range(world):
            write(src / f"{role}-rank-{k}.json", [X("op", 1.0, 1)], distprof={"role": role})
    code, doc, err = cli("merge", src, "-o", tmp_path / "m.tar", "--roles", "actor", "--json")
    assert code == 0, err
    names = {e["machine"]["name"] for e in doc["manifest"]["perfetto_manifest"]["files"]}
    assert names == {"actor rank 0", "actor rank 1"} and doc["skipped"] == 1


def test_bad_inputs_end_in_one_line_and_the_right_exit_code(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    write(src / "rank-0.json", [X("a", 1.0, 1)])
    (src / "rank-1.json").write_text("not json")
    code, doc, err = cli("merge", src, "-o", tmp_path / "m.tar", "--json")  # one rank unreadable: the other kept
    assert code == 1 and [e["path"] for e in doc["errors"]] == [str(src / "rank-1.json")]
    assert [x["rank"] for x in doc["members"]] == [0]
    for args, says in ((["-o", tmp_path / "m.json", "--format", "perfetto"], "ending in .tar"),
                       (["-o", tmp_path / "m.tar", "--format", "zip"], "--format zip"),
                       (["-o", tmp_path / "nowhere" / "m.tar"], "does not exist"),
                       (["-o", tmp_path / "m2.tar", "--ranks", "7"], "no readable trace")):
        code, _, err = cli("merge", src, *args)
        assert code == 2 and says in err and "Traceback" not in err, (args, err)
        assert len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "m2.tar")
    code, _, err = cli("merge", tmp_path / "empty-dir-missing", "-o", tmp_path / "x.tar")
    assert code == 2 and "Traceback" not in err


def test_a_cut_gzip_is_archived_as_far_as_it_goes_and_reported(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    write(src / "rank-0.json", [X("a", 1.0, 1)])
    good = write(src / "rank-1.json.gz", [X(f"op{i}", float(i), 1) for i in range(2000)])
    data = open(good, "rb").read()
    open(good, "wb").write(data[: len(data) // 2])
    r = archive_traces(str(src), str(tmp_path / "m.tar"), workers=1)
    (s,) = r["salvaged"]
    assert s["path"] == good and s["notes"]
    body = read_archive(tmp_path / "m.tar")[next(x["name"] for x in r["members"] if x["rank"] == 1)]
    whole = gzip.decompress(data)
    assert 0 < len(body) < len(whole) and whole.startswith(body)  # what the stream held, as it held it


def test_size_warning_names_the_native_processor(tmp_path, monkeypatch):
    monkeypatch.setattr(perfetto_archive, "VIEWER_LIMIT_BYTES", 10)
    r = archive_traces(DLRM, str(tmp_path / "m.tar"), workers=1)
    (w,) = r["warnings"]
    assert "trace_processor server http" in w and "--ranks" in w


@pytest.mark.parametrize("label", ["rank 3", "actor/micro step rank 12", "..", "", "x" * 300, "ü/ß rank 1"])
def test_member_names_sort_in_order_are_plain_and_short(label):
    a, b = member_name(9, label), member_name(10, label)
    assert a < b and a.endswith(".json") and len(a) < 100 and not a.startswith(".") and "/" not in a
    assert a.isascii()
