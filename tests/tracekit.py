"""Helpers for analysis tests: run the CLI, read one file's table, write small synthetic traces."""

import gzip
import json
import os
import subprocess
import sys

from conftest import DATA

from distprof.trace.reader import open_trace
from distprof.trace.table import TraceTable

TRACES = DATA
DLRM = os.path.join(TRACES, "dlrm-8rank-v100")
H100 = os.path.join(TRACES, "distprof-h100")  # distprof's own run directories from a real H100 (README there)


# What needs a process of its own: a Ray session joined or started (it would stay in the test's process) and the
# demo (a Ray cluster and workers of its own).
OWN_PROCESS = ("--ray", "demo")


def cli(*args, env=None, process=False, joined=False):
    """Run ``distprof ARGS``; returns (exit code, parsed JSON or stdout text, stderr).

    In this process by default, through click's test runner on the real typer app (``distprof.cli.app``, what the
    ``distprof`` script runs): the same parsing, exit codes, stdout and stderr, and log records reach stderr through
    the CLI's own handler as they would in a process of its own, without paying an interpreter and its imports per
    call (about 1 s of CPU each; the suite makes hundreds). ``env``, ``process=True``, ``--ray`` and ``demo`` run
    ``python -m distprof.cli`` in a child process, as users do (tests of the process itself: its environment,
    imports, a real terminal, signals, memory, use that). ``joined=True``: this process has already joined the
    cluster ``--ray`` names, so the call runs here (``ray_session`` uses that connection and leaves it open);
    joining from a process of its own stays tested where ``--ray`` runs without it."""
    args = [str(a) for a in args]
    own = any(a in OWN_PROCESS and not (joined and a == "--ray") for a in args)
    if env is not None or process or own:
        proc = subprocess.run([sys.executable, "-m", "distprof.cli", *args], capture_output=True, text=True,
                              env=env or os.environ.copy(), timeout=600)
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    else:
        code, out, err = _cli_here(args)
    if "--json" in args and out.strip():
        out = json.loads(out)
    return code, out, err


def _cli_here(args):
    import logging

    from typer.testing import CliRunner

    from distprof import cli as cli_module

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    # As in a process of its own: no handler on the root yet, so the CLI's logging.basicConfig installs its
    # RichHandler on stderr (pytest's capture handlers are put back afterwards).
    root.handlers = []
    named = {name: (lg.level, lg.disabled) for name, lg in logging.root.manager.loggerDict.items()
             if name.startswith("distprof") and isinstance(lg, logging.Logger)}
    try:
        result = CliRunner().invoke(cli_module.app, args, prog_name="distprof", catch_exceptions=False)
    finally:
        for h in root.handlers:
            h.close()
        root.handlers = handlers
        root.setLevel(level)
        for name, (lvl, disabled) in named.items():  # DISTPROF_LOG_LEVEL / -v set distprof's loggers' levels
            lg = logging.getLogger(name)
            lg.setLevel(lvl)
            lg.disabled = disabled
    return result.exit_code, result.stdout, result.stderr


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
