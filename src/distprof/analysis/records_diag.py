"""The typed records of ``diagnose`` and ``diff`` (beside :mod:`.records`, which holds summary's, steps' and
stragglers'): what :func:`~distprof.analysis.analyze.diagnose_result` and
:func:`~distprof.analysis.analyze.diff_result` return, what the terminal and the HTML report read, and what
``--json`` encodes (:func:`~.records.to_json`; fields in the order the keys are printed, an :data:`~msgspec.UNSET`
field left out).

A :class:`Finding` is what every diagnose rule makes (:mod:`.diagnose`): its ``evidence`` and ``what_if`` are
records too. Tables by name stay plain dicts: a finding's ``evidence.figures`` (each rule's own figures),
``diagnose``'s ``thresholds`` (:data:`.diagnose.THRESHOLDS`), a what-if's ``rl_steps`` and ``engine``.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from distprof.analysis.records import Envelope, Record, to_json

__all__ = [
    "AB",
    "Analysed",
    "DiagnoseResult",
    "DiffResult",
    "DiffRow",
    "DiffStepTime",
    "Finding",
    "FindingEvidence",
    "WhatIf",
]


# ---- diagnose -----------------------------------------------------------------------------------------------
class FindingEvidence(Record, kw_only=True):
    """What a finding is about: ``ranks`` (for ``straggler`` the rank holding the others back first; an unranked
    file is ``"? (path)"``), ``steps`` (numbers, capture windows ``[a, b]``), ``names`` (phase, kernel or op names
    that explain it, the root cause first) and the rule's ``figures`` (what it compared)."""
    role: str | None = None
    ranks: list[Any] = msgspec.field(default_factory=list)
    steps: list[Any] = msgspec.field(default_factory=list)
    names: list[str] = msgspec.field(default_factory=list)
    figures: dict[str, Any] = msgspec.field(default_factory=dict)


class WhatIf(Record, kw_only=True):
    """What fixing a finding would save, computed on the step's path across ranks
    (:func:`.diagnose.common.path_what_if`): the ``change``, the saving (``saves_us`` over ``steps`` steps), the
    naive sum of the cuts, the rank that would then arrive last; ``upper_bound`` when the remedy removes the time
    only in the best case. ``bounding_role`` adds the role that would bound instead and, from the RL step view, the
    critical path, its saving per RL step (``rl_steps``) and the engine's figures."""
    change: str
    saves_us: float
    saves_per_step_us: float
    naive_us: float
    steps: int
    then_last_rank: Any
    upper_bound: bool
    roles_then_bounding: str | UnsetType = UNSET
    critical_path: list[str] | UnsetType = UNSET
    rl_saves_us: float | UnsetType = UNSET
    rl_steps: list[dict[str, Any]] | UnsetType = UNSET
    engine: dict[str, Any] | UnsetType = UNSET


class Finding(Record, kw_only=True):
    """One thing wrong with the job, as ``diagnose --json`` prints it (DESIGN.md fixes ``id``, ``claim``,
    ``cost_us``, ``evidence.{role, ranks, steps, names}`` and ``fix``)."""
    id: str
    """Stable rule id (``straggler``, ``bounding_role``, ...): scripts key on it."""
    claim: str
    """One sentence, with the numbers that make it true."""
    cost_us: float
    """Wall-clock step time the job loses to it over the analysed steps (what fixing it would save)."""
    cost_share: float | None = None
    """``cost_us`` as a share of the analysed steps' time."""
    evidence: FindingEvidence = msgspec.field(default_factory=FindingEvidence)
    fix: str
    """A concrete next step."""
    what_if: WhatIf | None = None
    plot: str | None = None
    """The :class:`~.diagnose.Plot` that shows it."""

    def to_dict(self) -> dict[str, Any]:
        """Its ``--json`` object: ``to_json(finding)``."""
        return to_json(self)


class Analysed(Record, kw_only=True):
    """What the rules looked at: roles, ranks, steps, whether the device rules could apply, and ``caveats``: what
    they could not judge on these files (a role with ranks missing)."""
    roles: list[Any]
    ranks: int
    steps: int
    device: bool
    caveats: list[str]


class DiagnoseResult(Envelope):
    """``distprof diagnose``: the findings ranked by the step time they cost, what was analysed, the rules'
    thresholds, and the keys every verb shares (the caveats are among its warnings)."""
    findings: list[Finding]
    analysed: Analysed
    thresholds: dict[str, Any]


# ---- diff ---------------------------------------------------------------------------------------------------
class DiffRow(Record, kw_only=True):
    """One kernel, op, phase or category: each side's time (total and, comparing per step, per step and rank),
    the change and ``ratio`` (B over A, per step when ``compares`` is ``per_step``)."""
    kind: str
    name: str
    a_us: float
    b_us: float
    change_us: float
    ratio: float | None
    a_count: int
    b_count: int
    a_per_step_us: float | None
    b_per_step_us: float | None
    change_per_step_us: float | None


class DiffStepTime(Record, kw_only=True):
    """One role's median step on each side (over its ranks and steps)."""
    role: str | None
    a_median_us: float | None
    b_median_us: float | None
    a_steps: int
    b_steps: int
    ratio: float | None


class AB(Record, kw_only=True):
    """A count on each side."""
    a: int
    b: int


class DiffResult(Record, kw_only=True):
    """``distprof diff`` (:func:`.diff.compare`): rows by the absolute change of what they compare, the median step
    per role, kernel time per side, names only one side has, why the sides may not compare like for like
    (``warnings``), and with :func:`~.analyze.diff_result` the keys every verb shares (``scope`` per side)."""
    rows: list[DiffRow]
    compares: str  # "per_step" or "totals"
    steps: AB
    rank_steps: AB
    step_time: list[DiffStepTime]
    kernel_total_a_us: float
    kernel_total_b_us: float
    kernel_per_step_a_us: float | None
    kernel_per_step_b_us: float | None
    only_in_a: list[str]
    only_in_b: list[str]
    errors: list[dict[str, Any]] | UnsetType = UNSET
    salvaged: list[dict[str, Any]] | UnsetType = UNSET
    conflicts: list[dict[str, Any]] | UnsetType = UNSET
    warnings: list[str] = msgspec.field(default_factory=list)
    skipped: int | UnsetType = UNSET
    scope: dict[str, Any] | UnsetType = UNSET
    files_read: int | UnsetType = UNSET
