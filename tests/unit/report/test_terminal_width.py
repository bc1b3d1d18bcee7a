"""Every table the CLI prints fits the terminal it is printed on (issue 18, item 6).

Each verb runs in a real pseudo-terminal whose size is set with TIOCSWINSZ, as a user's terminal sets it; rich
reads the width from the pty (no COLUMNS in the environment). At 80 and 120 columns the output must have no line
wider than the terminal (stdout and stderr, the progress bar included), no figure cut by an ellipsis
(``463.2…``), the columns and phase names it is there to show, and the same figures as the verb's JSON for the
same input. Layout rules themselves (middle cuts, wrapping, splitting a table too wide) are checked directly on
``distprof.report.termfit`` below, without a process.
"""

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from conftest import TESTS
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.cells import cell_len
from rich.console import Console
from rich.text import Text
from tracekit import DLRM, TRACES, X, write

import distprof
from distprof.analysis import analyze
from distprof.report.termfit import Col, FitTable, cut_middle, distinct_cuts, wrap
from distprof.report.terminal import us

H100 = os.path.join(TRACES, "distprof-h100")
GLOO = os.path.join(H100, "ddp-gloo-cuda-slow-rank1")   # 2 ranks on a GPU, rank 1 the straggler
HF = os.path.join(H100, "hf-gpt2")                     # HF Trainer phases, H100 kernel names
VERL = os.path.join(TESTS, "unit", "config", "dialects", "verl_ppo_torch.yaml")
SRC = os.path.dirname(os.path.dirname(distprof.__file__))
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]|\x1b[=>78]")
CUT_FIGURE = re.compile(r"\d…|…\d")


def run_in_pty(argv, cols, rows=50):
    """``python ARGV`` with stdout and stderr on a pty of ``cols`` x ``rows``. Returns (exit code, lines of what
    was written with ANSI escapes removed, each line split at carriage returns: a line the progress bar rewrote
    is each of its versions)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(TERM="xterm-256color", PYTHONPATH=os.pathsep.join([SRC, *filter(None, [env.get("PYTHONPATH")])]))
    proc = subprocess.Popen([sys.executable, *argv], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env,
                            close_fds=True)
    os.close(slave)
    data, deadline = b"", time.monotonic() + 300
    try:
        while True:  # until EOF: the child and everything it started closed the pty
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                proc.kill()
                pytest.fail(f"{argv} wrote nothing for 300 s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other end is closed
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(master)
    code = proc.wait(timeout=60)
    text = ANSI.sub("", data.decode("utf-8", "replace")).replace("\r\n", "\n")
    return code, [seg for line in text.split("\n") for seg in line.split("\r")]


def cli_in_pty(cols, *args):
    return run_in_pty(["-m", "distprof.cli", *map(str, args)], cols)


def rl_run(root):
    """A demo-like run directory: rollout, ref and a 2-rank actor (rank 1 slow in actor/prepare, so the actor's
    all-reduce waits for it), steps 1-3, each rank one window with its manifest line, one job's clock."""
    spec = {("rollout", 0): [("rollout/generate", 0, 70_000)], ("ref", 0): [("ref/log_probs", 80_000, 25_000)]}
    for r in (0, 1):
        spec[("actor", r)] = [("actor/prepare", 110_000, 10_000 + 40_000 * r), ("actor/update", 150_000, 20_000),
                              ("actor/sync_weights_to_the_rollout_engine", 172_000, 5_000)]
    for (role, rank), phases in spec.items():
        events = []
        for step in (1, 2, 3):
            t0 = 1_700_000_000_000_000 + step * 200_000
            events.append(X(f"ProfilerStep#{step}", t0 + phases[0][1], 180_000 - phases[0][1], cat="user_annotation"))
            events += [X(p, t0 + o, d, cat="user_annotation") for p, o, d in phases]
            if role == "actor":
                arrive = 120_000 + 40_000 * rank
                events += [X("c10d::allreduce_", t0 + arrive, 160_010 - arrive, tid=2), X("aten::mm", t0 + 150_000, 15_000)]
        folder = os.path.join(root, role, f"rank{rank:05d}")
        os.makedirs(folder)
        name = "step00000001-00000003.pt.trace.json"
        write(os.path.join(folder, name), events, distributedInfo={"rank": rank, "world_size": 2 if role == "actor" else 1})
        with open(os.path.join(folder, "manifest.jsonl"), "w") as fh:
            fh.write(json.dumps({"role": role, "rank": rank, "steps": [1, 3], "file": f"{role}/rank{rank:05d}/{name}"}) + "\n")
    return str(root)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return {"dlrm": DLRM, "hf": HF, "gloo": GLOO, "rl": rl_run(tmp_path_factory.mktemp("rl"))}


_DOCS = {}


def doc(verb, path):
    """What ``distprof VERB PATH --json`` prints (the library call behind it), read once per module."""
    if (verb, path) not in _DOCS:
        _DOCS[verb, path] = getattr(analyze, verb)(path, workers=1, **({"top": 15} if verb == "summary" else {}))
    return _DOCS[verb, path]


def assert_fits(lines, cols):
    wide = [line for line in lines if len(line) > cols]
    assert not wide, f"{len(wide)} lines wider than {cols} columns, e.g. {wide[0]!r}"
    cut = [line for line in lines if CUT_FIGURE.search(line)]
    assert not cut, f"a figure cut by an ellipsis: {cut[0]!r}"


def expected(verb, d):
    """Words the output must hold (column and phase names) and figures it must show whole, from the JSON."""
    words, figures = set(), []
    if verb == "summary":
        words |= {"count", "total", "share", "compute", "idle", "traced"}
        for k in d["kernels"]:
            figures += [us(k["total_us"]), f"{k['count']:,}"]
        for o in d["ops"]:
            figures += [us(o["total_us"]), us(o["self_us"])]
        for p in d["phases"]:
            figures.append(us(p["wall_us"]))
            words |= {p["name"]} if len(p["name"]) <= 30 else set()
        for r in d["ranks"]:
            dev = (r.get("temporal") or {}).get("device")
            figures += [us(dev["span_us"])] if dev else []
    elif verb == "steps":
        words |= {"duration", "waited", "busy", "caused", "phases:"}
        for row in d["steps"]:
            for x in row["ranks"]:
                figures += [us(x["dur_us"]), us(x["waited_us"]), us(x["busy_us"]), us(x["wait_caused_us"])]
                # the phases the table shows (--phases 4), each with its figure on one line
                figures += [f"{k} {us(v)}" for k, v in list(x["phases"].items())[:4]]
    elif verb == "stragglers":
        words |= {"rank", "waited", "collectives", "caused", "arrivals", "longest wait"}
        for r in d["ranks"]:
            figures += [us(r["wait_caused_us"]), us(r["waited_us"])]
        for w in d["worst"]:  # the collectives that cost the most waiting
            figures += [f"{w['kind']}", us(w["wait_caused_us"]), us(w["max_wait_us"])]
    elif verb == "diagnose":
        words |= {"fix:", "evidence:"}
        for f in d["findings"]:
            words.add(f["id"])
            figures.append(us(f["cost_us"]))
    return words, figures


CASES = [("summary", "dlrm", 80), ("summary", "dlrm", 120), ("summary", "hf", 80),
         ("steps", "hf", 80), ("steps", "hf", 120), ("steps", "gloo", 80), ("steps", "rl", 80), ("steps", "rl", 120),
         ("stragglers", "dlrm", 80), ("stragglers", "dlrm", 120), ("stragglers", "rl", 80),
         ("diagnose", "dlrm", 80), ("diagnose", "dlrm", 120), ("diagnose", "gloo", 80), ("diagnose", "rl", 80)]


@pytest.mark.slow
@pytest.mark.parametrize("verb,name,cols", CASES, ids=[f"{v}-{n}-{c}" for v, n, c in CASES])
def test_verb_fits_the_terminal_with_every_figure_whole(inputs, verb, name, cols):
    path = inputs[name]
    code, lines = cli_in_pty(cols, verb, path)
    assert code == 0, "\n".join(lines)
    assert_fits(lines, cols)
    text = "\n".join(lines)
    words, figures = expected(verb, doc(verb, path))
    missing = sorted(w for w in words if w not in text) + [f for f in figures if f not in text]
    assert not missing, f"not in the output: {missing[:8]}\n{text}"
    if verb == "steps":
        # each role named once: in the title when the run has one role, else once at the head of its rows
        roles = {row["role"] for row in doc(verb, path)["steps"]}
        if len(roles) == 1:
            assert f"role {roles.pop()}" in text
        else:
            table = lines[next(i for i, line in enumerate(lines) if line.startswith("Steps:")):]
            table = table[:next(i for i, line in enumerate(table) if line.startswith("Per step"))]
            assert all(sum(line.startswith(role + " ") for line in table) == 1 for role in roles), text
    if name == "rl" and verb == "steps":
        assert "Not shown: device idle (no data)" in text  # no device on this job: the column is left out


def test_long_kernel_names_are_cut_in_the_middle_on_a_terminal_and_whole_in_a_pipe():
    code, lines = cli_in_pty(80, "summary", DLRM, "--top", "5")
    assert code == 0
    names = [k["name"] for k in analyze.summary(DLRM, top=5, workers=1)["kernels"]]
    rows = [line for line in lines if "…" in line and not CUT_FIGURE.search(line)]
    longest = max(names, key=len)  # hundreds of characters: its start and its end, with the cut shown
    assert any(line.startswith(longest[:12]) and "…" in line for line in rows), "\n".join(lines)
    proc = subprocess.run([sys.executable, "-m", "distprof.cli", "summary", DLRM, "--top", "5"], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": SRC}, timeout=300)
    assert proc.returncode == 0
    out = proc.stdout
    kernels = out[out.index("Device kernels"):out.index("CPU ops")]
    assert "…" not in kernels and max(len(line) for line in out.splitlines()) <= 200
    # a name longer than its column is folded inside it, whole: a row's pieces, in order, are the name
    head, _, *body = kernels.splitlines()[1:]
    edge = head.index("count") - 2  # the name column's right edge (the count column is as wide as its header)
    rows = []
    for line in body:
        if line[edge:].strip():
            rows.append(line[:edge].strip())
        elif line.strip() and rows:
            rows[-1] += line[:edge].strip()
    assert [r.replace(" ", "") for r in rows] == [n.replace(" ", "") for n in names], kernels


@pytest.fixture(scope="module")
def trigger_dir(tmp_path_factory):
    from distprof.capture.trigger import RequestStore, TriggerAck, send

    root = str(tmp_path_factory.mktemp("trigger"))
    with open(os.path.join(root, "run.json"), "w") as fh:
        json.dump({"config": {"trigger": True}}, fh)
    req, _ = send(root, steps=2)
    store = RequestStore(root)
    store.ack(TriggerAck(id=req.id, role="actor", rank=0, state="captured", steps=[120, 121]))
    store.ack(TriggerAck(id=req.id, role="actor", rank=1, state="refused",
                         detail="the memory guard refused the window: 71.2 GB of host memory in use, the limit is 64 GB"))
    return root, req.id


@pytest.mark.slow
def test_other_tables_fit_the_terminal(inputs, trigger_dir, tmp_path):
    """check, diff, validate, trigger --status and the demo's table of trace files, at 80 columns (the verbs
    above show that 120 adds nothing a table at 80 does not)."""
    run_dir, rid = trigger_dir
    files = [{"role": role, "rank": rank, "steps": [2, 3], "bytes": 1_234_567 * (rank + 1),
              "file": f"{role}/rank{rank:05d}/step00000002-00000003.pt.trace.json.gz"}
             for role, rank in (("actor", 0), ("actor", 1), ("ref", 0), ("rollout", 0))]
    demo = ("from distprof import cli\nfrom distprof.report import terminal as render\n"
            f"cli.console.print(render.files_table({str(tmp_path / ('a-long-run-directory-name' * 3))!r}, {files!r}))")
    for cols in (80,):
        runs = {
            "check": (cli_in_pty(cols, "check", GLOO), ["trainer/rank00001/step00000003-00000006.pt.trace.json.gz"]),
            "diff": (cli_in_pty(cols, "diff", DLRM, DLRM, "--rank-a", "0", "--rank-b", "7"), ["kind", "ratio"]),
            "validate": (cli_in_pty(cols, "validate", VERL, "--dialect", "verl"), ["Mapping", "valid"]),
            "trigger": (cli_in_pty(cols, "trigger", run_dir, "--status"), [rid, "captured", "refused", "71.2 GB"]),
            "demo": (run_in_pty(["-c", demo], cols), ["1,234,567", "2,469,134", "rollout", "bytes"]),
        }
        for what, ((code, lines), words) in runs.items():
            assert code == 0, (what, "\n".join(lines))
            assert_fits(lines, cols)
            text = "\n".join(lines)
            assert all(w in text for w in words), (what, cols, words, text)


# ---- the layout rules, without a process ----------------------------------------------------------------------
KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
          "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)")


@pytest.mark.parametrize("width", [12, 24, 40, 60])
def test_a_cut_name_fits_shows_the_cut_and_never_touches_a_digit(width):
    for name in (KERNEL, "ampere_sgemm_128x64_nn_" + "9" * 60 + "_tail", "x" * 300):
        cut = cut_middle(name, width)
        assert len(cut) <= width and "…" in cut and not CUT_FIGURE.search(cut), cut
        assert cut[:4] == name[:4]
    assert cut_middle("aten::mm", 40) == "aten::mm"
    assert cut_middle("nccl_kernel(int, float)", 21) == "nccl_kernel(…)"  # the argument list goes first


def test_names_that_would_read_the_same_keep_where_they_differ():
    a, b = KERNEL, KERNEL.replace("FillFunctor<float>, at::detail", "FillFunctor<int>, at::detail", 1)
    plain = [cut_middle(a, 50), cut_middle(b, 50)]
    assert plain[0] == plain[1]  # the head and the tail alone say nothing about the difference
    cuts = distinct_cuts([a, b], 50)
    assert cuts[0] != cuts[1] and all(len(c) <= 50 for c in cuts), cuts


def test_prose_wraps_between_figures_not_inside_them():
    text = Text("   what-if: each step gets up to 18.22 ms shorter (train/data 80.23 ms, optimizer 5.20 ms)")
    for width in range(24, 90):
        lines = [line.plain for line in wrap(text, width)]
        assert all(len(line) <= width for line in lines)
        joined = "\n".join(lines)
        assert "18.22 ms" in joined and "80.23 ms" in joined and "5.20 ms" in joined, joined
        assert all(line.startswith("   ") for line in lines)  # continuation lines keep the indent


def test_a_list_of_phases_breaks_between_entries():
    entries = ["## forward ## 4.50 ms", "DistributedDataParallel.forward 4.44 ms", "## sparse_data_dist ## 2.37 ms"]
    text = Text("      phases: " + ", ".join(entries))
    for width in range(48, 100):
        lines = [line.plain for line in wrap(text, width, hang=2, sep=", ")]
        assert all(len(line) <= width for line in lines)
        assert all(any(e in line for line in lines) for e in entries), (width, lines)  # each entry on one line


def test_a_table_too_wide_for_its_figures_goes_on_in_a_second_part_with_its_keys():
    figures = [[us(123_456.7 * (k + 1) + rank) for k in range(7)] for rank in range(3)]  # "123.46 ms" ...
    t = FitTable("Per rank", [Col("role", "key", once=True), Col("rank", "key")] +
                 [Col(f"figure {k}") for k in range(7)] + [Col("unused"), Col("phases", "line")])
    for rank in range(3):
        t.add_row("actor", str(rank), *figures[rank], "-", Text(f"actor/update {us(12_345.0)}"))
    console = Console(width=80, force_terminal=True, color_system=None, record=True)
    console.print(t)
    lines = console.export_text().splitlines()
    assert_fits(lines, 80)
    text = "\n".join(lines)
    assert "(continued)" in text and "Per rank, role actor" in text
    assert all(f in text for row in figures for f in row)
    assert text.count("\n0 ") == text.count("\n2 ") == 2  # each part repeats the rank
    assert "unused (no data)" in text and text.count("phases: actor/update 12.35 ms") == 3


_NAMES = st.text(alphabet="ab_:<>(), 0123456789x.#", max_size=300)
_WORDS = st.lists(st.text(alphabet="abcdefgh/_.0123456789", min_size=1, max_size=40), max_size=12).map(" ".join)


@settings(max_examples=200)
@given(st.lists(_NAMES, min_size=1, max_size=6), st.integers(1, 120))
def test_any_name_cut_fits_shows_the_cut_and_keeps_clear_of_digits(names, width):
    for name, cut in zip(names, distinct_cuts(names, width)):
        assert cell_len(cut) <= width and (cut == name or "…" in cut)
        assert not CUT_FIGURE.search(cut), (name, cut)


@settings(max_examples=60)
@given(st.lists(st.sampled_from(["num", "fixed", "name", "text", "line"]), min_size=1, max_size=10),
       st.integers(1, 4), st.integers(80, 160), st.booleans(), st.data())
def test_any_table_fits_its_width_with_every_figure_whole(kinds, rows, width, whole_names, data):
    t = FitTable(data.draw(_WORDS), [Col("role", "key", once=True), Col("rank", "key")] +
                 [Col(f"c{i} {kind}", kind) for i, kind in enumerate(kinds)])
    figures = []
    for r in range(rows):
        cells = []
        for kind in kinds:
            if kind == "num":
                cells.append(us(data.draw(st.floats(0, 1e10))))
                figures.append(cells[-1])
            else:
                cells.append(data.draw(st.text("abc-", max_size=12) if kind == "fixed" else
                                       _NAMES if kind == "name" else _WORDS))
        t.add_row(data.draw(st.sampled_from(["actor", "rollout"])), str(r), *cells)
    lines = [line.plain for line in t.lines(width, whole_names=whole_names)]
    assert all(cell_len(line) <= width for line in lines), lines
    assert all(f in "\n".join(lines) for f in figures)


def test_a_table_of_keys_alone_wider_than_the_terminal_is_drawn_not_a_crash():
    # Every shown column a key and together too wide: the split into parts had no value column to spread
    # (a range step of 0 raised ValueError).
    t = FitTable("keys", [Col("role", "key"), Col("rank", "key"), Col("host", "key")])
    t.add_row("a" * 50, "1" * 30, "h" * 40)
    text = "\n".join(x.plain for x in t.lines(40))
    assert all(v in text for v in ("a" * 50, "1" * 30, "h" * 40))  # keys are never cut; the row is drawn whole
