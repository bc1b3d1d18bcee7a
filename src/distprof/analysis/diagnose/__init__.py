"""What is wrong, in words: findings ranked by the time they cost, each with its evidence and a next step.

Built on :func:`distprof.analysis.analyze.investigate` (one read; nothing here reads a trace or recomputes a
figure an analysis already has). Each rule is a function of the job (:class:`.rules.common.Job`, the
:class:`~.analyze.Investigation` arranged by role and rank) returning findings, in :mod:`.rules`; a rule fires
only above the threshold its docstring states, and never without evidence. The thresholds are constants
(:data:`THRESHOLDS` lists them; ``diagnose --json`` prints it).

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
host-bound, host syncs, memcpy, pageable copies, data loading) the saving if that time went away entirely,
so an upper bound (the claim says "up to"). ``cost_share`` is ``cost_us`` over the analysed steps' time
(per step, the longest rank's duration, summed): the one percentage a finding has. Claims give durations
(per step, per rank and step), never a second share of the step. A finding whose what-if saves no step time
(the ranks it concerns never arrive last) is not reported, except a straggler, which has passed its own
thresholds.

**Rules** (ids are stable; thresholds are the constants of :mod:`.rules.common`):

- ``straggler``: per role, the rank whose late arrivals cost the others the most waiting (``stragglers``'
  ``wait_caused_us``, over the steps in which it ran with others), when that waiting is at least
  :data:`STRAGGLER_WAIT_SHARE` of the other ranks' summed step time and the rank holds them back
  consistently. Root cause: of the rank's phases (annotation wall time), kernels (device time, collectives
  left out), ops (self time, communication left out) and its start of the step, the one where it exceeds
  the median of the other ranks the most per step. Its *lateness* is the waiting it causes per waiting
  rank and step. Two forms:

  - *one cause*: it is the step's ``slowest_rank`` in at least :data:`STRAGGLER_CONSISTENCY` of the steps,
    and its root cause explains at least :data:`STRAGGLER_EXPLAINED` of its lateness. What-if: that cause
    takes the median rank's time, on it and on its late group (other ranks late for the same cause by
    :data:`STRAGGLER_GROUP_SHARE` of its excess: a slow node);
  - *no one cause* (``figures.no_single_cause``): it holds the others back, by at least
    :data:`STRAGGLER_WAIT_SHARE` of their step time, in :data:`STRAGGLER_SPREAD_CONSISTENCY` of at least
    :data:`STRAGGLER_SPREAD_MIN_STEPS` steps. The claim says no one cause explains it and lists the leading
    candidates with their excess, and how much slower its CPU ops are in all; the fix names what tells them
    apart (CPU time against wall time, other processes on its cores, a slower host). What-if: it arrives
    with the median rank.

  Consistency is what tells a straggler from a busy machine: on a 2-core machine running four 2-rank gloo
  jobs at once, the rank a job waited for caused 21-80% of the other's step time in waiting, but it changed
  between steps (and no one cause explained more than 40% of it: a descheduled process is slow everywhere);
  the slow ranks of real jobs (the gloo test job, the demo's actor, DLRM rank 7) are the slowest in every
  step and one cause explains 89-99% of their waiting. The claim leads with the waiting it causes; where
  the waiting ranks' hosts sat in a sync call meanwhile (``stragglers``' ``sync_waiting_us``: DLRM's
  ``cudaStreamSynchronize`` behind a SendRecv that waits for rank 7), it says so: the sync is where they
  wait. Evidence ranks: the culprit first, its late group, the :data:`STRAGGLER_WAITERS_SHOWN` ranks that
  waited for it most.
- ``bounding_role``: in a job with several roles (RL: rollout, ref, actor ...), over the steps they share,
  the role whose work (per rank: the time something traced runs in the step, less its waiting for peers;
  per role: its busiest rank) is the longest, when it is at least :data:`ROLE_BOUND_RATIO` times the next
  role's and the difference is at least :data:`ROLE_BOUND_SHARE` of the step's wall time (first start to
  last end over every role). Its cost: the difference, what the step saves if the role's work took as long
  as the next role's, whether the roles run one after another or at once. The other roles' idle time
  (wall time less their work) is in the claim.
- ``exposed_communication`` (device): per role, the time a collective runs and no compute kernel does
  (``temporal``'s device communication: collective kernels, or host collectives on a gloo rank, whose
  device waits meanwhile), less the time the rank waited for late peers (the straggler's share), at least
  :data:`EXPOSED_COMM_SHARE` of the step on average. What-if: all of it overlapped with compute. With host
  collectives the fix says to use NCCL for CUDA tensors.
- ``launch_bound`` (device): per role, at least :data:`LAUNCH_BOUND_RANK_STEPS` of the rank-steps are
  launch-bound by :mod:`.launch`'s rule (device idle >= 20% of its span, half of it waiting for the host,
  and half of that wait spent issuing work: launch calls, the ops making them and the Python between
  them, ``idle``'s ``host_wait.launch_us``). What-if, an upper bound: the device never waits while the
  host issues work (fewer, larger kernels: CUDA graphs, ``torch.compile``).
- ``host_bound`` (device): per role, the device waits for host work that launches nothing (``idle``'s
  ``host_wait.phase_us`` and ``untraced_us``: an annotated phase such as a data phase or a sleep, or host
  code nothing names; DataLoader ``__next__`` is left to ``data_loading``), less a straggler's excess, at
  least :data:`HOST_BOUND_SHARE` of the step. From each rank's device-level figure (the gaps between steps
  included), per step. What-if, an upper bound: that work off the device's path.
- ``host_sync`` (device): per role, a rank spends at least :data:`HOST_SYNC_SHARE` of its step in ops that
  block the host until the device has a value (``aten::item``, ``aten::_local_scalar_dense``: ``.item()``,
  ``.tolist()``, ``if tensor:``; :func:`.vocab.is_sync_op`; self time, so nested calls count once) or in
  runtime calls that wait for the device (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize`` and their HIP names: :func:`.vocab.is_sync_runtime`; ``torch.cuda.synchronize()``
  is one), not counting the part spent waiting for a late peer (the straggler's). A ``.item()`` makes both
  (the op calls the runtime), so a rank's figure is the larger of the two, never their sum. What-if, an
  upper bound: none of them.
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

- ``low_mfu`` (device, traces with shapes): per role, the ranks whose MFU over their steps is below
  :data:`LOW_MFU`, with its cause (launch-bound, exposed communication, memory-bound ops, small GEMMs, in that
  order) and the step time lost against the same FLOPs at that MFU: :mod:`.mfu`.
- ``slow_collective`` (device collectives with recorded sizes, two or more traced ranks): a collective whose bus
  bandwidth is far below the link's (:mod:`distprof.analysis.links`; the link assumed from the job's size), or
  whose start skew dominates its transfer: :mod:`.collective`.

- ``memory_leak`` (memory answers: allocator snapshots, ``profile_memory`` traces): allocated memory at step
  boundaries grows at every boundary across :data:`.memory.LEAK_MIN_STEPS` of them, by at least
  :data:`.memory.LEAK_MIN_BYTES` and :data:`.memory.LEAK_MIN_SHARE` of the first; ``oom``: a snapshot holds an
  out-of-memory, explained: :mod:`.memory`. Both cost no step time (``cost_us`` 0).

On CPU-only traces the device rules do not apply (no device figures): ``straggler``, ``bounding_role``,
``data_loading`` and ``outlier_steps`` do.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from distprof.analysis.diagnose.collective import slow_collective
from distprof.analysis.diagnose.common import (
    DATA_LOADING_SHARE,
    EXPOSED_COMM_SHARE,
    HOST_BOUND_SHARE,
    HOST_SYNC_SHARE,
    LAUNCH_BOUND_RANK_STEPS,
    MEMCPY_SHARE,
    OUTLIER_MIN_STEPS,
    OUTLIER_RATIO,
    PAGEABLE_SHARE,
    ROLE_BOUND_RATIO,
    ROLE_BOUND_SHARE,
    STRAGGLER_CONSISTENCY,
    STRAGGLER_EXPLAINED,
    STRAGGLER_SPREAD_CONSISTENCY,
    STRAGGLER_SPREAD_MIN_STEPS,
    STRAGGLER_WAIT_SHARE,
    STRAGGLER_WAITERS_SHOWN,
    THRESHOLDS,
    Finding,
    Job,
    Plot,
    path_saving,
    ranks_of,
    step_key,
)
from distprof.analysis.diagnose.copies import memcpy, pageable_memcpy
from distprof.analysis.diagnose.device import exposed_communication, host_bound, host_sync, launch_bound
from distprof.analysis.diagnose.host import data_loading, outlier_steps
from distprof.analysis.diagnose.memory import MEMORY_THRESHOLDS, memory_leak, oom
from distprof.analysis.diagnose.mfu import low_mfu
from distprof.analysis.diagnose.roles import bounding_role
from distprof.analysis.diagnose.straggler import straggler
from distprof.analysis.investigation import Investigation
from distprof.analysis.records_diag import Analysed

logger = logging.getLogger(__name__)

__all__ = [
    "DATA_LOADING_SHARE",
    "EXPOSED_COMM_SHARE",
    "HOST_BOUND_SHARE",
    "HOST_SYNC_SHARE",
    "LAUNCH_BOUND_RANK_STEPS",
    "MEMCPY_SHARE",
    "OUTLIER_MIN_STEPS",
    "OUTLIER_RATIO",
    "PAGEABLE_SHARE",
    "ROLE_BOUND_RATIO",
    "ROLE_BOUND_SHARE",
    "RULES",
    "STRAGGLER_CONSISTENCY",
    "STRAGGLER_EXPLAINED",
    "STRAGGLER_SPREAD_CONSISTENCY",
    "STRAGGLER_SPREAD_MIN_STEPS",
    "STRAGGLER_WAITERS_SHOWN",
    "STRAGGLER_WAIT_SHARE",
    "THRESHOLDS",
    "Finding",
    "Plot",
    "analysed",
    "diagnose",
    "path_saving",
]

# The straggler runs first: later rules leave its excess out (Job.straggler_cut), so no cause is costed twice.
RULES: tuple[Callable[[Job], list[Finding]], ...] = (
    straggler, bounding_role, exposed_communication, launch_bound, host_bound, host_sync, data_loading, memcpy,
    pageable_memcpy, outlier_steps, low_mfu, slow_collective, memory_leak, oom)
THRESHOLDS.update(MEMORY_THRESHOLDS)
_TIMELESS = frozenset({"straggler", "memory_leak", "oom"})  # reported without a step-time saving


def diagnose(inv: Investigation) -> list[Finding]:
    """Every rule on one :class:`~.analyze.Investigation`; findings sorted by ``cost_us`` descending."""
    job = Job(inv)
    # A finding that saves no step time on the path (its ranks never arrive last) is not one; a straggler that
    # passed its thresholds is, even when the next rank would arrive as late.
    findings = [f for rule in RULES for f in rule(job) if f.cost_us > 0 or f.id in _TIMELESS]
    findings.sort(key=lambda f: (-f.cost_us, f.id, str(f.evidence.role)))
    return findings


def analysed(inv: Investigation) -> Analysed:
    """What the rules looked at: roles, ranks, steps, whether device rules could apply, and ``caveats``:
    what the rules could not judge on these files (a role with ranks missing)."""
    job = Job(inv)
    keys = {str(step_key(row)) for rows in job.by_role.values() for row in rows}
    caveats = [f"{role + ': ' if role else ''}{present} of {world} ranks "
               f"are here; a rank's wait for an absent rank cannot be told from communication, so exposed "
               f"communication is not judged and straggler figures cover only the ranks present"
               for role, (present, world) in job.partial.items()]
    return Analysed(roles=list(job.by_role), ranks=sum(len(ranks_of(rows)) for rows in job.by_role.values()),
                    steps=len(keys), device=job.device, caveats=caveats)
