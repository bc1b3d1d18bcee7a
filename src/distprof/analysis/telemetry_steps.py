"""Step telemetry in the analysis verbs (``telemetry: true``): a coarse view of the whole run, beside the traces.

The traces cover a few windows; telemetry covers every step of every rank (:mod:`.telemetry` reads the streams).
:func:`combine` turns a run directory's streams into the records ``distprof steps`` adds (:mod:`.records`):

- per (role, rank) a :class:`~.records.TelemetryRank`: steps kept, first and last, median, p90 (nearest rank)
  and max step time, the slowest step, and its phases (outermost ``annotate`` ranges) by share of the step time
  summed over the steps (at most ``MAX_PHASES``, the largest), each with its median over the steps it ran in;
- per role a :class:`~.records.TelemetryTimeline`: the role's step range cut in at most ``MAX_BUCKETS`` buckets of
  consecutive steps, each rank's median step time per bucket (100,000 steps stay a small object).

A selection applies as to the traces: ``--ranks``, ``--roles`` and ``--steps`` keep those ranks, roles and steps.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Sequence

from distprof.analysis.records import TelemetryBucket, TelemetryPhase, TelemetryRank, TelemetryTimeline
from distprof.analysis.telemetry import RankSeries, StepRecord, TelemetryRun, read_run
from distprof.rundir.layout import TELEMETRY, TELEMETRY_OLD, is_url
from distprof.trace.selection import Selection

__all__ = ["MAX_BUCKETS", "MAX_PHASES", "combine", "read", "timeline"]

MAX_BUCKETS = 50  # buckets per role's timeline
MAX_PHASES = 16  # phases listed per rank (a stream may name thousands)


def read(path: str) -> TelemetryRun | None:
    """The telemetry under a local folder ``path``; None when it holds none (a URL, a file, a folder of traces).
    Only problems with the streams themselves are kept: a folder that cannot be listed is the trace listing's to
    report, once."""
    local = path.removeprefix("file://")
    if is_url(path) or not os.path.isdir(local):
        return None
    run = read_run(local)
    run.errors = [p for p in run.errors if os.path.basename(p.path or "") in (TELEMETRY, TELEMETRY_OLD)]
    return run if run.series or run.errors else None


def _median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    return float(sorted_values[mid]) if n % 2 else (sorted_values[mid - 1] + sorted_values[mid]) / 2


def _p90(sorted_values: Sequence[float]) -> float:
    return float(sorted_values[max(0, math.ceil(0.9 * len(sorted_values)) - 1)])


def _selected(s: RankSeries, selection: Selection) -> list[StepRecord]:
    if selection.steps is None:
        return s.steps
    return [r for r in s.steps if r.step in selection.steps]


def rank_figures(role: str, rank: int, steps: list[StepRecord], skipped: int = 0) -> TelemetryRank:
    """One rank's figures over ``steps`` (non-empty, in step order)."""
    durs = sorted(r.dur_us for r in steps)
    slowest = max(steps, key=lambda r: r.dur_us)
    total = sum(durs) or 1
    per_phase: dict[str, list[int]] = defaultdict(list)
    for r in steps:
        for name, v in r.phases.items():
            per_phase[name].append(v)
    phases = [TelemetryPhase(name=name, share=sum(v) / total, median_us=_median(sorted(v)))
              for name, v in per_phase.items()]
    phases.sort(key=lambda p: (-p.share, p.name))
    return TelemetryRank(role=role, rank=rank, steps=len(steps), first_step=steps[0].step,
                         last_step=steps[-1].step, median_us=_median(durs), p90_us=_p90(durs),
                         max_us=float(slowest.dur_us), slowest_step=slowest.step, phases=phases[:MAX_PHASES],
                         skipped=skipped)


def timeline(role: str, ranks: dict[int, list[StepRecord]], max_buckets: int = MAX_BUCKETS) -> TelemetryTimeline:
    """``role``'s step range cut in at most ``max_buckets`` buckets of equal width: per bucket, each rank's median
    step time (buckets no rank has a step in are left out)."""
    lo = min(s[0].step for s in ranks.values())
    hi = max(s[-1].step for s in ranks.values())
    width = max(1, math.ceil((hi - lo + 1) / max_buckets))
    cells: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rank, steps in ranks.items():
        for r in steps:
            cells[(r.step - lo) // width][rank].append(r.dur_us)
    buckets = []
    for i in sorted(cells):
        first = lo + i * width
        buckets.append(TelemetryBucket(first_step=first, last_step=min(hi, first + width - 1),
                                       median_us={rank: _median(sorted(v)) for rank, v in sorted(cells[i].items())}))
    return TelemetryTimeline(role=role, buckets=buckets)


def combine(run: TelemetryRun, selection: Selection | None = None
            ) -> tuple[list[TelemetryRank], list[TelemetryTimeline]]:
    """Per (role, rank) its figures, by role then rank; per role its timeline (selection applied)."""
    selection = selection or Selection()
    ranks: list[TelemetryRank] = []
    by_role: dict[str, dict[int, list[StepRecord]]] = defaultdict(dict)
    for (role, rank), s in sorted(run.series.items()):
        if not selection.role_ok(role) or not selection.rank_ok(rank):
            continue
        steps = _selected(s, selection)
        if not steps:
            continue
        ranks.append(rank_figures(role, rank, steps, s.skipped))
        by_role[role][rank] = steps
    return ranks, [timeline(role, by_role[role]) for role in sorted(by_role)]
