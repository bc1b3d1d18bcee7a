"""One big file read on several cores: its events list cut into runs that pool workers decode and reduce.

Every test compares the split read with the one-process read of the same file (the columns, the analyses'
figures) and proves the split really happened (runs were handed out), on real GPU traces from tests/data.
Small batches (64 KB) make real traces of a few MB split into many runs.
"""

import gzip
import json
import logging
import os
import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tracekit import DLRM, TRACES, X, same_table, write

from distprof.analysis import analyze
from distprof.analysis.parallel import SplitPool
from distprof.trace import native
from distprof.trace.reader import TraceError, TraceStream, decode_run
from distprof.trace.selection import Selection
from distprof.trace.table import TraceTable

SMALL_BATCH = 64 << 10
REAL = [os.path.join(DLRM, sorted(os.listdir(DLRM))[3]),
        os.path.join(TRACES, "hta", "nccl_data.json.gz"), os.path.join(TRACES, "hta", "ns_resolution_rank-0.pt.trace.json.gz")]


@pytest.fixture(scope="module")
def pool():
    with SplitPool(2) as p:
        yield p


def _read(path, pool=None, sel=None):
    t = TraceStream(str(path), lean=True, batch_bytes=SMALL_BATCH)
    return TraceTable.read(t, sel, pool=pool), t


def _plain(src, tmp_path):
    out = tmp_path / os.path.basename(src).removesuffix(".gz")
    with gzip.open(src, "rb") as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g)
    return out


@pytest.mark.parametrize("src", REAL, ids=lambda p: os.path.basename(p)[:24])
@pytest.mark.parametrize("plain", [True, False], ids=["plain", "gzip"])
def test_a_split_read_of_a_real_trace_is_the_one_process_read(src, plain, pool, tmp_path):
    path = _plain(src, tmp_path) if plain else src
    whole, _ = _read(path)
    split, t = _read(path, pool)
    assert t._deferred >= 3  # runs really went to the workers (spans of the file, or inflated bytes)
    same_table(whole, split)


def test_the_verbs_figures_do_not_depend_on_splitting(tmp_path):
    """The verb as users call it: one file, workers=2 (split, default 1 MB runs) against workers=1."""
    path = str(_plain(REAL[2], tmp_path))
    assert os.path.getsize(path) > 3 * (4 << 20)
    for verb in ("summary", "steps"):
        one = getattr(analyze, verb)(path, workers=1)
        two = getattr(analyze, verb)(path, workers=2)
        assert json.dumps(one, sort_keys=True, default=str) == json.dumps(two, sort_keys=True, default=str), verb
        assert one["files_read"] == 1


def _with_bad_event(tmp_path, bad, name="bad.json"):
    """A real trace with one element in the middle that is not a lean event as the fast path wants it."""
    doc = json.loads(gzip.open(REAL[0], "rb").read())
    ev = doc["traceEvents"]
    text = json.dumps(doc)
    mid = json.dumps(ev[len(ev) // 2])
    assert text.count(mid) == 1
    p = tmp_path / name
    p.write_text(text.replace(mid, mid + ", " + bad))
    return p


@pytest.mark.parametrize("bad", ['{"ph": "X", "name": 7}', '{"ph": "X", "ts": "soon", "name": "x"}'],
                         ids=["wrong-type", "wrong-time"])
def test_a_run_that_does_not_decode_whole_is_read_again_on_the_salvaging_path(bad, pool, tmp_path, caplog):
    path = _with_bad_event(tmp_path, bad)
    whole, t1 = _read(path)
    with caplog.at_level(logging.INFO, logger="distprof.trace.table"):
        split, t2 = _read(path, pool)
    same_table(whole, split)
    assert t2.report == t1.report and t1.report.events_skipped == 1  # skipped and counted, on both paths
    assert "read again in one process" in caplog.text


def test_event_ends_inside_strings_are_no_cut(pool, tmp_path, caplog):
    """Every name holds what looks like the end of one event and the start of the next: a run cut there
    does not decode whole, and the file is read again in one process, with the same result."""
    doc = json.loads(gzip.open(REAL[0], "rb").read())
    for e in doc["traceEvents"]:
        if e.get("ph") == "X":
            e["name"] += ' "}, {"ph": "X"'
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps(doc))
    assert decode_run(b'[{"ph": "X", "name": "a \\"}]') is None
    whole, _ = _read(path)
    with caplog.at_level(logging.INFO, logger="distprof.trace.table"):
        split, t = _read(path, pool)
    assert "read again in one process" in caplog.text  # (the second read resets the stream's counts)
    same_table(whole, split)
    assert whole.names[0].endswith('"}, {"ph": "X"')


def test_a_file_cut_off_mid_run_is_salvaged_as_in_one_process(pool, tmp_path):
    full = _plain(REAL[0], tmp_path)
    cut = tmp_path / "cut.json"
    data = full.read_bytes()
    cut.write_bytes(data[: len(data) * 3 // 4])
    whole, t1 = _read(cut)
    split, t2 = _read(cut, pool)
    assert t1.report.truncated and t2.report == t1.report
    same_table(whole, split)


def test_a_rank_left_out_by_the_selection_stops_the_split_read(pool, tmp_path):
    path = _plain(REAL[0], tmp_path)
    tb, t = _read(path, pool, Selection(ranks={5}))
    assert tb is None and t._deferred <= 1  # stopped at the first run, not read to the end


def test_a_small_file_never_starts_the_workers(tmp_path):
    path = write(tmp_path / "small.json", [X("op", 0, 5), X("op", 10, 5)])
    with SplitPool(2) as p:
        tb, t = _read(path, p)
        # (with the native decoder, the events are one run all the same: reduced here, as the file's tail)
        assert tb.info.events == 2 and t._deferred == (1 if native.available() else 0) and p._pool is None


_REAL_PLAIN = gzip.open(REAL[0], "rb").read()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.integers(0, len(_REAL_PLAIN) - 1), st.sampled_from(b'{}[],:"\\ x0\xff')),
                      min_size=1, max_size=6), cut=st.none() | st.integers(1, len(_REAL_PLAIN)), gz=st.booleans())
# Malformed JSON in the stretch after the runs, read in the driver: the events lost are estimated from the mean size
# of the events read, the runs' events included (found by hypothesis: the split read estimated without them).
@example(edits=[(936029, ord("{"))], cut=None, gz=True)
@example(edits=[(980806, ord("x"))], cut=None, gz=False)  # the same in a plain file's last event
def test_a_damaged_trace_reads_the_same_split_or_not(edits, cut, gz, pool, tmp_path):
    """Bytes changed where a cut may land, or the file cut short: the split read gives what the one-process
    read gives (the same table and report, or the same one-line error)."""
    data = bytearray(_REAL_PLAIN)
    for at, b in edits:
        data[at] = b
    path = tmp_path / ("damaged.json.gz" if gz else "damaged.json")
    path.write_bytes(gzip.compress(bytes(data[:cut]), compresslevel=1, mtime=0) if gz else bytes(data[:cut]))
    outcomes = []
    for p in (None, pool):
        try:
            tb, t = _read(path, p)
            outcomes.append((tb, t.report))
        except TraceError as e:
            outcomes.append(str(e))
    (a, b) = outcomes
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
    else:
        assert a[1] == b[1]
        same_table(a[0], b[0])
