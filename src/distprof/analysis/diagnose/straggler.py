"""The ``straggler`` rule: the rank holding the others back, its root cause or its leading candidates, its late
group, and the waiting it causes (see :mod:`distprof.analysis.diagnose` for the rule and the path model)."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import numpy as np

from distprof.analysis.diagnose.common import (
    SECONDARY_SHARE,
    STRAGGLER_CONSISTENCY,
    STRAGGLER_EXPLAINED,
    STRAGGLER_GROUP_MAX,
    STRAGGLER_GROUP_SHARE,
    STRAGGLER_SPREAD_CONSISTENCY,
    STRAGGLER_SPREAD_MIN_STEPS,
    STRAGGLER_WAIT_SHARE,
    STRAGGLER_WAITERS_SHOWN,
    Finding,
    Job,
    Plot,
    by_rank,
    fmt_dur,
    median_of,
    name_text,
    path_what_if,
    rank_name,
    ranks_text,
    step_key,
    steps_text,
)
from distprof.analysis.records import RankStep, StepRow, StragglerRank
from distprof.analysis.records_diag import FindingEvidence
from distprof.trace.vocab import STEP_PREFIX, is_comm_host_event, is_comm_kernel, is_sync

logger = logging.getLogger(__name__)

__all__ = ["straggler"]


def _phase_causes(job: Job, rank: Any, rows: list[StepRow], mine: list[RankStep], n_steps: int
                  ) -> list[dict[str, Any]]:
    """Per phase of the rank or the others: its excess over the others' median, per step (numpy's median over
    each step's matrix of phases by rank, built once for every candidate: the same value as :func:`median_of`
    over the others, a phase a rank lacks counting 0)."""
    per_row = [job.phase_matrix(row) for row in rows]
    meds = []
    for row, (idx, m, ranks) in zip(rows, per_row, strict=True):
        others = np.array([r != rank for r in ranks], dtype=bool)
        if not others.any():
            meds.append((idx, [0.0] * len(idx)))
        elif ranks.count(rank) == 1 and idx:  # (the common case: leave its one column out of sorted rows)
            meds.append((idx, job.phase_medians(row, ranks.index(rank)).tolist()))
        else:
            meds.append((idx, np.median(m[others], axis=0).tolist()))
    cands: list[dict[str, Any]] = []
    for name in {n for idx, _, _ in per_row for n in idx}:
        med = [md[idx[name]] if name in idx else 0.0 for idx, md in meds]
        ex = [x.phases.get(name, 0.0) - m for x, m in zip(mine, med, strict=False)]
        cands.append({"kind": "phase", "name": name, "per_step": ex,
                      "rank_us": sum(x.phases.get(name, 0.0) for x in mine) / n_steps,
                      "median_us": sum(med) / n_steps})
    return cands


def _name_causes(job: Job, role: Any, rank: Any, others: list[list[RankStep]], n_steps: int
                 ) -> list[dict[str, Any]]:
    """Per kernel (not collectives) and op (self time, not communication) of the rank: its time per step over the
    other ranks' median (numpy's median over the role's matrix of names by rank: the same value as
    :func:`median_of` over the others, a name a rank lacks counting 0)."""
    cands: list[dict[str, Any]] = []
    other_ranks = sorted({o.rank for os_ in others for o in os_ if o.rank is not None})
    everyone = tuple(sorted({rank, *other_ranks}, key=repr)) if rank is not None else tuple(other_ranks)
    for which, keep, kind in (("kernels", lambda n: not is_comm_kernel(n), "kernel"),
                              ("ops", lambda n: not is_comm_host_event(n) and not n.startswith(STEP_PREFIX), "op")):
        own = {k: v for k, v in job.names_per_step(role, rank, which).items() if keep(k)}
        if not own:
            continue
        if other_ranks and rank is not None and rank not in other_ranks:  # (the matrix's columns: everyone)
            meds = job.names_medians(role, everyone, which, rank, list(own)).tolist()
        elif other_ranks:
            rows, cols, m = job.names_matrix(role, everyone, which)
            meds = np.median(m[np.ix_([rows[n] for n in own], [cols[r] for r in other_ranks])], axis=1).tolist()
        else:
            meds = [0.0] * len(own)
        for (name, v), med in zip(own.items(), meds, strict=True):
            cands.append({"kind": kind, "name": name, "per_step": [v - med] * n_steps, "rank_us": v, "median_us": med})
    return cands


def _late_start(mine: list[RankStep], others: list[list[RankStep]], rows: list[StepRow]
                ) -> dict[str, Any]:
    """The rank's start of the step after the others' median start, per step, named after its latest step."""
    late = [x.start_us - median_of(o.start_us for o in os_) for x, os_ in zip(mine, others, strict=False)]
    worst = max(range(len(rows)), key=lambda j: late[j])
    step_name = f"{STEP_PREFIX}{rows[worst].step}" if rows[worst].ranks[0].source == "ProfilerStep" \
        else "(start of the capture window)"
    return {"kind": "late_start", "name": step_name, "per_step": late, "rank_us": None, "median_us": None}


def _root_causes(job: Job, role: Any, rank: Any, rows: list[StepRow]) -> list[dict[str, Any]]:
    """Where ``rank`` exceeds the median of the other ranks, per step, most first: phases, kernels (not
    collectives), ops (self time, not communication), and its start of the step."""
    mine = [next(x for x in row.ranks if x.rank == rank) for row in rows]
    others = [[x for x in row.ranks if x.rank != rank] for row in rows]
    cands = [*_phase_causes(job, rank, rows, mine, len(rows)), *_name_causes(job, role, rank, others, len(rows)),
             _late_start(mine, others, rows)]
    for c in cands:
        c["excess_us"] = sum(c["per_step"]) / len(rows)
    cands = [c for c in cands if c["excess_us"] > 0]
    cands.sort(key=lambda c: (-c["excess_us"], c["kind"], c["name"]))
    return cands


def _cause_text(c: dict[str, Any], runner_up: dict[str, Any] | None) -> str:
    if c["kind"] == "late_start":
        inside = f"; inside the step nothing exceeds the median rank's time by more than " \
                 f"{fmt_dur(runner_up['excess_us'])} ({runner_up['kind']} {name_text(runner_up['name'])})" \
            if runner_up else ""
        return f"it starts the step {fmt_dur(c['excess_us'])} after the median rank (what delays it runs before the " \
               f"step, outside the traced steps){inside}"
    what = {"phase": "phase", "kernel": "kernel", "op": "op"}[c["kind"]]
    self_note = " self time" if c["kind"] == "op" else ""
    return f"its {what} {name_text(c['name'])} takes {fmt_dur(c['rank_us'])}{self_note} per step against " \
           f"{fmt_dur(c['median_us'])} on the median rank"


_STRAGGLER_FIX = {
    "phase": "Find why {name} is slower on {who} than on the others: its input shard or data path, a slower or "
             "busier host (other processes, CPU affinity), or work only that rank does; balance or overlap it.",
    "kernel": "Find why {name} runs longer on {who}: its input shapes (uneven shards, dynamic sequence lengths) "
              "or its GPU (clocks, thermal throttling, another process on it); balance the work.",
    "op": "Find why {name} costs more host time on {who}: uneven inputs, a busier host or CPU affinity; "
          "balance the work or move it off the step.",
    "late_start": "Look at what {who} does between steps, before the traced step starts (the previous step's "
                  "tail, logging, checkpointing, evaluation, garbage collection, data loading outside the "
                  "step); profile a wider window (more consecutive steps) to see it.",
}


_SPREAD_FIX = ("Tell the candidates apart on {who}. Compare its CPU time with its wall time per step: the trace "
               "records no CPU time, so measure it (time.process_time() or psutil.Process().cpu_times() around the "
               "step). CPU time well below wall time: it is descheduled; look for other processes on its cores "
               "(top -H, ps -eLo psr,pid,comm) and pin each rank to its own cores (taskset, numactl). CPU time equal "
               "to wall time with every op slower: a slower or throttled host (compare lscpu and clocks with the "
               "other ranks' hosts). One phase or op slower than the rest: uneven work; balance its inputs.")


def _straggler_tops(job: Job) -> dict[Any, StragglerRank]:
    """Per role, its rank that causes the most waiting (``stragglers``' row of it), if it arrives late at all."""
    tops: dict[Any, StragglerRank] = {}
    for r in job.inv.stragglers.ranks or []:
        if r.rank is not None and r.wait_caused_us > 0 and r.late_arrivals > 0 and r.role not in tops:
            tops[r.role] = r  # the list is sorted by wait_caused_us, descending
    return tops


def _steps_with(job: Job, role: Any, rank: Any) -> tuple[list[StepRow], float, float]:
    """The role's steps of several ranks that ``rank`` is in, the waiting it causes in them, and the other ranks'
    time in them."""
    rows = [row for row in job.by_role.get(role, [])
            if len(row.ranks) > 1 and any(x.rank == rank for x in row.ranks)]
    caused = sum(x.wait_caused_us for row in rows for x in row.ranks if x.rank == rank)
    others = sum(x.dur_us for row in rows for x in row.ranks if x.rank != rank)
    return rows, caused, others


def straggler(job: Job) -> list[Finding]:
    """The rank holding the others back, per role, and its root cause, or its leading candidates when no one
    cause explains it (thresholds: :data:`STRAGGLER_WAIT_SHARE`, :data:`STRAGGLER_CONSISTENCY`,
    :data:`STRAGGLER_EXPLAINED`, :data:`STRAGGLER_SPREAD_CONSISTENCY`, :data:`STRAGGLER_SPREAD_MIN_STEPS`)."""
    out = []
    for role, top in _straggler_tops(job).items():
        rank, who = top.rank, rank_name(role, top.rank)
        rows, caused, others = _steps_with(job, role, rank)
        if others <= 0 or caused < STRAGGLER_WAIT_SHARE * others:
            continue
        held_back = sum(1 for row in rows if row.slowest_rank == rank)
        causes = _root_causes(job, role, rank, rows)
        waiters = sum(len(row.ranks) - 1 for row in rows)  # rank-steps that could wait for it
        lateness = caused / waiters  # the waiting it causes per waiting rank and step
        explained = causes[0]["excess_us"] / lateness if causes else 0.0
        if held_back >= STRAGGLER_CONSISTENCY * len(rows) and explained >= STRAGGLER_EXPLAINED:
            f = _one_cause(job, role, rank, rows, causes[0], causes)
        elif _holds_back_every_step(rank, rows):
            f = _no_one_cause(job, role, rank, rows, causes, lateness)
        else:
            logger.debug("straggler: %s holds the others back in %d of %d steps; its largest cause explains %.0f%%",
                         who, held_back, len(rows), 100 * explained)
            continue
        f.evidence.figures.update({"wait_caused_us": caused, "others_step_us": others, "wait_share": caused / others,
                          "holds_back_steps": held_back, "cause_explains": explained, "lateness_us": lateness,
                          "late_arrivals": top.late_arrivals, "collectives": top.collectives,
                          "candidates": [{"kind": c["kind"], "name": c["name"], "excess_us": c["excess_us"],
                                          "share": c["excess_us"] / lateness} for c in causes[:5]]})
        job.straggler_roles.add(role)
        out.append(f)
    return out


def _holds_back_every_step(rank: Any, rows: list[StepRow]) -> bool:
    """Without one cause, consistency is what tells a straggler from a busy machine (whose late rank changes
    between steps): it holds the others back, by at least :data:`STRAGGLER_WAIT_SHARE` of their step time, in
    :data:`STRAGGLER_SPREAD_CONSISTENCY` of at least :data:`STRAGGLER_SPREAD_MIN_STEPS` steps."""
    if len(rows) < STRAGGLER_SPREAD_MIN_STEPS:
        return False
    hits = 0
    for row in rows:
        mine = sum(x.wait_caused_us for x in row.ranks if x.rank == rank)
        theirs = sum(x.dur_us for x in row.ranks if x.rank != rank)
        hits += row.slowest_rank == rank and theirs > 0 and mine >= STRAGGLER_WAIT_SHARE * theirs
    return hits >= STRAGGLER_SPREAD_CONSISTENCY * len(rows)


def _waiting_text(job: Job, role: Any, culprits: list[Any], rows: list[StepRow]) -> tuple[str, list[Any], dict]:
    """``they wait ... for it`` with the host-sync part of that wait; the ranks that waited for the culprits,
    most first; figures."""
    waited: dict[Any, float] = defaultdict(float)
    synced: dict[Any, float] = defaultdict(float)
    for c in job.inv.stragglers.wait_matrix or []:
        if c.role == role and c.culprit in culprits and c.waiter not in culprits:
            waited[c.waiter] += c.wait_us
            synced[c.waiter] += c.sync_us
    n = len(rows)
    total = sum(waited.values())
    it = "it" if len(culprits) == 1 else "them"
    text = (f"the other rank waits {fmt_dur(total / n)} per step for {it}" if len(waited) == 1 else
            f"the other ranks wait {fmt_dur(total / n)} per step for {it} in all "
            f"(up to {fmt_dur(max(waited.values(), default=0.0) / n)} each)")
    sync_ranks = sorted((r for r in synced if synced[r] > 0), key=lambda r: (-synced[r], str(r)))
    if sync_ranks:
        calls: dict[str, float] = defaultdict(float)
        for r in sync_ranks:
            for name, v in job.names_per_step(role, r, "runtime").items():
                if is_sync(name):
                    calls[name] += v
            for name, v in job.names_per_step(role, r, "ops").items():
                if is_sync(name):
                    calls[name] += v
        call = max(calls, key=lambda k: calls[k]) if calls else "sync calls"
        text += (f"; {fmt_dur(sum(synced.values()) / n)} of that is {ranks_text(sync_ranks)} blocked in "
                 f"{name_text(call)} (their host waits for the device, which waits for {it}: the sync is where "
                 f"they wait, not a cause)")
    ranked = sorted(waited, key=lambda r: (-waited[r], _rank_key(r)))
    return text, ranked, {"waited_for_us": by_rank({r: waited[r] for r in ranked}),
                          "sync_waiting_us": by_rank({r: synced[r] for r in sync_ranks})}


def _rank_key(r: Any) -> tuple:
    return (0, r, "") if isinstance(r, int) else (1, 0, str(r))


def _evidence_ranks(rank: Any, members: list[Any], ranked: list[Any], rows: list[StepRow]) -> list[Any]:
    """The culprit, its late group, and the :data:`STRAGGLER_WAITERS_SHOWN` ranks that waited for them most."""
    rest = [r for r in ranked if r not in (rank, *members)]
    if not rest:  # nobody in the wait matrix (a rank of its own): the others, by rank
        rest = sorted({x.rank for row in rows for x in row.ranks if x.rank not in (rank, None, *members)},
                      key=_rank_key)
    return [rank, *members, *rest[:STRAGGLER_WAITERS_SHOWN]]


def _one_cause(job: Job, role: Any, rank: Any, rows: list[StepRow], cause: dict[str, Any],
               causes: list[dict[str, Any]]) -> Finding:
    """The straggler finding when one cause explains its lateness (a late group shares it)."""
    who = rank_name(role, rank)
    keys = [step_key(row) for row in rows]
    held_back = sum(1 for row in rows if row.slowest_rank == rank)
    runner_up = next((c for c in causes[1:] if c["kind"] != "late_start"), None)
    group = _late_together(job, role, rank, cause, rows)
    members = [r for r, _ in group]
    waiting, ranked, waited = _waiting_text(job, role, [rank, *members], rows)
    late = who if not group else f"{who} (with {ranks_text(members)}, late by as much: a slow node or group)"
    claim = (f"{late} holds the other ranks back in {held_back} of {len(rows)} steps ({steps_text(keys)}): "
             f"{waiting}; {_cause_text(cause, runner_up)}.")
    # Fixing the cause on one rank of a late group saves nothing while the others stay late: the what-if
    # brings every member's cause to the median together.
    cuts: list[dict[int, float]] = [{} for _ in rows]
    for member, c in [(rank, cause), *group]:
        for j, (row, ex) in enumerate(zip(rows, c["per_step"], strict=False)):
            i = next((i for i, x in enumerate(row.ranks) if x.rank == member), None)
            if i is None:
                continue
            cap = float("inf") if c["kind"] == "late_start" else row.ranks[i].busy_us
            cuts[j][i] = min(max(ex, 0.0), cap)
            if c["kind"] != "late_start":  # time inside the step: part of the rank's work
                _note_cut(job, role, row, member, cuts[j][i])
    fixed = f"{who} and {ranks_text(members)}" if group else who
    change = (f"{fixed} start{'' if group else 's'} the step with the median rank" if cause["kind"] == "late_start" else
              f"{fixed}'s {cause['kind']} {name_text(cause['name'])} takes the median rank's time "
              f"({fmt_dur(cause['median_us'])} instead of {fmt_dur(cause['rank_us'])} per step)")
    what_if = path_what_if(rows, cuts, change)
    step_time = job.step_time(rows)
    return Finding(
        id="straggler", claim=claim, cost_us=what_if.saves_us,
        cost_share=what_if.saves_us / step_time if step_time else None,
        evidence=FindingEvidence(
            role=role, ranks=_evidence_ranks(rank, members, ranked, rows), steps=keys,
            names=[c["name"] for c in causes[:3] if c["excess_us"] >= SECONDARY_SHARE * cause["excess_us"]],
            figures={"late_together": members, "no_single_cause": False, **waited,
                     "cause": {k: cause[k] for k in ("kind", "name", "rank_us", "median_us", "excess_us")}}),
        fix=_STRAGGLER_FIX[cause["kind"]].format(name=name_text(cause["name"]), who=who), what_if=what_if,
        plot=Plot.WAITS)


def _no_one_cause(job: Job, role: Any, rank: Any, rows: list[StepRow], causes: list[dict[str, Any]],
                  lateness: float) -> Finding:
    """The straggler finding when no one cause explains its lateness: the leading candidates with their shares,
    what would tell them apart, and how much slower its host work is overall."""
    who = rank_name(role, rank)
    keys = [step_key(row) for row in rows]
    held_back = sum(1 for row in rows if row.slowest_rank == rank)
    waiting, ranked, waited = _waiting_text(job, role, [rank], rows)
    lead = causes[:3]
    excesses = ", ".join(f"{c['kind'].replace('_', ' ')} {name_text(c['name'], 40)} +{fmt_dur(c['excess_us'])}"
                         for c in lead)
    listed = f"; its largest excesses over the median rank are {excesses}" if lead else ""
    ratio = _op_ratio(job, role, rank, rows)
    overall = f"; its CPU ops take {ratio:.1f}x the median rank's self time in all" if ratio and ratio >= 1.1 else ""
    claim = (f"{who} holds the other ranks back in {held_back} of {len(rows)} steps ({steps_text(keys)}): {waiting}; "
             f"no one cause explains the {fmt_dur(lateness)} per step it arrives late{listed}{overall}.")
    # What-if: it arrives with the median rank (start + busy), in every step.
    cuts = []
    for row in rows:
        i = next(i for i, x in enumerate(row.ranks) if x.rank == rank)
        x = row.ranks[i]
        med = median_of(o.start_us + o.busy_us for o in row.ranks if o.rank != rank)
        cut = min(max(x.start_us + x.busy_us - med, 0.0), x.busy_us)
        cuts.append({i: cut})
        _note_cut(job, role, row, rank, cut)
    what_if = path_what_if(rows, cuts, f"{who} arrives with the median rank")
    step_time = job.step_time(rows)
    return Finding(
        id="straggler", claim=claim, cost_us=what_if.saves_us,
        cost_share=what_if.saves_us / step_time if step_time else None,
        evidence=FindingEvidence(
            role=role, ranks=_evidence_ranks(rank, [], ranked, rows), steps=keys, names=[c["name"] for c in lead],
            figures={"late_together": [], "no_single_cause": True, "cause": None, "op_ratio": ratio, **waited}),
        fix=_SPREAD_FIX.format(who=who), what_if=what_if, plot=Plot.WAITS)


def _op_ratio(job: Job, role: Any, rank: Any, rows: list[StepRow]) -> float | None:
    """The rank's CPU-op self time per step over the median other rank's (communication left out): well above 1
    with no one op to blame points at the host (contention, a slower CPU) rather than its work."""
    def total(r: Any) -> float:
        return sum(v for k, v in job.names_per_step(role, r, "ops").items()
                   if not is_comm_host_event(k) and not is_sync(k) and not k.startswith(STEP_PREFIX))
    others = sorted({x.rank for row in rows for x in row.ranks if x.rank != rank}, key=_rank_key)
    med = median_of(total(r) for r in others)
    return total(rank) / med if med > 0 else None


def _note_cut(job: Job, role: Any, row: StepRow, rank: Any, cut: float) -> None:
    """The straggler's excess in a step, which other rules leave out of their figures (no cause is costed twice)."""
    k = step_key(row)
    job.straggler_cut[(role, tuple(k) if isinstance(k, list) else k, rank)] = cut


def _late_together(job: Job, role: Any, rank: Any, cause: dict[str, Any], rows: list[StepRow]
                   ) -> list[tuple[Any, dict[str, Any]]]:
    """Other ranks late for the same cause by at least :data:`STRAGGLER_GROUP_SHARE` of the straggler's excess
    (the ranks of a slow node): ``[(rank, its cause)]``, most waited-for first."""
    # Candidates: the ranks that would arrive latest if nobody waited (start + busy), summed over the steps; a
    # rank just ahead of the straggler at every collective is never "last" itself, so arrival order finds it.
    arrival: dict[Any, float] = defaultdict(float)
    for row in rows:
        for x in row.ranks:
            if isinstance(x.rank, int) and x.rank != rank:
                arrival[x.rank] += x.start_us + x.busy_us
    group = []
    for r in sorted(arrival, key=lambda r: -arrival[r])[:STRAGGLER_GROUP_MAX]:
        cs = _root_causes(job, role, r, rows)
        if cs and cs[0]["kind"] == cause["kind"] and cs[0]["name"] == cause["name"] and \
                cs[0]["excess_us"] >= STRAGGLER_GROUP_SHARE * cause["excess_us"]:
            group.append((r, cs[0]))
    return group
