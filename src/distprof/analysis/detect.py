"""The watcher's rules: which rank, role or job got slow, decided from the ranks' step telemetry alone.

Pure computation over :class:`~distprof.analysis.telemetry.RankSeries` (no I/O, no clock): the watcher
(:mod:`.watch`) feeds it what it read, :func:`detect` runs it over whole histories. Thresholds are the fields of
``detection`` (:class:`~distprof.config.watch.DetectOptions`; docs/telemetry.md, "Rules"):

``slow_rank``
    Per role and step that at least 2 ranks reported: each rank's step time and its time in each outermost
    ``annotate`` phase is compared with the median over the role's ranks (a phase: over the ranks that ran it;
    one that fewer than 2 ranks ran is not judged; nor one whose name says it holds a collective, ``wait_phases``:
    there the rank that arrived first waits longest, and phase times alone cannot tell it from a slow one). A
    rank is slow in a step when one of them is above ``slow_factor`` x that median and above ``min_phase_ms``,
    by at least ``min_share`` of the median step time; it fires when that holds ``slow_steps`` consecutive
    steps. The evidence is the rank, the slow phase with the largest excess over the median in the step it
    fired (``step`` when no phase is slow, only the step time), its time, the median, and the healthy peer (the
    rank closest to the median). In a synchronous job every rank's *step* time is the same (all wait for the slowest
    in the collective); the phase that computes is what differs, so phases are what finds the rank.
``slowdown``
    Per role, the role's step time (median over its ranks) is judged once ``baseline_steps + slow_steps`` steps
    are known: it fires when the median of the last ``slow_steps`` steps is above ``slowdown_factor`` x the
    median of the ``baseline_steps`` steps before them (and the rise is above ``min_phase_ms``). The rank named
    is the one that worked longest (phases, else step time) in the step it fired.
``bounding_role``
    With several roles (one step each per RL step, numbered alike), or one ``driver`` role whose phases are
    named ``role/...`` (the driver waits on the roles: each prefix's phases summed), the *unit* taking the most
    time (median of the last ``slow_steps`` steps) is compared with the one that took the most over the
    ``baseline_steps`` steps before: it fires when another unit took over and its own time rose above
    ``slowdown_factor`` x its baseline (a role that started bounding because it got slower, not by noise).

Each rule fires once per episode (per rule and role, and per rank for ``slow_rank``): it is armed again after
its condition has not held for ``slow_steps`` consecutive steps.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from distprof.analysis.telemetry import RankSeries, StepRecord
from distprof.rundir.layout import DRIVER_ROLE

__all__ = ["RULES", "STALE_S", "Detection", "Detector", "Tracker", "detect"]

RULES = ("slow_rank", "slowdown", "bounding_role")
STEP = "step"  # the metric name of a step's wall time (phases carry their own names)
STALE_S = 30.0  # a rank whose newest step ended this much before its role's newest waits for no one


@dataclass(frozen=True)
class Detection:
    """One rule firing: where (role, rank), when (step), why (phase, value against reference) and whom to capture."""

    rule: str
    role: str
    step: int
    rank: int | None
    """The rank named: the slow one (slow_rank), the one that worked longest (slowdown, bounding_role)."""
    phase: str | None = None
    """slow_rank: the phase (or ``step``) that is slow."""
    value_us: float = 0.0
    """Its time: the rank's (slow_rank), the recent median (slowdown, bounding_role)."""
    reference_us: float = 0.0
    """What it was compared with: the median over ranks (slow_rank), the baseline median (the others)."""
    peer: int | None = None
    """A healthy rank of the same role to capture beside it (the rank closest to the median), if any."""
    previous: str | None = None
    """bounding_role: the unit that bounded in the baseline."""
    message: str = ""

    @property
    def key(self) -> tuple[str, str, int | None]:
        """The episode it belongs to (:meth:`Detector.in_episode`)."""
        if self.rule == "bounding_role":
            return (self.rule, "*", None)
        return (self.rule, self.role, self.rank if self.rule == "slow_rank" else None)

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "role": self.role, "rank": self.rank, "step": self.step, "phase": self.phase,
                "value_us": round(self.value_us), "reference_us": round(self.reference_us), "peer": self.peer,
                "previous": self.previous, "message": self.message}


@dataclass
class _Episode:
    """Fires once when its condition has held ``need`` consecutive steps; armed again after ``clear`` without."""

    need: int
    clear: int
    held: int = 0
    cleared: int = 0
    armed: bool = True

    def update(self, holds: bool) -> bool:
        if holds:
            self.held += 1
            self.cleared = 0
            if self.armed and self.held >= self.need:
                self.armed = False
                return True
            return False
        self.held = 0
        if not self.armed:
            self.cleared += 1
            if self.cleared >= self.clear:
                self.armed, self.cleared = True, 0
        return False


def _ms(us: float) -> str:
    return f"{us / 1000:.1f} ms"


def _work(r: StepRecord) -> float:
    """What a rank computed in a step: its phases' sum (a synchronous step's wall time is everyone's), else the
    step time."""
    return float(sum(r.phases.values())) if r.phases else float(r.dur_us)


def _closest(values: Mapping[int, float], target: float, exclude: Iterable[int] = ()) -> int | None:
    skip = set(exclude)
    cands = [(abs(v - target), rank) for rank, v in values.items() if rank not in skip]
    return min(cands)[1] if cands else None


class Detector:
    """The rules' state across steps; :meth:`observe` one role's step at a time (in step order), then
    :meth:`observe_units` for ``bounding_role``."""

    def __init__(self, options: Any) -> None:
        self.o = options
        self.min_us = float(options.min_phase_ms) * 1000
        self.episodes: dict[tuple[str, str, int | None], _Episode] = {}
        keep = int(options.baseline_steps) + int(options.slow_steps)
        self._role_times: dict[str, deque[float]] = {}
        self._unit_times: deque[dict[str, float]] = deque(maxlen=keep)
        self._keep = keep

    def _episode(self, key: tuple[str, str, int | None], need: int) -> _Episode:
        ep = self.episodes.get(key)
        if ep is None:
            ep = self.episodes[key] = _Episode(need, int(self.o.slow_steps))
        return ep

    def in_episode(self, key: tuple[str, str, int | None]) -> bool:
        """The episode ``key`` fired and has not cleared yet (its condition has not been false for ``slow_steps``
        consecutive steps)."""
        ep = self.episodes.get(key)
        return ep is not None and not ep.armed

    def observe(self, role: str, step: int, records: Mapping[int, StepRecord]) -> list[Detection]:
        """One step of ``role``: ``records`` by rank (the ranks that reported it)."""
        out = self._slow_rank(role, step, records) if len(records) >= 2 else []
        if records:
            out += self._slowdown(role, step, records)
        return out

    # ---- slow_rank -------------------------------------------------------------------------------------------
    def _slow_rank(self, role: str, step: int, records: Mapping[int, StepRecord]) -> list[Detection]:
        metrics: dict[str, dict[int, float]] = {STEP: {r: float(rec.dur_us) for r, rec in records.items()}}
        for rank, rec in records.items():
            for name, us in rec.phases.items():
                metrics.setdefault(name, {})[rank] = float(us)
        factor = float(self.o.slow_factor)
        waits = tuple(getattr(self.o, "wait_phases", ()))
        floor = max(self.min_us, float(getattr(self.o, "min_share", 0.0)) * statistics.median(metrics[STEP].values()))
        # rank -> (a phase, excess, metric, value, median): a slow phase is named before the step time
        worst: dict[int, tuple[bool, float, str, float, float]] = {}
        for name, values in metrics.items():
            if len(values) < 2 or (name != STEP and waits and any(w in name.lower() for w in waits)):
                continue  # a phase holding a collective: the longest in it waited, it was not slow
            med = statistics.median(values.values())
            for rank, v in values.items():
                if v > factor * med and v > self.min_us and v - med >= floor:
                    cand = (name != STEP, v - med, name, v, med)
                    if rank not in worst or cand[:2] > worst[rank][:2]:
                        worst[rank] = cand
        out = []
        for rank in records:
            if self._episode(("slow_rank", role, rank), int(self.o.slow_steps)).update(rank in worst):
                _, _, name, v, med = worst[rank]
                peer = _closest(metrics[name], med, exclude=worst)
                what = "step time" if name == STEP else f"phase {name}"
                out.append(Detection(
                    "slow_rank", role, step, rank, name, v, med, peer,
                    message=f"{role} rank {rank}: {what} {_ms(v)} against the median rank's {_ms(med)} "
                            f"({v / med if med else float('inf'):.2f}x) for {self.o.slow_steps} steps "
                            f"(to step {step})"))
        return out

    # ---- slowdown --------------------------------------------------------------------------------------------
    def _slowdown(self, role: str, step: int, records: Mapping[int, StepRecord]) -> list[Detection]:
        times = self._role_times.get(role)
        if times is None:
            times = self._role_times[role] = deque(maxlen=self._keep)
        times.append(statistics.median(float(r.dur_us) for r in records.values()))
        if len(times) < self._keep:
            return []
        n = int(self.o.slow_steps)
        hist = list(times)
        recent, base = statistics.median(hist[-n:]), statistics.median(hist[:-n])
        holds = recent > float(self.o.slowdown_factor) * base and recent - base > self.min_us
        if not self._episode(("slowdown", role, None), 1).update(holds):
            return []
        work = {rank: _work(r) for rank, r in records.items()}
        rank = max(work, key=lambda k: (work[k], -k))
        peer = _closest(work, statistics.median(work.values()), exclude=[rank])
        return [Detection("slowdown", role, step, rank, None, recent, base, peer,
                          message=f"{role}: step time {_ms(recent)} over the last {n} steps against "
                                  f"{_ms(base)} before ({recent / base if base else float('inf'):.2f}x; "
                                  f"to step {step})")]

    # ---- bounding_role ---------------------------------------------------------------------------------------
    def observe_units(self, step: int, times: Mapping[str, float], ranks: Mapping[str, Mapping[int, StepRecord]]
                      ) -> list[Detection]:
        """One RL step: each unit's (role's, or the driver's ``role/`` prefix's) time; ``ranks``: the records of
        the units that are roles with telemetry (for the rank to name and its peer)."""
        if len(times) < 2:
            return []
        self._unit_times.append(dict(times))
        if len(self._unit_times) < self._keep:
            return []
        n = int(self.o.slow_steps)
        hist = list(self._unit_times)
        names = {u for t in hist for u in t}

        def med(rows: list[dict[str, float]], u: str) -> float:
            return statistics.median(r.get(u, 0.0) for r in rows)

        recent = {u: med(hist[-n:], u) for u in names}
        base = {u: med(hist[:-n], u) for u in names}
        top, before = max(recent, key=lambda u: (recent[u], u)), max(base, key=lambda u: (base[u], u))
        holds = (top != before and recent[top] > float(self.o.slowdown_factor) * base[top]
                 and recent[top] - base[top] > self.min_us)
        if not self._episode(("bounding_role", "*", None), 1).update(holds):
            return []
        rank = peer = None
        recs = ranks.get(top)
        if recs:
            work = {k: _work(r) for k, r in recs.items()}
            rank = max(work, key=lambda k: (work[k], -k))
            peer = _closest(work, statistics.median(work.values()), exclude=[rank])
        return [Detection("bounding_role", top, step, rank, None, recent[top], base[top], peer, previous=before,
                          message=f"{top} now bounds the step: {_ms(recent[top])} over the last {n} steps "
                                  f"against {_ms(base[top])} before; {before} bounded it before "
                                  f"({_ms(recent[before])} now; to step {step})")]


def _units_of_driver(records: Mapping[int, StepRecord]) -> dict[str, float]:
    """The driver's phases summed per ``role/`` prefix (a phase without one is its own unit); median over ranks."""
    per_rank: list[dict[str, float]] = []
    for rec in records.values():
        u: dict[str, float] = {}
        for name, us in rec.phases.items():
            unit = name.split("/", 1)[0] if "/" in name else name
            u[unit] = u.get(unit, 0.0) + us
        per_rank.append(u)
    names = {n for u in per_rank for n in u}
    return {n: statistics.median(u.get(n, 0.0) for u in per_rank) for n in names}


@dataclass
class Tracker:
    """Feeds a :class:`Detector` the steps every rank has reported, as the streams grow.

    A step of a role is judged once every live rank of the role reported it (a rank whose newest step ended over
    ``stale_s`` before the role's newest waits for no one: a dead or stuck rank does not stop detection), or, with
    ``final``, once any rank did. ``bounding_role`` judges an RL step once every role has passed it."""

    options: Any
    stale_s: float = STALE_S
    detector: Detector = field(init=False)
    next_step: dict[str, int] = field(default_factory=dict)
    _units: dict[int, dict[str, float]] = field(default_factory=dict)
    _unit_ranks: dict[int, dict[str, dict[int, StepRecord]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.detector = Detector(self.options)

    def update(self, series: Iterable[RankSeries], final: bool = False) -> list[Detection]:
        by_role: dict[str, list[RankSeries]] = {}
        for s in series:
            if s.steps:
                by_role.setdefault(s.role, []).append(s)
        out: list[Detection] = []
        driver = DRIVER_ROLE in by_role
        roles_as_units = not driver and len(by_role) >= 2
        for role in sorted(by_role):
            for step, recs in self._ready(role, by_role[role], final):
                out += self.detector.observe(role, step, recs)
                if driver and role == DRIVER_ROLE:
                    out += self.detector.observe_units(step, _units_of_driver(recs), {})
                elif roles_as_units:
                    self._units.setdefault(step, {})[role] = statistics.median(float(r.dur_us) for r in recs.values())
                    self._unit_ranks.setdefault(step, {})[role] = dict(recs)
        if roles_as_units:
            out += self._bounding(list(by_role), final)
        return out

    def _ready(self, role: str, ranks: list[RankSeries], final: bool) -> list[tuple[int, dict[int, StepRecord]]]:
        """The steps of ``role`` ready to judge, in order, each with its records by rank; moves the cursor."""
        newest = max(s.steps[-1].t for s in ranks)
        live = [s for s in ranks if s.steps[-1].t >= newest - self.stale_s] or ranks
        upto = max(s.steps[-1].step for s in ranks) if final else min(s.steps[-1].step for s in live)
        start = self.next_step.get(role)
        if start is None:
            start = min(s.steps[0].step for s in ranks)
        if upto < start:
            return []
        steps: dict[int, dict[int, StepRecord]] = {}
        for s in ranks:
            i = bisect.bisect_left(s.steps, start, key=lambda r: r.step)
            while i < len(s.steps) and s.steps[i].step <= upto:
                rec = s.steps[i]
                steps.setdefault(rec.step, {})[s.rank] = rec
                i += 1
        self.next_step[role] = upto + 1
        return sorted(steps.items())

    def _bounding(self, roles: list[str], final: bool) -> list[Detection]:
        passed = min(self.next_step.get(r, 0) for r in roles)
        out: list[Detection] = []
        for step in sorted(self._units):
            if step >= passed and not final:
                break
            times = self._units.pop(step)
            out += self.detector.observe_units(step, times, self._unit_ranks.pop(step, {}))
        return out


def detect(series: Iterable[RankSeries], options: Any) -> list[Detection]:
    """Every detection in whole histories (one pass, every rank's steps as they are: a finished run)."""
    return Tracker(options).update(list(series), final=True)
