"""The analyses' combined results as typed records: what ``combine`` returns, what an
:class:`~distprof.analysis.investigation.Investigation` holds, and what diagnose and the report read.

``--json`` is an encoding of these records (:func:`to_json`): fields are declared in the order the keys are
printed, and a field whose value is :data:`msgspec.UNSET` is left out (keys today's output prints only for some
rows, such as a rank row's ``window``). The figures inside the rows are records too, each made by its analysis
module: :class:`IdleFigure` (:mod:`.idle`), :class:`LaunchFigure` and :class:`LaunchStep` (:mod:`.launch`),
:class:`Temporal` (:mod:`.temporal`), :class:`Overlap` (:mod:`.overlap`), :class:`StepBreakdown`
(:mod:`.breakdown`), :class:`ProfilingCost` (:mod:`.cost`); a figure that means nothing for a rank or step (no
device work, no launch) is :class:`NotApplicable`. Only tables by name stay plain dicts (``phases``,
``categories``, ``outside_steps``, ``calls``, ``threads``: ``{name: figure}``).

Records are read as attributes, which a type checker follows (no ``record["key"]``: a misspelled key would be a
silent None). An unset field is :data:`msgspec.UNSET`, which is falsy: ``row.window or None`` reads as the
``--json`` mapping's missing key did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from distprof.analysis.records_comm import CollectiveRow
from distprof.analysis.records_flops import FlopsRow, RooflinePoint
from distprof.analysis.records_mem import MemoryRow

__all__ = [
    "UNSET",
    "Collective",
    "CommOverlap",
    "DelayStats",
    "DeviceTime",
    "Envelope",
    "FileFacts",
    "HostTime",
    "HostWait",
    "IdleFigure",
    "KernelRow",
    "LaunchBoundRule",
    "LaunchFigure",
    "LaunchStep",
    "LaunchThresholds",
    "Mismatch",
    "NotApplicable",
    "OpRow",
    "Overlap",
    "PhaseRow",
    "ProfilingCost",
    "RankStep",
    "Ranked",
    "Record",
    "StepBreakdown",
    "StepRow",
    "StepsResult",
    "StragglerRank",
    "StragglerStep",
    "StragglersResult",
    "StreamIdle",
    "SummaryRank",
    "SummaryResult",
    "TelemetryBucket",
    "TelemetryPhase",
    "TelemetryRank",
    "TelemetryTimeline",
    "Temporal",
    "TimeStats",
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


F = TypeVar("F")


@dataclass
class Ranked(Generic[F]):
    """One rank's figure as an analysis's ``combine`` gives it, with who it is (the rank's first file's path)."""
    role: str | None
    rank: int | None
    path: str
    figure: F


class Envelope(Record, kw_only=True):
    """The keys every verb shares: the base of the verbs' results (keyword-only fields, so they come after a
    result's own fields, in ``--json`` too), and alone what a verb whose result is still its ``--json`` dict
    (``merge``, ``report``) gives the terminal's ``problems`` (:meth:`of`)."""
    scope: dict[str, Any] | UnsetType = UNSET
    errors: list[dict[str, Any]] | UnsetType = UNSET
    salvaged: list[dict[str, Any]] | UnsetType = UNSET
    conflicts: list[dict[str, Any]] | UnsetType = UNSET
    warnings: list[str] = msgspec.field(default_factory=list)
    skipped: int | UnsetType = UNSET
    files_read: int | UnsetType = UNSET

    @classmethod
    def of(cls, doc: dict[str, Any]) -> Envelope:
        """The shared keys of a ``--json`` object (those it lacks unset)."""
        return cls(**{k: doc[k] for k in cls.__struct_fields__ if k in doc})


# ---- the figures inside the rows (each made by its analysis module) -------------------------------------------
class NotApplicable(Record, kw_only=True):
    """A figure that means nothing here (``idle``, ``launch``): why (``device_events``: launch statistics of a rank
    whose device work no launch call is linked to)."""
    applicable: bool = False
    reason: str = "no device events"
    device_events: int | UnsetType = UNSET


class HostWait(Record, kw_only=True):
    """What the host does while the device waits for it (:mod:`.idle`): µs by cause; ``phases``: µs per phase."""
    launch_us: float = 0.0
    collective_us: float = 0.0
    sync_us: float = 0.0
    phase_us: float = 0.0
    untraced_us: float = 0.0
    phases: dict[str, float] = msgspec.field(default_factory=dict)


class StreamIdle(Record, kw_only=True):
    """One stream's device idle time by cause (:mod:`.idle`)."""
    stream: int
    applicable: bool = True
    span_us: float
    busy_us: float
    idle_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_us: float
    idle_share: float
    host_wait_share: float
    kernel_wait_share: float
    other_share: float


class IdleFigure(Record, kw_only=True):
    """Device idle time by cause (:mod:`.idle`) of a rank or a step (with its ``streams``), or over all ranks (with
    ``ranks`` and ``kernel_wait_below_us``)."""
    applicable: bool = True
    span_us: float
    busy_us: float
    idle_us: float
    host_wait_us: float
    kernel_wait_us: float
    other_us: float
    host_wait: HostWait | UnsetType = UNSET
    idle_share: float
    host_wait_share: float
    kernel_wait_share: float
    other_share: float
    streams: list[StreamIdle] | UnsetType = UNSET
    ranks: int | UnsetType = UNSET
    kernel_wait_below_us: float | UnsetType = UNSET


class DelayStats(Record, kw_only=True):
    mean: float
    p50: float
    p95: float
    max: float


class TimeStats(Record, kw_only=True):
    total: float
    mean: float


class LaunchBoundRule(Record, kw_only=True):
    idle_share: float
    host_wait_share: float
    launch_share: float


class LaunchThresholds(Record, kw_only=True):
    runtime_cutoff_us: float
    launch_delay_cutoff_us: float
    launch_bound: LaunchBoundRule


class LaunchFigure(Record, kw_only=True):
    """Kernel launch statistics (:mod:`.launch`) of a rank (``launch_bound_steps``) or over all ranks (``ranks``,
    ``launch_bound_ranks``, ``thresholds``)."""
    applicable: bool = True
    launches: int
    device_events: int
    unlinked_device_events: int
    delay_us: DelayStats
    cpu_us: TimeStats
    device_us: TimeStats
    short: int
    short_share: float
    runtime_outliers: int
    delay_outliers: int
    calls: dict[str, int]
    launch_bound_steps: list[int] | UnsetType = UNSET
    ranks: int | UnsetType = UNSET
    launch_bound_ranks: list[int | None] | UnsetType = UNSET
    thresholds: LaunchThresholds | UnsetType = UNSET


class LaunchStep(Record, kw_only=True):
    """One rank's launches in one step (:mod:`.launch`), and whether the step is launch-bound."""
    applicable: bool = True
    launches: int
    delay_mean_us: float
    delay_p95_us: float
    delay_max_us: float
    short: int
    short_share: float
    delay_outliers: int
    launch_bound: bool


class DeviceTime(Record, kw_only=True):
    """Where the device's time goes (:mod:`.temporal`); the shares of the span on a rank's figure, not a step's."""
    span_us: float
    compute_us: float
    communication_us: float
    memory_us: float
    idle_us: float
    compute_share: float | UnsetType = UNSET
    communication_share: float | UnsetType = UNSET
    memory_share: float | UnsetType = UNSET
    idle_share: float | UnsetType = UNSET


class HostTime(Record, kw_only=True):
    """Where the host's time goes (:mod:`.temporal`); ``threads``: CPU-op busy µs per thread kind."""
    span_us: float
    compute_us: float
    communication_us: float
    idle_us: float
    in_phases_us: float
    threads: dict[str, float]
    compute_share: float | UnsetType = UNSET
    communication_share: float | UnsetType = UNSET
    idle_share: float | UnsetType = UNSET
    in_phases_share: float | UnsetType = UNSET


class Temporal(Record, kw_only=True):
    """The temporal breakdown (:mod:`.temporal`): device (None without device work) and host (None: no host span)."""
    device: DeviceTime | None
    host: HostTime | None


class CommOverlap(Record, kw_only=True):
    communication_us: float
    overlapped_us: float
    share: float


class Overlap(Record, kw_only=True):
    """Communication overlapped by compute (:mod:`.overlap`), on the device and on the host (None: no figure)."""
    device: CommOverlap | None
    host: CommOverlap | None


class StepBreakdown(Record, kw_only=True):
    """A step's (or the average step's) TensorBoard-style breakdown (:mod:`.breakdown`): µs per category."""
    dur_us: float
    kernel: float
    memcpy: float
    memset: float
    communication: float
    runtime: float
    dataloader: float
    cpu_exec: float
    other: float


class ProfilingCost(Record, kw_only=True):
    """Profiling's own cost of one (role, rank), as its manifest recorded it (:mod:`.cost`)."""
    role: str | None
    rank: int | None
    baseline_s: float | None
    profiled_s: float | None
    inflation: float | None
    baseline_steps: int
    profiled_steps: int
    windows: int
    reliable: bool
    reason: str
    baseline_spread: float | None
    export_s: float | None
    export_total_s: float | None
    export_windows: int


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
    idle: IdleFigure | NotApplicable | UnsetType = UNSET
    launch: LaunchFigure | NotApplicable | UnsetType = UNSET
    temporal: Temporal | UnsetType = UNSET
    overlap: Overlap | UnsetType = UNSET
    step_breakdown: StepBreakdown | UnsetType | None = UNSET


class SummaryResult(Envelope):
    """``distprof summary``: kernels, ops, phases, categories over all ranks; per rank its breakdowns."""
    kernels: list[KernelRow]
    ops: list[OpRow]
    phases: list[PhaseRow]
    categories: dict[str, float]
    ranks: list[SummaryRank]
    device_busy_us: float
    traced_us: float
    outside_steps: dict[str, float]
    profiling_cost: list[ProfilingCost]
    idle: IdleFigure | NotApplicable | UnsetType = UNSET
    launch: LaunchFigure | NotApplicable | UnsetType = UNSET
    step_breakdown: StepBreakdown | UnsetType | None = UNSET
    flops: list[FlopsRow] | UnsetType = UNSET  # per role, rank, step (analysis.mfu); absent for traces without shapes
    flops_ops: list[RooflinePoint] | UnsetType = UNSET  # roofline points of the top ops
    collectives: list[CollectiveRow] | UnsetType = UNSET  # the collective report (analysis.collectives)
    memory: list[MemoryRow] | UnsetType = UNSET  # memory answers per rank (analysis.memory); absent without any


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
    breakdown: StepBreakdown | UnsetType = UNSET
    temporal: Temporal | UnsetType = UNSET
    overlap: Overlap | UnsetType = UNSET
    idle: IdleFigure | NotApplicable | UnsetType = UNSET
    launch: LaunchStep | NotApplicable | UnsetType = UNSET
    # Model FLOPs of the step, achieved TFLOP/s and MFU (analysis.mfu; only where the trace has shapes)
    flops: float | UnsetType = UNSET
    tflops_per_s: float | UnsetType | None = UNSET
    mfu: float | UnsetType | None = UNSET
    peak_tflops: float | UnsetType | None = UNSET
    flops_wall_us: float | UnsetType | None = UNSET  # the wall MFU divides by: to the end of the step's device work


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


# ---- step telemetry (telemetry: true; made by analysis.telemetry_steps) ------------------------------------------
class TelemetryPhase(Record, kw_only=True):
    """One outermost ``annotate`` phase of a rank over its telemetry: its share of the rank's step time (summed
    over the steps) and its median time over the steps it ran in."""
    name: str
    share: float
    median_us: float


class TelemetryRank(Record, kw_only=True):
    """One (role, rank)'s step times over its whole telemetry stream."""
    role: str
    rank: int
    steps: int
    first_step: int
    last_step: int
    median_us: float
    p90_us: float
    max_us: float
    slowest_step: int
    phases: list[TelemetryPhase]
    skipped: int = 0  # lines of the stream that could not be read


class TelemetryBucket(Record, kw_only=True):
    """A run of consecutive steps: each rank's median step time in it (ranks without a step there left out)."""
    first_step: int
    last_step: int
    median_us: dict[int, float]


class TelemetryTimeline(Record, kw_only=True):
    """One role's coarse timeline: its step range cut in at most ``telemetry_steps.MAX_BUCKETS`` buckets."""
    role: str
    buckets: list[TelemetryBucket]


class StepsResult(Envelope):
    """``distprof steps``: per step and rank: duration, waits, phases, breakdowns; the RL step view; where the run
    directory holds step telemetry, its per-rank figures and per-role timeline (unset, so left out, without)."""
    steps: list[StepRow]
    profiling_cost: list[ProfilingCost]
    rl_steps: list[Any] = msgspec.field(default_factory=list)  # rlsteps.RLStep
    step_breakdown: StepBreakdown | UnsetType | None = UNSET
    telemetry: list[TelemetryRank] | UnsetType = UNSET
    telemetry_timeline: list[TelemetryTimeline] | UnsetType = UNSET
    telemetry_read: int | UnsetType = UNSET  # telemetry streams read (the exit code counts them as files read)
    flops_reason: str | UnsetType = UNSET  # why no step has FLOPs or MFU (no shapes: record_shapes is needed)


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


class StragglersResult(Envelope):
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
