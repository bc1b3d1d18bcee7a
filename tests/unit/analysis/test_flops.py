"""FLOPs and bytes from shapes (analysis/flops.py), peaks (analysis/peaks.py), attribution and MFU (analysis/mfu.py):
each formula against a hand computation, the counting rule and the kernel attribution on synthetic traces, and the
H100 GPT-2 run (tests/data/distprof-h100/gpt2-bf16-shapes-step4: one step of it) against 6*N*T."""

import io
import json
import os

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from tracekit import H100, X, table, write

from distprof.analysis import analyze, mfu, peaks
from distprof.analysis.flops import TABLE, cost, parse_concrete
from distprof.trace.vocab import SHAPED_OPS

BF = "c10::BFloat16"
GPT2 = os.path.join(H100, "gpt2-bf16-shapes-step4")


def flops(name, dims, types=None, concrete=None):
    got = cost(name, dims, types or [BF if d else "Scalar" for d in dims], concrete)
    assert got is not None, name
    return got


# ---- the table ------------------------------------------------------------------------------------------------
def test_the_reader_keeps_shapes_of_exactly_the_ops_the_table_has_formulas_for():
    assert set(TABLE) == SHAPED_OPS
    assert all(f.source for f in TABLE.values())


def test_concrete_inputs_parse_as_values():
    assert parse_concrete("[1, 2]") == [1, 2]
    assert parse_concrete("True") is True and parse_concrete("False") is False
    assert parse_concrete("3") == 3 and parse_concrete("0.125") == 0.125
    assert parse_concrete("") is None and parse_concrete("same") == "same"
    assert parse_concrete("[True, False, True]") == [True, False, True]


def test_matrix_products_are_2mnk_with_bytes_read_and_written():
    m, k, n = 8192, 768, 2304
    f, b, dt = flops("aten::mm", [[m, k], [k, n]])
    assert (f, b, dt) == (2 * m * n * k, 2 * (m * k + k * n + m * n), "bf16")
    f, b, _ = flops("aten::addmm", [[n], [m, k], [k, n], [], []], [BF, BF, BF, "Scalar", "Scalar"])
    assert f == 2 * m * n * k and b == 2 * (n + m * k + k * n + m * n)  # the bias read, not counted as FLOPs
    assert flops("aten::bmm", [[4, 32, 16], [4, 16, 8]])[0] == 2 * 4 * 32 * 8 * 16
    assert flops("aten::baddbmm", [[4, 32, 8], [4, 32, 16], [4, 16, 8], [], []])[0] == 2 * 4 * 32 * 8 * 16
    # matmul broadcasts batch dims and takes 1-D operands as torch.matmul does
    assert flops("aten::matmul", [[2, 1, 5, 6], [3, 6, 7]])[0] == 2 * (2 * 3) * 5 * 7 * 6
    assert flops("aten::matmul", [[6], [6, 7]])[0] == 2 * 1 * 7 * 6
    assert flops("aten::linear", [[8, 1024, 768], [3072, 768], [3072]])[0] == 2 * 8 * 1024 * 768 * 3072
    f, _, dt = flops("aten::_scaled_mm", [[64, 128], [128, 32], [], []], ["c10::Float8_e4m3fn"] * 2 + ["float"] * 2)
    assert (f, dt) == (2 * 64 * 32 * 128, "fp8")
    assert cost("aten::mm", [[4, 5], [6, 7]], [BF, BF], None) is None  # shapes that do not fit: not counted


def test_convolutions_with_stride_padding_dilation_groups():
    # conv2d: x [2, 16, 32, 32], w [32, 4, 3, 3] (groups 4), stride 2, padding 1, dilation 1: out 16x16
    dims = [[2, 16, 32, 32], [32, 4, 3, 3], [32], [], [], [], [], [], []]
    conc = ["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "4"]
    f, b, _ = flops("aten::convolution", dims, [BF, BF, BF] + ["ScalarList"] * 3 + ["Scalar", "ScalarList", "Scalar"],
                    conc)
    assert f == 2 * 2 * (16 * 16) * (3 * 3) * 32 * 4
    assert b == 2 * (2 * 16 * 32 * 32 + 32 * 4 * 9 + 32 + 2 * 32 * 16 * 16)
    # dilation 2, no padding: out = (32 - 2*2 - 1) // 1 + 1 = 28
    assert flops("aten::_convolution", dims[:3] + [[]] * 10,
                 concrete=["", "", "", "[1, 1]", "[0, 0]", "[2, 2]", "False", "[0, 0]", "4"])[0] == \
        2 * 2 * 28 * 28 * 9 * 32 * 4
    # cudnn_convolution(self, weight, padding, stride, dilation, groups, ...): padding before stride
    assert flops("aten::cudnn_convolution", [[2, 16, 32, 32], [32, 4, 3, 3]] + [[]] * 7,
                 concrete=["", "", "[1, 1]", "[2, 2]", "[1, 1]", "4"])[0] == 2 * 2 * 16 * 16 * 9 * 32 * 4
    # conv1d with no Concrete Inputs: stride 1, padding 0, dilation 1 assumed
    assert flops("aten::conv1d", [[1, 3, 10], [8, 3, 3]])[0] == 2 * 1 * 8 * 3 * 3 * 8
    # transposed: the input's spatial points (flop_counter's rule)
    assert flops("aten::convolution", [[1, 8, 5, 5], [8, 4, 3, 3], []] + [[]] * 6,
                 concrete=["", "", "", "[2, 2]", "[0, 0]", "[1, 1]", "True", "[0, 0]", "1"])[0] == \
        2 * 1 * 25 * 9 * 8 * 4
    # backward: each gradient asked for is the forward's FLOPs
    go, x, w = [2, 32, 16, 16], [2, 16, 32, 32], [32, 4, 3, 3]
    fwd = 2 * 2 * 16 * 16 * 9 * 32 * 4
    conc_b = ["", "", "", "[32]", "[2, 2]", "[1, 1]", "[1, 1]", "False", "[0, 0]", "4", "[True, True, False]"]
    assert flops("aten::convolution_backward", [go, x, w] + [[]] * 8, concrete=conc_b)[0] == 2 * fwd
    conc_b[-1] = "[False, True, True]"
    assert flops("aten::convolution_backward", [go, x, w] + [[]] * 8, concrete=conc_b)[0] == fwd


def test_attention_forward_and_backward():
    b, h, s, d = 8, 12, 1024, 64
    q = [b, h, s, d]
    fwd = 2 * b * h * s * s * d + 2 * b * h * s * s * d  # Q.K^T and P.V
    f, by, _ = flops("aten::_scaled_dot_product_cudnn_attention", [q, q, q, [], [], [], [], [], []])
    assert f == fwd and by == 2 * 4 * b * h * s * d  # q, k, v read; out written
    assert flops("aten::scaled_dot_product_attention", [q, q, q])[0] == fwd
    assert flops("aten::_cudnn_attention_forward", [q, q, q])[0] == fwd
    assert flops("aten::_scaled_dot_product_flash_attention", [q, q, q])[0] == fwd
    # the kernels take [b, s, h, d]
    bshd = [b, s, h, d]
    assert flops("aten::_flash_attention_forward", [bshd] * 3)[0] == fwd
    assert flops("aten::_efficient_attention_forward", [bshd] * 3)[0] == fwd
    # GQA: 2 key/value heads for 12 query heads, the query heads count
    assert flops("aten::_scaled_dot_product_efficient_attention", [q, [b, 2, s, d], [b, 2, s, d]])[0] == fwd
    # cross attention, d_v != d_qk: 2*b*h*s_q*s_k*(d_qk + d_v)
    assert flops("aten::scaled_dot_product_attention", [[1, 2, 10, 8], [1, 2, 30, 8], [1, 2, 30, 16]])[0] == \
        2 * 1 * 2 * 10 * 30 * (8 + 16)
    # backward: the gradients' four GEMMs, twice the forward (no recompute of Q.K^T)
    lse = [b, h, s, 1]
    for name in ("aten::_cudnn_attention_backward", "aten::_scaled_dot_product_cudnn_attention_backward",
                 "aten::_scaled_dot_product_flash_attention_backward",
                 "aten::_scaled_dot_product_efficient_attention_backward"):
        f, by, _ = flops(name, [q, q, q, q, q, lse], [BF] * 5 + ["float"])
        assert f == 2 * fwd, name
        assert by == 2 * 8 * b * h * s * d + 4 * b * h * s  # 5 tensors and lse read, 3 gradients written
    assert flops("aten::_flash_attention_backward", [bshd] * 5)[0] == 2 * fwd
    # varlen: [total, heads, dim]: every query against max_k (argument 6), an upper bound
    conc = ["", "", "", "", "", "512", "512"]
    assert flops("aten::_flash_attention_forward", [[1000, 4, 64]] * 3 + [[3], [3], [], []], concrete=conc)[0] == \
        2 * 4 * 1000 * 512 * (64 + 64)


def test_memory_ops_have_bytes_and_no_flops():
    x = [8, 1024, 768]
    n = 8 * 1024 * 768
    assert flops("aten::add", [x, x, []], [BF, BF, "Scalar"]) == (0.0, 3 * 2 * n, "bf16")
    assert flops("aten::mul", [x, [768]])[:2] == (0.0, 2 * (n + 768 + n))  # the broadcast output
    assert flops("aten::gelu", [x])[:2] == (0.0, 2 * 2 * n)
    assert flops("aten::copy_", [x, x, []], [BF, "float", "Scalar"])[:2] == (0.0, 2 * n + 4 * n)
    assert flops("aten::native_layer_norm", [x, [], [768], [768], []], [BF, "ScalarList", BF, BF, "Scalar"])[:2] \
        == (0.0, 2 * (n + 768 + 768 + n))
    assert flops("aten::_softmax", [[4, 1024, 1024], [], []], [BF, "Scalar", "Scalar"])[1] == 2 * 2 * 4 * 1024 * 1024
    assert flops("aten::embedding", [[50257, 768], [8, 1024]], [BF, "long int"])[1] == \
        8 * 8 * 1024 + 2 * 8 * 1024 * 768 * 2


# ---- peaks ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,dtype,device,tflops", [
    ("NVIDIA H100 80GB HBM3", "bf16", "H100 SXM", 989.4),
    ("NVIDIA H100 PCIe", "bf16", "H100 PCIe", 756),
    ("NVIDIA H100 NVL", "fp8", "H100 NVL", 1670.5),
    ("NVIDIA H200", "fp16", "H200 SXM", 989.4),
    ("NVIDIA A100-SXM4-80GB", "bf16", "A100 80GB SXM", 312),
    ("NVIDIA A100 80GB PCIe", "tf32", "A100 80GB PCIe", 156),
    ("NVIDIA A100-PCIE-40GB", "fp32", "A100 40GB", 19.5),
    ("Tesla V100-SXM2-16GB", "fp16", "V100 SXM2", 125),
    ("Tesla V100-PCIE-32GB", "fp16", "V100 PCIe", 112),
    ("Tesla V100S-PCIE-32GB", "fp32", "V100S PCIe", 16.4),
    ("AMD Instinct MI250X/MI250", "bf16", "MI250", 362.1),
    ("AMD Instinct MI250X", "bf16", "MI250X", 383),
    ("AMD Instinct MI300X", "bf16", "MI300X", 1307.4),
])
def test_peaks_by_device_name_and_dtype(name, dtype, device, tflops):
    p = peaks.lookup(name, dtype)
    assert (p.device, p.tflops) == (device, tflops)


def test_peaks_unknown_device_or_dtype_and_the_users_figure():
    assert peaks.lookup("AMD Radeon Graphics", "bf16") is None
    assert peaks.lookup("Tesla V100-SXM2-16GB", "bf16").tflops is None  # no bf16 on Volta
    p = peaks.lookup("AMD Radeon Graphics", "bf16", user_tflops=100)
    assert (p.tflops, p.user) == (100.0, True)


# ---- counting and attribution on a synthetic trace ------------------------------------------------------------
def _op(name, ts, dur, dims, tid=1, seq=None, types=None):
    args = {"Input_Dims": dims, "Input_type": types or [BF] * len(dims)}
    if seq is not None:
        args["Sequence_number"] = seq
    return X(name, ts, dur, tid=tid, **args)


def _launch(ts, corr, k_ts, k_dur, tid=1):
    return [X("cudaLaunchKernel", ts, 2, cat="cuda_runtime", tid=tid, correlation=corr),
            X(f"gemm{corr}", k_ts, k_dur, cat="kernel", pid=0, tid=7, correlation=corr, stream=7)]


def test_innermost_op_counted_once_kernels_attributed_recompute_left_out(tmp_path):
    a, w = [64, 32], [16, 32]
    events = [
        X("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        X("train/forward", 5, 400, cat="user_annotation"),
        _op("aten::linear", 10, 100, [a, w, [16]]),  # holds addmm: not counted
        _op("aten::addmm", 20, 80, [[16], a, [32, 16], [], []], types=[BF, BF, BF, "Scalar", "Scalar"]),
        _op("aten::copy_", 30, 10, [[16], [16]]),  # inside the counted addmm: its kernels are the addmm's
        *_launch(40, 1, 500, 20),
        *_launch(32, 2, 480, 5),
        _op("aten::mul", 200, 20, [a, a]),  # a bytes-only op of its own
        *_launch(205, 3, 530, 4),
        X("train/backward", 420, 500, cat="user_annotation"),
        X("autograd::engine::evaluate_function: CheckpointFunctionBackward", 450, 200, tid=2),
        _op("aten::mm", 460, 50, [a, [32, 16]], tid=2, seq=7),  # a forward op in backward: recomputed
        _op("aten::mm", 700, 50, [[16, 64], a], tid=2),  # backward's own GEMM
        *_launch(710, 4, 800, 30, tid=2),
    ]
    tb = table(write(tmp_path / "t.json", [e for ev in events for e in (ev if isinstance(ev, list) else [ev])],
                     deviceProperties=[{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]))
    part = mfu.extract(tb)
    row = part["steps"][1]
    gemm = 2 * 64 * 16 * 32
    assert row["flops"] == {"bf16": 2 * gemm}  # addmm and the backward mm; linear and the recomputed mm are not
    assert row["recompute_flops"] == gemm
    assert row["kernel_us"] == 20 + 5 + 30  # addmm's two kernels (the copy_'s launch is inside it), the mm's
    assert row["phases"] == {"train/forward": {"bf16": gemm}, "train/backward": {"bf16": gemm}}
    top = {k[0]: v for k, v in part["top"].items()}
    assert "aten::linear" not in top and "aten::copy_" not in top
    assert top["aten::mul"][3] == 4  # its kernel
    rows, points = mfu.combine([(tb.info, part)])
    r = rows[0]
    wall = 1000  # the step's range (its last kernel ends at 830)
    assert r.wall_us == wall and r.flops == 2 * gemm
    assert r.tflops_per_s == pytest.approx(2 * gemm / (wall * 1e-6) / 1e12)
    assert r.mfu == pytest.approx(2 * gemm / (wall * 1e-6) / (989.4e12))
    assert (r.peak_tflops, r.dtype, r.device) == (989.4, "bf16", "H100 SXM")
    assert r.phases["train/backward"].wall_us == 500
    assert {p.name for p in points} == {"aten::addmm", "aten::mm", "aten::mul"}
    rows, _ = mfu.combine([(tb.info, part)], peak_tflops=100)
    assert rows[0].mfu == pytest.approx(2 * gemm / (wall * 1e-6) / 100e12) and rows[0].peak_source == "user"


def test_a_trace_without_shapes_says_record_shapes_is_needed(tmp_path):
    tb = table(write(tmp_path / "t.json", [X("ProfilerStep#1", 0, 100, cat="user_annotation"),
                                           X("aten::mm", 10, 20, Input_type=[BF, BF])]))
    assert tb.has_shapes is False and not tb.shape_ev.size and not tb.shape_keys
    part = mfu.extract(tb)
    assert part["shapes"] is False and part["flop_ops"] == 1
    assert mfu.missing_reason([part]) == mfu.NEEDS_SHAPES
    rows, _ = mfu.combine([(tb.info, part)])
    assert rows[0].reason == mfu.NEEDS_SHAPES and rows[0].flops is None


def test_summary_without_shapes_has_no_flops_key_and_the_terminal_says_why():
    from distprof.report.flops_view import flops as render

    s = analyze.summary_result(os.path.join(H100, "transformer-fp32"), workers=1)
    assert "flops" not in analyze.to_json(s)  # --json as before for traces without shapes
    out = io.StringIO()
    render(Console(file=out, width=80), s)
    assert "record_shapes is needed" in out.getvalue()


# ---- the H100 GPT-2 run ----------------------------------------------------------------------------------------
def test_gpt2_on_h100_flops_per_step_by_hand_and_against_6NT():
    d = analyze.summary(GPT2, workers=1)
    (row,) = d["flops"]
    assert {"role", "rank", "step", "flops", "tflops_per_s", "mfu", "peak_tflops", "dtype"} <= set(row)
    assert (row["role"], row["rank"], row["step"], row["dtype"], row["peak_tflops"]) == ("trainer", 0, 4, "bf16",
                                                                                           989.4)
    # By hand: 6 layers of qkv, proj, fc, fc2 GEMMs and the tied LM head, 8,192 tokens, forward + 2x backward;
    # attention (b 8, h 12, s 1024, d 64): 4*b*h*s^2*d forward, twice that backward.
    gemms = 6 * 2 * 8192 * 768 * (2304 + 768 + 3072 + 3072) + 2 * 8192 * 768 * 8192
    attention = 6 * 4 * 8 * 12 * 1024 ** 2 * 64
    assert row["flops"] == 3 * gemms + 3 * attention
    # 6*N*T (49.6M parameters, 8,192 tokens) leaves attention out: within 25% (docs/analysis.md says why it differs)
    six_nt = 6 * 49.6e6 * 8192
    assert 0.75 <= row["flops"] / six_nt <= 1.25
    assert row["tflops_per_s"] == pytest.approx(row["flops"] / row["wall_us"] * 1e-6)
    assert row["mfu"] == pytest.approx(row["tflops_per_s"] / 989.4)
    assert 100 <= row["tflops_per_s"] <= 140  # the 100-140 TFLOP/s for 6*N*T at 17-25 ms per step
    assert row["kernel_us"] > 0 and set(row["phases"]) == {"train/forward", "train/backward"}
    assert row["phases"]["train/backward"]["flops"] == 2 * row["phases"]["train/forward"]["flops"]
    points = d["flops_ops"]
    assert points and all(p["kernel_us"] > 0 for p in points)
    mm = next(p for p in points if p["name"] == "aten::mm" and p["flops"])
    assert mm["bound"] == "compute" and mm["intensity"] == pytest.approx(mm["flops"] / mm["bytes"])


def test_shapes_are_costed_once_per_shape_whatever_their_json_spacing(tmp_path):
    """The reader keeps each op's shapes as their JSON (one key per distinct shape, decoded where FLOPs are
    computed): the same shape written with other spacing costs the same and is one top row; a field that is not a
    list makes the op count no FLOPs, as args of the wrong shape always did."""
    from distprof.trace.columns import _ShapeArgs, shape_key, shape_of

    a, b = [64, 32], [32, 16]
    events = [X("ProfilerStep#1", 0, 1000, cat="user_annotation"),
              _op("aten::mm", 10, 50, [a, b]), _op("aten::mm", 100, 50, [a, b]), _op("aten::mm", 200, 50, [a, b]),
              _op("aten::mm", 300, 50, [a, b], types="oops"), _op("aten::mm", 400, 50, [[2, 2], [3, 3]])]
    text = json.dumps({"traceEvents": events})
    # the second op's shapes written with other spacing
    text = text.replace('"Input Dims": [[64, 32], [32, 16]]', '"Input Dims": [ [64,32],[32,16] ]', 2)
    text = text.replace('"Input Dims": [ [64,32],[32,16] ]', '"Input Dims": [[64, 32], [32, 16]]', 1)
    (tmp_path / "t.json").write_text(text)
    tb = table(tmp_path / "t.json")
    assert tb.has_shapes is True
    assert tb.shape_ev.tolist() == [1, 2, 3, 5]  # the op whose types are no list has no shapes
    assert len(tb.shape_keys) == 3 and tb.shape_key.tolist() == [0, 1, 0, 2]
    assert shape_of(tb.shape_keys[1])[0] == [a, b]
    part = mfu.extract(tb)
    assert part["steps"][1]["flops"] == {"bf16": 3 * 2 * 64 * 16 * 32}  # the [2,2]x[3,3] op fits no formula
    assert [(k[0], v[0]) for k, v in part["top"].items()] == [("aten::mm", 3)]
    assert shape_key(_ShapeArgs()) is None
    assert shape_key(msgspec.json.decode(b'{"Input Dims": null}', type=_ShapeArgs)) is None
    assert shape_key(msgspec.json.decode(b'{"Input Dims": 5}', type=_ShapeArgs)) is None
    assert shape_key(msgspec.json.decode(b'{"Input Dims": [[1]], "Concrete Inputs": {}}', type=_ShapeArgs)) is None
    assert shape_key(msgspec.json.decode(b'{"Input Dims": [[1]], "Input type": null}', type=_ShapeArgs)) == \
        shape_key(msgspec.json.decode(b'{"Input Dims": [[1]]}', type=_ShapeArgs))


def test_first_shaped_op_with_numbers_out_of_range_says_no_shapes(tmp_path):
    """The stream's first shaped op decides has_shapes, its args decoded whole as before the shapes were kept as
    JSON: a 1e999 in its Input Dims makes the trace one without shapes (found by a review of that change)."""
    ev = [X("ProfilerStep#1", 0, 1000, cat="user_annotation"), _op("aten::mm", 100, 20, [["BIG", 4], [4, 4]]),
          _op("aten::mm", 200, 20, [[64, 32], [32, 16]])]
    (tmp_path / "t.json").write_text(json.dumps({"traceEvents": ev}).replace('"BIG"', "1e999"))
    tb = table(tmp_path / "t.json")
    assert tb.has_shapes is False
    part = mfu.extract(tb)
    assert part["shapes"] is False and part["flop_ops"] == 2


def test_top_ops_are_in_the_order_of_their_first_counted_op(tmp_path):
    """The top ops' order (ties of the roofline's sort keep it): by each shape's first counted op, whatever the
    shapes' order of appearance among ops that are not counted (found by a review of the grouped sums)."""
    a, b = [[64, 32], [32, 16]], [[8, 4], [4, 2]]
    ev = [X("ProfilerStep#1", 0, 1000, cat="user_annotation"), _op("aten::mm", 100, 50, b),
          _op("aten::mm", 110, 10, a), _op("aten::mm", 200, 20, b)]  # the outer b holds a: not counted
    part = mfu.extract(table(write(tmp_path / "t.json", ev)))
    assert [k[2] for k in part["top"]] == ["[64,32]x[32,16]", "[8,4]x[4,2]"]
    _, points = mfu.combine([(table(tmp_path / "t.json").info, part)], top=1)
    assert [p.shapes for p in points] == ["[64,32]x[32,16]"]


_DIM = st.one_of(st.integers(-2, 70), st.sampled_from([2**63, 10**30, 1.5, -0.0, "3", None, True]))
_DIMS = st.lists(st.one_of(st.lists(_DIM, max_size=4), _DIM), max_size=5)
_TYPES = st.lists(st.sampled_from([BF, "float", "c10::Half", "long int", "Scalar", "", "c10::Float8_e4m3fn", 1]),
                  max_size=5)
_CONCRETE = st.lists(st.sampled_from(["", "[2, 2]", "[1, 1]", "False", "True", "4", "[0, 0]", "x", 3]), max_size=9)
_ODD = st.sampled_from([b"1e999", b'"x"', b"{}", b"null", b"[[1e400]]", b"-1e309"])


@st.composite
def _shaped_ops(draw) -> bytes:
    """A step of shaped ops (the table's names), each with drawn Input Dims / Input type / Concrete Inputs, some
    fields replaced by raw JSON of the wrong type or out of range, some ops nested in others, a backward range."""
    events = [X("ProfilerStep#1", 0, 10_000, cat="user_annotation"), X("train/fwd", 0, 5_000, cat="user_annotation"),
              X("autograd::engine::evaluate_function: MmBackward0", 6_000, 3_000, tid=2)]
    names = sorted(TABLE)
    for i in range(draw(st.integers(1, 12))):
        args = {"Input Dims": draw(_DIMS), "Input type": draw(_TYPES)}
        if draw(st.booleans()):
            args["Concrete Inputs"] = draw(_CONCRETE)
        if draw(st.booleans()):
            args["Sequence number"] = draw(st.one_of(st.integers(-1, 5), st.sampled_from(["7", 1.5])))
        name = draw(st.sampled_from(names))
        if draw(st.integers(0, 2)) == 0:  # a matrix product whose shapes fit (FLOPs to count)
            m, k, n = (draw(st.integers(1, 64)) for _ in range(3))
            name, args["Input Dims"], args["Input type"] = "aten::mm", [[m, k], [k, n]], [BF, BF]
        ts = draw(st.sampled_from([100 * i, 100 * i + 10, 6_100 + 50 * i]))
        e = {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1,
             "tid": 2 if ts > 6_000 else 1, "ts": ts, "dur": draw(st.sampled_from([5, 50, 200])), "args": args}
        events.append(e)
    text = json.dumps({"traceEvents": events}).encode()
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # a value as raw JSON of the wrong type or out of range
        field = draw(st.sampled_from([b'"Input Dims": ', b'"Input type": ', b'"Concrete Inputs": ']))
        at = text.find(field, draw(st.integers(0, len(text))))
        if at >= 0:
            start = at + len(field)
            end = _value_end(text, start)
            text = text[:start] + draw(_ODD) + text[end:]
    return text


def _value_end(text: bytes, start: int) -> int:
    """Where the JSON value (a list, a string, a number or null, as json.dumps wrote it) at ``start`` ends."""
    depth, j, in_str = 0, start, False
    while j < len(text):
        c = text[j:j + 1]
        if in_str:
            if c == b"\\":
                j += 1
            elif c == b'"':
                in_str = False
                if depth == 0:
                    return j + 1
        elif c == b'"':
            in_str = True
        elif c == b"[":
            depth += 1
        elif c == b"]":
            depth -= 1
            if depth == 0:
                return j + 1
        elif c in (b",", b"}") and depth == 0:
            return j
        j += 1
    return j


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(_shaped_ops())
def test_flops_of_odd_shapes_never_raise_and_agree_on_both_paths(tmp_path, text):
    """Fuzz: shaped ops whose Input Dims, Input type and Concrete Inputs are odd (huge, negative, floats, strings,
    null, the wrong type, out of range), nested or in a backward range, read into a table and costed. The shapes are
    kept as their JSON and decoded where FLOPs are computed: mfu never raises, and the native and Python paths give
    the same FLOPs part."""
    from distprof.trace import native

    path = tmp_path / "t.json"
    path.write_bytes(text)
    got = []
    for on in (True, False):
        prev = native.use(on)
        try:
            part = mfu.extract(table(path))
        finally:
            native.use(prev)
        assert part["shapes"] in (True, False)
        got.append(repr(part))
    assert got[0] == got[1]
