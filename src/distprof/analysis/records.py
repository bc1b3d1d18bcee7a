"""The analyses' combined results as typed records: what ``combine`` returns, what an
:class:`~distprof.analysis.analyze.Investigation` holds, and what diagnose and the report read.

``--json`` is an encoding of these records (:func:`to_json`): fields are declared in the order the keys are
printed, and a field whose value is :data:`msgspec.UNSET` is left out (keys today's output prints only for some
rows, such as a rank row's ``window``). Figures that are tables by name (``phases``, ``categories``) or another
analysis's own object (``idle``, ``launch``, ``temporal``, ``overlap``, ``breakdown``, ``profiling_cost``) stay
plain dicts inside the records.

Records are read as attributes, which a type checker follows (no ``record["key"]``: a misspelled key would be a
silent None). An unset field is :data:`msgspec.UNSET`, which is falsy: ``row.launch or {}`` reads as the
``--json`` mapping's missing key did.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

__all__ = [
    "UNSET",
    "Collective",
    "FileFacts",
    "Investigation",
    "KernelRow",
    "Mismatch",
    "OpRow",
    "PhaseRow",
    "RankStep",
    "Record",
    "StepRow",
    "StepsResult",
    "StragglerRank",
    "StragglerStep",
    "StragglersResult",
    "SummaryRank",
    "SummaryResult",
    "Wait",
    "WaitPair",
    "to_json",
]


class Record(msgspec.Struct, kw_only=True):
    """A typed result row: read its fields as attributes (a field left out of ``--json`` is :data:`UNSET`)."""


def _plain(obj: Any) -> Any:
    if hasattr(obj, "item"):  # a numpy scalar
        return obj.item()
    raise TypeError(f"cannot encode {type(obj).__name__}")


def to_json(record: Any) -> Any:
    """``record`` (a record, a list of them, a dict holding them) as the plain objects ``--json`` prints."""
    return msgspec.to_builtins(record, enc_hook=_plain)


# ---- summary --------------------------------------------------------------------------------------------
class KernelRow(Record, kw_only=True):
    name: str
    count: int
    total_us: float
    share: float


class OpRow(Record, kw_only=True):
    name: str
    count: int
    total_us: float
    self_us: float
    share: float


class PhaseRow(Record, kw_only=True):
    name: str
    count: int
    total_us: float
    wall_us: float
    self_us: float
    share: float


class SummaryRank(Record, kw_only=True):
    """One rank's own figures (its files summed)."""
    rank: int | None
    role: str | None
    path: str
    files: int
    rank_source: str | None
    device_busy_us: float
    device_span_us: float
    idle_share: float | None
    traced_us: float
    categories: dict[str, float]
    kernel_total_us: float
    top_kernels: list[KernelRow]
    idle: dict[str, Any] | UnsetType | None = UNSET
    launch: dict[str, Any] | UnsetType | None = UNSET
    temporal: dict[str, Any] | UnsetType | None = UNSET
    overlap: dict[str, Any] | UnsetType | None = UNSET
    step_breakdown: dict[str, Any] | UnsetType | None = UNSET


class SummaryResult(Record, kw_only=True):
    """``distprof summary``: kernels, ops, phases, categories over all ranks; per rank its breakdowns."""
    kernels: list[KernelRow]
    ops: list[OpRow]
    phases: list[PhaseRow]
    categories: dict[str, float]
    ranks: list[SummaryRank]
    device_busy_us: float
    traced_us: float
    outside_steps: dict[str, float]
    profiling_cost: list[dict[str, Any]] | dict[str, Any] | None
    idle: dict[str, Any] | UnsetType | None = UNSET
    launch: dict[str, Any] | UnsetType | None = UNSET
    step_breakdown: dict[str, Any] | UnsetType | None = UNSET
    # the keys every verb shares (analyze's envelope)
    scope: dict[str, Any] | UnsetType = UNSET
    errors: list[dict[str, Any]] | UnsetType = UNSET
    salvaged: list[dict[str, Any]] | UnsetType = UNSET
    conflicts: list[dict[str, Any]] | UnsetType = UNSET
    warnings: list[str] = msgspec.field(default_factory=list)
    skipped: int | UnsetType = UNSET
    files_read: int | UnsetType = UNSET


# ---- steps ----------------------------------------------------------------------------------------------
class RankStep(Record, kw_only=True):
    """One rank's figures in one step (or capture window)."""
    rank: Any  # int; None for a file without a rank (diagnose names it by its file)
    path: str
    dur_us: float
    waited_us: float
    busy_us: float
    wait_caused_us: float
    sync_waiting_us: float
    phases: dict[str, float]
    categories: dict[str, float]
    source: str
    start_us: float
    window: list[int] | UnsetType = UNSET
    breakdown: dict[str, Any] | UnsetType = UNSET
    temporal: dict[str, Any] | UnsetType | None = UNSET
    overlap: dict[str, Any] | UnsetType = UNSET
    idle: dict[str, Any] | UnsetType | None = UNSET
    launch: dict[str, Any] | UnsetType | None = UNSET


class StepRow(Record, kw_only=True):
    """One (role, step): every rank's figures and the rank holding the others back."""
    role: str | None
    step: Any  # the step number; a capture window's first step
    window: list[int] | None
    ranks: list[RankStep]
    slowest_rank: Any = UNSET
    longest_rank: Any = UNSET
    max_us: float
    min_us: float | UnsetType = UNSET
    waited_us: float | UnsetType = UNSET
    mean_phases: dict[str, float] | UnsetType = UNSET
    launch_bound_ranks: list[int] | UnsetType = UNSET


class StepsResult(Record, kw_only=True):
    """``distprof steps``: per step and rank: duration, waits, phases, breakdowns; the RL step view."""
    steps: list[StepRow]
    profiling_cost: list[dict[str, Any]] | dict[str, Any] | None
    rl_steps: list[Any] = msgspec.field(default_factory=list)  # rlsteps.RLStep
    step_breakdown: dict[str, Any] | UnsetType | None = UNSET
    scope: dict[str, Any] | UnsetType = UNSET
    errors: list[dict[str, Any]] | UnsetType = UNSET
    salvaged: list[dict[str, Any]] | UnsetType = UNSET
    conflicts: list[dict[str, Any]] | UnsetType = UNSET
    warnings: list[str] = msgspec.field(default_factory=list)
    skipped: int | UnsetType = UNSET
    files_read: int | UnsetType = UNSET


# ---- stragglers -----------------------------------------------------------------------------------------
class StragglerRank(Record, kw_only=True):
    role: str | None
    rank: int
    wait_caused_us: float = 0.0
    late_arrivals: int = 0
    waited_us: float = 0.0
    collectives: int = 0
    sync_waiting_us: float = 0.0


class Mismatch(Record, kw_only=True):
    role: str | None
    step: Any
    group: str
    kind: str
    counts: dict[str, int]


class Collective(Record, kw_only=True):
    """One matched collective instance (``worst`` lists the late ones)."""
    role: str | None
    group: str
    kind: str
    index: int
    step: Any
    last_rank: int
    wait_caused_us: float = 0.0
    max_wait_us: float = 0.0


class StragglerStep(Record, kw_only=True):
    role: str | None
    step: Any
    collectives: int
    wait_us: float
    slowest_rank: int | None


class Wait(Record, kw_only=True):
    """Per rank and step: the time it waited and the waiting of others it caused."""
    role: str | None
    rank: int
    step: Any
    waited_us: float
    wait_caused_us: float
    sync_waiting_us: float


class WaitPair(Record, kw_only=True):
    role: str | None
    waiter: int
    culprit: int
    wait_us: float
    sync_us: float


class StragglersResult(Record, kw_only=True):
    """``distprof stragglers``: collectives matched across ranks; who arrives last, who waits how long."""
    ranks: list[StragglerRank]
    matched: int
    mismatched: list[Mismatch]
    steps: list[StragglerStep]
    worst: list[Collective]
    waits: list[Wait]
    sources: list[str]
    unranked: list[str]
    wait_matrix: list[WaitPair]
    scope: dict[str, Any] | UnsetType = UNSET
    errors: list[dict[str, Any]] | UnsetType = UNSET
    salvaged: list[dict[str, Any]] | UnsetType = UNSET
    conflicts: list[dict[str, Any]] | UnsetType = UNSET
    warnings: list[str] = msgspec.field(default_factory=list)
    skipped: int | UnsetType = UNSET
    files_read: int | UnsetType = UNSET


# ---- per file (not printed) ---------------------------------------------------------------------------------
class FileFacts(Record, kw_only=True):
    """What diagnose and the report know of one file, beside the verbs' records: who wrote it and its names'
    tables (``{name: (count, total_us[, self_us])}``; ``step_*`` inside its steps, else its whole trace)."""
    path: str
    role: str | None
    label: str | None  # its role as the results name it ("actor (run 2)" when runs share a folder)
    rank: int | None
    world_size: int | None
    start_us: float | None
    kernels: dict[str, tuple] = msgspec.field(default_factory=dict)
    ops: dict[str, tuple] = msgspec.field(default_factory=dict)
    phases: dict[str, tuple] = msgspec.field(default_factory=dict)
    step_kernels: dict[str, tuple] = msgspec.field(default_factory=dict)
    step_ops: dict[str, tuple] = msgspec.field(default_factory=dict)
    step_runtime: dict[str, tuple] = msgspec.field(default_factory=dict)


@dataclass
class Investigation:
    """What one read of a path gives every verb, typed: ``summary``, ``steps`` and ``stragglers`` are the records
    those verbs' ``--json`` encode (``stragglers.worst`` uncapped), made from one decode of each file; ``files``
    what diagnose and the report know of each file. ``diagnose`` and ``report`` read these, so nothing is read or
    computed twice (``run`` keeps the per-file parts for the report's worst-step timelines)."""
    path: str
    run: Any  # analyze.Run: the per-file parts, kept for the report's worst-step timelines
    summary: SummaryResult
    steps: StepsResult
    stragglers: StragglersResult
    files: list[FileFacts] = field(default_factory=list)

    def envelope(self) -> dict[str, Any]:
        """The keys every verb shares (errors, salvaged, conflicts, warnings, skipped, scope, files_read)."""
        keys = ("scope", "errors", "salvaged", "conflicts", "warnings", "skipped", "files_read")
        return {k: getattr(self.steps, k) for k in keys}
