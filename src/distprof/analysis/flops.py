"""FLOPs and bytes of one op from its input shapes: the one table of formulas (:data:`TABLE`).

A trace written with ``record_shapes`` gives every CPU op its ``Input Dims`` (one list per argument: a tensor's
sizes, ``[]`` for a non-tensor), ``Input type`` (``c10::BFloat16``, ``float``, ``Scalar`` ...) and ``Concrete
Inputs`` (the values of scalar arguments as strings: ``"[1, 1]"``, ``"True"``, ``"0.125"``). torch's own per-op
``flops`` (``with_flops``) is missing from recent torch's traces (2.11 writes none), so distprof computes them here.

The reference is PyTorch's ``torch/utils/flop_counter.py`` (torch 2.13): a GEMM of (mxk)·(kxn) is 2·m·n·k FLOPs
(one multiply and one add per term; bias additions are not counted), a convolution is 2 x the output points x
the filter x the input channels per group x the batch, attention is its two GEMMs. Where distprof departs from it:

- attention backward counts the four GEMMs of the gradients (2 x the forward), not the fifth that flop_counter has
  counted since torch 2.5 (the kernel recomputing Q·Kᵀ): MFU counts no recomputation (PaLM, appendix B: a
  training step is 3 x the forward);
- a grouped convolution's weight gradient is divided by the groups (flop_counter's is not);
- causal masks are not halved (as flop_counter: "We aren't accounting for causal attention here"), and a varlen
  (nested, 3-D) attention counts every query against the longest key sequence (``max_k``), an upper bound;
- a convolution whose stride, padding or dilation the trace does not give (no ``Concrete Inputs``) is taken with
  stride 1, padding 0, dilation 1 (what an older torch records).

Bytes are what an op must move at least: every tensor argument read once and its outputs written once (a roofline's
denominator; caches and re-reads are not modelled). Elementwise and normalisation ops have bytes only (FLOPs 0:
MFU counts matrix work, as flop_counter does).

Which op is counted when counted ops nest (``aten::linear`` -> ``aten::addmm``, ``aten::scaled_dot_product_attention``
-> ``aten::_scaled_dot_product_cudnn_attention`` -> ``aten::_cudnn_attention_forward``): the **innermost**, the op
that launches the kernels, with the shapes the dispatcher resolved (:mod:`.mfu` applies the rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["DTYPES", "ELEMENT_BYTES", "TABLE", "Formula", "Inputs", "cost", "parse_concrete"]

# Input type -> bytes per element (the dtypes c10 names; anything else is not a tensor of known size).
ELEMENT_BYTES = {
    "double": 8, "float": 4, "c10::BFloat16": 2, "c10::Half": 2, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1, "long int": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}
# Input type -> the dtype a peak is looked up by (peaks.py)
DTYPES = {"double": "fp64", "float": "fp32", "c10::BFloat16": "bf16", "c10::Half": "fp16",
          "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
          "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8", "unsigned char": "int8"}


def parse_concrete(text: Any) -> Any:
    """A ``Concrete Inputs`` string as a value: ``"[1, 1]"`` -> [1, 1], ``"True"`` -> True, ``"2"`` -> 2,
    ``"0.1"`` -> 0.1, ``""`` -> None; other strings as they are (``"same"``)."""
    if not isinstance(text, str):
        return text
    s = text.strip()
    if not s:
        return None
    if s.startswith("[") and s.endswith("]"):
        return [parse_concrete(x) for x in s[1:-1].split(",") if x.strip()]
    if s in ("True", "False"):
        return s == "True"
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    return s


class Inputs:
    """One op's arguments as the trace records them (``Input Dims``, ``Input type``, ``Concrete Inputs``)."""

    def __init__(self, dims: list, types: list | None = None, concrete: list | None = None) -> None:
        self.dims = dims
        self.types = types or []
        self.concrete = concrete or []

    def shape(self, i: int) -> list[int] | None:
        """Argument ``i``'s sizes when it is a tensor (of ints), else None."""
        if i >= len(self.dims):
            return None
        d = self.dims[i]
        if not isinstance(d, list) or not all(type(x) is int for x in d):
            return None
        if not d and self.type(i) not in ELEMENT_BYTES:
            return None  # [] is a scalar argument, unless its type says it is a 0-d tensor
        return d

    def type(self, i: int) -> str:
        return self.types[i] if i < len(self.types) and isinstance(self.types[i], str) else ""

    def value(self, i: int, default: Any = None) -> Any:
        v = parse_concrete(self.concrete[i]) if i < len(self.concrete) else None
        return default if v is None else v

    def nbytes(self, i: int) -> int:
        s = self.shape(i)
        return 0 if s is None else math.prod(s) * ELEMENT_BYTES.get(self.type(i), 0)

    def elem(self, i: int) -> int:
        return ELEMENT_BYTES.get(self.type(i), 0)

    def tensor_bytes(self) -> int:
        """Every tensor argument, read once."""
        return sum(self.nbytes(i) for i in range(len(self.dims)))

    def dtype(self, *at: int) -> str | None:
        """The dtype (peaks.py's name) of the first of the arguments ``at`` (all when none given) with one."""
        for i in at or range(len(self.types)):
            d = DTYPES.get(self.type(i))
            if d is not None:
                return d
        return None


@dataclass(frozen=True)
class Formula:
    """One table entry: FLOPs (None: a memory-bound op, bytes only) and bytes of an op, from its inputs; the
    arguments whose dtype is the op's; where the formula comes from."""
    flops: Callable[[Inputs], float] | None
    bytes: Callable[[Inputs], float]
    dtype_of: tuple[int, ...]
    source: str


class ShapeError(ValueError):
    """The recorded shapes do not fit the op's formula (the op is then not counted)."""


def _need(a: Inputs, *idx: int) -> list[list[int]]:
    out = []
    for i in idx:
        s = a.shape(i)
        if s is None:
            raise ShapeError(f"argument {i} is not a tensor")
        out.append(s)
    return out


# ---- matrix products -------------------------------------------------------------------------------------
def _mnk(x: list[int], w: list[int]) -> tuple[int, int, int, int]:
    """(batch, m, n, k) of matmul(x, w) with torch.matmul's rules (1-D operands, broadcast batch dims)."""
    if not x or not w:
        raise ShapeError("matmul of a 0-d tensor")
    xs = [1, *x] if len(x) == 1 else x
    ws = [*w, 1] if len(w) == 1 else w
    m, k = xs[-2], xs[-1]
    k2, n = ws[-2], ws[-1]
    if k != k2:
        raise ShapeError(f"inner dimensions {k} and {k2} differ")
    bx, bw = xs[:-2], ws[:-2]
    width = max(len(bx), len(bw))
    bx, bw = [1] * (width - len(bx)) + bx, [1] * (width - len(bw)) + bw
    return math.prod(max(p, q) for p, q in zip(bx, bw, strict=True)), m, n, k


def _gemm(a: Inputs, ia: int, ib: int) -> tuple[float, float]:
    """FLOPs and bytes of the product of arguments ``ia`` and ``ib`` (other tensor arguments read once)."""
    x, w = _need(a, ia, ib)
    b, m, n, k = _mnk(x, w)
    return 2.0 * b * m * n * k, float(a.tensor_bytes() + b * m * n * a.elem(ia))


def _linear(a: Inputs) -> tuple[float, float]:
    x, w = _need(a, 0, 1)  # input [..., in], weight [out, in]
    if len(w) != 2 or not x or x[-1] != w[1]:
        raise ShapeError("linear: weight is not [out, in]")
    m = math.prod(x[:-1])
    return 2.0 * m * w[0] * w[1], float(a.tensor_bytes() + m * w[0] * a.elem(0))


_FLOP_COUNTER = "torch/utils/flop_counter.py (torch 2.13)"
_GEMM_SRC = f"{_FLOP_COUNTER} mm_flop: 2*m*n*k"


def _two(ia: int, ib: int) -> tuple[Callable[[Inputs], float], Callable[[Inputs], float]]:
    return (lambda a: _gemm(a, ia, ib)[0]), (lambda a: _gemm(a, ia, ib)[1])


# ---- convolutions ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Conv:
    """Where a convolution op keeps its arguments (None: not an argument of that op)."""
    stride: int | None
    padding: int | None
    dilation: int | None
    transposed: int | bool  # an argument index, or the op's fixed value
    groups: int | None
    output_padding: int | None = None


def _ints(v: Any, n: int, default: int) -> list[int]:
    if isinstance(v, list) and len(v) == n and all(type(x) is int for x in v):
        return v
    if isinstance(v, list) and len(v) == 1 and type(v[0]) is int:
        return v * n
    if type(v) is int:
        return [v] * n
    return [default] * n


def _conv_forward(a: Inputs, at: _Conv) -> tuple[float, float]:
    """flop_counter's conv_flop_count: 2 * batch * prod(out spatial) * prod(filter) * c_out * c_in/groups (for a
    transposed convolution the input's spatial points stand for the output's)."""
    x, w = _need(a, 0, 1)
    if len(x) < 3 or len(w) != len(x):
        raise ShapeError("convolution: input and weight ranks differ")
    nd = len(x) - 2
    transposed = at.transposed if isinstance(at.transposed, bool) else bool(a.value(at.transposed, False))
    stride = _ints(a.value(at.stride) if at.stride is not None else None, nd, 1)
    pad_v = a.value(at.padding) if at.padding is not None else None
    dil = _ints(a.value(at.dilation) if at.dilation is not None else None, nd, 1)
    groups = a.value(at.groups, 1) if at.groups is not None else 1
    groups = groups if type(groups) is int and groups > 0 else 1
    ksz = w[2:]
    if pad_v == "same":
        out = list(x[2:])
    else:
        pad = _ints(pad_v if pad_v != "valid" else 0, nd, 0)
        if transposed:
            opad = _ints(a.value(at.output_padding) if at.output_padding is not None else None, nd, 0)
            out = [(i - 1) * s - 2 * p + d * (k - 1) + o + 1
                   for i, s, p, d, k, o in zip(x[2:], stride, pad, dil, ksz, opad, strict=True)]
        else:
            out = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in zip(x[2:], stride, pad, dil, ksz,
                                                                                     strict=True)]
    points = math.prod(x[2:]) if transposed else math.prod(out)
    flops = 2.0 * x[0] * points * math.prod(ksz) * w[0] * w[1]
    c_out = w[1] * groups if transposed else w[0]
    return flops, float(a.tensor_bytes() + x[0] * c_out * math.prod(out) * a.elem(0))


def _conv(at: _Conv) -> tuple[Callable[[Inputs], float], Callable[[Inputs], float]]:
    return (lambda a: _conv_forward(a, at)[0]), (lambda a: _conv_forward(a, at)[1])


def _conv_backward(a: Inputs) -> tuple[float, float]:
    """aten::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask): each gradient asked for (output_mask[0]: input, [1]: weight) is the
    forward's FLOPs (flop_counter's conv_backward_flop, with the weight gradient divided by the groups)."""
    go, x, w = _need(a, 0, 1, 2)
    if len(go) < 3 or len(x) != len(go) or len(w) != len(go):
        raise ShapeError("convolution_backward: ranks differ")
    transposed = bool(a.value(7, False))
    mask = a.value(10)
    mask = mask if isinstance(mask, list) and len(mask) >= 2 else [True, True, True]
    per_gradient = 2.0 * x[0] * math.prod((x if transposed else go)[2:]) * math.prod(w[2:]) * w[0] * w[1]
    flops = per_gradient * (bool(mask[0]) + bool(mask[1]))
    out = (a.nbytes(1) if mask[0] else 0) + (a.nbytes(2) if mask[1] else 0)
    return flops, float(a.tensor_bytes() + out)


# ---- attention -------------------------------------------------------------------------------------------
def _attention_sizes(a: Inputs, iq: int, layout: str, max_k_at: int | None) -> tuple[int, int, int, int, int, int]:
    """(batch, query heads, s_q, s_k, d_qk, d_v) of query/key/value at ``iq``..``iq+2``. ``layout`` "bhsd" (the
    sdpa ops) or "bshd" (the flash / efficient kernels); a 3-D query is varlen ([total, heads, dim]): every query
    against the longest key sequence (``max_k``, argument ``max_k_at``), an upper bound."""
    q, k, v = _need(a, iq, iq + 1, iq + 2)
    if len(q) == 3 and len(k) == 3 and len(v) == 3:
        mk = a.value(max_k_at) if max_k_at is not None else None
        s_k = mk if type(mk) is int and mk > 0 else k[0]
        return 1, q[1], q[0], s_k, q[2], v[2]
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        raise ShapeError("attention: query, key, value are not 4-D")
    if layout == "bshd":
        return q[0], q[2], q[1], k[1], q[3], v[3]
    return q[0], q[1], q[2], k[2], q[3], v[3]


def _attention(iq: int, layout: str, backward: bool, max_k_at: int | None = None, grads_at: int | None = None
               ) -> tuple[Callable[[Inputs], float], Callable[[Inputs], float]]:
    """Forward: Q·Kᵀ and P·V, 2·b·h·s_q·s_k·(d_qk + d_v) (flop_counter's sdpa_flop_count). Backward: the gradients'
    four GEMMs, 2 x that (see the module docstring). Bytes: the tensors read, and the output (forward) or the
    gradients of query, key and value (backward) written."""
    def flops(a: Inputs) -> float:
        b, h, sq, sk, dq, dv = _attention_sizes(a, iq, layout, max_k_at)
        return (2.0 if backward else 1.0) * 2.0 * b * h * sq * sk * (dq + dv)

    def nbytes(a: Inputs) -> float:
        b, h, sq, _, _, dv = _attention_sizes(a, iq, layout, max_k_at)
        written = sum(a.nbytes(i) for i in range(iq, iq + 3)) if backward else b * h * sq * dv * a.elem(iq)
        return float(a.tensor_bytes() + written)
    return flops, nbytes


# ---- memory-bound ops: bytes only -------------------------------------------------------------------------
def _broadcast(a: Inputs) -> int:
    """Elements of the broadcast of the tensor arguments (the output of an elementwise op)."""
    shapes = [s for i in range(len(a.dims)) if (s := a.shape(i)) is not None]
    if not shapes:
        return 0
    width = max(len(s) for s in shapes)
    out = [1] * width
    for s in shapes:
        for j, d in enumerate([1] * (width - len(s)) + s):
            out[j] = max(out[j], d)
    return math.prod(out)


def _elementwise(a: Inputs) -> float:
    """Read every tensor argument, write the broadcast output (in the first tensor's dtype)."""
    first = next((i for i in range(len(a.dims)) if a.shape(i) is not None), 0)
    return float(a.tensor_bytes() + _broadcast(a) * a.elem(first))


def _reads_only(a: Inputs) -> float:
    """Read every tensor argument (copy_: the source read, the destination written; a reduction's small output)."""
    return float(a.tensor_bytes())


def _like(*idx: int) -> Callable[[Inputs], float]:
    """Read every tensor argument, write outputs the size of arguments ``idx``."""
    return lambda a: float(a.tensor_bytes() + sum(a.nbytes(i) for i in idx))


def _embedding(a: Inputs) -> float:
    """aten::embedding(weight, indices): the indices read, one row read and written per index."""
    w, idx = _need(a, 0, 1)
    return float(a.nbytes(1) + 2 * math.prod(idx) * (w[-1] if w else 0) * a.elem(0))


def _memory(fn: Callable[[Inputs], float], source: str, dtype_of: tuple[int, ...] = (0,)) -> Formula:
    return Formula(None, fn, dtype_of, source)


def _flop_entry(pair: tuple[Callable[[Inputs], float], Callable[[Inputs], float]], dtype_of: tuple[int, ...],
                source: str) -> Formula:
    return Formula(pair[0], pair[1], dtype_of, source)


_SDPA_FWD = f"{_FLOP_COUNTER} sdpa_flop_count"
_SDPA_BWD = f"{_FLOP_COUNTER} sdpa_backward_flop_count, without its recompute of Q·Kᵀ"
_CONV_SRC = f"{_FLOP_COUNTER} conv_flop_count"
_BYTES_SRC = "distprof: every tensor argument read once, the output written once"

# name -> Formula. Argument positions follow each op's schema (torch.ops.aten.<op>.default._schema, torch 2.13).
TABLE: dict[str, Formula] = {
    # matrix products
    "aten::mm": _flop_entry(_two(0, 1), (0,), _GEMM_SRC),  # mm(self, mat2)
    "aten::addmm": _flop_entry(_two(1, 2), (1,), f"{_FLOP_COUNTER} addmm_flop (bias not counted)"),
    "aten::bmm": _flop_entry(_two(0, 1), (0,), f"{_FLOP_COUNTER} bmm_flop: 2*b*m*n*k"),
    "aten::baddbmm": _flop_entry(_two(1, 2), (1,), f"{_FLOP_COUNTER} baddbmm_flop"),
    "aten::matmul": _flop_entry(_two(0, 1), (0,), "torch.matmul's broadcasting; 2*batch*m*n*k as mm_flop"),
    "aten::linear": Formula(lambda a: _linear(a)[0], lambda a: _linear(a)[1], (0,), "2*rows*in*out as mm_flop"),
    "aten::_scaled_mm": _flop_entry(_two(0, 1), (0,), f"{_FLOP_COUNTER} _scaled_mm_flop"),
    # convolutions: convolution / _convolution(input, weight, bias, stride, padding, dilation, transposed,
    # output_padding, groups, ...); cudnn_convolution(self, weight, padding, stride, dilation, groups, ...);
    # cudnn_convolution_transpose(self, weight, padding, output_padding, stride, dilation, groups, ...);
    # conv1d/2d/3d(input, weight, bias, stride, padding, dilation, groups)
    "aten::convolution": _flop_entry(_conv(_Conv(3, 4, 5, 6, 8, 7)), (0,), _CONV_SRC),
    "aten::_convolution": _flop_entry(_conv(_Conv(3, 4, 5, 6, 8, 7)), (0,), _CONV_SRC),
    "aten::cudnn_convolution": _flop_entry(_conv(_Conv(3, 2, 4, False, 5)), (0,), _CONV_SRC),
    "aten::cudnn_convolution_transpose": _flop_entry(_conv(_Conv(4, 2, 5, True, 6, 3)), (0,), _CONV_SRC),
    "aten::conv1d": _flop_entry(_conv(_Conv(3, 4, 5, False, 6)), (0,), _CONV_SRC),
    "aten::conv2d": _flop_entry(_conv(_Conv(3, 4, 5, False, 6)), (0,), _CONV_SRC),
    "aten::conv3d": _flop_entry(_conv(_Conv(3, 4, 5, False, 6)), (0,), _CONV_SRC),
    "aten::convolution_backward": Formula(lambda a: _conv_backward(a)[0], lambda a: _conv_backward(a)[1], (0,),
                                          f"{_FLOP_COUNTER} conv_backward_flop"),
    # attention, forward: query, key, value first; [b, h, s, d] for the sdpa ops, [b, s, h, d] for the kernels
    "aten::scaled_dot_product_attention": _flop_entry(_attention(0, "bhsd", False), (0,), _SDPA_FWD),
    "aten::_scaled_dot_product_flash_attention": _flop_entry(_attention(0, "bhsd", False), (0,), _SDPA_FWD),
    "aten::_scaled_dot_product_efficient_attention": _flop_entry(_attention(0, "bhsd", False), (0,), _SDPA_FWD),
    "aten::_scaled_dot_product_cudnn_attention": _flop_entry(_attention(0, "bhsd", False), (0,), _SDPA_FWD),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _flop_entry(_attention(0, "bhsd", False), (0,), _SDPA_FWD),
    # _flash_attention_forward(query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, ...)
    "aten::_flash_attention_forward": _flop_entry(_attention(0, "bshd", False, 6), (0,), _SDPA_FWD),
    # _efficient_attention_forward(query, key, value, bias, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
    "aten::_efficient_attention_forward": _flop_entry(_attention(0, "bshd", False, 7), (0,), _SDPA_FWD),
    # _cudnn_attention_forward(query, key, value, attn_bias, cum_seq_q, cum_seq_k, max_q, max_k, ...)
    "aten::_cudnn_attention_forward": _flop_entry(_attention(0, "bhsd", False, 7), (0,), _SDPA_FWD),
    # attention, backward: grad_out, query, key, value first
    "aten::_scaled_dot_product_flash_attention_backward": _flop_entry(_attention(1, "bhsd", True), (1,), _SDPA_BWD),
    "aten::_scaled_dot_product_efficient_attention_backward": _flop_entry(_attention(1, "bhsd", True), (1,),
                                                                          _SDPA_BWD),
    "aten::_scaled_dot_product_cudnn_attention_backward": _flop_entry(_attention(1, "bhsd", True), (1,), _SDPA_BWD),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _flop_entry(_attention(1, "bhsd", True), (1,),
                                                                              _SDPA_BWD),
    # _flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, ...)
    "aten::_flash_attention_backward": _flop_entry(_attention(1, "bshd", True, 9), (1,), _SDPA_BWD),
    # _efficient_attention_backward(grad_out_, query, key, value, bias, out, cu_seqlens_q, cu_seqlens_k,
    # max_seqlen_q, max_seqlen_k, ...)
    "aten::_efficient_attention_backward": _flop_entry(_attention(1, "bshd", True, 9), (1,), _SDPA_BWD),
    # _cudnn_attention_backward(grad_out, query, key, value, out, logsumexp, philox_seed, philox_offset, attn_bias,
    # cum_seq_q, cum_seq_k, max_q, max_k, ...)
    "aten::_cudnn_attention_backward": _flop_entry(_attention(1, "bhsd", True, 12), (1,), _SDPA_BWD),
}
for _n in ("add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "neg", "exp", "log", "sqrt", "rsqrt", "pow",
           "tanh", "tanh_backward", "sigmoid", "sigmoid_backward", "relu", "relu_", "threshold_backward", "gelu",
           "gelu_backward", "silu", "silu_backward", "where", "masked_fill", "_softmax", "_softmax_backward_data",
           "_log_softmax", "_log_softmax_backward_data", "native_dropout_backward"):
    TABLE["aten::" + _n] = _memory(_elementwise, _BYTES_SRC, (1,) if _n == "where" else (0,))
TABLE.update({
    "aten::copy_": _memory(_reads_only, "distprof: the source read, the destination written", (1,)),
    "aten::sum": _memory(_reads_only, "distprof: the input read (the reduced output is small)"),
    "aten::mean": _memory(_reads_only, "distprof: the input read (the reduced output is small)"),
    # native_layer_norm(input, normalized_shape, weight, bias, eps): the output like the input
    "aten::native_layer_norm": _memory(_like(0), _BYTES_SRC),
    "aten::layer_norm": _memory(_like(0), _BYTES_SRC),
    "aten::_fused_rms_norm": _memory(_like(0), _BYTES_SRC),
    "aten::rms_norm": _memory(_like(0), _BYTES_SRC),
    "aten::native_batch_norm": _memory(_like(0), _BYTES_SRC),
    # native_dropout(input, p, train): the output, and a mask of bools
    "aten::native_dropout": _memory(lambda a: float(a.tensor_bytes() + a.nbytes(0) + _broadcast(a)), _BYTES_SRC),
    # native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    "aten::native_layer_norm_backward": _memory(_like(1, 5, 6), _BYTES_SRC),
    "aten::embedding": _memory(_embedding, "distprof: the indices read, a row read and written per index"),
})


def cost(name: str, dims: list, types: list | None, concrete: list | None) -> tuple[float, float, str | None] | None:
    """(FLOPs, bytes, dtype) of op ``name`` with these recorded inputs; None when the op is not in :data:`TABLE`
    or its shapes do not fit the formula."""
    f = TABLE.get(name)
    if f is None or not isinstance(dims, list):
        return None
    a = Inputs(dims, types if isinstance(types, list) else None, concrete if isinstance(concrete, list) else None)
    try:
        flops = f.flops(a) if f.flops is not None else 0.0
        nbytes = f.bytes(a)
    except (ShapeError, TypeError, ValueError, IndexError, OverflowError):
        return None
    return flops, nbytes, a.dtype(*f.dtype_of) or a.dtype()
