"""The collective report's typed rows (:mod:`.collectives`), beside :mod:`.records` (which holds the verbs' results
and imports these): ``summary --json``'s ``collectives``. Fields are declared in the order the keys are printed."""

from __future__ import annotations

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["CollectiveRow"]


class CollectiveRow(msgspec.Struct, kw_only=True):
    """One (role, process group, collective) of the collective report; every figure is over its matched instances.

    ``bytes``: the collective's size S summed over the instances (per instance: the recorded message elements times
    the dtype's size; which message, in or out, per collective in :data:`.collectives.FORMULAS`); ``min_dur_us``: the
    transfer time summed over the instances (per instance: the shortest duration among the ranks that took part);
    ``skew_us``: the median over the instances of the spread of the ranks' start times; ``algbw_gbps``: ``bytes`` /
    ``min_dur_us`` (GB/s, 1e9 bytes); ``busbw_gbps``: per instance algbw times NCCL's factor, weighted the same way.
    A figure the trace does not allow (no recorded sizes, host-side collectives with no transfer time, a single rank)
    is None, and ``note`` says why.
    """
    role: str | None
    group: str
    name: str
    count: int
    bytes: int | None
    min_dur_us: float | None
    skew_us: float | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    last_rank: int | None
    last_share: float | None
    group_desc: str | None = None
    group_size: int | None = None
    ranks: int = 0  # ranks traced that took part
    dtype: str | None = None
    bytes_per_call: int | None = None  # the median instance's size S
    dur_median_us: float | None = None  # the median instance's transfer time
    skew_mean_us: float | None = None
    skew_max_us: float | None = None
    last_arrivals: dict[str, int] = msgspec.field(default_factory=dict)  # rank -> instances it arrived last at
    source: str = "device"  # device: collective kernels; host: c10d ops (gloo, CPU-only jobs)
    note: str | None = None
    # all-to-all(-v) size imbalance (TraceLens's size_imbalance): per call, the largest rank's message over the
    # ranks' mean (in- or out-message, the larger); the max and the mean over the calls. Only where the ranks'
    # sizes are recorded and can differ (all-to-all, send/recv families, or split sizes recorded).
    imbalance: float | UnsetType = UNSET
    imbalance_mean: float | UnsetType = UNSET
    # per call, the largest entry of the ranks' In/Out split sizes over their mean (max over calls); where recorded
    split_imbalance: float | UnsetType = UNSET
