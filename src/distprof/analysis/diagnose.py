"""What is wrong, in words: findings ranked by the time they cost, each with its evidence and a next step.

Built on :func:`distprof.analysis.analyze.investigate` (one read; nothing here reads a trace or recomputes a
figure an analysis already has). Each rule is a function of an :class:`~.analyze.Investigation` returning
findings; a rule fires only above the threshold its docstring states, and never without evidence. The
thresholds are the module's constants (:data:`THRESHOLDS` lists them; ``diagnose --json`` prints it).

**The step's path across ranks (the what-if model).** Within one step of one role, each rank ``r`` starts
at ``start_r`` and is busy for ``busy_r = dur_r - waited_r`` (its step less the time it sat blocked in
collectives waiting for late peers, as ``stragglers`` measures it). Its *arrival* ``start_r + busy_r`` is
when it would finish if it never had to wait. The ranks of a synchronous step leave it together, at about
the latest arrival plus a part they share (the last collectives, which every rank spends alike), so the
rank that arrives last is on the step's path and the others wait for it. A what-if removes time from some
ranks (``cut_r``: a phase brought to the median rank's time, a late start, exposed communication ...) and
asks how much earlier the latest arrival comes:

    saving = max_r(start_r + busy_r) - max_r(start_r + busy_r - cut_r)

Cutting the last rank's time helps only until the next-slowest rank arrives last, so this is never more
than the naive ``cut`` of the last rank, and often much less (the DLRM set: rank 7's late start is
4.5 ms, but ranks 2 and 6 arrive 1.9 ms after it would). A rank that starts late (its previous step ran
long) arrives late by as much, which is why the start counts. Savings are summed over the analysed steps.
A trace without steps is one unit over its traced time. The model assumes the ranks' clocks agree (as
``stragglers`` does; ranks of one host share a clock).

A finding's ``cost_us`` is the wall-clock step time it costs over the analysed steps: its what-if saving,
or for rules whose remedy removes the time only in the best case (exposed communication, launch-bound,
host syncs, memcpy, pageable copies, data loading) the saving if that time went away entirely, so an upper bound (the claim
says "up to"). ``cost_share`` is ``cost_us`` over the analysed steps' time (per step, the longest rank's
duration, summed). A finding whose what-if saves no step time (the ranks it concerns never arrive last) is
not reported, except a straggler, which has passed its own thresholds.

**Rules** (ids are stable; thresholds are the constants below):

- ``straggler``: per role, the rank whose late arrivals cost the others the most waiting (``stragglers``'
  ``wait_caused_us``, over the steps in which it ran with others), when all of these hold: that waiting is
  at least :data:`STRAGGLER_WAIT_SHARE` of the other ranks' summed step time; the rank is the step's
  ``slowest_rank`` in at least :data:`STRAGGLER_CONSISTENCY` of those steps; and its root cause explains
  at least :data:`STRAGGLER_EXPLAINED` of the waiting it causes per waiting rank and step. Root cause: of
  the rank's phases (annotation wall time), kernels (device time, collectives left out), ops (self time,
  communication left out) and its start of the step, the one where it exceeds the median of the other
  ranks the most per step. What-if: that one takes the median rank's time. The three conditions are what
  tells a straggler from a busy machine: on a 2-core machine running four 2-rank gloo jobs at once, the
  rank a job waited for caused 21-80% of the other's step time in waiting, but it changed between steps,
  or no one cause explained more than 40% of it (a descheduled process is slow everywhere); the slow ranks
  of real jobs (the gloo test job, the demo's actor, DLRM rank 7) are the slowest in every step and one
  cause explains 89-99% of their waiting.
- ``bounding_role``: in a job with several roles (RL: rollout, ref, actor ...), over the steps they share,
  the role whose work (per rank: the time something traced runs in the step, less its waiting for peers;
  per role: its busiest rank) is the longest, when it is at least :data:`ROLE_BOUND_RATIO` times the next
  role's and the difference is at least :data:`ROLE_BOUND_SHARE` of the step's wall time (first start to
  last end over every role). Its cost: the difference, what the step saves if the role's work took as long
  as the next role's, whether the roles run one after another or at once. The other roles' idle time
  (wall time less their work) is in the claim.
- ``exposed_communication`` (device): per role, collective kernel time when no compute kernel runs, less
  the time the rank waited for late peers (the straggler's share), at least :data:`EXPOSED_COMM_SHARE` of
  the step on average. What-if: all of it overlapped with compute.
- ``launch_bound`` (device): per role, at least :data:`LAUNCH_BOUND_RANK_STEPS` of the rank-steps are
  launch-bound by :mod:`.launch`'s rule (device idle >= 20% of its span, half of it waiting for the host,
  half the launches shorter on the device than the call). What-if, an upper bound: the device never waits
  for the host (fewer, larger kernels: CUDA graphs, ``torch.compile``).
- ``host_sync`` (device): per role, a rank spends at least :data:`HOST_SYNC_SHARE` of its step in ops that
  block the host until the device has a value (``aten::item``, ``aten::_local_scalar_dense``: ``.item()``,
  ``.tolist()``, ``if tensor:``; :func:`.vocab.is_sync_op`; self time, so nested calls count once) or in
  runtime calls that wait for the device (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize`` and their HIP names: :func:`.vocab.is_sync_runtime`; ``torch.cuda.synchronize()``
  is one). A ``.item()`` makes both (the op calls the runtime), so a rank's figure is the larger of the
  two, never their sum. What-if, an upper bound: none of them.
- ``data_loading``: per role, the DataLoader's ``__next__`` (the step breakdown's ``dataloader``) takes at
  least :data:`DATA_LOADING_SHARE` of the step. What-if, an upper bound: loading fully overlapped.
- ``memcpy`` (device): per role, memcpy (the step breakdown's ``memcpy``: copies with no kernel running)
  takes at least :data:`MEMCPY_SHARE` of the step. What-if, an upper bound: copies hidden behind compute.
- ``pageable_memcpy`` (device): per role, copies from or to pageable host memory (Kineto's ``Memcpy HtoD
  (Pageable -> Device)``, ``Memcpy DtoH (Device -> Pageable)``) take at least :data:`PAGEABLE_SHARE` of the
  step. What-if, an upper bound: pinned memory, so the copies neither block the host nor run staged.
- ``outlier_steps``: per rank with at least :data:`OUTLIER_MIN_STEPS` steps, a step longer than
  :data:`OUTLIER_RATIO` times the rank's median step. What-if: the step took the median time (on the
  path: a rank that only waited in that step saves nothing). The phase that grew most is named.

On CPU-only traces the device rules do not apply (no device figures): ``straggler``, ``bounding_role``,
``data_loading`` and ``outlier_steps`` do.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable

from .ranks import unranked_label
from .launch import LAUNCH_BOUND_HOST_WAIT_SHARE, LAUNCH_BOUND_IDLE_SHARE, LAUNCH_BOUND_SHORT_SHARE
from .vocab import (STEP_PREFIX, is_comm_host_event, is_comm_kernel, is_dataloader, is_sync_op, is_sync_runtime,
                    memcpy_endpoints)

logger = logging.getLogger(__name__)

__all__ = ["Finding", "Plot", "diagnose", "path_saving", "THRESHOLDS", "STRAGGLER_WAIT_SHARE", "STRAGGLER_CONSISTENCY",
           "STRAGGLER_EXPLAINED", "ROLE_BOUND_RATIO",
           "ROLE_BOUND_SHARE", "EXPOSED_COMM_SHARE", "LAUNCH_BOUND_RANK_STEPS", "HOST_SYNC_SHARE",
           "DATA_LOADING_SHARE", "MEMCPY_SHARE", "PAGEABLE_SHARE", "OUTLIER_RATIO", "OUTLIER_MIN_STEPS"]

STRAGGLER_WAIT_SHARE = 0.2  # waiting caused, over the other ranks' summed step time
STRAGGLER_CONSISTENCY = 2 / 3  # share of the steps in which it is the rank holding the others back
STRAGGLER_EXPLAINED = 0.5  # its root cause's excess over the waiting it causes per waiting rank
STRAGGLER_GROUP_SHARE = 0.8  # another rank late for the same cause by this share of the straggler's excess joins it
STRAGGLER_GROUP_MAX = 64  # ranks examined for a late group (the most waited-for first)
ROLE_BOUND_RATIO = 1.5  # bounding role's work over the next role's
ROLE_BOUND_SHARE = 0.1  # and the difference over the step's wall time
EXPOSED_COMM_SHARE = 0.1  # exposed communication (less waiting for peers) over step time
LAUNCH_BOUND_RANK_STEPS = 0.5  # share of a role's rank-steps that are launch-bound
HOST_SYNC_SHARE = 0.05  # a rank's blocking device-to-host reads over its step time
DATA_LOADING_SHARE = 0.1  # DataLoader __next__ over step time
MEMCPY_SHARE = 0.1  # memcpy with nothing else on the device, over step time
PAGEABLE_SHARE = 0.01  # copies to or from pageable host memory over step time
OUTLIER_RATIO = 1.5  # a step over this many times the rank's median step
OUTLIER_MIN_STEPS = 3  # steps a rank needs for a median to mean something
SECONDARY_SHARE = 0.25  # further root-cause names listed when at least this share of the first's excess

THRESHOLDS = {
    "straggler": {"wait_caused_share_of_others_step_time": STRAGGLER_WAIT_SHARE,
                  "holds_back_share_of_steps": STRAGGLER_CONSISTENCY, "cause_explains_share_of_wait": STRAGGLER_EXPLAINED,
                  "late_group_share_of_cause": STRAGGLER_GROUP_SHARE},
    "bounding_role": {"work_ratio_to_next_role": ROLE_BOUND_RATIO, "difference_share_of_step": ROLE_BOUND_SHARE},
    "exposed_communication": {"share_of_step": EXPOSED_COMM_SHARE},
    "launch_bound": {"launch_bound_rank_steps_share": LAUNCH_BOUND_RANK_STEPS,
                     "step_rule": {"idle_share": LAUNCH_BOUND_IDLE_SHARE, "host_wait_share": LAUNCH_BOUND_HOST_WAIT_SHARE,
                                   "short_share": LAUNCH_BOUND_SHORT_SHARE}},
    "host_sync": {"share_of_rank_step": HOST_SYNC_SHARE},
    "data_loading": {"share_of_step": DATA_LOADING_SHARE},
    "memcpy": {"share_of_step": MEMCPY_SHARE},
    "pageable_memcpy": {"share_of_step": PAGEABLE_SHARE},
    "outlier_steps": {"ratio_to_rank_median_step": OUTLIER_RATIO, "min_steps": OUTLIER_MIN_STEPS},
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
    DIFF = "diff"  # run-to-run diff (report --compare)
    ALL = (STEP_TIME, PHASES, TEMPORAL, OVERLAP, WAITS, KERNELS, OPS, IDLE, DIFF)


@dataclass
class Finding:
    """One thing wrong with the job. ``--json`` prints :meth:`to_dict` (DESIGN.md fixes ``id``, ``claim``,
    ``cost_us``, ``evidence.{role, ranks, steps, names}`` and ``fix``)."""
    id: str
    """Stable rule id (``straggler``, ``bounding_role``, ...): scripts key on it."""
    claim: str
    """One sentence, with the numbers that make it true."""
    cost_us: float
    """Wall-clock step time the job loses to it over the analysed steps (what fixing it would save)."""
    fix: str
    """A concrete next step."""
    role: str | None = None
    ranks: list[int] = field(default_factory=list)
    """The ranks concerned; for ``straggler`` the rank holding the others back first."""
    steps: list[Any] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    """Phase, kernel or op names that explain it (for ``straggler``: the root cause first)."""
    figures: dict[str, Any] = field(default_factory=dict)
    """The figures compared (e.g. the straggler's phase time and the median rank's)."""
    cost_share: float | None = None
    """``cost_us`` as a share of the analysed steps' time."""
    what_if: dict[str, Any] | None = None
    """What fixing it would save, computed on the step's path across ranks: ``{"change", "saves_us", ...}``."""
    plot: str | None = None
    """The :class:`Plot` that shows it."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        evidence = {"role": d.pop("role"), "ranks": d.pop("ranks"), "steps": d.pop("steps"), "names": d.pop("names"),
                    "figures": d.pop("figures")}
        return {"id": d["id"], "claim": d["claim"], "cost_us": d["cost_us"], "cost_share": d["cost_share"],
                "evidence": evidence, "fix": d["fix"], "what_if": d["what_if"], "plot": d["plot"]}


# ---- the path model ---------------------------------------------------------------------------------------
def path_saving(ranks: list[dict[str, Any]], cut: dict[int, float]) -> tuple[float, Any, Any]:
    """One step: how much earlier the latest arrival comes when rank ``ranks[i]`` loses ``cut[i]`` µs (see the
    module docstring). ``ranks`` are a ``steps`` row's ranks (``start_us``, ``busy_us``). Returns (saving,
    the rank arriving last before, the rank arriving last after)."""
    if not ranks:
        return 0.0, None, None
    base = min(x["start_us"] for x in ranks)  # epoch µs are ~1.7e15: relative times keep sub-µs precision
    before = [x["start_us"] - base + x["busy_us"] for x in ranks]
    cuts = [max(cut.get(i, 0.0), 0.0) for i in range(len(ranks))]
    after = [a - c for a, c in zip(before, cuts)]
    last_before = max(range(len(ranks)), key=lambda i: before[i])
    last_after = max(range(len(ranks)), key=lambda i: after[i])
    saving = min(max(before[last_before] - after[last_after], 0.0), max(cuts))  # never more than the largest cut
    return saving, ranks[last_before]["rank"], ranks[last_after]["rank"]


def _what_if(rows: list[dict[str, Any]], cuts: list[dict[int, float]], change: str, upper_bound: bool = False
             ) -> dict[str, Any]:
    """The path saving over several steps (``cuts[j]`` for ``rows[j]``), with the naive sum for contrast."""
    saves = naive = 0.0
    then_last: Counter = Counter()
    for row, cut in zip(rows, cuts):
        s, _, after = path_saving(row["ranks"], cut)
        saves += s
        naive += max((max(v, 0.0) for v in cut.values()), default=0.0)
        if cut:
            then_last[after] += 1
    return {"change": change, "saves_us": saves, "saves_per_step_us": saves / len(rows) if rows else 0.0,
            "naive_us": naive, "steps": len(rows), "then_last_rank": then_last.most_common(1)[0][0] if then_last else None,
            "upper_bound": upper_bound}


# ---- words and numbers ------------------------------------------------------------------------------------
def _dur(v: float) -> str:
    """A duration for a sentence: three significant digits, in the unit that reads best."""
    v = float(v)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g} s"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.3g} ms"
    return f"{v:.3g} µs"


def _pct(v: float) -> str:
    return f"{v:.0%}" if v >= 0.01 else f"{v:.1%}"


def _key(row: dict[str, Any]) -> Any:
    """A row's step: its number, its capture window ``[a, b]``, or None (a trace without steps)."""
    return row["window"] if row.get("window") else row["step"]


def _ranges(nums: Iterable[int], limit: int = 6) -> str:
    """``2-3, 5-6``: consecutive numbers as ranges, at most ``limit`` of them (then ``... (N in all)``)."""
    nums = sorted(set(nums))
    parts = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(parts) if len(parts) <= limit else ", ".join(parts[:limit]) + f" ... ({len(nums)} in all)"


def _steps_text(keys: list[Any]) -> str:
    """``step 10``, ``steps 2-3, 5-6``, ``window 2-3``, ``the traced time`` (a trace without steps)."""
    if not keys or all(k is None for k in keys):
        return "the traced time"
    windows = [k for k in keys if isinstance(k, (list, tuple))]
    nums = sorted({k for k in keys if isinstance(k, int)})
    text = []
    if nums:
        text.append(("step " if len(nums) == 1 else "steps ") + _ranges(nums))
    if windows:
        text.append(("window " if len(windows) == 1 else "windows ") + ", ".join(f"{a}-{b}" for a, b in windows))
    return " and ".join(text)


def _who(role: str | None, rank: Any) -> str:
    if rank is not None and not isinstance(rank, int):
        return f"{role} file {rank[3:-1]}" if role else f"file {rank[3:-1]}"  # an unranked file: "? (dir/name)"
    r = "?" if rank is None else rank
    return f"{role} rank {r}" if role else f"rank {r}"


def _n(name: str, limit: int = 80) -> str:
    """A trace name inside a sentence, cut (C++ kernel names run to thousands of characters; evidence.names
    keeps them whole)."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def _by_rank(d: dict[Any, Any]) -> dict[str, Any]:
    """A per-rank figure with JSON keys (an unranked trace's is ``"?"``, as the tables show it)."""
    return {"?" if r is None else str(r): v for r, v in d.items()}


def _ranks_text(ranks: list[Any]) -> str:
    """``rank 3``, ``ranks 0-7``, ``ranks 0, 2, 4 ... (512 in all)``; an unranked trace is ``?``."""
    known = [r for r in ranks if isinstance(r, int)]
    files = [str(r) for r in ranks if not isinstance(r, int)]
    text = ", ".join(([_ranges(known)] if known else []) + files[:3] + ([f"... ({len(files)} files)"] if len(files) > 3 else []))
    return ("rank " if len(ranks) == 1 else "ranks ") + text


def _median(values: Iterable[float]) -> float:
    values = list(values)
    return float(statistics.median(values)) if values else 0.0


# ---- the job as the rules see it --------------------------------------------------------------------------
class _Job:
    """The Investigation's figures arranged for the rules: step rows per role, per-file parts by path."""

    def __init__(self, inv: Any) -> None:
        self.inv = inv
        self.parts = {r.info.path: r.parts for r in inv.run.files}
        self.infos = {r.info.path: r.info for r in inv.run.files}
        rows = list(inv.steps.get("steps") or [])
        if not rows:
            rows = self._whole_trace_rows()
        rows = [_label_unranked(row) for row in rows]
        self.by_role: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            if row["ranks"]:
                self.by_role[row["role"]].append(row)
        # (role, rank) -> [(row, index in row["ranks"], rank's figures)], built once: rules look ranks up often.
        self.of_rank: dict[tuple[Any, Any], list[tuple[dict[str, Any], int, dict[str, Any]]]] = defaultdict(list)
        for role, rs in self.by_role.items():
            for row in rs:
                for i, x in enumerate(row["ranks"]):
                    self.of_rank[(role, x["rank"])].append((row, i, x))
        # Roles whose traces say the job had more ranks than are here (one rank's file, --ranks 0-3, a sampled
        # set): role -> (ranks present, world size). Waiting for an absent rank looks like communication time.
        self.partial: dict[Any, tuple[int, int]] = {}
        for role, rs in self.by_role.items():
            paths = {x["path"] for row in rs for x in row["ranks"]}
            worlds = [self.infos[p].world_size for p in paths if p in self.infos and self.infos[p].world_size]
            present = len({x["rank"] for row in rs for x in row["ranks"] if isinstance(x["rank"], int)})
            if worlds and max(worlds) > present:
                self.partial[role] = (present, max(worlds))
        self.device = any((x.get("temporal") or {}).get("device") for rs in self.by_role.values() for row in rs
                          for x in row["ranks"])
        self._names: dict[tuple, dict[str, float]] = {}
        self.straggler_roles: set[Any] = set()  # filled by the straggler rule, which runs first
        # (role, step key, rank) -> the straggler's root-cause excess in that step: other rules judge the role
        # without it, so one cause is not reported (and costed) twice
        self.straggler_cut: dict[tuple[Any, Any, Any], float] = {}

    def _whole_trace_rows(self) -> list[dict[str, Any]]:
        """Traces without steps: one unit per role over each rank's traced time (its whole-trace figures)."""
        by_role: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        for r in self.inv.summary.get("ranks") or []:
            info = self.infos.get(r["path"])
            traced = r.get("traced_us") or 0.0
            if info is None or traced <= 0:
                continue
            x = {"rank": r["rank"], "path": r["path"], "dur_us": traced, "waited_us": 0.0, "busy_us": traced,
                 "wait_caused_us": 0.0, "phases": {}, "categories": r.get("categories") or {},
                 "start_us": info.start_us or 0.0, "temporal": r.get("temporal"), "idle": r.get("idle")}
            if r.get("step_breakdown"):
                x["breakdown"] = r["step_breakdown"]
            by_role[r["role"]].append(x)
        return [{"role": role, "step": None, "window": None, "ranks": xs, "max_us": max(x["dur_us"] for x in xs)}
                for role, xs in by_role.items()]

    def step_time(self, rows: list[dict[str, Any]]) -> float:
        return sum(row.get("max_us") or max(x["dur_us"] for x in row["ranks"]) for row in rows)

    def names_per_step(self, role: Any, rank: Any, which: str) -> dict[str, float]:
        """A rank's kernels (device time), ops (self time) or runtime calls by name, per step: the time inside
        its files' steps over its step count (a trace without steps: its whole-trace totals)."""
        key = (role, rank, which)
        if key not in self._names:
            mine = self.of_rank.get((role, rank), [])
            total: dict[str, float] = defaultdict(float)
            for p in sorted({x["path"] for _, _, x in mine}):  # sorted: float sums do not depend on hash order
                parts = self.parts.get(p) or {}
                src = parts.get("step_names") or parts.get("summary") or {}
                for name, v in src.get(which, {}).items():
                    total[name] += v[2] if which == "ops" else v[1]  # ops: (count, total, self); kernels: (count, total)
            n = max(len(mine), 1)
            self._names[key] = {k: v / n for k, v in total.items()}
        return self._names[key]

    def kernel_names(self, role: Any, rank: Any, keep: Callable[[str], bool]) -> dict[str, float]:
        return {k: v for k, v in self.names_per_step(role, rank, "kernels").items() if keep(k)}


def _label_unranked(row: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``row`` in which each file without a rank is a rank of its own, named by its file."""
    if all(x["rank"] is not None for x in row["ranks"]):
        return row
    return {**row, "ranks": [x if x["rank"] is not None else {**x, "rank": unranked_label(x["path"])}
                             for x in row["ranks"]]}


def _rank_order(r: Any) -> tuple:
    return (0, r, "") if isinstance(r, int) else (1, 0, str(r))  # numbered ranks first, then unranked files


def _ranks_of(rows: list[dict[str, Any]]) -> list[Any]:
    """The ranks in ``rows``, unranked files (named by :func:`unranked_label`) last, each a rank of its own."""
    return sorted({x["rank"] for row in rows for x in row["ranks"]}, key=_rank_order)


# ---- rules ------------------------------------------------------------------------------------------------
def _root_causes(job: _Job, role: Any, rank: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where ``rank`` exceeds the median of the other ranks, per step, most first: phases, kernels (not
    collectives), ops (self time, not communication), and its start of the step."""
    cands: list[dict[str, Any]] = []
    mine = [next(x for x in row["ranks"] if x["rank"] == rank) for row in rows]
    others = [[x for x in row["ranks"] if x["rank"] != rank] for row in rows]
    names = {n for x in mine for n in x["phases"]} | {n for os_ in others for o in os_ for n in o["phases"]}
    for name in names:
        ex = [x["phases"].get(name, 0.0) - _median(o["phases"].get(name, 0.0) for o in os_) for x, os_ in zip(mine, others)]
        cands.append({"kind": "phase", "name": name, "per_step": ex,
                      "rank_us": sum(x["phases"].get(name, 0.0) for x in mine) / len(rows),
                      "median_us": sum(_median(o["phases"].get(name, 0.0) for o in os_) for os_ in others) / len(rows)})
    other_ranks = sorted({o["rank"] for os_ in others for o in os_ if o["rank"] is not None})
    for which, keep, kind in (("kernels", lambda n: not is_comm_kernel(n), "kernel"),
                              ("ops", lambda n: not is_comm_host_event(n) and not n.startswith(STEP_PREFIX), "op")):
        own = {k: v for k, v in job.names_per_step(role, rank, which).items() if keep(k)}
        theirs = [job.names_per_step(role, r, which) for r in other_ranks]
        for name, v in own.items():
            med = _median(t.get(name, 0.0) for t in theirs)
            cands.append({"kind": kind, "name": name, "per_step": [v - med] * len(rows), "rank_us": v, "median_us": med})
    late = [x["start_us"] - _median(o["start_us"] for o in os_) for x, os_ in zip(mine, others)]
    worst = max(range(len(rows)), key=lambda j: late[j])
    step_name = f"{STEP_PREFIX}{rows[worst]['step']}" if rows[worst]["ranks"][0].get("source") == "ProfilerStep" \
        else "(start of the capture window)"
    cands.append({"kind": "late_start", "name": step_name, "per_step": late, "rank_us": None, "median_us": None})
    for c in cands:
        c["excess_us"] = sum(c["per_step"]) / len(rows)
    cands = [c for c in cands if c["excess_us"] > 0]
    cands.sort(key=lambda c: (-c["excess_us"], c["kind"], c["name"]))
    return cands


def _cause_text(c: dict[str, Any], runner_up: dict[str, Any] | None) -> str:
    if c["kind"] == "late_start":
        inside = f"; inside the step nothing exceeds the median rank's time by more than {_dur(runner_up['excess_us'])} " \
                 f"({runner_up['kind']} {_n(runner_up['name'])})" if runner_up else ""
        return f"it starts the step {_dur(c['excess_us'])} after the median rank (what delays it runs before the " \
               f"step, outside the traced steps){inside}"
    what = {"phase": "phase", "kernel": "kernel", "op": "op"}[c["kind"]]
    self_note = " self time" if c["kind"] == "op" else ""
    return f"its {what} {_n(c['name'])} takes {_dur(c['rank_us'])}{self_note} per step against {_dur(c['median_us'])} " \
           f"on the median rank"


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


def _straggler(job: _Job) -> list[Finding]:
    """The rank holding the others back, per role, and its root cause (thresholds: :data:`STRAGGLER_WAIT_SHARE`,
    :data:`STRAGGLER_CONSISTENCY`, :data:`STRAGGLER_EXPLAINED`)."""
    out = []
    tops: dict[Any, dict[str, Any]] = {}
    for r in job.inv.stragglers.get("ranks") or []:
        if r["rank"] is not None and r["wait_caused_us"] > 0 and r["late_arrivals"] > 0 and r["role"] not in tops:
            tops[r["role"]] = r  # the list is sorted by wait_caused_us, descending
    for role, top in tops.items():
        rank, who = top["rank"], _who(role, top["rank"])
        rows = [row for row in job.by_role.get(role, [])
                if len(row["ranks"]) > 1 and any(x["rank"] == rank for x in row["ranks"])]
        caused = sum(x["wait_caused_us"] for row in rows for x in row["ranks"] if x["rank"] == rank)
        others = sum(x["dur_us"] for row in rows for x in row["ranks"] if x["rank"] != rank)
        if others <= 0 or caused < STRAGGLER_WAIT_SHARE * others:
            continue
        held_back = sum(1 for row in rows if row.get("slowest_rank") == rank)
        if held_back < STRAGGLER_CONSISTENCY * len(rows):
            logger.debug("straggler: %s holds the others back in %d of %d steps only", who, held_back, len(rows))
            continue
        causes = _root_causes(job, role, rank, rows)
        waiters = sum(len(row["ranks"]) - 1 for row in rows)  # rank-steps that could wait for it
        explained = causes[0]["excess_us"] / (caused / waiters) if causes else 0.0
        if explained < STRAGGLER_EXPLAINED:
            logger.debug("straggler: %s's lateness is spread out (its largest cause explains %.0f%%)", who, 100 * explained)
            continue
        cause = causes[0]
        keys = [_key(row) for row in rows]
        runner_up = next((c for c in causes[1:] if c["kind"] != "late_start"), None)
        group = _late_together(job, role, rank, cause, rows)
        late = f"{who} arrives last" if not group else \
            f"{who} (with {_ranks_text([r for r, _ in group])}, late by as much: a slow node or group) arrives last"
        claim = (f"{late} at {top['late_arrivals']} of {top['collectives']} collectives in "
                 f"{_steps_text(keys)} and costs the other ranks {_dur(caused / len(rows))} of waiting per step "
                 f"({_pct(caused / others)} of their step time); {_cause_text(cause, runner_up)}.")
        # Fixing the cause on one rank of a late group saves nothing while the others stay late: the what-if
        # brings every member's cause to the median together.
        cuts = [{} for _ in rows]
        for member, c in [(rank, cause), *group]:
            for j, (row, ex) in enumerate(zip(rows, c["per_step"])):
                i = next((i for i, x in enumerate(row["ranks"]) if x["rank"] == member), None)
                if i is None:
                    continue
                cap = float("inf") if c["kind"] == "late_start" else row["ranks"][i]["busy_us"]
                cuts[j][i] = min(max(ex, 0.0), cap)
                if c["kind"] != "late_start":  # time inside the step: part of the rank's work
                    k = _key(row)
                    job.straggler_cut[(role, tuple(k) if isinstance(k, list) else k, member)] = cuts[j][i]
        # The what-if fixes the whole late group.
        fixed = f"{who} and {_ranks_text([r for r, _ in group])}" if group else who
        change = (f"{fixed} start{'' if group else 's'} the step with the median rank" if cause["kind"] == "late_start" else
                  f"{fixed}'s {cause['kind']} {_n(cause['name'])} takes the median rank's time "
                  f"({_dur(cause['median_us'])} instead of {_dur(cause['rank_us'])} per step)")
        what_if = _what_if(rows, cuts, change)
        waited_for = defaultdict(float)  # the other ranks, those that waited for it most first
        for c in job.inv.stragglers.get("wait_matrix") or []:
            if c["role"] == role and c["culprit"] == rank:
                waited_for[c["waiter"]] += c["wait_us"]
        members = [r for r, _ in group]
        rest = sorted({x["rank"] for row in rows for x in row["ranks"] if x["rank"] not in (rank, None, *members)},
                      key=lambda r: (-waited_for[r], r))
        job.straggler_roles.add(role)
        step_time = job.step_time(rows)
        out.append(Finding(
            id="straggler", claim=claim, cost_us=what_if["saves_us"], role=role, ranks=[rank, *members, *rest],
            steps=keys,
            names=[c["name"] for c in causes[:3] if c["excess_us"] >= SECONDARY_SHARE * cause["excess_us"]],
            fix=_STRAGGLER_FIX[cause["kind"]].format(name=_n(cause["name"]), who=who),
            figures={"wait_caused_us": caused, "others_step_us": others, "wait_share": caused / others,
                     "holds_back_steps": held_back, "cause_explains": explained, "late_together": members,
                     "late_arrivals": top["late_arrivals"], "collectives": top["collectives"],
                     "cause": {k: cause[k] for k in ("kind", "name", "rank_us", "median_us", "excess_us")},
                     "candidates": [{k: c[k] for k in ("kind", "name", "excess_us")} for c in causes[:5]]},
            cost_share=what_if["saves_us"] / step_time if step_time else None, what_if=what_if, plot=Plot.WAITS))
    return out


def _late_together(job: _Job, role: Any, rank: Any, cause: dict[str, Any], rows: list[dict[str, Any]]
                   ) -> list[tuple[Any, dict[str, Any]]]:
    """Other ranks late for the same cause by at least :data:`STRAGGLER_GROUP_SHARE` of the straggler's excess
    (the ranks of a slow node): ``[(rank, its cause)]``, most waited-for first."""
    # Candidates: the ranks that would arrive latest if nobody waited (start + busy), summed over the steps; a
    # rank just ahead of the straggler at every collective is never "last" itself, so arrival order finds it.
    arrival: dict[Any, float] = defaultdict(float)
    for row in rows:
        for x in row["ranks"]:
            if isinstance(x["rank"], int) and x["rank"] != rank:
                arrival[x["rank"]] += x.get("start_us", 0.0) + x["busy_us"]
    group = []
    for r in sorted(arrival, key=lambda r: -arrival[r])[:STRAGGLER_GROUP_MAX]:
        cs = _root_causes(job, role, r, rows)
        if cs and cs[0]["kind"] == cause["kind"] and cs[0]["name"] == cause["name"] and \
                cs[0]["excess_us"] >= STRAGGLER_GROUP_SHARE * cause["excess_us"]:
            group.append((r, cs[0]))
    return group


def _work(x: dict[str, Any]) -> float:
    """A rank's work in a step: the time something traced runs, less its waiting for peers (a role that idles
    until the driver ends the step has little)."""
    b = x.get("breakdown")
    if b:
        return max(b["dur_us"] - b.get("other", 0.0) - x["waited_us"], 0.0)
    return max(x["phases"].values(), default=x["busy_us"])  # a capture window: its longest phase (phases nest)


def _bounding_role(job: _Job) -> list[Finding]:
    """The role whose work bounds the steps of a multi-role job (thresholds: :data:`ROLE_BOUND_RATIO`,
    :data:`ROLE_BOUND_SHARE`)."""
    if len(job.by_role) < 2:
        return []
    by_key: dict[Any, dict[Any, dict[str, Any]]] = defaultdict(dict)
    for role, rows in job.by_role.items():
        for row in rows:
            k = _key(row)
            by_key[tuple(k) if isinstance(k, list) else k][role] = row
    shared = {k: v for k, v in by_key.items() if k is not None and len(v) > 1}
    if not shared:
        return []
    total: dict[Any, float] = defaultdict(float)
    steps = []
    for k, roles in sorted(shared.items(), key=lambda kv: str(kv[0])):
        xs = [x for row in roles.values() for x in row["ranks"]]
        wall = max(x["start_us"] + x["dur_us"] for x in xs) - min(x["start_us"] for x in xs)
        # A straggler's excess is its own finding: the role's work is judged as if that rank took the median time.
        work = {role: max(((_work(x) - job.straggler_cut.get((role, k, x["rank"]), 0.0), x["rank"]) for x in row["ranks"]),
                          key=lambda t: t[0]) for role, row in roles.items()}
        for role, (w, _) in work.items():
            total[role] += w
        steps.append((k, roles, wall, work))
    ranked = sorted(total, key=lambda r: -total[r])
    bound, nxt = ranked[0], ranked[1]
    saving = sum(max(work[bound][0] - max(w for r, (w, _) in work.items() if r != bound), 0.0)
                 for _, roles, _, work in steps if bound in work)
    walls = sum(wall for _, _, wall, _ in steps)
    if total[bound] < ROLE_BOUND_RATIO * total[nxt] or walls <= 0 or saving < ROLE_BOUND_SHARE * walls:
        return []
    n = len(steps)
    idle = sum(wall - _work(x) for _, roles, wall, _ in steps for role, row in roles.items() if role != bound
               for x in row["ranks"])
    other_time = sum(wall for _, roles, wall, _ in steps for role, row in roles.items() if role != bound
                     for _ in row["ranks"])
    ranks = Counter(work[bound][1] for _, _, _, work in steps if bound in work)
    rank = ranks.most_common(1)[0][0]
    phases: dict[str, float] = defaultdict(float)
    for _, roles, _, _ in steps:
        for x in roles.get(bound, {"ranks": []})["ranks"]:
            if x["rank"] == rank:
                for name, v in x["phases"].items():
                    phases[name] += v / n
    names = [p for p, _ in sorted(phases.items(), key=lambda kv: -kv[1])[:3]]
    others = ", ".join(f"{_dur(total[r] / n)} for {r}" for r in ranked[1:])
    straggler = bound in job.straggler_roles
    claim = (f"role {bound} bounds {_steps_text([k for k, *_ in steps])}: its work takes {_dur(total[bound] / n)} per "
             f"step (its {_who(None, rank)}"
             + (", not counting the straggler's excess, a finding of its own" if straggler else "")
             + f") against {others}; the other roles' ranks sit idle {_dur(idle / n)} per "
             f"step in all waiting for it ({_pct(idle / other_time) if other_time else '-'} of their time).")
    return [Finding(
        id="bounding_role", claim=claim, cost_us=saving, role=bound, ranks=[rank], steps=[k for k, *_ in steps],
        names=names,
        fix=f"Shorten or split {bound}'s work (more workers or GPUs for it, smaller batches per step), or overlap the "
            f"other roles with it (generate step N+1 while {bound} works on step N, as asynchronous RL does).",
        figures={"work_per_step_us": {str(r or ""): total[r] / n for r in ranked}, "idle_other_roles_us": idle,
                 "wall_us": walls},
        cost_share=saving / walls,
        what_if={"change": f"{bound}'s work takes as long as {nxt}'s", "saves_us": saving, "saves_per_step_us": saving / n,
                 "naive_us": saving, "steps": n, "then_last_rank": None, "upper_bound": False,
                 "roles_then_bounding": nxt},
        plot=Plot.PHASES)]


def _share_rule(job: _Job, rule: str, figure: Callable[[dict[str, Any]], float | None], threshold: float,
                device: bool) -> list[tuple[Any, list[dict[str, Any]], list[dict[int, float]], float, dict[Any, float]]]:
    """Per role: the rows, each rank's ``figure`` (µs per step, None: not applicable) as cuts, the figure's
    share of the step time, and per rank its total; only the roles at or above ``threshold``."""
    hits = []
    for role, rows in job.by_role.items():
        if device and not any((x.get("temporal") or {}).get("device") for row in rows for x in row["ranks"]):
            continue
        cuts, part, dur = [], 0.0, 0.0
        per_rank: dict[Any, float] = defaultdict(float)
        for row in rows:
            cut = {}
            for i, x in enumerate(row["ranks"]):
                v = figure(x)
                if v is None:
                    continue
                cut[i] = min(max(v, 0.0), x["busy_us"])
                part += v
                dur += x["dur_us"]
                per_rank[x["rank"]] += v
            cuts.append(cut)
        if dur > 0 and part >= threshold * dur and part > 0:
            hits.append((role, rows, cuts, part / dur, per_rank))
        else:
            logger.debug("%s: role %s below threshold (%.3f of step time)", rule, role, part / dur if dur else 0.0)
    return hits


def _finding(job: _Job, rule: str, role: Any, rows: list[dict[str, Any]], cuts: list[dict[int, float]],
             per_rank: dict[Any, float], claim: str, wi: dict[str, Any], fix: str, names: list[str],
             figures: dict[str, Any], plot: str) -> Finding:
    """A finding about the rows' steps: evidence ranks by their share of the figure, the steps where it was cut."""
    st = job.step_time(rows)
    ranks = [r for r, v in sorted(per_rank.items(), key=lambda kv: -kv[1]) if v > 0 and r is not None]
    steps = [_key(row) for row, cut in zip(rows, cuts) if any(v > 0 for v in cut.values())]
    return Finding(id=rule, claim=claim, cost_us=wi["saves_us"], role=role, ranks=ranks, steps=steps,
                   names=names, fix=fix, figures=figures, cost_share=wi["saves_us"] / st if st else None, what_if=wi,
                   plot=plot)


def _top_rank(per_rank: dict[Any, float]) -> Any:
    return max(per_rank, key=lambda r: per_rank[r])


def _exposed_communication(job: _Job) -> list[Finding]:
    """Collectives not hidden behind compute, beyond waiting for late peers (:data:`EXPOSED_COMM_SHARE`)."""
    def exposed(x: dict[str, Any]) -> float | None:
        dev = (x.get("temporal") or {}).get("device")
        return None if not dev else max(dev["communication_us"] - x["waited_us"], 0.0)

    out = []
    for role, rows, cuts, share, per_rank in _share_rule(job, "exposed_communication", exposed, EXPOSED_COMM_SHARE, True):
        if role in job.partial:
            continue  # with ranks missing, their lateness cannot be told from transfer time (see caveats())
        top = _top_rank(per_rank)
        kernels: dict[str, float] = defaultdict(float)
        for r in per_rank:
            for k, v in job.kernel_names(role, r, is_comm_kernel).items():
                kernels[k] += v
        names = [k for k, _ in sorted(kernels.items(), key=lambda kv: -kv[1])[:3]]
        wi = _what_if(rows, cuts, "every collective overlapped with compute", upper_bound=True)
        claim = (f"communication not overlapped with compute, beyond waiting for late ranks, takes {_pct(share)} of the "
                 f"step in {_steps_text([_key(r) for r in rows])} (most on {_who(role, top)}: "
                 f"{_dur(per_rank[top] / len(rows))} per step); overlapping it would save up to "
                 f"{_dur(wi['saves_per_step_us'])} per step.")
        out.append(_finding(job, "exposed_communication", role, rows, cuts, per_rank, claim, wi,
                            "Overlap communication with compute: DDP bucket_cap_mb and gradient_as_bucket_view, FSDP "
                            "forward/backward prefetch, collectives issued before the compute that does not need their "
                            "result; if transfers themselves are slow, check the interconnect and NCCL_ALGO/NCCL_PROTO.",
                            names, {"share_of_step": share, "per_rank_us": _by_rank(per_rank)}, Plot.OVERLAP))
    return out


def _launch_bound(job: _Job) -> list[Finding]:
    """Devices idle waiting for the host to launch short kernels (:data:`LAUNCH_BOUND_RANK_STEPS`)."""
    out = []
    for role, rows in job.by_role.items():
        pairs = [(row, i, x) for row in rows for i, x in enumerate(row["ranks"]) if (x.get("launch") or {}).get("applicable")]
        bound = [(row, i, x) for row, i, x in pairs if x["launch"].get("launch_bound")]
        if not pairs or len(bound) < LAUNCH_BOUND_RANK_STEPS * len(pairs):
            continue
        cuts, per_rank = [], defaultdict(float)
        for row in rows:
            cut = {}
            for r2, i, x in bound:
                if r2 is row:
                    cut[i] = min((x.get("idle") or {}).get("host_wait_us", 0.0), x["busy_us"])
                    per_rank[x["rank"]] += cut[i]
            cuts.append(cut)
        idle = [x["idle"] for _, _, x in bound if (x.get("idle") or {}).get("applicable")]
        span = sum(f["span_us"] for f in idle)
        idle_us = sum(f["idle_us"] for f in idle)
        host = sum(f["host_wait_us"] for f in idle)
        launches = sum(x["launch"]["launches"] for _, _, x in bound)
        short = sum(x["launch"]["short"] for _, _, x in bound)
        calls: Counter = Counter()
        for r in job.inv.summary.get("ranks") or []:
            if r.get("role") == role and (r.get("launch") or {}).get("applicable"):
                calls.update(r["launch"].get("calls") or {})
        ranks = _ranks_of([{"ranks": [x for _, _, x in bound]}])
        wi = _what_if(rows, cuts, "the device never waits for the CPU to launch work", upper_bound=True)
        claim = (f"{len(bound)} of {len(pairs)} rank-steps are launch-bound ({_ranks_text(ranks)}): the device "
                 f"is idle {_pct(idle_us / span) if span else '-'} of its span, {_pct(host / idle_us) if idle_us else '-'} "
                 f"of that waiting for the CPU to launch work, and {_pct(short / launches) if launches else '-'} of "
                 f"the launches run shorter on the device than the launch call; up to {_dur(wi['saves_per_step_us'])} "
                 f"per step could be saved.")
        out.append(_finding(job, "launch_bound", role, rows, cuts, per_rank, claim, wi,
                            "Launch fewer, larger kernels: CUDA graphs (torch.compile mode='reduce-overhead'), "
                            "torch.compile fusion, larger batches per step, and no host work between launches "
                            "(Python overhead, .item()); faster kernels will not help.",
                            [c for c, _ in calls.most_common(3)],
                            {"rank_steps": len(pairs), "launch_bound_rank_steps": len(bound), "idle_us": idle_us,
                             "host_wait_us": host, "span_us": span, "launches": launches, "short": short},
                            Plot.IDLE))
    return out


def _host_sync(job: _Job) -> list[Finding]:
    """Device-to-host reads that block the host inside the step (:data:`HOST_SYNC_SHARE` of a rank's step)."""
    out = []
    for role, rows in job.by_role.items():
        per_step: dict[Any, dict[str, float]] = {}
        for r in _ranks_of(rows):
            if any((x.get("temporal") or {}).get("device") for _, _, x in job.of_rank[(role, r)]):
                ops = {k: v for k, v in job.names_per_step(role, r, "ops").items() if is_sync_op(k)}
                calls = {k: v for k, v in job.names_per_step(role, r, "runtime").items() if is_sync_runtime(k)}
                # .item() shows as both (the op calls the runtime's sync): the larger side, not the sum
                per_step[r] = ops if sum(ops.values()) >= sum(calls.values()) else calls
        hot = {}
        for r, ops in per_step.items():
            durs = [x["dur_us"] for _, _, x in job.of_rank[(role, r)]]
            mean = sum(durs) / len(durs) if durs else 0.0
            if mean > 0 and sum(ops.values()) >= HOST_SYNC_SHARE * mean:
                hot[r] = (sum(ops.values()), mean)
        if not hot:
            continue
        cuts, per_rank = [], defaultdict(float)
        for row in rows:
            cut = {}
            for i, x in enumerate(row["ranks"]):
                if x["rank"] in hot:
                    cut[i] = min(hot[x["rank"]][0], x["busy_us"])
                    per_rank[x["rank"]] += cut[i]
            cuts.append(cut)
        top = max(hot, key=lambda r: hot[r][0] / hot[r][1])
        names: dict[str, float] = defaultdict(float)
        for r in hot:
            for k, v in per_step[r].items():
                names[k] += v
        wi = _what_if(rows, cuts, "no blocking device-to-host reads in the step", upper_bound=True)
        claim = (f"{_who(role, top)} blocks {_dur(hot[top][0])} per step ({_pct(hot[top][0] / hot[top][1])} of its step) "
                 f"reading values back from the device ({', '.join(_n(k) for k in sorted(names))})"
                 + (f"; {len(hot)} ranks do" if len(hot) > 1 else "") + f"; removing those syncs would save up to "
                 f"{_dur(wi['saves_per_step_us'])} per step.")
        out.append(_finding(job, "host_sync", role, rows, cuts, per_rank, claim, wi,
                            "Keep values on the device inside the step: no .item(), .tolist(), .cpu(), print() or "
                            "Python if on device tensors; accumulate metrics on the device and read them every N steps; "
                            "torch.cuda.set_sync_debug_mode('warn') points at each sync.",
                            [k for k, _ in sorted(names.items(), key=lambda kv: -kv[1])],
                            {"per_rank_us_per_step": _by_rank({r: v[0] for r, v in hot.items()}),
                             "share_of_step": _by_rank({r: v[0] / v[1] for r, v in hot.items()})}, Plot.OPS))
    return out


def _breakdown(name: str) -> Callable[[dict[str, Any]], float | None]:
    def fig(x: dict[str, Any]) -> float | None:
        b = x.get("breakdown")
        return None if not b else b.get(name, 0.0)
    return fig


def _data_loading(job: _Job) -> list[Finding]:
    """The DataLoader's share of the step (:data:`DATA_LOADING_SHARE`)."""
    out = []
    for role, rows, cuts, share, per_rank in _share_rule(job, "data_loading", _breakdown("dataloader"), DATA_LOADING_SHARE, False):
        names = sorted({n for row in rows for x in row["ranks"] for n in x["phases"] if is_dataloader(n)})
        top = _top_rank(per_rank)
        wi = _what_if(rows, cuts, "data loading fully overlapped with the step", upper_bound=True)
        claim = (f"loading data (the DataLoader's __next__) takes {_pct(share)} of the step in "
                 f"{_steps_text([_key(r) for r in rows])} (most on {_who(role, top)}: {_dur(per_rank[top] / len(rows))} "
                 f"per step); overlapping it would save up to {_dur(wi['saves_per_step_us'])} per step.")
        out.append(_finding(job, "data_loading", role, rows, cuts, per_rank, claim, wi,
                            "Load ahead of the step: DataLoader num_workers > 0, persistent_workers=True, prefetch_factor, "
                            "pin_memory=True; move decoding and augmentation out of the training process.",
                            names, {"share_of_step": share}, Plot.PHASES))
    return out


def _memcpy(job: _Job) -> list[Finding]:
    """Copies with nothing else on the device (:data:`MEMCPY_SHARE` of the step)."""
    out = []
    for role, rows, cuts, share, per_rank in _share_rule(job, "memcpy", _breakdown("memcpy"), MEMCPY_SHARE, True):
        kinds: dict[str, float] = defaultdict(float)
        for r in per_rank:
            for k, v in job.kernel_names(role, r, lambda n: memcpy_endpoints(n) is not None).items():
                kinds[k] += v
        wi = _what_if(rows, cuts, "every copy overlapped with compute", upper_bound=True)
        claim = (f"memory copies with no kernel running take {_pct(share)} of the step in "
                 f"{_steps_text([_key(r) for r in rows])}; hiding them behind compute would save up to "
                 f"{_dur(wi['saves_per_step_us'])} per step.")
        out.append(_finding(job, "memcpy", role, rows, cuts, per_rank, claim, wi,
                            "Copy less and earlier: keep tensors on the device, copy with non_blocking=True from pinned "
                            "memory on a side stream ahead of use, avoid .to()/.cpu() round trips inside the step.",
                            [k for k, _ in sorted(kinds.items(), key=lambda kv: -kv[1])[:3]], {"share_of_step": share},
                            Plot.TEMPORAL))
    return out


def _pageable_memcpy(job: _Job) -> list[Finding]:
    """Copies to or from pageable host memory (:data:`PAGEABLE_SHARE` of the step)."""
    out = []
    for role, rows in job.by_role.items():
        per_step = {r: job.kernel_names(role, r, lambda n: "Pageable" in (memcpy_endpoints(n) or ()))
                    for r in _ranks_of(rows)}
        cuts, per_rank, part, dur = [], defaultdict(float), 0.0, 0.0
        for row in rows:
            cut = {}
            for i, x in enumerate(row["ranks"]):
                v = sum(per_step.get(x["rank"], {}).values())
                dur += x["dur_us"]
                if v > 0:
                    cut[i] = min(v, x["busy_us"])
                    per_rank[x["rank"]] += v
                    part += v
            cuts.append(cut)
        if not part or dur <= 0 or part < PAGEABLE_SHARE * dur:
            continue
        names: dict[str, float] = defaultdict(float)
        for ks in per_step.values():
            for k, v in ks.items():
                names[k] += v
        share = part / dur
        wi = _what_if(rows, cuts, "copies from pinned memory, asynchronous to the host", upper_bound=True)
        claim = (f"copies to or from pageable (not pinned) host memory take {_pct(share)} of the step in "
                 f"{_steps_text([_key(r) for r in rows])} ({', '.join(_n(k) for k in sorted(names))}); pinned memory would save up to "
                 f"{_dur(wi['saves_per_step_us'])} per step.")
        out.append(_finding(job, "pageable_memcpy", role, rows, cuts, per_rank, claim, wi,
                            "Pin the host buffers: DataLoader(pin_memory=True) or tensor.pin_memory(), then "
                            ".to(device, non_blocking=True); for device-to-host reads, copy into a pinned buffer.",
                            [k for k, _ in sorted(names.items(), key=lambda kv: -kv[1])],
                            {"share_of_step": share, "per_rank_us": _by_rank(per_rank)}, Plot.KERNELS))
    return out


def _outlier_steps(job: _Job) -> list[Finding]:
    """Steps far longer than the rank's median step (:data:`OUTLIER_RATIO`, :data:`OUTLIER_MIN_STEPS`)."""
    out = []
    for role, rows in job.by_role.items():
        rows = [row for row in rows if isinstance(row["step"], int) and not row.get("window")]
        at = {id(row): j for j, row in enumerate(rows)}
        flagged: dict[int, dict[int, float]] = defaultdict(dict)  # row index -> {rank index: cut}
        detail = []
        for r in _ranks_of(rows):
            mine = [(at[id(row)], i, x) for row, i, x in job.of_rank[(role, r)] if id(row) in at]
            if len(mine) < OUTLIER_MIN_STEPS:
                continue
            med = _median(x["dur_us"] for _, _, x in mine)
            for j, i, x in mine:
                if med > 0 and x["dur_us"] > OUTLIER_RATIO * med:
                    flagged[j][i] = min(x["dur_us"] - med, x["busy_us"])
                    grew = {n: v - _median(y["phases"].get(n, 0.0) for _, _, y in mine if y is not x)
                            for n, v in x["phases"].items()}
                    phase = max(grew, key=lambda n: grew[n], default=None)
                    detail.append({"rank": r, "step": rows[j]["step"], "dur_us": x["dur_us"], "median_us": med,
                                   "ratio": x["dur_us"] / med, "phase": phase,
                                   "phase_growth_us": grew[phase] if phase is not None else None})
        if not detail:
            continue
        detail.sort(key=lambda d: -d["ratio"])
        worst = detail[0]
        per_rank: dict[Any, float] = defaultdict(float)
        for d in detail:
            per_rank[d["rank"]] += d["dur_us"] - d["median_us"]
        grew = f"; its phase {_n(worst['phase'])} grew most (+{_dur(worst['phase_growth_us'])})" \
            if worst["phase"] is not None and worst["phase_growth_us"] > 0 else ""
        claim = (f"{_steps_text([d['step'] for d in detail])} of {role + ' ' if role else ''}"
                 f"{_ranks_text(_ranks_of([{'ranks': [{'rank': r} for r in per_rank]}]))} take up to "
                 f"{worst['ratio']:.1f}x the rank's median step ({_who(None, worst['rank'])}, step {worst['step']}: "
                 f"{_dur(worst['dur_us'])} against {_dur(worst['median_us'])}){grew}.")
        names = list(dict.fromkeys(d["phase"] for d in detail if d["phase"] is not None and d["phase_growth_us"] > 0))
        cuts = [flagged.get(j, {}) for j in range(len(rows))]  # every step counts in the per-step figures
        wi = _what_if(rows, cuts, "each outlier step takes its rank's median time")
        f = _finding(job, "outlier_steps", role, rows, cuts, per_rank, claim, wi,
                     "Find what that step does differently: warm-up or compilation (profile later steps), "
                     "checkpointing, evaluation, logging, garbage collection (gc.freeze, gc.disable during steps), "
                     "a data-loader stall, or another job on the host.",
                     names, {"steps": detail}, Plot.STEP_TIME)
        out.append(f)
    return out


RULES: tuple[Callable[[_Job], list[Finding]], ...] = (
    _straggler, _bounding_role, _exposed_communication, _launch_bound, _host_sync, _data_loading, _memcpy,
    _pageable_memcpy, _outlier_steps)


def diagnose(inv: Any) -> list[Finding]:
    """Every rule on one :class:`~.analyze.Investigation`; findings sorted by ``cost_us`` descending."""
    job = _Job(inv)
    # A finding that saves no step time on the path (its ranks never arrive last) is not one; a straggler that
    # passed its thresholds is, even when the next rank would arrive as late.
    findings = [f for rule in RULES for f in rule(job) if f.cost_us > 0 or f.id == "straggler"]
    findings.sort(key=lambda f: (-f.cost_us, f.id, str(f.role)))
    return findings


def analysed(inv: Any) -> dict[str, Any]:
    """What the rules looked at: roles, ranks, steps, whether device rules could apply, and ``caveats``:
    what the rules could not judge on these files (a role with ranks missing)."""
    job = _Job(inv)
    keys = {str(_key(row)) for rows in job.by_role.values() for row in rows}
    caveats = [f"{role + ': ' if role else ''}{present} of {world} ranks "
               f"are here; a rank's wait for an absent rank cannot be told from communication, so exposed communication "
               f"is not judged and straggler figures cover only the ranks present"
               for role, (present, world) in job.partial.items()]
    return {"roles": list(job.by_role), "ranks": sum(len(_ranks_of(rows)) for rows in job.by_role.values()),
            "steps": len(keys), "device": job.device, "caveats": caveats}
