"""The analysis verbs as library calls: read a path once, run the analyses a verb needs, combine.

Each verb (``summary``, ``steps``, ``stragglers``, ``diagnose``, ``diff``) returns one plain dict, the object its
``--json`` prints (``summary_result``, ``steps_result``, ``stragglers_result``, ``diagnose_result``, ``diff_result``:
the same reading, as the typed record that object encodes, :mod:`.records` and :mod:`.records_diag`): the verb's own
keys plus the keys every verb shares:

- ``scope``: the selection (ranks, roles, steps, steps_only) the figures are restricted to;
- ``errors``: ``[{"path", "message"}]``, files that could not be read (exit code 1; 2 when none could);
- ``salvaged``: ``[{"path", ...}]``, files read only in part (truncated, events skipped), with what was lost;
- ``conflicts``: files that claim a rank another file already speaks for (see :mod:`.ranks`);
- ``warnings``: one line each (unknown device-like event categories, ...);
- ``skipped``: how many files the selection left out.

Per file, one pass builds a :class:`~.table.TraceTable` and every analysis the verb needs extracts its
compact part from it (in a worker process, or a Ray task); the driver combines the parts.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from msgspec import UNSET

from distprof.analysis import (
    breakdown,
    idle,
    launch,
    memory,
    memtrace,
    mfu,
    overlap,
    rlsteps,
    step_names,
    telemetry_steps,
    temporal,
    timeline,
)
from distprof.analysis import collectives as collectives_mod
from distprof.analysis import diagnose as diagnose_mod
from distprof.analysis import diff as diff_mod
from distprof.analysis import steps as steps_mod
from distprof.analysis import stragglers as stragglers_mod
from distprof.analysis import summary as summary_mod
from distprof.analysis.diagnose.hang import hang_finding, with_hang
from distprof.analysis.investigation import Investigation
from distprof.analysis.parallel import Progress, SplitPool, map_files
from distprof.analysis.records import (
    FileFacts,
    Ranked,
    StepsResult,
    StragglersResult,
    SummaryResult,
    Wait,
    to_json,
)
from distprof.analysis.records_diag import Analysed, DiagnoseResult, DiffResult
from distprof.analysis.telemetry import TelemetryRun
from distprof.rundir.layout import is_url
from distprof.trace.listing import TraceFile, find_traces
from distprof.trace.ranks import assign_runs, file_facts, resolve, role_of, runs
from distprof.trace.reader import TraceError, open_trace
from distprof.trace.selection import Selection
from distprof.trace.table import FileInfo, TraceTable
from distprof.util.problem import Problem

logger = logging.getLogger(__name__)

__all__ = [
    "ANALYSES",
    "DIFF_PARTS",
    "Investigation",
    "Run",
    "compare_runs",
    "diagnose",
    "diagnose_result",
    "diagnosis",
    "diagnosis_result",
    "diff",
    "diff_result",
    "exit_code",
    "investigate",
    "nothing_read",
    "read",
    "read_with_snapshots",
    "steps",
    "steps_result",
    "stragglers",
    "stragglers_result",
    "summary",
    "summary_result",
]

ANALYSES = {"summary": summary_mod, "temporal": temporal, "overlap": overlap, "breakdown": breakdown,
            "steps": steps_mod, "stragglers": stragglers_mod, "idle": idle, "launch": launch, "step_names": step_names,
            "timeline": timeline, "rlsteps": rlsteps, "mfu": mfu,
            "collectives": collectives_mod, "memory": memtrace}


@dataclass
class FileResult:
    """One file's identity and the parts its analyses extracted."""
    info: FileInfo
    parts: dict[str, Any]


@dataclass
class Skipped:
    path: str


def extract_file(f: TraceFile, on_read: Callable[[int], None] | None, names: tuple[str, ...],
                 selection: Selection, pool: SplitPool | None = None) -> FileResult | Skipped:
    """Read one file once and run the named analyses' extracts on it (runs in a worker; or here, with a
    ``pool`` decoding the file's runs of events)."""
    t = open_trace(f.path, manifest_rank=f.manifest_rank, role=f.role, window=f.window, on_read=on_read, lean=True)
    tb = TraceTable.read(t, selection, pool=pool)
    if tb is None:
        return Skipped(f.path)
    tb.info.run = file_facts(t.distributed_info, f.window, f.run_dir, f.path)  # which job wrote it
    return FileResult(tb.info, {n: ANALYSES[n].extract(tb) for n in names})


@dataclass
class Run:
    """What reading a path gave: the selected files' parts (conflict-free, in path order) and what went wrong."""
    path: str
    selection: Selection
    files: list[FileResult] = field(default_factory=list)
    errors: list[Problem] = field(default_factory=list)  # files and nodes that could not be read or listed
    skipped: int = 0
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what reading found about the files together (runs split, ...)
    tasks: list[dict[str, Any]] = field(default_factory=list)  # busy intervals from Ray's task timelines (rlsteps)
    workers: int | None = None  # the processes reading files (memory snapshots are read after the traces)

    def pairs(self, name: str) -> list[tuple[FileInfo, Any]]:
        return [(r.info, r.parts[name]) for r in self.files]

    def envelope(self) -> dict[str, Any]:
        return {
            "scope": self.selection.to_dict(),
            "errors": [e.file_dict() for e in self.errors],
            "salvaged": [{"path": r.info.path, **r.info.salvaged} for r in self.files if r.info.salvaged],
            "conflicts": self.conflicts,
            "warnings": self.notes + [f"{r.info.path}: {w}" for r in self.files for w in r.info.warnings],
            "skipped": self.skipped,
        }


def exit_code(result: dict[str, Any]) -> int:
    """0: every file read; 1: some files could not be read; 2: none could (see the module docstring)."""
    if result.get("errors"):
        return 1 if result.get("files_read", 0) or result.get("telemetry_read", 0) else 2
    return 0


def read(path: str, names: Iterable[str], selection: Selection | None = None, workers: int | None = None,
         ray_address: str | None = None, progress: Callable[[Progress], None] | None = None) -> Run:
    """Find the traces under ``path``, drop those the selection rules out, read the rest in parallel.

    With ``ray_address`` a local path is listed on every node of the cluster and each file read on the node that
    holds it (node-local scratch folders; ``$VARS`` in ``path`` expanded per node): see
    :mod:`distprof.analysis.rayfiles`.
    """
    if not ray_address:
        return _read(path, names, selection, workers, None, progress)
    from distprof.analysis.rayfiles import ray_session

    with ray_session(ray_address):  # one connection for the listing and the reading
        return _read(path, names, selection, workers, ray_address, progress)


def _read(path: str, names: Iterable[str], selection: Selection | None, workers: int | None,
          ray_address: str | None, progress: Callable[[Progress], None] | None) -> Run:
    selection = selection or Selection()
    names = tuple(names)
    problems: list[Problem] = []  # entries that are not readable traces (FIFOs, symlinks leaving path, ...)
    timelines: list[str] = []  # Ray's task timelines in a local run directory (the driver's): busy intervals
    if ray_address and not is_url(path):
        from distprof.analysis.rayfiles import find_traces_on_nodes

        found = find_traces_on_nodes(path, problems)
    else:
        found = find_traces(path, problems, timelines)
    if not found:
        why = "; ".join(map(str, problems[:3]))
        raise nothing_read(f"{path}: no readable trace ({why})" if why
                           else f"{path}: no trace files (*.json, *.json.gz) found",
                           problems)
    run = Run(path, selection, workers=workers)
    run.errors += problems
    run.tasks = _timeline_tasks(timelines)
    files = []
    for f in found:
        # What the run directory's manifest says rules a file out before it is opened.
        if (f.manifest_rank is not None and not selection.rank_ok(f.manifest_rank)) or \
                (f.role is not None and not selection.role_ok(f.role)) or \
                not selection.window_ok(f.window.steps if f.window is not None else None):
            run.skipped += 1
            continue
        files.append(f)
    fn = functools.partial(extract_file, names=names, selection=selection)
    results = map_files(fn, files, workers=workers, progress=progress, ray_address=ray_address, split=True)
    read_ok = []
    for r in results:
        if isinstance(r, Problem):
            run.errors.append(r)
        elif isinstance(r, Skipped):
            run.skipped += 1
        else:
            read_ok.append(r)
    # Files of different jobs never form one run: a role holding several is reported as "role (run K)", and every
    # analysis below keeps them apart.
    run.notes = assign_runs(r.info for r in read_ok)
    run.files, run.conflicts = resolve(read_ok)
    if not run.files and not run.errors:
        raise TraceError(f"{path}: no trace matches the selection ({_describe(selection)})")
    for c in run.conflicts:
        logger.info("%s: %s", c["path"], c["reason"])  # in the result's `conflicts`: the CLI prints each once
    return run


def nothing_read(message: str, errors: Iterable[Problem] = ()) -> TraceError:
    """The TraceError that ends a verb with nothing read (exit 2): ``message`` in one line, and ``errors`` the files
    that could not be read, each as ``Problem.file_dict()`` encodes it, ``{"path", "message"}`` (what --json lists;
    the CLI falls back to the path)."""
    e = TraceError(message)
    e.errors = [x.file_dict() for x in errors]  # type: ignore[attr-defined]
    return e


def _describe(sel: Selection) -> str:
    parts = []
    if sel.ranks is not None:
        parts.append("ranks " + ",".join(map(str, sorted(sel.ranks))))
    if sel.roles is not None:
        parts.append("roles " + ",".join(sel.roles))
    if sel.steps is not None:
        parts.append("steps " + ", ".join(f"ProfilerStep#{n}" for n in sorted(sel.steps)[:10]))
    elif sel.steps_only:
        parts.append("work inside steps only")
    return "; ".join(parts) or "everything"


R = TypeVar("R", SummaryResult, StepsResult, StragglersResult)


def _finish(run: Run, result: R) -> R:
    """``result`` with the keys every verb shares; its own warnings (what the combine found) after the run's."""
    env = run.envelope()
    own = result.warnings
    result.scope, result.errors, result.salvaged = env["scope"], env["errors"], env["salvaged"]
    result.conflicts, result.skipped = env["conflicts"], env["skipped"]
    result.warnings = env["warnings"] + own
    result.files_read = len(run.files)
    return result


# What each verb's figures are made of: the per-file extracts its read runs.
SUMMARY_PARTS = ("summary", "temporal", "overlap", "breakdown", "idle", "launch", "mfu", "collectives", "memory")
STEPS_PARTS = ("steps", "stragglers", "temporal", "overlap", "breakdown", "idle", "launch", "rlsteps", "mfu")
STRAGGLERS_PARTS = ("stragglers",)
INVESTIGATE_PARTS = tuple(dict.fromkeys(SUMMARY_PARTS + STEPS_PARTS + STRAGGLERS_PARTS + ("step_names",)))


def _summary_of(run: Run, top: int | None, peak_tflops: float | None = None) -> SummaryResult:
    out = summary_mod.combine(run.pairs("summary"), top=top)
    per_rank = {(r.role, r.rank, r.path): r for r in out.ranks}

    def attach(rows: list[Ranked[Any]], name: str) -> None:
        """Each rank's figure onto that rank's row (a rank the summary does not list is left out)."""
        for row in rows:
            target = per_rank.get((row.role, row.rank, row.path))
            if target is not None:
                setattr(target, name, row.figure)

    # Device idle by cause and kernel launch statistics: per rank, and over all ranks.
    idle_ranks, out.idle = idle.combine(run.pairs("idle"))
    attach(idle_ranks, "idle")
    launch_ranks, out.launch = launch.combine(run.pairs("launch"))
    attach(launch_ranks, "launch")
    attach(temporal.combine(run.pairs("temporal")), "temporal")
    attach(overlap.combine(run.pairs("overlap")), "overlap")
    b_ranks, out.step_breakdown = breakdown.combine(run.pairs("breakdown"))
    attach(b_ranks, "step_breakdown")
    # FLOPs and MFU (traces with shapes; a run none of whose traces has shapes keeps its --json as it was)
    flops_parts = run.pairs("mfu")
    if any(p.get("shapes") for _, p in flops_parts):
        out.flops, out.flops_ops = mfu.combine(flops_parts, peak_tflops=peak_tflops)
    coll = collectives_mod.combine(run.pairs("collectives"))
    if coll:  # the key only where the traces hold collectives
        out.collectives = coll
    # Memory answers: profile_memory traces' [memory] events and the path's allocator snapshots (read here)
    snaps = memory.find_snapshots(run.path, run.selection, run.errors)
    errors = len(run.errors)
    mem = memory.rows(memtrace.combine(run.pairs("memory")), snaps, run.errors, run.workers)
    if mem:  # the key only where the traces or snapshots allow
        out.memory = mem
    out = _finish(run, out)
    out.files_read = (out.files_read or 0) + len(snaps) - (len(run.errors) - errors)
    return out


def read_with_snapshots(path: str, names: Iterable[str], selection: Selection | None = None,
                        workers: int | None = None, ray_address: str | None = None,
                        progress: Callable[[Progress], None] | None = None) -> Run:
    """:func:`read`, except that a local path holding memory snapshots and no trace is a run with no trace files
    (``summary`` and ``diagnose`` then answer from the snapshots alone)."""
    try:
        return read(path, names, selection, workers, ray_address, progress)
    except TraceError:
        if not memory.find_snapshots(path, selection):
            raise
        return Run(path, selection or Selection(), workers=workers)


def _stragglers_of(run: Run, top: int | None) -> StragglersResult:
    return _finish(run, stragglers_mod.combine(run.pairs("stragglers"), top=top))


def _timeline_tasks(paths: list[str]) -> list[dict[str, Any]]:
    """Busy intervals of every role from Ray's task timelines (:mod:`.ray_timeline`); one that cannot be used is
    logged (``check`` names it) and left out."""
    from distprof.analysis.ray_timeline import TimelineError, busy_intervals

    out: list[dict[str, Any]] = []
    for p in paths:
        try:
            out += busy_intervals(p)
        except TimelineError as e:
            logger.warning("%s", e)
    return out


def _steps_of(run: Run, waits: list[Wait], tasks: list[dict[str, Any]] | None = None,
              peak_tflops: float | None = None) -> StepsResult:
    flops_parts = run.pairs("mfu")
    flops = mfu.combine(flops_parts, peak_tflops=peak_tflops, top=0)[0] \
        if any(p.get("shapes") for _, p in flops_parts) else []
    out = steps_mod.combine([(r.info, r.parts) for r in run.files], waits, flops)
    if not any(f.reason is UNSET for f in flops):
        reason = mfu.missing_reason(p for _, p in flops_parts)
        if reason is not None:
            out.flops_reason = reason
    # The RL step view (jobs with several roles; [] for one): ``tasks`` are busy intervals from outside the traces.
    # Given none, the run directory's own Ray task timelines (the driver's) are used.
    out.rl_steps = rlsteps.combine(out.steps, [(r.info, r.parts) for r in run.files],
                                   tasks if tasks is not None else run.tasks or None)
    out.step_breakdown = breakdown.combine(run.pairs("breakdown"))[1]
    return _finish(run, out)


def summary_result(path: str, selection: Selection | None = None, top: int | None = None,
                   workers: int | None = None, ray_address: str | None = None,
                   progress: Callable[[Progress], None] | None = None,
                   peak_tflops: float | None = None) -> SummaryResult:
    """``distprof summary`` as a record: kernels, ops, phases, categories over all ranks; per rank its breakdowns;
    FLOPs and MFU per rank and step when the traces have shapes (``peak_tflops``: the user's peak, every dtype)
    (reading only what summary needs; :func:`summary` is its ``--json`` object)."""
    if peak_tflops is not None and not peak_tflops > 0:
        raise ValueError(f"peak_tflops={peak_tflops!r}: must be a positive number of TFLOP/s (e.g. 989.4)")
    return _summary_of(read_with_snapshots(path, SUMMARY_PARTS, selection, workers, ray_address, progress), top,
                       peak_tflops)


def summary(path: str, selection: Selection | None = None, top: int | None = None, workers: int | None = None,
            ray_address: str | None = None, progress: Callable[[Progress], None] | None = None,
            peak_tflops: float | None = None) -> dict[str, Any]:
    """``distprof summary --json``: ``to_json`` of :func:`summary_result`."""
    return to_json(summary_result(path, selection, top, workers, ray_address, progress, peak_tflops))


def steps_result(path: str, selection: Selection | None = None, workers: int | None = None,
                 ray_address: str | None = None, progress: Callable[[Progress], None] | None = None,
                 tasks: list[dict[str, Any]] | None = None, peak_tflops: float | None = None) -> StepsResult:
    """``distprof steps`` as a record: per step and rank: duration, waits, phases, breakdowns; who holds the others
    back; the RL step view (``rl_steps``; ``tasks``: busy intervals from outside the traces, see :mod:`.rlsteps`);
    model FLOPs, TFLOP/s and MFU per rank and step where the traces have shapes (``peak_tflops`` as summary's)."""
    if peak_tflops is not None and not peak_tflops > 0:
        raise ValueError(f"peak_tflops={peak_tflops!r}: must be a positive number of TFLOP/s (e.g. 989.4)")
    tele = telemetry_steps.read(path)  # step telemetry (telemetry: true) in a local run directory; else None
    try:
        run = read(path, STEPS_PARTS, selection, workers, ray_address, progress)
    except TraceError as e:
        if tele is None or not tele.series:
            raise
        # A run directory with telemetry and no trace (nothing captured yet): the telemetry is the answer.
        run, listed = Run(path, selection or Selection()), getattr(e, "errors", [])
        return _with_telemetry(_finish(run, StepsResult(steps=[], profiling_cost=[])), tele, run.selection, listed)
    out = _steps_of(run, stragglers_mod.combine(run.pairs("stragglers"), top=0).waits, tasks, peak_tflops)
    return out if tele is None else _with_telemetry(out, tele, run.selection)


def _with_telemetry(out: StepsResult, tele: TelemetryRun, selection: Selection,
                    listed: list[dict[str, Any]] | None = None) -> StepsResult:
    """``out`` with the run's step telemetry (:mod:`.telemetry_steps`); streams that cannot be read are errors
    (after the trace listing's own ``listed``, when no trace was read)."""
    out.telemetry, out.telemetry_timeline = telemetry_steps.combine(tele, selection)
    out.telemetry_read = len(tele.series)
    errors = list(out.errors or []) + list(listed or [])
    known = {e.get("path") for e in errors}
    errors += [p.file_dict() for p in tele.errors if p.path not in known]  # (a linked stream: the listing's too)
    out.errors = errors
    return out


def steps(path: str, selection: Selection | None = None, workers: int | None = None, ray_address: str | None = None,
          progress: Callable[[Progress], None] | None = None, tasks: list[dict[str, Any]] | None = None
          ) -> dict[str, Any]:
    """``distprof steps --json``: ``to_json`` of :func:`steps_result`."""
    return to_json(steps_result(path, selection, workers, ray_address, progress, tasks))


def stragglers_result(path: str, selection: Selection | None = None, top: int | None = 10,
                      workers: int | None = None, ray_address: str | None = None,
                      progress: Callable[[Progress], None] | None = None) -> StragglersResult:
    """``distprof stragglers`` as a record: collectives matched across ranks; who arrives last, who waits how
    long (``worst``: the ``top`` that cost the most waiting; None: all)."""
    return _stragglers_of(read(path, STRAGGLERS_PARTS, selection, workers, ray_address, progress), top)


def stragglers(path: str, selection: Selection | None = None, top: int | None = 10, workers: int | None = None,
               ray_address: str | None = None, progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """``distprof stragglers --json``: ``to_json`` of :func:`stragglers_result`."""
    return to_json(stragglers_result(path, selection, top, workers, ray_address, progress))


def file_facts_of(run: Run) -> list[FileFacts]:
    """Per file what diagnose and the report need beside the verbs' records (:class:`~.records.FileFacts`)."""
    labels, _ = runs(r.info for r in run.files)
    out = []
    for r in run.files:
        summ = r.parts.get("summary") or {}
        inner = r.parts.get("step_names") or summ  # names inside the steps, else the whole trace's
        out.append(FileFacts(path=r.info.path, role=r.info.role, label=role_of(labels, r.info), rank=r.info.rank,
                             world_size=r.info.world_size, start_us=r.info.start_us, kernels=summ.get("kernels") or {},
                             ops=summ.get("ops") or {}, phases=summ.get("phases") or {},
                             step_kernels=inner.get("kernels") or {}, step_ops=inner.get("ops") or {},
                             step_runtime=inner.get("runtime") or {}))
    return out


def investigate(path: str, selection: Selection | None = None, top: int | None = None, workers: int | None = None,
                ray_address: str | None = None, progress: Callable[[Progress], None] | None = None,
                parts: tuple[str, ...] = ()) -> Investigation:
    """Read ``path`` once and compute what ``summary``, ``steps`` and ``stragglers`` answer; ``parts``: more
    per-file extracts (names of ``ANALYSES``, e.g. ``"timeline"`` for the report) kept in ``run.files``."""
    run = read_with_snapshots(path, INVESTIGATE_PARTS + tuple(p for p in parts if p not in INVESTIGATE_PARTS),
                              selection, workers, ray_address, progress)
    return investigation(run, top)


def investigation(run: Run, top: int | None = None) -> Investigation:
    """The :class:`Investigation` of a run read with (at least) :data:`INVESTIGATE_PARTS`."""
    strag = _stragglers_of(run, None)
    return Investigation(run.path, run, _summary_of(run, top), _steps_of(run, strag.waits), strag, file_facts_of(run))


def diagnosis_result(inv: Investigation) -> DiagnoseResult:
    """``distprof diagnose`` of an Investigation, as a record: findings, what was analysed, thresholds, the shared
    keys (the rules' caveats among the warnings, shown wherever those go)."""
    seen = diagnose_mod.analysed(inv)
    env = inv.envelope()
    return DiagnoseResult(findings=diagnose_mod.diagnose(inv), analysed=seen, thresholds=diagnose_mod.THRESHOLDS,
                          **{**env, "warnings": env["warnings"] + seen.caveats,
                             "files_read": inv.summary.files_read})  # (memory snapshots read count too)


def diagnosis(inv: Investigation) -> dict[str, Any]:
    """``diagnose --json`` of an Investigation: ``to_json`` of :func:`diagnosis_result`."""
    return to_json(diagnosis_result(inv))


def diagnose_result(path: str, selection: Selection | None = None, workers: int | None = None,
                    ray_address: str | None = None, progress: Callable[[Progress], None] | None = None
                    ) -> DiagnoseResult:
    """``distprof diagnose`` as a record: ``findings`` (see :mod:`.diagnose`), ranked by the step time they cost,
    with the rules' ``thresholds``, what was ``analysed``, and the keys every verb shares. A run directory with
    hang evidence of a stalled job adds the ``hang`` finding (:mod:`.diagnose.hang`), even with no trace read."""
    hang = hang_finding(path)
    try:
        inv = investigate(path, selection, workers=workers, ray_address=ray_address, progress=progress)
    except TraceError as e:
        if hang is None:
            raise
        # exit 1 (docs/hang.md): the traces are the errors (none found: the path itself), the ranks' evidence is
        # what was read
        errors = list(getattr(e, "errors", None) or []) or [Problem.at(path, str(e), text=str(e)).file_dict()]
        return DiagnoseResult(findings=[hang], analysed=Analysed(roles=[], ranks=0, steps=0,
                              device=False, caveats=[]), thresholds=diagnose_mod.THRESHOLDS,
                              errors=errors, warnings=[f"no trace was read: {e}"], files_read=_evidence_read(hang))
    out = diagnosis_result(inv)
    out.findings = with_hang(out.findings, hang)
    if hang is not None:
        if not out.files_read:  # every trace unreadable: the evidence was read (exit 1, not 2)
            out.files_read = _evidence_read(hang)
    return out


def _evidence_read(hang: Any) -> int:
    """The ranks whose hang evidence the ``hang`` finding was read from (at least one: it exists)."""
    states = (hang.evidence.figures or {}).get("states", {})
    return max(sum(s != "no_evidence" for s in states.values()), 1)


def diagnose(path: str, selection: Selection | None = None, workers: int | None = None, ray_address: str | None = None,
             progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """``distprof diagnose --json``: ``to_json`` of :func:`diagnose_result`."""
    return to_json(diagnose_result(path, selection, workers, ray_address, progress))


DIFF_PARTS = ("summary", "steps")


def compare_runs(ra: Run, rb: Run, top: int | None = None) -> DiffResult:
    """Two runs read with (at least) :data:`DIFF_PARTS`: :func:`.diff.compare` of their summaries, per step."""
    facts = [diff_mod.step_facts((r.info, r.parts.get("steps")) for r in run.files) for run in (ra, rb)]
    sa, sb = ra.selection, rb.selection
    chosen = (sa.steps is not None or sb.steps is not None, sa.ranks is not None or sb.ranks is not None)
    return diff_mod.compare([p for _, p in ra.pairs("summary")], [p for _, p in rb.pairs("summary")], top=top,
                            steps_a=facts[0], steps_b=facts[1], chosen=chosen)


def diff_result(a: str, b: str, selection_a: Selection | None = None, selection_b: Selection | None = None,
                top: int | None = None, workers: int | None = None, ray_address: str | None = None,
                progress: Callable[[Progress], None] | None = None) -> DiffResult:
    """``distprof diff`` as a record: per kernel, op, phase and category, A's and B's time per step (and in total)
    and the change; the median step per role; warnings when the two sides do not hold the same steps or ranks;
    the keys every verb shares, both sides' together (``scope`` per side)."""
    runs = [read(p, DIFF_PARTS, sel, workers, ray_address, progress) for p, sel in ((a, selection_a), (b, selection_b))]
    for run, label in zip(runs, "AB", strict=True):
        if not run.files:
            raise nothing_read(f"{run.path}: nothing to compare on side {label} "
                               f"({'; '.join(e.message for e in run.errors) or 'no trace matches the selection'})",
                               run.errors)
    out = compare_runs(runs[0], runs[1], top=top)
    ea, eb = runs[0].envelope(), runs[1].envelope()
    out.errors, out.salvaged, out.conflicts = (ea[k] + eb[k] for k in ("errors", "salvaged", "conflicts"))
    out.warnings = ea["warnings"] + eb["warnings"] + out.warnings  # the comparison's own after the reading's
    out.skipped = ea["skipped"] + eb["skipped"]
    out.scope = {"a": ea["scope"], "b": eb["scope"]}
    out.files_read = len(runs[0].files) + len(runs[1].files)
    return out


def diff(a: str, b: str, selection_a: Selection | None = None, selection_b: Selection | None = None,
         top: int | None = None, workers: int | None = None, ray_address: str | None = None,
         progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """``distprof diff --json``: ``to_json`` of :func:`diff_result`."""
    return to_json(diff_result(a, b, selection_a, selection_b, top, workers, ray_address, progress))
