"""The collective metadata torch records with a collective, as the trace holds it: message sizes, dtype, group.

torch's ``record_param_comms`` op (``torch/csrc/distributed/c10d/ParamCommsUtils.hpp``), and with recent Kineto the
NCCL kernel it launches, carry in ``args``: ``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``
(a ``c10::ScalarType`` name: ``Float``, ``BFloat16`` ...), ``Group size``, ``Process Group Name``,
``Process Group Description``, ``Process Group Ranks`` (a string ``"[0, 1]"``) and, where the version writes it,
``Seq``. Older traces (the DLRM set of 2023) carry none of it: :func:`comm_args` then gives None.

Every value is checked here, once: a trace is untrusted input, so a size that is not a non-negative integer, or
ranks that are not a list of integers, are dropped (None), never raised on.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

__all__ = ["CommArgs", "comm_args"]


class CommArgs(NamedTuple):
    """One collective's recorded sizes and group (None: not recorded, or not usable)."""
    in_nelems: int | None
    out_nelems: int | None
    dtype: str | None
    group_size: int | None
    group_ranks: tuple[int, ...] | None
    group_desc: str | None
    seq: int | None


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
        except ValueError:
            return None
    if isinstance(v, list) and all(_count(r) is not None for r in v):
        return tuple(int(r) for r in v)
    return None


def _text(v: Any) -> str | None:
    return v[:200] if isinstance(v, str) and v else None


def comm_args(in_nelems: Any, out_nelems: Any, dtype: Any, group_size: Any, group_ranks: Any, group_desc: Any,
              seq: Any) -> CommArgs | None:
    """The usable part of the recorded values (as decoded from ``args``); None when nothing is usable."""
    out = CommArgs(_count(in_nelems), _count(out_nelems), _text(dtype), _count(group_size), _ranks(group_ranks),
                   _text(group_desc), _count(seq))
    return out if any(v is not None for v in out) else None
