"""``distprof report``: one self-contained HTML file (opens offline) with the diagnosis at the top, each
finding linked to the plot that shows it, and the plots (:mod:`.figures`) made from one read of the traces.

:func:`write_report` reads a path once (:func:`~distprof.analysis.analyze.investigate`), diagnoses it and
writes the page; :func:`build_report` writes the page for an Investigation already made. With
``compare``, the other run is read once for what ``diff`` reads (summaries and steps) and compared with this run
per step, as ``distprof diff`` compares (:func:`distprof.analysis.analyze.compare_runs`).

Size: figures are per rank, per step or per name, never per event; plotly.js (about 4.8 MB) is most of
the file (docs/diagnosis.md gives the sizes measured for 8, 256 and 1,024 ranks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from distprof.analysis import analyze
from distprof.analysis.analyze import Investigation
from distprof.analysis.diagnose import Finding, analysed, diagnose
from distprof.analysis.diagnose.hang import hang_finding, with_hang
from distprof.analysis.parallel import Progress
from distprof.analysis.records import to_json
from distprof.analysis.records_diag import DiffResult
from distprof.analysis.writing import atomic_output, check_output
from distprof.report import evidence, figures, page, perf
from distprof.trace.listing import find_traces
from distprof.trace.selection import Selection
from distprof.trace.source import TraceError

logger = logging.getLogger(__name__)

__all__ = ["build_report", "render_report", "report_of", "write_report"]


def _meta(inv: Investigation) -> list[str]:
    ranks = inv.summary.ranks
    roles = sorted({r.role or "" for r in ranks} - {""})
    steps = sorted({str(s.step) for s in inv.steps.steps}, key=lambda s: (len(s), s))
    env = inv.envelope()
    lines = [f"traces: {inv.path}",
             f"{env['files_read']} files read, {len(ranks)} ranks"
             + (f", roles {', '.join(roles)}" if roles else "")
             + (f", steps {', '.join(steps[:20])}{' ...' if len(steps) > 20 else ''}" if steps else ", no steps")]
    scope = env.get("scope") or {}
    chosen = [f"{k} {v}" for k, v in scope.items() if v not in (None, False)]
    if chosen:
        lines.append("selection: " + "; ".join(chosen))
    return lines


def _page(inv: Investigation, findings: list[Finding], compare: DiffResult | None, compare_path: str,
          envelope: dict[str, Any] | None, out: str | None = None
          ) -> tuple[str, list[figures.Section], list[evidence.Evidence]]:
    sections = figures.sections(inv, compare, inv.path, compare_path)
    meta = _meta(inv) + ([f"compared with: {compare_path}"] if compare is not None else [])
    ev = evidence.for_findings(inv, findings, out)
    text = page.render(f"distprof report: {inv.path}", meta, findings, sections, envelope or inv.envelope(), ev,
                       tables=perf.blocks(inv))
    return text, sections, ev


def render_report(inv: Investigation, findings: list[Finding], compare: DiffResult | None = None,
                  compare_path: str = "", envelope: dict[str, Any] | None = None) -> str:
    """The report page for ``inv`` as a string. ``compare``: :func:`distprof.analysis.diff.compare`'s result
    with this run as A and the run at ``compare_path`` as B; ``envelope``: the problems to list (default
    ``inv.envelope()``). Trace files are shown as paths (:func:`build_report` links them relative to the page)."""
    return _page(inv, findings, compare, compare_path, envelope)[0]


def build_report(inv: Investigation, findings: list[Finding], out: str, compare: DiffResult | None = None,
                 compare_path: str = "", envelope: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write :func:`render_report`'s page to ``out`` through a hidden temporary file renamed when complete
    (``out`` is never a torn page). Returns ``{"out", "bytes", "plots", "timelines"}``: each plot's id, its number
    of figures and, when it does not apply, why (``note``); per finding (in order) the worst step its timeline
    draws (``{"role", "step", "ranks"}``, None without one). Trace files sitting under ``out``'s folder are linked
    relative to it."""
    text, sections, ev = _page(inv, findings, compare, compare_path, envelope, out)
    data = text.encode()
    with atomic_output(out) as f:
        f.write(data)
    logger.info("report: %s (%d bytes)", out, len(data))
    return {"out": out, "bytes": len(data),
            "plots": [{"id": s.id, "figures": len(s.figures), "note": s.note} for s in sections],
            "timelines": [e.step for e in ev]}


def _seen_here(path: str, ray_address: str | None) -> list:
    """The traces under ``path`` on this machine (``out`` must not be one of them). With Ray the files may live
    only on the cluster's nodes (``'$SCRATCH/run'``): then none is here, and the reading reports what is missing."""
    try:
        return find_traces(path, [])
    except TraceError:
        if ray_address:
            return []
        raise


def write_report(path: str, out: str, compare: str | None = None, selection: Selection | None = None,
                 workers: int | None = None, ray_address: str | None = None,
                 progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """``distprof report``: read ``path`` once, diagnose it, write the HTML report to ``out``.

    Returns ``{"out", "bytes", "findings" (each finding's dict, as diagnose --json), "plots" (each plot's
    id, its number of figures and, when it does not apply, why), "compare"}`` plus the keys every verb
    shares (``errors``, ``salvaged``, ..., ``files_read``; with ``compare`` the other run's problems are
    added to them). The selection applies to both runs. Raises TraceError when nothing under ``path`` (or
    ``compare``) can be read, or when ``out`` must not be written (checked before anything is read).
    """
    check_output(out, [f.path for p in (path, compare) if p for f in _seen_here(p, ray_address)], "report",
                 "report.html")
    inv = analyze.investigate(path, selection, workers=workers, ray_address=ray_address, progress=progress,
                              parts=("timeline",))
    return report_of(inv, out, compare, selection, workers, ray_address, progress)


def report_of(inv: Investigation, out: str, compare: str | None = None, selection: Selection | None = None,
              workers: int | None = None, ray_address: str | None = None,
              progress: Callable[[Progress], None] | None = None) -> dict[str, Any]:
    """:func:`write_report` for an Investigation already made (read with the ``timeline`` extract, or the page has
    no worst-step timelines); ``out`` is checked by the caller."""
    path = inv.path
    if not inv.run.files and not inv.summary.memory:  # (memory snapshots alone make a report: their answers)
        # Nothing read: a page saying "no findings" would be a false all-clear (and would replace a good report).
        raise TraceError(f"{path}: nothing to report, no trace could be read "
                         f"({'; '.join(e.message for e in inv.run.errors) or 'no trace matches the selection'}); "
                         f"{out} was not written")
    findings = with_hang(diagnose(inv), hang_finding(path))  # a stalled job's evidence beside the traces
    env = inv.envelope()
    env["warnings"] = env["warnings"] + analysed(inv).caveats
    # memory snapshots read count too (as diagnose's): a report of snapshots alone is not a run of nothing read
    env["files_read"] = max(env["files_read"], inv.summary.files_read or 0)
    d = None
    if compare:
        # Only what diff reads of the other run (summaries and steps): each of its files is decoded once, none of
        # ours again. Compared per step, as `distprof diff` compares.
        other = analyze.read(compare, analyze.DIFF_PARTS, selection, workers, ray_address, progress)
        if not other.files:
            raise TraceError(f"{compare}: nothing to compare with "
                             f"({'; '.join(e.message for e in other.errors) or 'no trace matches the selection'})")
        d = analyze.compare_runs(inv.run, other)
        oe = other.envelope()
        oe["warnings"] = oe["warnings"] + d.warnings
        env = {**env, **{k: env[k] + oe[k] for k in ("errors", "salvaged", "conflicts", "warnings")},
               "skipped": env["skipped"] + oe["skipped"], "files_read": env["files_read"] + len(other.files)}
    written = build_report(inv, findings, out, d, compare or "", env)
    return {**written, "findings": to_json(findings), "compare": compare,
            "rl_steps": to_json(inv.steps.rl_steps), **env}
