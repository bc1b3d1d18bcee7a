"""The FLOPs and MFU views outside ``summary``: ``steps`` per rank and step (terminal and ``--json``), the top-ops
table with the shapes that tell its rows apart, and the progress bar that is drawn only when there is a file to
read. On the real H100 GPT-2 trace (tests/data/distprof-h100/gpt2-bf16-shapes-step4) and one without shapes."""

import io
import os

import pytest
from rich.cells import cell_len
from tracekit import TRACES

from distprof.analysis import analyze
from distprof.analysis.parallel import Progress
from distprof.cli_support import progress_bar
from distprof.report import terminal
from distprof.report.flops_view import flops as flops_tables
from distprof.report.flops_view import op_label
from distprof.report.termfit import FitConsole

H100 = os.path.join(TRACES, "distprof-h100")
GPT2 = os.path.join(H100, "gpt2-bf16-shapes-step4")


def _terminal(width=80):
    out = io.StringIO()
    return out, FitConsole(file=out, width=width, force_terminal=True, color_system=None, legacy_windows=False)


@pytest.fixture(scope="module")
def gpt2_steps():
    return analyze.steps_result(GPT2, workers=1)


def test_steps_json_has_each_ranks_flops_tflops_and_mfu_as_summary_computes_them(gpt2_steps):
    d = analyze.to_json(gpt2_steps)
    (row,) = analyze.summary(GPT2, workers=1)["flops"]
    (x,) = d["steps"][0]["ranks"]
    assert {"dur_us", "waited_us", "busy_us", "phases", "categories"} <= set(x)  # the keys it had
    assert (x["flops"], x["tflops_per_s"], x["mfu"], x["peak_tflops"], x["flops_wall_us"]) == \
        (row["flops"], row["tflops_per_s"], row["mfu"], row["peak_tflops"], row["wall_us"])
    assert x["mfu"] == pytest.approx(x["flops"] / (x["flops_wall_us"] * 1e-6) / (989.4e12))
    assert "flops_reason" not in d


def test_steps_terminal_shows_tflops_and_mfu_in_80_columns(gpt2_steps):
    out, console = _terminal(80)
    terminal.steps(console, gpt2_steps)
    text = out.getvalue()
    x = gpt2_steps.steps[0].ranks[0]
    assert "Achieved TFLOP/s and MFU per step" in text
    assert f"{x.tflops_per_s:,.1f}" in text and f"{x.mfu:.1%}" in text and "989" in text
    assert max(cell_len(line) for line in text.splitlines()) <= 80, text


def test_steps_without_shapes_say_once_that_record_shapes_is_needed():
    s = analyze.steps_result(os.path.join(H100, "transformer-fp32"), workers=1)
    assert "record_shapes is needed" in s.flops_reason
    assert all("mfu" not in x for row in analyze.to_json(s)["steps"] for x in row["ranks"])
    out, console = _terminal(80)
    terminal.steps(console, s)
    assert out.getvalue().replace("\n", " ").count("record_shapes is needed") == 1


def test_top_ops_show_the_shapes_that_tell_two_rows_of_one_op_apart():
    s = analyze.summary_result(GPT2, workers=1)
    muls = [p for p in s.flops_ops if p.name == "aten::mul"]
    assert len(muls) >= 2  # the same op at different shapes: two roofline points
    labels = [op_label(p) for p in s.flops_ops]
    assert len(set(labels)) == len(labels)
    assert "aten::mul [8,1024,3072]x[8,1024,3072]" in labels
    out, console = _terminal(80)
    flops_tables(console, s)
    text = out.getvalue()
    assert max(cell_len(line) for line in text.splitlines()) <= 80, text
    rows = [line.split("  ")[0] for line in text.splitlines() if line.startswith("aten::mul")]
    assert len(rows) >= 2 and len(set(rows)) == len(rows), text  # on the terminal too, cut or not


@pytest.mark.parametrize("files,drawn", [(0, False), (2, True)])
def test_the_progress_bar_is_drawn_only_when_there_are_files_to_read(files, drawn):
    out, console = _terminal(100)
    bar, show = progress_bar(console)
    with bar:
        show(Progress(0, files, 0, 0))
    assert ("reading 0/2 traces" in out.getvalue()) is drawn


# ---- diagnose: low_mfu and slow_collective carry their numbers to the terminal and --json ---------------------
def _diagnosis_text(result):
    out, console = _terminal(80)
    terminal.diagnose(console, result)
    return out.getvalue().replace("\n", " ")


def test_low_mfu_on_gpt2_carries_its_numbers_to_json_and_the_terminal():
    res = analyze.diagnose_result(GPT2, workers=1)
    d = analyze.to_json(res)
    (f,) = [f for f in d["findings"] if f["id"] == "low_mfu"]
    fig = f["evidence"]["figures"]
    (row,) = analyze.summary(GPT2, workers=1)["flops"]
    assert (fig["mfu"], fig["tflops_per_s"], fig["peak_tflops"], fig["dtype"]) == \
        (row["mfu"], row["tflops_per_s"], 989.4, "bf16")
    assert fig["cause"] == "launch_bound" and fig["cause"] in ("launch_bound", "exposed_communication",
                                                               "memory_bound", "small_gemms")
    text = _diagnosis_text(res)
    assert "low_mfu" in text and "MFU is 12%" in text and "120 TFLOP/s" in text and "cause: launch-bound" in text


def test_slow_collective_carries_its_numbers_to_json_and_the_terminal():
    import copy

    from distprof.analysis.diagnose.common import SLOW_COLLECTIVE_SHARE

    inv = copy.deepcopy(analyze.investigate(os.path.join(TRACES, "hta", "nccl_data.json.gz"), workers=1))
    assert not [f for f in analyze.diagnosis(inv)["findings"] if f["id"] == "slow_collective"]  # one rank: not judged
    for c in inv.summary.collectives:
        c.ranks = 2  # as if both ranks had been traced (tests/unit/analysis/test_diagnose_throughput.py)
    res = analyze.diagnosis_result(inv)
    (f,) = [f for f in analyze.to_json(res)["findings"] if f["id"] == "slow_collective"]
    fig = f["evidence"]["figures"]
    assert fig["busbw_gbps"] == pytest.approx(6.558, rel=1e-3) and fig["link_gbps"] == 300.0
    assert fig["busbw_gbps"] < SLOW_COLLECTIVE_SHARE * fig["link_gbps"] and fig["count"] == 15
    text = _diagnosis_text(res)
    assert "slow_collective" in text and "6.56 GB/s" in text and "300 GB/s" in text and "NVLink 3" in text


def test_slow_collective_does_not_judge_a_sampled_set():
    """HTA's two-rank-sampled (2 of a 128-rank job) has sizes since the nccl:* ranges are read; its ranks' start
    skew may be waiting for the 126 untraced ranks: not judged (it was judged nothing before only for lack of sizes)."""
    path = os.path.join(TRACES, "hta", "two-rank-sampled")
    inv = analyze.investigate(path, workers=1)
    (c,) = inv.summary.collectives
    assert c.bytes and c.ranks == 2 and c.skew_us > c.dur_median_us  # the skew form would fire on 2 of 2
    assert "slow_collective" not in [f["id"] for f in analyze.diagnosis(inv)["findings"]]
