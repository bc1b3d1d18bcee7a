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


# ---- slow_collective ------------------------------------------------------------------------------------------
HTA_NCCL = os.path.join(TRACES, "hta", "nccl_data.json.gz")


@pytest.fixture(scope="module")
def nccl():
    return analyze.investigate(HTA_NCCL, workers=1)


def _slow(inv):
    return [f for f in diagnose(inv) if f.id == "slow_collective"]


def test_one_traced_rank_or_no_sizes_is_not_judged(nccl):
    # HTA's NCCL trace is rank 0 of 2: its all-reduce lasts as long as rank 0 waits for rank 1
    assert [c.ranks for c in nccl.summary.collectives] == [1, 1] and not _slow(nccl)
    # the DLRM set records no group size (its sizes come from the nccl:* ranges): no busbw, no finding
    inv = analyze.investigate(DLRM, workers=1)
    assert all(c.busbw_gbps is None for c in inv.summary.collectives) and not _slow(inv)


def test_allreduce_far_below_nvlink(nccl):
    inv = copy.deepcopy(nccl)
    for c in inv.summary.collectives:
        c.ranks = 2  # as if both ranks were traced
    (f,) = _slow(inv)
    c = inv.summary.collectives[0]
    assert c.name == "allreduce" and c.busbw_gbps == pytest.approx(6.558, rel=1e-3)
    # A100-PG509-200 (an SXM4 board), 2 ranks: one node, NVLink 3 at 300 GB/s per direction; busbw = algbw for n=2
    assert f.evidence.figures["link_gbps"] == 300.0 and f.evidence.figures["assumed_span"] == "one node"
    expected = 15 * 30.0 + c.bytes / 300e9 * 1e6
    assert f.cost_us == pytest.approx(c.min_dur_us - expected)
    assert "6.56 GB/s" in f.claim and "NVLink 3" in f.claim and "one node" in f.claim
    assert f.evidence.names == ["allreduce", "default_pg"] and f.evidence.steps == [4, 5, 6]
    assert f.what_if.upper_bound and "NCCL_DEBUG=INFO" in f.fix
    # the broadcast (424 bytes per call) is latency: 6 calls of 18 µs are under 4 x (30 µs + its bytes at 300 GB/s)
    # a healthy all-reduce: 26 MB in 120 µs (219 GB/s) is not slow
    c.min_dur_us, c.busbw_gbps = 15 * 120.0, c.bytes / (15 * 120.0) * 1e-3
    assert not _slow(inv)


def test_skew_that_dominates_the_transfer(nccl):
    from distprof.analysis.diagnose.collective import slow_collective
    from distprof.analysis.diagnose.common import Job

    inv = copy.deepcopy(nccl)
    c = inv.summary.collectives[0]
    c.ranks, c.min_dur_us, c.dur_median_us = 2, 15 * 120.0, 120.0
    c.busbw_gbps = c.bytes / c.min_dur_us * 1e-3
    c.skew_us, c.skew_mean_us, c.last_rank, c.last_share = 5000.0, 6000.0, 1, 0.9
    (f,) = _slow(inv)
    assert f.evidence.figures["form"] == "skew" and f.cost_us == pytest.approx(15 * 6000.0)
    assert "5 ms apart" in f.claim and "rank 1 arrives last in 90%" in f.claim and f.evidence.ranks[0] == 1
    job = Job(inv)
    job.straggler_roles.add(c.role)  # a straggler finding costs that waiting already
    assert slow_collective(job) == []


def test_link_reference_and_its_assumption():
    from distprof.analysis.links import reference

    assert reference("NVIDIA H100 80GB HBM3", 8)[0].gbps == 450.0
    assert reference("NVIDIA H100 80GB HBM3", 16) == (reference("NVIDIA H100 80GB HBM3", 16)[0], "several nodes")
    assert reference("NVIDIA H100 80GB HBM3", 16)[0].gbps == 50.0  # NDR, one NIC per GPU
    assert reference("NVIDIA H100 PCIe", 4)[0].name == "PCIe gen5 x16"
    assert reference("NVIDIA A100-SXM4-80GB", None)[1] == "several nodes"  # unknown size: the lower link
    assert reference("AMD Instinct MI300X", 8) is None and reference(None, 8) is None
