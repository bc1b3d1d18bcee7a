"""The ``bounding_role`` rule: the role whose work bounds the steps of a multi-role job (see
:mod:`distprof.analysis.diagnose`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from distprof.analysis.diagnose.common import (
    ROLE_BOUND_RATIO,
    ROLE_BOUND_SHARE,
    Finding,
    Job,
    Plot,
    fmt_dur,
    rank_name,
    step_key,
    steps_text,
)
from distprof.analysis.records import RankStep, StepRow
from distprof.analysis.records_diag import FindingEvidence, WhatIf
from distprof.analysis.rlsteps import RLStep
from distprof.rundir.layout import DRIVER_ROLE
from distprof.trace.vocab import ENGINE_SUFFIX

__all__ = ["bounding_role"]


def _work(x: RankStep) -> float:
    """A rank's work in a step: the time something traced runs, less its waiting for peers (a role that idles
    until the driver ends the step has little)."""
    b = x.breakdown
    if b:
        return max(b.dur_us - b.other - x.waited_us, 0.0)
    return max(x.phases.values(), default=x.busy_us)  # a capture window: its longest phase (phases nest)


def _shared_steps(by_role: dict[Any, list[StepRow]]) -> dict[Any, dict[Any, StepRow]]:
    """Per step key that more than one role has: each role's row of it."""
    by_key: dict[Any, dict[Any, StepRow]] = defaultdict(dict)
    for role, rows in by_role.items():
        for row in rows:
            k = step_key(row)
            by_key[tuple(k) if isinstance(k, list) else k][role] = row
    return {k: v for k, v in by_key.items() if k is not None and len(v) > 1}


def _role_work(job: Job, shared: dict[Any, dict[Any, StepRow]]) -> tuple[dict[Any, float], list[tuple]]:
    """Each role's work summed over the shared steps, and per step ``(key, rows by role, wall time, work)``
    where work is each role's ``(work, rank)`` of its rank with the most."""
    total: dict[Any, float] = defaultdict(float)
    steps = []
    for k, roles in sorted(shared.items(), key=lambda kv: str(kv[0])):
        xs = [x for row in roles.values() for x in row.ranks]
        wall = max(x.start_us + x.dur_us for x in xs) - min(x.start_us for x in xs)
        # A straggler's excess is its own finding: the role's work is judged as if that rank took the median time.
        work = {role: max(((_work(x) - job.straggler_cut.get((role, k, x.rank), 0.0), x.rank)
                           for x in row.ranks), key=lambda t: t[0]) for role, row in roles.items()}
        for role, (w, _) in work.items():
            total[role] += w
        steps.append((k, roles, wall, work))
    return total, steps


def _saving(steps: list[tuple], bound: Any) -> float:
    """What the steps would save were the bounding role's work no longer than the most of the other roles'."""
    return sum(max(work[bound][0] - max(w for r, (w, _) in work.items() if r != bound), 0.0)
               for _, roles, _, work in steps if bound in work)


def _others_waiting(steps: list[tuple], bound: Any) -> tuple[float, float]:
    """The other roles' ranks' idle time (wall less their work) summed over the steps, and their time in all."""
    idle = sum(wall - _work(x) for _, roles, wall, _ in steps for role, row in roles.items() if role != bound
               for x in row.ranks)
    other_time = sum(wall for _, roles, wall, _ in steps for role, row in roles.items() if role != bound
                     for _ in row.ranks)
    return idle, other_time


def _rank_phases(steps: list[tuple], bound: Any, rank: Any) -> list[str]:
    """The three longest phases of the bounding role's rank, per step."""
    n = len(steps)
    phases: dict[str, float] = defaultdict(float)
    for _, roles, _, _ in steps:
        row = roles.get(bound)
        for x in row.ranks if row is not None else []:
            if x.rank == rank:
                for name, v in x.phases.items():
                    phases[name] += v / n
    return [p for p, _ in sorted(phases.items(), key=lambda kv: -kv[1])[:3]]


def bounding_role(job: Job) -> list[Finding]:
    """The role whose work bounds the steps of a multi-role job (thresholds: :data:`ROLE_BOUND_RATIO`,
    :data:`ROLE_BOUND_SHARE`)."""
    # The driver's phases are its waits on the other roles (distprof.integrations.ray.driver): it orchestrates,
    # never bounds.
    by_role = {role: rows for role, rows in job.by_role.items() if role != DRIVER_ROLE}
    if len(by_role) < 2:
        return []
    shared = _shared_steps(by_role)
    if not shared:
        return []
    total, steps = _role_work(job, shared)
    ranked = sorted(total, key=lambda r: -total[r])
    bound, nxt = ranked[0], ranked[1]
    saving = _saving(steps, bound)
    walls = sum(wall for _, _, wall, _ in steps)
    if total[bound] < ROLE_BOUND_RATIO * total[nxt] or walls <= 0 or saving < ROLE_BOUND_SHARE * walls:
        return []
    n = len(steps)
    idle, other_time = _others_waiting(steps, bound)
    ranks = Counter(work[bound][1] for _, _, _, work in steps if bound in work)
    rank = ranks.most_common(1)[0][0]
    names = _rank_phases(steps, bound, rank)
    others = ", ".join(f"{fmt_dur(total[r] / n)} for {r}" for r in ranked[1:])
    straggler = bound in job.straggler_roles
    claim = (f"role {bound} bounds {steps_text([k for k, *_ in steps])}: its work takes {fmt_dur(total[bound] / n)} "
             f"per step (its {rank_name(None, rank)}"
             + (", not counting the straggler's excess, a finding of its own" if straggler else "")
             + f") against {others}; the other roles' ranks sit idle {fmt_dur(idle / n)} per "
             f"step in all waiting for it.")
    rl_if, cause = _rl_what_if(job, bound)
    claim += cause
    return [Finding(
        id="bounding_role", claim=claim, cost_us=saving, cost_share=saving / walls,
        evidence=FindingEvidence(
            role=bound, ranks=[rank], steps=[k for k, *_ in steps], names=names,
            figures={"work_per_step_us": {str(r or ""): total[r] / n for r in ranked}, "idle_other_roles_us": idle,
                     "other_roles_time_us": other_time, "wall_us": walls}),
        fix=f"Shorten or split {bound}'s work (more workers or GPUs for it, smaller batches per step), or overlap the "
            f"other roles with it (generate step N+1 while {bound} works on step N, as asynchronous RL does).",
        what_if=WhatIf(change=f"{bound}'s work takes as long as {nxt}'s", saves_us=saving, saves_per_step_us=saving / n,
                       naive_us=saving, steps=n, then_last_rank=None, upper_bound=False, roles_then_bounding=nxt,
                       **rl_if),
        plot=Plot.PHASES)]


def _rl_what_if(job: Job, bound: Any) -> tuple[dict[str, Any], str]:
    """The RL step view's what-if for the bounding role (``steps``' ``rl_steps``, :mod:`..rlsteps`): per step its
    critical path and the saving were the role at its median step's time, replayed on the path; and the engine's
    cause (iterations, prefill vs decode) where the role's engine traces say it (text for the claim)."""
    rl: list[RLStep] = job.inv.steps.rl_steps or []
    if not rl:
        return {}, ""
    per = []
    for s in rl:
        w = next((x for x in s.what_if if x.role == bound), None)
        per.append({"step": s.step, "critical_path": s.critical_path, "saves_us": w.saves_us if w else 0.0})
    paths = Counter(tuple(p["critical_path"]) for p in per)
    out = {"critical_path": list(paths.most_common(1)[0][0]), "rl_saves_us": sum(p["saves_us"] for p in per),
           "rl_steps": per}
    engines = [e for s in rl for e in s.engine or [] if e.role in (bound, f"{bound}{ENGINE_SUFFIX}")]
    if not engines:
        return out, ""
    n = len({id(s) for s in rl})
    it = sum(e.engine_iterations for e in engines) / n
    pre, dec = sum(e.prefill_us for e in engines) / n, sum(e.decode_us for e in engines) / n
    out["engine"] = {"role": engines[0].role, "iterations_per_step": it, "prefill_us_per_step": pre,
                     "decode_us_per_step": dec}
    text = f" Its engine ({engines[0].role}) runs {it:,.0f} iterations per step"
    if pre + dec > 0:
        stage, other = ("decode", "prefill") if dec >= pre else ("prefill", "decode")
        text += (f", {fmt_dur(max(pre, dec))} of it in {stage} against {fmt_dur(min(pre, dec))} in {other}: "
                 f"{stage} bounds the generation")
    return out, text + "."
