"""Rules about a device waiting: ``exposed_communication``, ``launch_bound``, ``host_bound`` (the device waits
for host work that launches nothing) and ``host_sync``. See :mod:`distprof.analysis.diagnose`."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from distprof.analysis.diagnose.common import (
    EXPOSED_COMM_SHARE,
    HOST_BOUND_SHARE,
    HOST_SYNC_SHARE,
    LAUNCH_BOUND_RANK_STEPS,
    Finding,
    Job,
    Plot,
    by_rank,
    fmt_dur,
    make_finding,
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
from distprof.analysis.records import IdleFigure, LaunchFigure, LaunchStep, RankStep, StepRow, SummaryRank
from distprof.trace.vocab import is_collective_op, is_comm_kernel, is_dataloader, is_sync_op, is_sync_runtime

__all__ = ["exposed_communication", "host_bound", "host_sync", "launch_bound"]

_UNTRACED = "(no op, no phase)"
_RankStepAt = tuple[StepRow, int, RankStep]  # a row, the rank's index in row.ranks, its figures


def _cut_key(row: StepRow) -> Any:
    k = step_key(row)
    return tuple(k) if isinstance(k, list) else k


def exposed_communication(job: Job) -> list[Finding]:
    """Collectives not hidden behind compute, beyond waiting for late peers (:data:`EXPOSED_COMM_SHARE`).
    The collectives are where :func:`.vocab.collective_source` puts them: kernels, or host collectives (gloo)."""
    def exposed(x: RankStep) -> float | None:
        dev = x.temporal.device if x.temporal else None
        return None if dev is None else max(dev.communication_us - x.waited_us, 0.0)

    out = []
    for role, rows, cuts, share, per_rank in share_rule(job, "exposed_communication", exposed, EXPOSED_COMM_SHARE,
                                                        True):
        if role in job.partial:
            continue  # with ranks missing, their lateness cannot be told from transfer time (see caveats())
        top = top_rank(per_rank)
        kernels: dict[str, float] = defaultdict(float)
        host: dict[str, float] = defaultdict(float)
        for r in per_rank:
            for k, v in job.kernel_names(role, r, is_comm_kernel).items():
                kernels[k] += v
            for k, v in job.names_per_step(role, r, "ops").items():
                if is_collective_op(k):
                    host[k] += v
        on_host = not kernels  # gloo: the collectives run on the host, the device waits
        named = host if on_host else kernels
        names = [k for k, _ in sorted(named.items(), key=lambda kv: -kv[1])[:3]]
        wi = path_what_if(rows, cuts, "every collective overlapped with compute", upper_bound=True)
        where = "host collectives (gloo: the device waits while they run)" if on_host else "communication"
        claim = (f"{where} not overlapped with compute, beyond waiting for late ranks, take "
                 f"{fmt_dur(sum(per_rank.values()) / sum(len(c) for c in cuts))} per rank and step in "
                 f"{steps_text([step_key(r) for r in rows])} (most on {rank_name(role, top)}: "
                 f"{fmt_dur(per_rank[top] / len(rows))} per step); overlapping it would save up to "
                 f"{fmt_dur(wi.saves_per_step_us)} per step.")
        fix = ("Overlap communication with compute: DDP bucket_cap_mb and gradient_as_bucket_view, FSDP "
               "forward/backward prefetch, collectives issued before the compute that does not need their "
               "result; if transfers themselves are slow, check the interconnect and NCCL_ALGO/NCCL_PROTO.")
        if on_host:
            fix = ("The collectives run on the host (gloo): CUDA tensors are copied to host memory, reduced there and "
                   "copied back while the device waits. Use NCCL for CUDA tensors (init_process_group('nccl'), or "
                   "backend='cpu:gloo,cuda:nccl'); else " + fix[0].lower() + fix[1:])
        out.append(make_finding(job, "exposed_communication", role, rows, cuts, per_rank, claim, wi, fix,
                                names, {"share_of_step": share, "per_rank_us": by_rank(per_rank),
                                        "collectives_on": "host" if on_host else "device"}, Plot.OVERLAP))
    return out


def _idle(x: RankStep) -> IdleFigure | None:
    return x.idle if isinstance(x.idle, IdleFigure) else None


def _launch(x: RankStep) -> LaunchStep | None:
    return x.launch if isinstance(x.launch, LaunchStep) else None


def _issuing_us(f: IdleFigure | None) -> float:
    """Of an idle figure's host wait, the time the host spends issuing work (0 without a figure)."""
    return f.host_wait.launch_us if f is not None and f.host_wait else 0.0


def _busy_cuts(rows: list[StepRow], per_step: dict[Any, float]
               ) -> tuple[list[dict[int, float]], defaultdict[Any, float]]:
    """Each row's cut: a rank in ``per_step`` loses that much of its step (at most its busy time)."""
    cuts: list[dict[int, float]] = []
    per_rank: defaultdict[Any, float] = defaultdict(float)
    for row in rows:
        cut = {i: min(per_step[x.rank], x.busy_us) for i, x in enumerate(row.ranks) if x.rank in per_step}
        for i, v in cut.items():
            per_rank[row.ranks[i].rank] += v
        cuts.append(cut)
    return cuts, per_rank


def _launch_rank_steps(rows: list[StepRow]) -> tuple[list[_RankStepAt], list[_RankStepAt]]:
    """The role's rank-steps where the launch figure applies, and those of them that are launch-bound."""
    pairs = [(row, i, x) for row in rows for i, x in enumerate(row.ranks) if _launch(x) is not None]
    bound = [(row, i, x) for row, i, x in pairs if (la := _launch(x)) is not None and la.launch_bound]
    return pairs, bound


def _launch_cuts(rows: list[StepRow], bound: list[_RankStepAt]
                 ) -> tuple[list[dict[int, float]], defaultdict[Any, float]]:
    """What goes away in each row: the host wait during which the host issues work, on its launch-bound ranks."""
    cuts: list[dict[int, float]] = []
    per_rank: defaultdict[Any, float] = defaultdict(float)
    for row in rows:
        cut = {}
        for r2, i, x in bound:
            if r2 is row:
                cut[i] = min(_issuing_us(_idle(x)), x.busy_us)
                per_rank[x.rank] += cut[i]
        cuts.append(cut)
    return cuts, per_rank


def _launch_figures(bound: list[_RankStepAt]) -> tuple[int, dict[str, Any]]:
    """The launch-bound rank-steps' idle and launch figures, summed, and how many rank-steps the idle ones are."""
    idle = [f for _, _, x in bound if (f := _idle(x)) is not None]
    launches = [la for _, _, x in bound if (la := _launch(x)) is not None]
    return max(len(idle), 1), {
        "idle_us": sum(f.idle_us for f in idle), "host_wait_us": sum(f.host_wait_us for f in idle),
        "host_issuing_us": sum(_issuing_us(f) for f in idle),
        "span_us": sum(f.span_us for f in idle), "launches": sum(la.launches for la in launches),
        "short": sum(la.short for la in launches)}


def _launch_calls(job: Job, role: Any) -> Counter:
    """The role's launch calls (runtime names) and how often each ran, from the summary."""
    calls: Counter = Counter()
    for r in job.inv.summary.ranks or []:
        if r.role == role and isinstance(r.launch, LaunchFigure):
            calls.update(r.launch.calls)
    return calls


def launch_bound(job: Job) -> list[Finding]:
    """Devices idle while the host issues work: launch calls, the ops making them and the Python between them
    fill the device's gaps (:data:`LAUNCH_BOUND_RANK_STEPS`; the step rule is :mod:`.launch`'s)."""
    out = []
    for role, rows in job.by_role.items():
        pairs, bound = _launch_rank_steps(rows)
        if not pairs or len(bound) < LAUNCH_BOUND_RANK_STEPS * len(pairs):
            continue
        cuts, per_rank = _launch_cuts(rows, bound)
        n, fig = _launch_figures(bound)
        calls = _launch_calls(job, role)
        ranks = sorted_ranks(x.rank for _, _, x in bound)
        wi = path_what_if(rows, cuts, "the device never waits for the CPU to launch work", upper_bound=True)
        claim = (f"{len(bound)} of {len(pairs)} rank-steps are launch-bound ({ranks_text(ranks)}): the device is idle "
                 f"{fmt_dur(fig['idle_us'] / n)} of its {fmt_dur(fig['span_us'] / n)} per rank and step, "
                 f"{fmt_dur(fig['host_issuing_us'] / n)} of it waiting while the host issues work "
                 f"({fig['launches'] // n} launches per step, the ops that make them and the Python between them; "
                 f"{fig['short'] // n} of them run shorter on the device than the call); up to "
                 f"{fmt_dur(wi.saves_per_step_us)} per step could be saved.")
        out.append(make_finding(job, "launch_bound", role, rows, cuts, per_rank, claim, wi,
                                "Launch fewer, larger kernels: CUDA graphs (torch.compile mode='reduce-overhead'), "
                                "torch.compile fusion, larger batches per step, and no host work between launches "
                                "(Python overhead, .item()); faster kernels will not help.",
                                [c for c, _ in calls.most_common(3)],
                                {"rank_steps": len(pairs), "launch_bound_rank_steps": len(bound), **fig}, Plot.IDLE))
    return out


def _host_wait_per_step(job: Job, summary: dict[tuple[Any, Any], SummaryRank], role: Any,
                        rows: list[StepRow]) -> tuple[dict[Any, float], defaultdict[str, float]]:
    """Per rank of the role, the device's wait per step for host work that launches nothing (less the rank's
    straggler excess), and that wait per phase (untraced host code as :data:`_UNTRACED`), summed over the ranks."""
    per_step: dict[Any, float] = {}
    phases: defaultdict[str, float] = defaultdict(float)
    for r in ranks_of(rows):
        mine = job.of_rank[(role, r)]
        s = summary.get((role, r))
        hw = s.idle.host_wait if s is not None and isinstance(s.idle, IdleFigure) else None
        if not hw or not mine:
            continue
        named = {k: v for k, v in hw.phases.items() if not is_dataloader(k)}
        excess = sum(job.straggler_cut.get((role, _cut_key(row), r), 0.0) for row, _, _ in mine)
        total = max(sum(named.values()) + hw.untraced_us - excess, 0.0)
        if total > 0:
            per_step[r] = total / len(mine)
            scale = total / (sum(named.values()) + hw.untraced_us)
            for k, v in [*named.items(), (_UNTRACED, hw.untraced_us)]:
                phases[k] += v * scale / len(mine)
    return per_step, phases


def _host_bound_fix(lead: list[tuple[str, float]]) -> str:
    named_lead = [k for k, _ in lead if k != _UNTRACED]
    fix = (f"Take {', '.join(name_text(k) for k in named_lead) or 'that work'} off the device's path: prepare the "
           "next batch while the device runs this one (DataLoader workers, pin_memory, copies to the device on a "
           "side stream ahead of use), move logging, checkpointing and metrics to a background thread, or "
           "shorten it (profile it with with_stack to see what it runs).")
    if any(k == _UNTRACED for k, _ in lead):
        fix += (" The host code no op or phase names: wrap it in distprof.annotate or profile with with_stack to "
                "see it.")
    return fix


def host_bound(job: Job) -> list[Finding]:
    """The device waiting for host work that launches nothing: an annotated phase (not the DataLoader's, which
    ``data_loading`` owns), or host code no op or phase names (:data:`HOST_BOUND_SHARE` of the step). From
    each rank's device-level idle figure (gaps between steps included), per step; less a straggler's excess."""
    out = []
    summary = {(r.role, r.rank): r for r in job.inv.summary.ranks or []}
    for role, rows in job.by_role.items():
        per_step, phases = _host_wait_per_step(job, summary, role, rows)
        dur = sum(x.dur_us for row in rows for x in row.ranks if x.rank in per_step)
        part = sum(per_step[x.rank] for row in rows for x in row.ranks if x.rank in per_step)
        if not per_step or dur <= 0 or part < HOST_BOUND_SHARE * dur:
            continue
        cuts, per_rank = _busy_cuts(rows, per_step)
        top = top_rank(per_rank)
        lead = [(k, v) for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v > 0][:3]
        n_ranks = len(per_step)
        untraced = "untraced host code (" + _UNTRACED[1:-1] + ")"
        what = ", ".join(f"{untraced if k == _UNTRACED else 'phase ' + name_text(k)} {fmt_dur(v / n_ranks)}"
                         for k, v in lead)
        wi = path_what_if(rows, cuts, "the device never waits for host work that launches nothing", upper_bound=True)
        claim = (f"the device waits {fmt_dur(part / sum(len(c) for c in cuts))} per rank and step in "
                 f"{steps_text([step_key(r) for r in rows])} for host work that launches nothing ({what}; most on "
                 f"{rank_name(role, top)}: {fmt_dur(per_rank[top] / len(rows))} per step); taking it off the "
                 f"device's path would save up to {fmt_dur(wi.saves_per_step_us)} per step.")
        out.append(make_finding(job, "host_bound", role, rows, cuts, per_rank, claim, wi, _host_bound_fix(lead),
                                [k for k, _ in lead], {"share_of_step": part / dur, "per_rank_us_per_step":
                                                       by_rank(per_step), "by_phase_us_per_step": dict(lead)},
                                Plot.IDLE))
    return out


def _sync_per_step(job: Job, role: Any, rows: list[StepRow]) -> dict[Any, dict[str, float]]:
    """Per rank with device activity, its blocking device-to-host reads per step, by name."""
    per_step: dict[Any, dict[str, float]] = {}
    for r in ranks_of(rows):
        if any(x.temporal and x.temporal.device for _, _, x in job.of_rank[(role, r)]):
            ops = {k: v for k, v in job.names_per_step(role, r, "ops").items() if is_sync_op(k)}
            calls = {k: v for k, v in job.names_per_step(role, r, "runtime").items() if is_sync_runtime(k)}
            # .item() shows as both (the op calls the runtime's sync): the larger side, not the sum
            per_step[r] = ops if sum(ops.values()) >= sum(calls.values()) else calls
    return per_step


def _sync_hot(job: Job, role: Any, per_step: dict[Any, dict[str, float]]
              ) -> tuple[dict[Any, tuple[float, float]], dict[Any, float]]:
    """The ranks whose own sync time (less waiting for late peers) reaches :data:`HOST_SYNC_SHARE` of their mean
    step: ``(own per step, mean step)``, and the waiting per step of each of them."""
    hot, peers = {}, {}
    for r, ops in per_step.items():
        mine = job.of_rank[(role, r)]
        durs = [x.dur_us for _, _, x in mine]
        mean = sum(durs) / len(durs) if durs else 0.0
        waiting = sum(x.sync_waiting_us for _, _, x in mine) / len(mine) if mine else 0.0
        own = max(sum(ops.values()) - waiting, 0.0)
        if mean > 0 and own >= HOST_SYNC_SHARE * mean:
            hot[r], peers[r] = (own, mean), waiting
    return hot, peers


def host_sync(job: Job) -> list[Finding]:
    """Device-to-host reads that block the host inside the step (:data:`HOST_SYNC_SHARE` of a rank's step), not
    counting the time they wait for a late peer (``stragglers``' ``sync_waiting_us``: the straggler's cost)."""
    out = []
    for role, rows in job.by_role.items():
        per_step = _sync_per_step(job, role, rows)
        hot, peers = _sync_hot(job, role, per_step)
        if not hot:
            continue
        cuts, per_rank = _busy_cuts(rows, {r: v[0] for r, v in hot.items()})
        top = max(hot, key=lambda r: hot[r][0] / hot[r][1])
        names: dict[str, float] = defaultdict(float)
        for r in hot:
            for k, v in per_step[r].items():
                names[k] += v
        wi = path_what_if(rows, cuts, "no blocking device-to-host reads in the step", upper_bound=True)
        also = f", besides {fmt_dur(peers[top])} per step waiting in them for late ranks" if peers[top] > 0 else ""
        claim = (f"{rank_name(role, top)} blocks {fmt_dur(hot[top][0])} per step of its {fmt_dur(hot[top][1])} step "
                 f"reading values back from the device ({', '.join(name_text(k) for k in sorted(names))}{also})"
                 + (f"; {len(hot)} ranks do" if len(hot) > 1 else "") + f"; removing those syncs would save up to "
                 f"{fmt_dur(wi.saves_per_step_us)} per step.")
        out.append(make_finding(job, "host_sync", role, rows, cuts, per_rank, claim, wi,
                                "Keep values on the device inside the step: no .item(), .tolist(), .cpu(), print() or "
                                "Python if on device tensors; accumulate metrics on the device and read them every N "
                                "steps; torch.cuda.set_sync_debug_mode('warn') points at each sync.",
                                [k for k, _ in sorted(names.items(), key=lambda kv: -kv[1])],
                                {"per_rank_us_per_step": by_rank({r: v[0] for r, v in hot.items()}),
                                 "share_of_step": by_rank({r: v[0] / v[1] for r, v in hot.items()}),
                                 "waiting_for_peers_us_per_step": by_rank(peers)}, Plot.OPS))
    return out
