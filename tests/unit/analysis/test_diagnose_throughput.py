"""diagnose's ``low_mfu`` and ``slow_collective`` rules: on the real H100 GPT-2 trace (shapes, bf16), on HTA's NCCL
trace, and on copies of their investigations with one figure changed for each cause (no other data set holds a
healthy run or each cause alone)."""

import copy
import os

import pytest
from tracekit import DLRM, TRACES

from distprof.analysis import analyze
from distprof.analysis.diagnose import diagnose
from distprof.analysis.diagnose.common import LOW_MFU
from distprof.analysis.records_flops import RooflinePoint

GPT2 = os.path.join(TRACES, "distprof-h100", "gpt2-bf16-shapes-step4")


@pytest.fixture(scope="module")
def gpt2():
    return analyze.investigate(GPT2, workers=1)


def _ids(inv):
    return [f.id for f in diagnose(inv)]


def _low(inv):
    hits = [f for f in diagnose(inv) if f.id == "low_mfu"]
    assert len(hits) <= 1
    return hits[0] if hits else None


def _no_launch_bound(inv):
    for row in inv.steps.steps:
        for x in row.ranks:
            x.launch.launch_bound = False


def test_gpt2_has_low_mfu_launch_bound_with_its_figures(gpt2):
    f = _low(gpt2)
    assert f is not None
    row = gpt2.summary.flops[0]
    # the hand computation: 2.86 TFLOP in 23.8 ms on an H100 SXM (989.4 bf16 TFLOP/s dense)
    assert row.flops == pytest.approx(2.86e12, rel=0.01) and row.wall_us == pytest.approx(23797.15)
    mfu = row.flops / (row.wall_us * 1e-6) / 989.4e12
    assert f.evidence.figures["mfu"] == pytest.approx(mfu) and 0.11 < mfu < 0.13
    assert "120 TFLOP/s" in f.claim and "989.4 TFLOP/s" in f.claim and "bf16" in f.claim and "H100 SXM" in f.claim
    # cause: the launch rule's figures (its own finding costs the 7.33 ms launch wait)
    assert f.evidence.figures["cause"] == "launch_bound" and "launch-bound" in f.claim and "7.33 ms" in f.claim
    # memory-bound ops hold too (55% of the top ops' kernel time: unfused GELU, LayerNorm), listed after it
    assert list(f.evidence.figures["causes"]) == ["launch_bound", "memory_bound"]
    assert f.evidence.names[0] == "aten::mul"
    # cost: the step at 30% MFU would take wall x mfu / 0.3
    assert f.cost_us == pytest.approx(row.wall_us * (1 - row.mfu / LOW_MFU))
    assert f.evidence.ranks == [0] and f.evidence.steps == [4] and f.evidence.role == "trainer"
    assert "launch_bound" in _ids(gpt2)


def test_healthy_mfu_has_no_finding(gpt2):
    inv = copy.deepcopy(gpt2)
    inv.summary.flops[0].mfu = 0.45
    assert "low_mfu" not in _ids(inv)


def test_causes_in_their_order(gpt2):
    inv = copy.deepcopy(gpt2)
    _no_launch_bound(inv)
    f = _low(inv)
    assert f.evidence.figures["cause"] == "memory_bound" and "memory-bound ops take 55%" in f.claim
    assert "fuse" in f.fix
    # exposed communication comes before memory-bound ops
    comm = copy.deepcopy(inv)
    x = comm.steps.steps[0].ranks[0]
    x.temporal.device.communication_us = 0.2 * x.dur_us
    f = _low(comm)
    assert f.evidence.figures["cause"] == "exposed_communication"
    assert list(f.evidence.figures["causes"]) == ["exposed_communication", "memory_bound"]
    # small GEMMs: products of 2 x 64 x 64 x 64 FLOPs per call, far under 10 µs at the peak
    small = copy.deepcopy(inv)
    small.summary.flops_ops = [RooflinePoint(
        name="aten::mm", dtype="bf16", shapes="[64,64]x[64,64]", count=1000, flops=1000 * 2 * 64 ** 3,
        bytes=1000 * 3 * 64 * 64 * 2, kernel_us=3000.0, tflops_per_s=None, gbps=None, intensity=300.0,
        device="H100 SXM", peak_tflops=989.4, peak_tbps=3.35, bound="compute")]
    f = _low(small)
    assert f.evidence.figures["cause"] == "small_gemms" and "small matrix products: 100%" in f.claim
    # nothing holds: said so
    small.summary.flops_ops[0].flops = 1000 * 2 * 8192 ** 3
    f = _low(small)
    assert f.evidence.figures["cause"] is None and "no launch, communication" in f.claim


def test_no_shapes_or_little_matrix_work_is_not_judged():
    # a trace without shapes: no flops figures, no finding
    assert "low_mfu" not in _ids(analyze.investigate(os.path.join(TRACES, "distprof-h100", "hf-gpt2"), workers=1))
    # DLRM has shapes and an MFU of 0.03%, but its matrix products run 20% of its kernel time: not judged
    inv = analyze.investigate(DLRM, workers=1)
    assert inv.summary.flops and max(r.mfu for r in inv.summary.flops) < 0.001
    assert "low_mfu" not in _ids(inv)
