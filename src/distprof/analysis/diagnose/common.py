"""What every diagnose rule shares: the thresholds, the path model (its what-if), words and numbers, and the job as
the rules see it; the findings they make are records (:class:`~distprof.analysis.records_diag.Finding`). The rules
and the model are described in :mod:`distprof.analysis.diagnose`."""

from __future__ import annotations

import logging
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import msgspec
import numpy as np

from distprof.analysis.investigation import Investigation
from distprof.analysis.launch import LAUNCH_BOUND_HOST_WAIT_SHARE, LAUNCH_BOUND_IDLE_SHARE, LAUNCH_BOUND_LAUNCH_SHARE
from distprof.analysis.records import RankStep, StepBreakdown, StepRow
from distprof.analysis.records_diag import Finding, FindingEvidence, WhatIf
from distprof.trace.ranks import unranked_label
from distprof.util.intervals import ranges_text

logger = logging.getLogger(__name__)

STRAGGLER_WAIT_SHARE = 0.2  # waiting caused, over the other ranks' summed step time
STRAGGLER_CONSISTENCY = 2 / 3  # share of the steps in which it is the rank holding the others back
STRAGGLER_EXPLAINED = 0.5  # its root cause's excess over the waiting it causes per waiting rank
STRAGGLER_GROUP_SHARE = 0.8  # another rank late for the same cause by this share of the straggler's excess joins it
STRAGGLER_GROUP_MAX = 64  # ranks examined for a late group (the most waited-for first)
STRAGGLER_SPREAD_CONSISTENCY = 0.9  # no one cause: share of the steps it must hold the others back by the threshold
STRAGGLER_SPREAD_MIN_STEPS = 3  # and the fewest steps that can show it
STRAGGLER_WAITERS_SHOWN = 3  # evidence: the culprit, its late group, and this many of the ranks that waited most
ROLE_BOUND_RATIO = 1.5  # bounding role's work over the next role's
ROLE_BOUND_SHARE = 0.1  # and the difference over the step's wall time
EXPOSED_COMM_SHARE = 0.1  # exposed communication (less waiting for peers) over step time
LAUNCH_BOUND_RANK_STEPS = 0.5  # share of a role's rank-steps that are launch-bound
HOST_BOUND_SHARE = 0.1  # device waiting for host work that launches nothing (phases, untraced), over step time
HOST_SYNC_SHARE = 0.05  # a rank's blocking device-to-host reads over its step time
DATA_LOADING_SHARE = 0.1  # DataLoader __next__ over step time
MEMCPY_SHARE = 0.1  # memcpy with nothing else on the device, over step time
PAGEABLE_SHARE = 0.01  # copies to or from pageable host memory over step time
OUTLIER_RATIO = 1.5  # a step over this many times the rank's median step
OUTLIER_MIN_STEPS = 3  # steps a rank needs for a median to mean something
LOW_MFU = 0.3  # a rank's MFU over its recorded steps below this is low (dense peak, :mod:`..peaks`)
LOW_MFU_FLOP_KERNEL_SHARE = 0.25  # judged only where the counted FLOP ops' kernels are this share of device compute
LOW_MFU_MEMORY_SHARE = 0.5  # cause: memory-bound top ops (below the ridge) take this share of the top ops' kernel time
LOW_MFU_SMALL_GEMM_US = 10.0  # a GEMM is small when its FLOPs per call take under this many µs at the peak
LOW_MFU_SMALL_GEMM_SHARE = 0.5  # cause: small GEMMs take this share of the top GEMMs' kernel time
SLOW_COLLECTIVE_SHARE = 0.25  # busbw below this share of the link's, and the time over 1/this of the link's time
SLOW_COLLECTIVE_LATENCY_US = 30.0  # per call, what the link's time allows for NCCL's latency
SLOW_COLLECTIVE_SKEW_RATIO = 1.0  # skew form: the median start skew over the median transfer time
SLOW_COLLECTIVE_MIN_SHARE = 0.01  # its cost over the role's step time
SECONDARY_SHARE = 0.25  # further root-cause names listed when at least this share of the first's excess

THRESHOLDS = {
    "straggler": {"wait_caused_share_of_others_step_time": STRAGGLER_WAIT_SHARE,
                  "holds_back_share_of_steps": STRAGGLER_CONSISTENCY,
                  "cause_explains_share_of_wait": STRAGGLER_EXPLAINED,
                  "late_group_share_of_cause": STRAGGLER_GROUP_SHARE,
                  "no_single_cause": {"holds_back_share_of_steps": STRAGGLER_SPREAD_CONSISTENCY,
                                      "min_steps": STRAGGLER_SPREAD_MIN_STEPS}},
    "bounding_role": {"work_ratio_to_next_role": ROLE_BOUND_RATIO, "difference_share_of_step": ROLE_BOUND_SHARE},
    "exposed_communication": {"share_of_step": EXPOSED_COMM_SHARE},
    "launch_bound": {"launch_bound_rank_steps_share": LAUNCH_BOUND_RANK_STEPS,
                     "step_rule": {"idle_share": LAUNCH_BOUND_IDLE_SHARE,
                                   "host_wait_share": LAUNCH_BOUND_HOST_WAIT_SHARE,
                                   "launch_share": LAUNCH_BOUND_LAUNCH_SHARE}},
    "host_bound": {"share_of_step": HOST_BOUND_SHARE},
    "host_sync": {"share_of_rank_step": HOST_SYNC_SHARE},
    "data_loading": {"share_of_step": DATA_LOADING_SHARE},
    "memcpy": {"share_of_step": MEMCPY_SHARE},
    "pageable_memcpy": {"share_of_step": PAGEABLE_SHARE},
    "outlier_steps": {"ratio_to_rank_median_step": OUTLIER_RATIO, "min_steps": OUTLIER_MIN_STEPS},
    "low_mfu": {"mfu": LOW_MFU, "flop_kernel_share_of_compute": LOW_MFU_FLOP_KERNEL_SHARE,
                "memory_bound_share": LOW_MFU_MEMORY_SHARE, "small_gemm_us_at_peak": LOW_MFU_SMALL_GEMM_US,
                "small_gemm_share": LOW_MFU_SMALL_GEMM_SHARE},
    "slow_collective": {"busbw_share_of_link": SLOW_COLLECTIVE_SHARE, "latency_us_per_call": SLOW_COLLECTIVE_LATENCY_US,
                        "skew_ratio_to_transfer": SLOW_COLLECTIVE_SKEW_RATIO,
                        "cost_share_of_step": SLOW_COLLECTIVE_MIN_SHARE},
}


class Plot:
    """Ids of the report's plots: a finding names the one that shows it (the report links the claim to it)."""
    STEP_TIME = "step-time"  # heatmap: step time per rank x step, per role
    PHASES = "phases"  # stacked bars: phase breakdown per role (and per rank)
    TEMPORAL = "temporal"  # per rank: compute / exposed communication / memory / idle (device, else host)
    OVERLAP = "overlap"  # per rank: share of communication overlapped by compute
    WAITS = "waits"  # who waits for whom (wait matrix, aggregated for many ranks)
    KERNELS = "kernels"  # top kernels
    OPS = "ops"  # top CPU ops
    IDLE = "idle"  # device idle by cause per rank, launch statistics
    RL_STEPS = "rl-steps"  # timeline of the worst and the median RL step: a lane per role and rank (rlsteps)
    MEMORY = "memory"  # memory over time per rank (analysis.memory; report.memplot)
    DIFF = "diff"  # run-to-run diff (report --compare)
    ALL = (STEP_TIME, PHASES, TEMPORAL, OVERLAP, WAITS, KERNELS, OPS, IDLE, RL_STEPS, DIFF)
    # MEMORY is drawn only where the traces or snapshots hold memory data (after RL_STEPS), so it is not in ALL,
    # the plots every report has (DIFF: with --compare)


# ---- the path model ---------------------------------------------------------------------------------------
def path_saving(ranks: list[RankStep], cut: dict[int, float]) -> tuple[float, Any, Any]:
    """One step: how much earlier the latest arrival comes when rank ``ranks[i]`` loses ``cut[i]`` µs (see the
    module docstring). ``ranks`` are a ``steps`` row's ranks (``start_us``, ``busy_us``). Returns (saving,
    the rank arriving last before, the rank arriving last after)."""
    if not ranks:
        return 0.0, None, None
    base = min(x.start_us for x in ranks)  # epoch µs are ~1.7e15: relative times keep sub-µs precision
    before = [x.start_us - base + x.busy_us for x in ranks]
    cuts = [max(cut.get(i, 0.0), 0.0) for i in range(len(ranks))]
    after = [a - c for a, c in zip(before, cuts, strict=True)]
    last_before = max(range(len(ranks)), key=lambda i: before[i])
    last_after = max(range(len(ranks)), key=lambda i: after[i])
    saving = min(max(before[last_before] - after[last_after], 0.0), max(cuts))  # never more than the largest cut
    return saving, ranks[last_before].rank, ranks[last_after].rank


def path_what_if(rows: list[StepRow], cuts: list[dict[int, float]], change: str, upper_bound: bool = False
                 ) -> WhatIf:
    """The path saving over several steps (``cuts[j]`` for ``rows[j]``), with the naive sum for contrast."""
    saves = naive = 0.0
    then_last: Counter = Counter()
    for row, cut in zip(rows, cuts, strict=True):
        s, _, after = path_saving(row.ranks, cut)
        saves += s
        naive += max((max(v, 0.0) for v in cut.values()), default=0.0)
        if cut:
            then_last[after] += 1
    return WhatIf(change=change, saves_us=saves, saves_per_step_us=saves / len(rows) if rows else 0.0,
                  naive_us=naive, steps=len(rows), then_last_rank=then_last.most_common(1)[0][0] if then_last else None,
                  upper_bound=upper_bound)


# ---- words and numbers ------------------------------------------------------------------------------------
def fmt_dur(v: float) -> str:
    """A duration for a sentence: three significant digits, in the unit that reads best."""
    v = float(v)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3g} ms"
    return f"{v:.3g} µs"


def fmt_pct(v: float) -> str:
    return f"{v:.0%}" if v >= 0.01 else f"{v:.1%}"


def step_key(row: StepRow) -> Any:
    """A row's step: its number, its capture window ``[a, b]``, or None (a trace without steps)."""
    return row.window if row.window else row.step


def fmt_ranges(nums: Iterable[int], limit: int = 6) -> str:
    """``2-3, 5-6``: consecutive numbers as ranges, at most ``limit`` of them (then ``... (N in all)``)."""
    return ranges_text(nums, limit=limit)


def steps_text(keys: list[Any]) -> str:
    """``step 10``, ``steps 2-3, 5-6``, ``window 2-3``, ``the traced time`` (a trace without steps)."""
    if not keys or all(k is None for k in keys):
        return "the traced time"
    windows = [k for k in keys if isinstance(k, (list, tuple))]
    nums = sorted({k for k in keys if isinstance(k, int)})
    text = []
    if nums:
        text.append(("step " if len(nums) == 1 else "steps ") + fmt_ranges(nums))
    if windows:
        text.append(("window " if len(windows) == 1 else "windows ") + ", ".join(f"{a}-{b}" for a, b in windows))
    return " and ".join(text)


def rank_name(role: str | None, rank: Any) -> str:
    if rank is not None and not isinstance(rank, int):
        return f"{role} file {rank[3:-1]}" if role else f"file {rank[3:-1]}"  # an unranked file: "? (dir/name)"
    r = "?" if rank is None else rank
    return f"{role} rank {r}" if role else f"rank {r}"


def name_text(name: str, limit: int = 80) -> str:
    """A trace name inside a sentence, cut (C++ kernel names run to thousands of characters; evidence.names
    keeps them whole)."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def by_rank(d: dict[Any, Any]) -> dict[str, Any]:
    """A per-rank figure with JSON keys (an unranked trace's is ``"?"``, as the tables show it)."""
    return {"?" if r is None else str(r): v for r, v in d.items()}


def ranks_text(ranks: list[Any]) -> str:
    """``rank 3``, ``ranks 0-7``, ``ranks 0, 2, 4 ... (512 in all)``; an unranked trace is ``?``."""
    known = [r for r in ranks if isinstance(r, int)]
    files = [str(r) for r in ranks if not isinstance(r, int)]
    more = [f"... ({len(files)} files)"] if len(files) > 3 else []
    text = ", ".join(([fmt_ranges(known)] if known else []) + files[:3] + more)
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def median_of(values: Iterable[float]) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else 0.0


class LeaveOneOut:
    """The medians of each row of a matrix (rows: names; columns: ranks) over every column but one, for any one
    column: each row sorted once, then a column's medians cost O(rows), not a median over the other columns per
    candidate rank (quadratic in ranks at a thousand ranks). Taking one value out of a sorted row shifts what
    follows it by one, so the middle of the rest is read off the sorted row: the same floats as ``np.median`` (and
    :func:`median_of`) over the other columns."""

    def __init__(self, m: np.ndarray) -> None:
        order = np.argsort(m, axis=1, kind="stable")
        self.sorted = np.take_along_axis(m, order, axis=1)
        self.pos = np.empty_like(order)  # where each value went in its sorted row
        np.put_along_axis(self.pos, order, np.broadcast_to(np.arange(m.shape[1]), m.shape), axis=1)

    def medians(self, rows: np.ndarray, col: int) -> np.ndarray:
        """The medians of ``rows`` over every column but ``col`` (at least one other column)."""
        n = self.sorted.shape[1] - 1
        at = self.pos[rows, col]

        def kth(k: int) -> np.ndarray:  # the k-th smallest of the row without its value in col
            return self.sorted[rows, k + (k >= at)]

        return kth(n // 2) if n % 2 else (kth(n // 2 - 1) + kth(n // 2)) / 2


# ---- the job as the rules see it --------------------------------------------------------------------------
class Job:
    """The Investigation's typed records arranged for the rules: step rows per role, each file's facts by path."""

    def __init__(self, inv: Investigation) -> None:
        self.inv = inv
        self.files = {f.path: f for f in inv.files}
        rows = list(inv.steps.steps) or self._whole_trace_rows()
        self.by_role: dict[Any, list[StepRow]] = defaultdict(list)
        for row in map(_label_unranked, rows):
            if row.ranks:
                self.by_role[row.role].append(row)
        # (role, rank) -> [(row, index in row.ranks, rank's figures)], built once: rules look ranks up often.
        self.of_rank: dict[tuple[Any, Any], list[tuple[StepRow, int, RankStep]]] = defaultdict(list)
        for role, rs in self.by_role.items():
            for row in rs:
                for i, x in enumerate(row.ranks):
                    self.of_rank[(role, x.rank)].append((row, i, x))
        self.partial = self._partial()
        self.device = any(x.temporal and x.temporal.device for rs in self.by_role.values() for row in rs
                          for x in row.ranks)
        self._names: dict[tuple, dict[str, float]] = {}
        self._matrices: dict[tuple, tuple[dict[str, int], dict[Any, int], np.ndarray]] = {}
        self._loo: dict[Any, LeaveOneOut] = {}  # names_matrix's key, or a StepRow's id -> its LeaveOneOut
        self._phase_rows: dict[int, tuple[StepRow, dict[str, int], np.ndarray, list[Any]]] = {}
        self.straggler_roles: set[Any] = set()  # filled by the straggler rule, which runs first
        # (role, step key, rank) -> the straggler's root-cause excess in that step: other rules judge the role
        # without it, so one cause is not reported (and costed) twice
        self.straggler_cut: dict[tuple[Any, Any, Any], float] = {}

    def _partial(self) -> dict[Any, tuple[int, int]]:
        """Roles whose traces say the job had more ranks than are here (one rank's file, --ranks 0-3, a sampled
        set): role -> (ranks present, world size). Waiting for an absent rank looks like communication time."""
        out: dict[Any, tuple[int, int]] = {}
        for role, rs in self.by_role.items():
            paths = {x.path for row in rs for x in row.ranks}
            worlds = [f.world_size for p in paths if (f := self.files.get(p)) is not None and f.world_size]
            present = len({x.rank for row in rs for x in row.ranks if isinstance(x.rank, int)})
            if worlds and max(worlds) > present:
                out[role] = (present, max(worlds))
        return out

    def _whole_trace_rows(self) -> list[StepRow]:
        """Traces without steps: one unit per role over each rank's traced time (its whole-trace figures)."""
        by_role: dict[Any, list[RankStep]] = defaultdict(list)
        for r in self.inv.summary.ranks:
            f = self.files.get(r.path)
            traced = r.traced_us or 0.0
            if f is None or traced <= 0:
                continue
            x = RankStep(rank=r.rank, path=r.path, dur_us=traced, waited_us=0.0, busy_us=traced, wait_caused_us=0.0,
                         sync_waiting_us=0.0, phases={}, categories=r.categories or {}, source="trace",
                         start_us=f.start_us or 0.0, temporal=r.temporal, idle=r.idle)
            if r.step_breakdown:
                x.breakdown = r.step_breakdown
            by_role[r.role].append(x)
        return [StepRow(role=role, step=None, window=None, ranks=xs, max_us=max(x.dur_us for x in xs))
                for role, xs in by_role.items()]

    def step_time(self, rows: list[StepRow]) -> float:
        return sum(row.max_us or max(x.dur_us for x in row.ranks) for row in rows)

    def names_per_step(self, role: Any, rank: Any, which: str) -> dict[str, float]:
        """A rank's kernels (device time), ops (self time) or runtime calls by name, per step: the time inside
        its files' steps over its step count (a trace without steps: its whole-trace totals)."""
        key = (role, rank, which)
        if key not in self._names:
            mine = self.of_rank.get((role, rank), [])
            total: dict[str, float] = defaultdict(float)
            for p in sorted({x.path for _, _, x in mine}):  # sorted: float sums do not depend on hash order
                f = self.files.get(p)
                table = {} if f is None else {"kernels": f.step_kernels, "ops": f.step_ops,
                                              "runtime": f.step_runtime}.get(which, {})
                for name, v in table.items():
                    # ops: (count, total, self); kernels: (count, total)
                    total[name] += v[2] if which == "ops" else v[1]
            n = max(len(mine), 1)
            self._names[key] = {k: v / n for k, v in total.items()}
        return self._names[key]

    def names_matrix(self, role: Any, ranks: tuple[Any, ...], which: str
                     ) -> tuple[dict[str, int], dict[Any, int], np.ndarray]:
        """:meth:`names_per_step` of ``ranks`` as one matrix, built once: the row of each name any of them has, the
        column of each rank, and the figures (0 where a rank lacks the name). The medians over the other ranks,
        taken for every candidate rank, are then one numpy call each instead of a loop over ranks per name."""
        key = (role, ranks, which)
        if key not in self._matrices:
            per = [self.names_per_step(role, r, which) for r in ranks]
            rows: dict[str, int] = {}
            for d in per:
                for name in d:
                    rows.setdefault(name, len(rows))
            m = np.zeros((len(rows), len(ranks)))
            for j, d in enumerate(per):
                if d:
                    m[[rows[n] for n in d], j] = list(d.values())
            self._matrices[key] = (rows, {r: j for j, r in enumerate(ranks)}, m)
        return self._matrices[key]

    def names_medians(self, role: Any, ranks: tuple[Any, ...], which: str, rank: Any, names: list[str]
                      ) -> np.ndarray:
        """The medians over ``ranks`` but ``rank`` (one of them, once) of ``names`` (rows of
        :meth:`names_matrix`)."""
        rows, cols, m = self.names_matrix(role, ranks, which)
        key = (role, ranks, which)
        if key not in self._loo:
            self._loo[key] = LeaveOneOut(m)
        return self._loo[key].medians(np.array([rows[n] for n in names], dtype=np.int64), cols[rank])

    def phase_medians(self, row: StepRow, col: int) -> np.ndarray:
        """One step's medians of each phase of :meth:`phase_matrix` over its ranks but the one at ``col``."""
        idx, m, _ = self.phase_matrix(row)
        loo = self._loo.get(id(row))
        if loo is None or self._phase_rows[id(row)][0] is not row:
            loo = self._loo[id(row)] = LeaveOneOut(m.T)
        return loo.medians(np.arange(len(idx)), col)

    def phase_matrix(self, row: StepRow) -> tuple[dict[str, int], np.ndarray, list[Any]]:
        """One step's phases by rank, built once: the column of each phase any rank has, the figures (one row per
        rank of ``row.ranks``, 0 where a rank lacks the phase) and the ranks."""
        got = self._phase_rows.get(id(row))
        if got is None or got[0] is not row:
            idx: dict[str, int] = {}
            for x in row.ranks:
                for n in x.phases:
                    idx.setdefault(n, len(idx))
            m = np.zeros((len(row.ranks), len(idx)))
            for i, x in enumerate(row.ranks):
                if x.phases:
                    m[i, [idx[n] for n in x.phases]] = list(x.phases.values())
            got = self._phase_rows[id(row)] = (row, idx, m, [x.rank for x in row.ranks])
        return got[1], got[2], got[3]

    def kernel_names(self, role: Any, rank: Any, keep: Callable[[str], bool]) -> dict[str, float]:
        return {k: v for k, v in self.names_per_step(role, rank, "kernels").items() if keep(k)}


def _label_unranked(row: StepRow) -> StepRow:
    """A copy of ``row`` in which each file without a rank is a rank of its own, named by its file."""
    if all(x.rank is not None for x in row.ranks):
        return row
    return msgspec.structs.replace(row, ranks=[x if x.rank is not None else
                                               msgspec.structs.replace(x, rank=unranked_label(x.path))
                                               for x in row.ranks])


def _rank_order(r: Any) -> tuple:
    return (0, r, "") if isinstance(r, int) else (1, 0, str(r))  # numbered ranks first, then unranked files


def ranks_of(rows: list[StepRow]) -> list[Any]:
    """The ranks in ``rows``, unranked files (named by :func:`unranked_label`) last, each a rank of its own."""
    return sorted_ranks(x.rank for row in rows for x in row.ranks)


def sorted_ranks(ranks: Iterable[Any]) -> list[Any]:
    """``ranks`` once each, numbered ranks first, then unranked files (named by :func:`unranked_label`)."""
    return sorted(set(ranks), key=_rank_order)


def share_rule(job: Job, rule: str, figure: Callable[[RankStep], float | None], threshold: float,
               device: bool) -> list[tuple[Any, list[StepRow], list[dict[int, float]], float, dict[Any, float]]]:
    """Per role: the rows, each rank's ``figure`` (µs per step, None: not applicable) as cuts, the figure's
    share of the step time, and per rank its total; only the roles at or above ``threshold``."""
    hits = []
    for role, rows in job.by_role.items():
        if device and not any(x.temporal and x.temporal.device for row in rows for x in row.ranks):
            continue
        cuts, part, dur = [], 0.0, 0.0
        per_rank: dict[Any, float] = defaultdict(float)
        for row in rows:
            cut = {}
            for i, x in enumerate(row.ranks):
                v = figure(x)
                if v is None:
                    continue
                cut[i] = min(max(v, 0.0), x.busy_us)
                part += v
                dur += x.dur_us
                per_rank[x.rank] += v
            cuts.append(cut)
        if dur > 0 and part >= threshold * dur and part > 0:
            hits.append((role, rows, cuts, part / dur, per_rank))
        else:
            logger.debug("%s: role %s below threshold (%.3f of step time)", rule, role, part / dur if dur else 0.0)
    return hits


def make_finding(job: Job, rule: str, role: Any, rows: list[StepRow], cuts: list[dict[int, float]],
                 per_rank: dict[Any, float], claim: str, wi: WhatIf, fix: str, names: list[str],
                 figures: dict[str, Any], plot: str) -> Finding:
    """A finding about the rows' steps: evidence ranks by their share of the figure, the steps where it was cut."""
    st = job.step_time(rows)
    ranks = [r for r, v in sorted(per_rank.items(), key=lambda kv: -kv[1]) if v > 0 and r is not None]
    steps = [step_key(row) for row, cut in zip(rows, cuts, strict=True) if any(v > 0 for v in cut.values())]
    return Finding(id=rule, claim=claim, cost_us=wi.saves_us, cost_share=wi.saves_us / st if st else None,
                   evidence=FindingEvidence(role=role, ranks=ranks, steps=steps, names=names, figures=figures), fix=fix,
                   what_if=wi, plot=plot)


def top_rank(per_rank: dict[Any, float]) -> Any:
    return max(per_rank, key=lambda r: per_rank[r])


def breakdown_figure(part: Callable[[StepBreakdown], float]) -> Callable[[RankStep], float | None]:
    """A rank-step's figure: ``part`` of its step breakdown (None without one)."""
    def fig(x: RankStep) -> float | None:
        b = x.breakdown
        return part(b) if b else None
    return fig

