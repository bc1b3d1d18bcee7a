"""Host-side rules that need no device: ``data_loading`` and ``outlier_steps`` (see
:mod:`distprof.analysis.diagnose`)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from distprof.analysis.diagnose.common import (
    DATA_LOADING_SHARE,
    OUTLIER_MIN_STEPS,
    OUTLIER_RATIO,
    Finding,
    Job,
    Plot,
    breakdown_figure,
    fmt_dur,
    make_finding,
    median_of,
    name_text,
    path_what_if,
    rank_name,
    ranks_of,
    ranks_text,
    share_rule,
    sorted_ranks,
    step_key,
    steps_text,
    top_rank,
)
from distprof.analysis.records import RankStep, StepRow
from distprof.trace.vocab import is_dataloader

__all__ = ["data_loading", "outlier_steps"]


def data_loading(job: Job) -> list[Finding]:
    """The DataLoader's share of the step (:data:`DATA_LOADING_SHARE`)."""
    out = []
    for role, rows, cuts, share, per_rank in share_rule(job, "data_loading", breakdown_figure(lambda b: b.dataloader),
                                                        DATA_LOADING_SHARE, False):
        names = sorted({n for row in rows for x in row.ranks for n in x.phases if is_dataloader(n)})
        top = top_rank(per_rank)
        wi = path_what_if(rows, cuts, "data loading fully overlapped with the step", upper_bound=True)
        claim = (f"loading data (the DataLoader's __next__) takes "
                 f"{fmt_dur(sum(per_rank.values()) / sum(len(c) for c in cuts))} per rank and step in "
                 f"{steps_text([step_key(r) for r in rows])} (most on {rank_name(role, top)}: "
                 f"{fmt_dur(per_rank[top] / len(rows))} per step); overlapping it would save up to "
                 f"{fmt_dur(wi.saves_per_step_us)} per step.")
        out.append(make_finding(job, "data_loading", role, rows, cuts, per_rank, claim, wi,
                            "Load ahead of the step: DataLoader num_workers > 0, persistent_workers=True, "
                            "prefetch_factor, pin_memory=True; move decoding and augmentation out of the training "
                            "process.",
                            names, {"share_of_step": share}, Plot.PHASES))
    return out


def _phase_growth(x: RankStep, mine: list[tuple[int, int, RankStep]]) -> tuple[str | None, float | None]:
    """The phase of step ``x`` that grew most over the median of the rank's other steps, and by how much."""
    grew = {n: v - median_of(y.phases.get(n, 0.0) for _, _, y in mine if y is not x)
            for n, v in x.phases.items()}
    phase = max(grew, key=lambda n: grew[n], default=None)
    return phase, grew[phase] if phase is not None else None


def _outliers(job: Job, role: Any, rows: list[StepRow]
              ) -> tuple[dict[int, dict[int, float]], list[dict[str, Any]]]:
    """The role's outlier steps: per row index the cut of each outlier rank (its excess over its median step, at
    most its busy time), and one record per outlier rank-step."""
    at = {id(row): j for j, row in enumerate(rows)}
    flagged: dict[int, dict[int, float]] = defaultdict(dict)  # row index -> {rank index: cut}
    detail = []
    for r in ranks_of(rows):
        mine = [(at[id(row)], i, x) for row, i, x in job.of_rank[(role, r)] if id(row) in at]
        if len(mine) < OUTLIER_MIN_STEPS:
            continue
        med = median_of(x.dur_us for _, _, x in mine)
        for j, i, x in mine:
            if med > 0 and x.dur_us > OUTLIER_RATIO * med:
                flagged[j][i] = min(x.dur_us - med, x.busy_us)
                phase, growth = _phase_growth(x, mine)
                detail.append({"rank": r, "step": rows[j].step, "dur_us": x.dur_us, "median_us": med,
                               "ratio": x.dur_us / med, "phase": phase, "phase_growth_us": growth})
    return flagged, detail


def _outlier_claim(role: Any, detail: list[dict[str, Any]], per_rank: dict[Any, float]) -> str:
    worst = detail[0]
    grew = f"; its phase {name_text(worst['phase'])} grew most (+{fmt_dur(worst['phase_growth_us'])})" \
        if worst["phase"] is not None and worst["phase_growth_us"] > 0 else ""
    return (f"{steps_text([d['step'] for d in detail])} of {role + ' ' if role else ''}"
            f"{ranks_text(sorted_ranks(per_rank))} take up to "
            f"{worst['ratio']:.1f}x the rank's median step ({rank_name(None, worst['rank'])}, step {worst['step']}: "
            f"{fmt_dur(worst['dur_us'])} against {fmt_dur(worst['median_us'])}){grew}.")


def outlier_steps(job: Job) -> list[Finding]:
    """Steps far longer than the rank's median step (:data:`OUTLIER_RATIO`, :data:`OUTLIER_MIN_STEPS`)."""
    out = []
    for role, rows in job.by_role.items():
        rows = [row for row in rows if isinstance(row.step, int) and not row.window]
        flagged, detail = _outliers(job, role, rows)
        if not detail:
            continue
        detail.sort(key=lambda d: -d["ratio"])
        per_rank: dict[Any, float] = defaultdict(float)
        for d in detail:
            per_rank[d["rank"]] += d["dur_us"] - d["median_us"]
        claim = _outlier_claim(role, detail, per_rank)
        names = list(dict.fromkeys(d["phase"] for d in detail if d["phase"] is not None and d["phase_growth_us"] > 0))
        cuts = [flagged.get(j, {}) for j in range(len(rows))]  # every step counts in the per-step figures
        wi = path_what_if(rows, cuts, "each outlier step takes its rank's median time")
        f = make_finding(job, "outlier_steps", role, rows, cuts, per_rank, claim, wi,
                         "Find what that step does differently: warm-up or compilation (profile later steps), "
                         "checkpointing, evaluation, logging, garbage collection (gc.freeze, gc.disable during steps), "
                         "a data-loader stall, or another job on the host.",
                         names, {"steps": detail}, Plot.STEP_TIME)
        out.append(f)
    return out
