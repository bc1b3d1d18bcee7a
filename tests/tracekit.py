"""Helpers for analysis tests: run the CLI, read one file's table, write small synthetic traces."""

import gzip
import json
import os
import subprocess
import sys

from distprof.analysis.reader import open_trace
from distprof.analysis.table import TraceTable

from conftest import SHARED

TRACES = os.path.join(SHARED, "data", "traces")
DLRM = os.path.join(TRACES, "dlrm-8rank-v100")
H100 = os.path.join(TRACES, "distprof-h100")  # distprof's own run directories from a real H100 (README there)


def cli(*args, env=None):
    """Run ``distprof ARGS``; returns (exit code, parsed JSON or stdout text, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", *map(str, args)], capture_output=True, text=True,
                          env=env or os.environ.copy(), timeout=600)
    out = proc.stdout
    if "--json" in args and out.strip():
        out = json.loads(out)
    return proc.returncode, out, proc.stderr


def table(path, **kw):
    """One file's TraceTable (whole file in memory: small traces only)."""
    return TraceTable.read(open_trace(str(path), lean=True, **kw))


TABLE_COLUMNS = ("ts", "dur", "end", "kind", "name", "track", "corr", "ext", "stream", "comm", "step", "scope")


def same_table(a, b):
    """Two TraceTables of one file hold the same columns, names, threads, metadata, steps and identity."""
    import numpy as np

    for c in TABLE_COLUMNS:
        np.testing.assert_array_equal(getattr(a, c), getattr(b, c), err_msg=c)
    assert a.names == b.names
    assert [(t.pid, t.tid, t.name, t.kind) for t in a.tracks] == [(t.pid, t.tid, t.name, t.kind) for t in b.tracks]
    assert a.meta == b.meta
    np.testing.assert_array_equal(a.steps, b.steps)
    assert a.info == b.info


def load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def write(path, events, **head):
    """A trace file in the object form (gzipped when the name ends .gz)."""
    doc = {**head, "traceEvents": events}
    data = json.dumps(doc).encode()
    path = str(path)
    with (gzip.open(path, "wb") if path.endswith(".gz") else open(path, "wb")) as f:
        f.write(data)
    return path


def X(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    e = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        e["args"] = {k.replace("_", " "): v for k, v in args.items()}
    return e
