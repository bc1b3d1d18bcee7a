"""The collective metadata torch records with a collective, as the trace holds it: message sizes, dtype, group.

torch's ``record_param_comms`` op (``torch/csrc/distributed/c10d/ParamCommsUtils.hpp``), and with recent Kineto the
NCCL kernel it launches, carry in ``args``: ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``
(a ``c10::ScalarType`` name: ``Float``, ``BFloat16`` ...), ``Group size``, ``Process Group Name``,
``Process Group Description``, ``Process Group Ranks`` (a string ``"[0, 1]"``) and, where the version writes it,
``Seq``, and for an all-to-all-v ``In split size`` / ``Out split size`` (the elements sent to / received from each
rank of the group, a list or its string ``"[393216, ...]"``).

Older traces (the DLRM set of 2023, torch 2.0) carry none of it on the kernel or on ``record_param_comms``
(whose ``Input Dims`` there are ``[]`` for a tensor list). What they do carry is the ``nccl:all_reduce`` /
``nccl:all_to_all`` range the collective runs in (a ``user_annotation``), with ``Input Dims`` and ``Input type``
of the tensor it sends (``[[394241]]``, ``["float"]``: the flattened gradient bucket; a rank's whole send buffer
for an all-to-all), inside the ``c10d::alltoall_base_`` op that records (output, input) (``[[768], [3392]]``: an
all-to-all-v whose ranks receive different amounts). :func:`from_input_dims` makes those the collective's messages
and dtype; they lack the group's size and ranks, its name, the sequence number and the split sizes (the DLRM
traces' own group is the default one, of ``distributedInfo.world_size`` ranks, which the report does not assume).

Every value is checked here, once: a trace is untrusted input, so a size that is not a non-negative integer, or
ranks that are not a list of integers, are dropped (None), never raised on.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

__all__ = ["SCALAR_TYPES", "CommArgs", "comm_args", "from_input_dims"]


class CommArgs(NamedTuple):
    """One collective's recorded sizes and group (None: not recorded, or not usable)."""
    in_nelems: int | None
    out_nelems: int | None
    dtype: str | None
    group_size: int | None
    group_ranks: tuple[int, ...] | None
    group_desc: str | None
    seq: int | None
    in_splits: tuple[int, ...] | None = None  # all-to-all-v: elements sent to each rank of the group
    out_splits: tuple[int, ...] | None = None  # ... and received from each


def _count(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return v if isinstance(v, int) and 0 <= v < 2**62 else None


def _ranks(v: Any) -> tuple[int, ...] | None:
    if isinstance(v, str) and len(v) < 1 << 20:
        try:
            v = json.loads(v)
        except (ValueError, RecursionError):  # a string nested deeper than json can follow
            return None
    if isinstance(v, list) and all(_count(r) is not None for r in v):
        return tuple(int(r) for r in v)
    return None


def _text(v: Any) -> str | None:
    return v[:200] if isinstance(v, str) and v else None


def comm_args(in_nelems: Any, out_nelems: Any, dtype: Any, group_size: Any, group_ranks: Any, group_desc: Any,
              seq: Any, in_splits: Any = None, out_splits: Any = None) -> CommArgs | None:
    """The usable part of the recorded values (as decoded from ``args``); None when nothing is usable."""
    out = CommArgs(_count(in_nelems), _count(out_nelems), _text(dtype), _count(group_size), _ranks(group_ranks),
                   _text(group_desc), _count(seq), _ranks(in_splits), _ranks(out_splits))
    return out if any(v is not None for v in out) else None


# ``Input type`` (C++ names, as record_shapes writes them) -> the c10::ScalarType name ``dtype`` uses
SCALAR_TYPES = {"float": "Float", "double": "Double", "c10::Half": "Half", "c10::BFloat16": "BFloat16",
                "long int": "Long", "int": "Int", "short int": "Short", "signed char": "Char", "unsigned char": "Byte",
                "bool": "Bool", "c10::Float8_e4m3fn": "Float8_e4m3fn", "c10::Float8_e5m2": "Float8_e5m2"}


def _nelems(dims: list, types: list, i: int) -> tuple[int | None, str | None]:
    """Elements and dtype of argument ``i`` when it is a tensor (of one or more dimensions)."""
    if i >= len(dims) or not isinstance(dims[i], list) or not dims[i] or \
            not all(_count(d) is not None for d in dims[i]):
        return None, None
    n = 1
    for d in dims[i]:
        n *= int(d)
    kind = types[i] if i < len(types) else None
    return n, SCALAR_TYPES.get(kind) if isinstance(kind, str) else None


# c10d ops whose first two arguments are (output, input) tensors (torch/csrc/distributed/c10d/Ops.cpp)
_OUT_IN = ("c10d::alltoall_base_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_")


def from_input_dims(dims: Any, types: Any, name: str = "") -> CommArgs | None:
    """A collective's messages from the ``Input Dims`` / ``Input type`` of the range it ran in (older traces: the
    module docstring): a ``nccl:*`` range's first argument is the in-message; ``c10d::alltoall_base_`` and the other
    ``_base_`` ops record (output, input). None when no argument is a tensor (a tensor list records ``[]``)."""
    if not isinstance(dims, list) or not dims or not isinstance(types, list):
        return None
    if name.startswith(_OUT_IN):
        (out_n, out_t), (in_n, in_t) = _nelems(dims, types, 0), _nelems(dims, types, 1)
    else:
        (in_n, in_t), out_n, out_t = _nelems(dims, types, 0), None, None
    if in_n is None and out_n is None:
        return None
    return comm_args(in_n, out_n, in_t or out_t, None, None, None, None)
