"""Inputs found by a red-team review of the split read (one file, runs decoded in pool workers) and of the ISA-L
inflate: each once made the split read differ from the one-process read, or miscounted, or mixed two files.

Runs are 64 KB here (as in test_analysis_split.py), so a trace of a few hundred KB is split into many runs.
"""

import gzip
import http.server
import json
import os
import signal
import threading
import zlib

import pytest
from tracekit import DLRM, X, cli, same_table, write

from distprof.analysis.parallel import SplitPool
from distprof.trace.reader import TraceError, TraceStream, decode_run
from distprof.trace.source import byte_chunks
from distprof.trace.table import TraceTable
from distprof.trace.vocab import Kind

SMALL_BATCH = 64 << 10
REAL = os.path.join(DLRM, sorted(os.listdir(DLRM))[3])


@pytest.fixture(scope="module")
def pool():
    with SplitPool(2) as p:
        yield p


def _read(path, pool=None, **kw):
    t = TraceStream(str(path), lean=True, batch_bytes=SMALL_BATCH, **kw)
    return TraceTable.read(t, None, pool=pool), t


def _real_events():
    return json.loads(gzip.open(REAL, "rb").read())["traceEvents"]


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_no_event_boundary_after_runs_were_handed_out_is_salvaged_as_in_one_process(gz, pool, tmp_path):
    """A real trace, then one event longer than the search limit (no event boundary for MBs), then more events.
    One process keeps the events before it (truncated, 'stopped reading'); the split read took them for 'no event
    yet' (its runs are not counted here) and refused the file as not a trace."""
    ev = _real_events()
    huge = X("x" * (3 << 20), 1, 1)
    path = write(tmp_path / ("long.json.gz" if gz else "long.json"), ev + [huge] + ev[:10])
    whole, t1 = _read(path, search_limit=1 << 20)
    split, t2 = _read(path, pool, search_limit=1 << 20)
    assert t1.report.truncated and "stopped reading" in t1.report.notes[-1]
    assert t2.report == t1.report
    same_table(whole, split)


@pytest.mark.parametrize("n", [1_097_576, 1_100_576])
def test_an_event_just_past_the_search_limit_is_judged_as_in_one_process(n, pool, tmp_path):
    """Whether the end of an event about as long as the search limit is found depends on where the batches fell:
    the split read (its driver's batches fall elsewhere) read such an event whole where one process gave up on
    it (truncated). An element longer than a batch after runs were handed out now sends the file to one process."""
    ev = _real_events()
    path = write(tmp_path / "long.json", ev + [X("x" * n, 1, 1)] + ev[:10])
    whole, t1 = _read(path, search_limit=1 << 20)
    split, t2 = _read(path, pool, search_limit=1 << 20)
    assert t1.report.truncated  # (these sizes: one process stops at this event)
    assert t2.report == t1.report
    same_table(whole, split)


def _kernel(i, stream):
    return X(f"kernel{i % 5}", 10 * i, 5, cat="kernel", pid=0, tid=7, correlation=i, stream=stream)


def test_named_streams_are_numbered_by_first_appearance_split_or_not(pool, tmp_path):
    """Streams that are names get numbers 10**15 + (order of first appearance). They were numbered in the order
    of a set (hash order: a different figure from one run of the CLI to the next), and a run reduced in a worker
    renumbered its names by number, so a real stream id equal to a name's number in that run was moved too."""
    names = [f"stream-{c}" for c in "hgfedcba"]  # all first seen in one batch
    pad = [X(f"op{i}", 10 * i, 5) for i in range(4000)]  # ~500 KB: the next kernels are in a run of their own
    evs = [_kernel(i, s) for i, s in enumerate(names)] + pad \
        + [_kernel(20, names[5]), _kernel(21, 10**15), _kernel(22, 3)] + pad + [_kernel(23, names[0])]
    path = write(tmp_path / "streams.json", evs)
    whole, _ = _read(path)
    split, t = _read(path, pool)
    assert t._deferred >= 3
    same_table(whole, split)
    assert (whole.kind == Kind.KERNEL).sum() == 12
    by_corr = dict(zip(whole.corr[whole.corr >= 0].tolist(), whole.stream[whole.corr >= 0].tolist()))
    assert [by_corr[i] for i in range(8)] == [10**15 + k for k in range(8)]  # first seen, first numbered
    assert by_corr[20] == 10**15 + 5 and by_corr[22] == 3 and by_corr[23] == 10**15


def _corrupt_crc(tmp_path):
    data = bytearray(gzip.compress(gzip.open(REAL, "rb").read(), mtime=0))
    data[-8] ^= 1  # the CRC: ISA-L and zlib both find it at the very end, after every byte was inflated
    p = tmp_path / "crc.json.gz"
    p.write_bytes(bytes(data))
    return p


def test_on_read_counts_each_byte_of_the_file_once(pool, tmp_path):
    """Progress: a gzip file read again with zlib after ISA-L failed was counted twice, and a split plain file
    counted the bytes before its first run twice."""
    gz = _corrupt_crc(tmp_path)
    seen, problem = [], []
    out = b"".join(byte_chunks(str(gz), SMALL_BATCH, seen.append, problem))
    assert "corrupt" in problem[0] and out == gzip.open(REAL, "rb").read()  # everything kept, the damage said
    assert sum(seen) == os.path.getsize(gz)
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.open(REAL, "rb").read())
    for p in (None, pool):
        seen = []
        t = TraceStream(str(plain), lean=True, batch_bytes=SMALL_BATCH, on_read=seen.append)
        TraceTable.read(t, None, pool=p)
        assert sum(seen) == os.path.getsize(plain), "split" if p else "one process"


def test_a_file_replaced_while_it_is_split_is_never_mixed_with_the_new_one(tmp_path):
    """Workers open the file again by path: one replaced since (same size, other names) must not be read as the
    rest of the first."""
    data = gzip.open(REAL, "rb").read()
    path, other = tmp_path / "t.json", tmp_path / "new.json"
    path.write_bytes(data)
    other.write_bytes(data.replace(b"ProfilerStep", b"ProfilerStop"))
    assert len(other.read_bytes()) == len(data) and other.read_bytes() != data
    t = TraceStream(str(path), lean=True, batch_bytes=SMALL_BATCH)
    batches = t.batches(defer=True)
    span = next(b for b in batches if not isinstance(b, list))
    assert decode_run(span) is not None  # the file as it was: its run decodes
    os.replace(other, path)
    assert decode_run(span) is None  # a worker: the file is read again in one process (the new file, whole)
    with pytest.raises(TraceError, match="replaced while it was read"):
        list(batches)  # the driver: one line naming the file, not the old file's start with the new one's end
    assert zlib.crc32(path.read_bytes()) != zlib.crc32(data)


class _KillingPool(SplitPool):
    """A SplitPool one of whose workers is killed (as the OOM killer would) once a few runs are in flight."""

    def __init__(self, workers, kill_at):
        super().__init__(workers)
        self.kill_at, self.submitted, self.killed = kill_at, 0, None

    def submit(self, fn, *args):
        fut = super().submit(fn, *args)
        self.submitted += 1
        if self.submitted == self.kill_at:
            pid = next(iter(self._pool._processes))
            os.kill(pid, signal.SIGKILL)
            self.killed = pid
        return fut


def test_a_worker_killed_mid_read_sends_the_file_to_the_one_process_read(tmp_path):
    """A dead worker breaks the pool (every run in flight fails): the file is read again here, not an internal error."""
    path = tmp_path / "plain.json"
    path.write_bytes(gzip.open(REAL, "rb").read())
    whole, _ = _read(path)
    with _KillingPool(2, kill_at=3) as p:
        split, _ = _read(path, p)
        assert p.killed is not None
    same_table(whole, split)


def test_the_cli_reads_a_file_with_an_event_of_65_mb_on_two_workers_as_on_one(tmp_path):
    """The defect above as users met it (default 4 MB runs, 64 MB search limit): --workers 1 finds the end of the
    65 MB event (the search stops a chunk past the limit) and reads the file whole (exit 0); --workers 2 gave up
    on it and called the file 'not a trace' (exit 2)."""
    ev = _real_events()
    path = write(tmp_path / "long.json", ev * 12 + [X("x" * (65 << 20), 1, 1)] + ev[:5])
    outs = [cli("summary", path, "--workers", w, "--json") for w in (1, 2)]
    (c1, j1, _), (c2, j2, _) = outs
    assert c1 == c2 == 0 and j1 == j2
    assert j1["files_read"] == 1 and not j1["errors"]


class _NoLengthHandler(http.server.BaseHTTPRequestHandler):
    """Serves files with no Content-Length (and no ranges): fsspec reads them as a stream that cannot seek."""
    protocol_version = "HTTP/1.0"
    root = ""

    def do_HEAD(self):
        self.send_response(200)
        self.end_headers()

    def do_GET(self):
        data = open(os.path.join(self.root, os.path.basename(self.path)), "rb").read()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("damage", ["cut", "crc"])
def test_a_damaged_gzip_stream_that_cannot_seek_is_salvaged_as_a_local_file(damage, tmp_path):
    """ISA-L gives up on a damaged stream and zlib reads it again from the start: an HTTP stream that cannot seek
    back made the whole file unreadable ('Cannot seek streaming HTTP file'); it is opened again instead."""
    data = _corrupt_crc(tmp_path).read_bytes()
    if damage == "cut":
        data = gzip.compress(gzip.open(REAL, "rb").read(), mtime=0)
        data = data[: len(data) * 3 // 4]
    local = tmp_path / "t.json.gz"
    local.write_bytes(data)
    handler = type("H", (_NoLengthHandler,), {"root": str(tmp_path)})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}/t.json.gz"
        import fsspec
        with fsspec.open(url, "rb").open() as f:
            f.read(10)
            with pytest.raises(ValueError, match="Cannot seek"):
                f.seek(0)  # (what made the file unreadable)
        got = []
        for p in (url, str(local)):
            problem = []
            got.append((b"".join(byte_chunks(p, SMALL_BATCH, None, problem)), problem))
            t = TraceStream(p, lean=True, batch_bytes=SMALL_BATCH)
            got.append((sum(len(b) for b in t.batches()), t.report))
    finally:
        srv.shutdown()
        srv.server_close()
    assert got[0] == got[2] and got[1] == got[3]
    assert got[0][1] and got[3][1].salvaged


def test_keys_read_by_a_split_pass_that_fails_do_not_outlive_it(pool, tmp_path):
    """The events list closes early near its end (a `]` and a key where a comma was): one process stops there and
    ignores the rest, baseTimeNanoseconds at the end included. The split pass read past it (the damage was in a
    run), applied baseTimeNanoseconds, and the one-process read that followed kept it: times shifted by 1.7e15 µs."""
    doc = {"traceEvents": _real_events(), "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    text = json.dumps(doc)
    evs = doc["traceEvents"]
    # Near the end (two runs before the last stretch): the failing run is met only at the last drain.
    k = next(k for k in range(len(evs) - 1, 0, -1) if text.rfind(json.dumps(evs[k])) < len(text) - 2 * SMALL_BATCH)
    mid = json.dumps(evs[k])
    assert text.count(mid) == 1
    path = tmp_path / "closed-early.json"
    path.write_text(text.replace(mid + ", ", mid + '], "junk": '))
    whole, t1 = _read(path)
    split, t2 = _read(path, pool)
    assert "not valid JSON" in t1.report.notes[0] and t1.offset_us == 0.0
    assert t2.offset_us == t1.offset_us and t2.report == t1.report
    same_table(whole, split)
