"""What the reader reads of a file that grows while it is read, and what it says about a corrupt region (issue 19,
items 16 and 17): a file appended to forever was followed forever (80 MB/s: killed at 90 s, 7.6 GB), and a 23 MB
corrupt region (20% of the events) was reported as "1 event skipped"."""

import gzip
import json
import subprocess
import sys

import pytest
from tracekit import X, cli

from distprof.trace.reader import TraceStream, decode_run

# A writer process that appends ``CHUNK`` to the file each time it is poked (one byte on stdin), answering once the
# bytes are on disk; at most ``LIMIT`` appends (so that a reader that follows the file still ends, and fails the
# test instead of hanging it). The test stops it (closes its stdin) after the reader has returned.
WRITER = r"""
import sys
path, chunk, limit = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3])
n = 0
with open(path, "ab", buffering=0) as f:
    while sys.stdin.buffer.read(1):
        if n < limit:
            f.write(chunk)
            n += 1
        sys.stdout.write(f"{n}\n")
        sys.stdout.flush()
print(n, "appends", file=sys.stderr)
"""
LIMIT = 200


def _event(i):
    return json.dumps(X(f"k{i}", i * 10, 5))


@pytest.mark.parametrize("how", ["plain", "split", "gzip"])
def test_a_file_growing_while_read_is_read_up_to_its_size_at_open(tmp_path, how):
    n = 400
    head = '{"traceEvents": [' + "".join(_event(i) + ", " for i in range(n))  # a writer mid-way through its events
    p = tmp_path / ("rank-0.json.gz" if how == "gzip" else "rank-0.json")
    if how == "gzip":
        # A gzip writer flushes whole members: each append is a member of its own, readable as it lands.
        p.write_bytes(gzip.compress(head.encode()))
    else:
        p.write_text(head)
    size_at_open = p.stat().st_size
    more = "".join(_event(i) + ", " for i in range(n, n + 20))
    args = [sys.executable, "-c", WRITER, str(p), more, str(LIMIT)]
    if how == "gzip":  # the chunk is bytes: written by the child as a gzip member of its own
        args[2] = WRITER.replace("sys.argv[2].encode()", "__import__('gzip').compress(sys.argv[2].encode())")
    writer = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=False)
    pokes = []

    def on_read(nbytes):  # every read of the file's bytes lets the writer append once more
        writer.stdin.write(b"x")
        writer.stdin.flush()
        pokes.append(int(writer.stdout.readline()))

    try:
        s = TraceStream(str(p), batch_bytes=4096, on_read=on_read, lean=how == "split")
        names = []
        for batch in s.batches(defer=how == "split"):
            if not isinstance(batch, list):
                batch = decode_run(batch)
            names += [e.name for e in batch if getattr(e, "name", "")]
    finally:
        writer.stdin.close()
        writer.wait(timeout=60)
        writer.stdout.close()
    assert pokes and pokes[-1] > 0 and p.stat().st_size > size_at_open  # the file really grew while it was read
    # Every event the file held when opened, and none appended since.
    assert names == [f"k{i}" for i in range(n)], (len(names), pokes[-1])
    assert s.report.truncated  # it ended inside the events list, at its size when opened
    grew = [x for x in s.report.notes if "grew" in x]
    assert grew == [f"the file grew while it was read: only the {size_at_open:,} bytes it had when opened were read"]


@pytest.mark.parametrize("junk", ["random", "zeros"])
def test_a_corrupt_region_says_how_many_bytes_and_events_it_cost(tmp_path, junk):
    import random

    events = [json.dumps(X(f"k{i}", i * 10, 5, cat="kernel", pid=0, tid=7)).encode() for i in range(60_000)]
    body = b", ".join(events)
    # Over 2 MB of events in the middle overwritten (a disk or copy gone wrong), the file's length unchanged.
    a, b = len(body) * 3 // 10, len(body) * 7 // 10
    rng = random.Random(19)
    bad = rng.randbytes(b - a) if junk == "random" else b"\0" * (b - a)
    p = tmp_path / "rank-0.json"
    p.write_bytes(b'{"traceEvents": [' + body[:a] + bad + body[b:] + b"]}")
    # The events lost: those not whole on either side of the region.
    starts = [0]
    for e in events:
        starts.append(starts[-1] + len(e) + 2)
    kept = [i for i, e in enumerate(events) if starts[i] + len(e) <= a or starts[i] >= b]
    lost = len(events) - len(kept)
    assert lost > 20_000 and len(bad) > (2 << 20)
    s = TraceStream(str(p), batch_bytes=1 << 16, lean=True)
    names = [e.name for batch in s.batches() for e in batch]
    assert names == [f"k{i}" for i in kept]  # every whole event on either side is kept
    r = s.report.to_dict()
    # The bytes jumped over: the region and the broken events at its edges (less than one event more each side).
    assert len(bad) <= r["bytes_skipped"] < len(bad) + 2 * max(map(len, events)) + 4
    # The events they held, estimated from the mean event size: within 2% of the truth, and said to be an estimate.
    assert abs(r["events_lost_estimate"] - lost) <= lost // 50, (r["events_lost_estimate"], lost)
    assert r["events_skipped"] == 1 and not r["truncated"]  # one place
    (note,) = r["notes"]
    assert note.startswith(f"{r['bytes_skipped']:,} bytes that are not valid JSON skipped (1 place): "
                           f"about {r['events_lost_estimate']:,} events lost (an estimate, at ")
    if junk != "random":
        return
    # The CLI: --json lists both figures, and the text output's salvage line says them.
    code, doc, _ = cli("summary", p, "--json")
    assert code == 0 and [(x["bytes_skipped"], x["events_lost_estimate"]) for x in doc["salvaged"]] == [
        (r["bytes_skipped"], r["events_lost_estimate"])]
    code, _, err = cli("summary", p)
    line = " ".join(err.split())  # one salvage line, folded to the terminal's width
    assert code == 0 and f"about {r['events_lost_estimate']:,} events lost (an estimate" in line
    assert f"{r['bytes_skipped']:,} bytes that are not valid JSON skipped" in line



def test_a_group_ranks_string_nested_past_json_depth_is_no_traceback():
    """Found by the native decoder's differential fuzzing: "Process Group Ranks" as a string of 1,000 nested
    brackets made json.loads raise RecursionError out of the reduction. The ranks are unknown instead."""
    from distprof.trace.columns import reduce_run

    run = ('[{"ph":"X","cat":"kernel","args":{"Collective name":"a","Process Group Ranks":"' + "[" * 1000
           + '"}}]').encode()
    cols = reduce_run(run)
    assert cols is not None and cols.meta == {0: (None, "a")}
