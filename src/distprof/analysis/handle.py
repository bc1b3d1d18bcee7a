"""One analysis handle for notebooks and scripts: ``run = distprof.analysis.open(path, ...)`` reads the traces once
(on first use: one pass over the files running every extract its methods need) and answers from that read.

    run = distprof.analysis.open("runs/exp1/profile", ranks="0-7", steps=[10, 11], workers=4)
    run.summary()      # SummaryResult: what `distprof summary --json` encodes
    run.steps()        # StepsResult: `distprof steps --json`
    run.stragglers()   # StragglersResult: `distprof stragglers --json` (``worst`` uncapped)
    run.diagnose()     # [Finding]: `distprof diagnose --json`'s findings, ranked by cost
    run.report("report.html")  # writes the HTML report, returns its path

The records are :mod:`distprof.analysis.records` (``to_json(record)`` gives the ``--json`` object). Nothing is
read twice: the per-file extracts of the first call are kept, and every method works from them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from distprof.analysis import analyze
from distprof.analysis import diagnose as diagnose_mod
from distprof.analysis.analyze import Investigation
from distprof.analysis.parallel import Progress
from distprof.analysis.records import StepsResult, StragglersResult, SummaryResult
from distprof.analysis.records_diag import DiagnoseResult, Finding
from distprof.analysis.writing import check_output
from distprof.trace.selection import Selection

__all__ = ["Analysis", "open"]

# Every extract any method needs, run in the one pass (the report's worst-step timelines included).
PARTS = (*analyze.INVESTIGATE_PARTS, "timeline")


class Analysis:
    """The traces under one path, read once on first use. Build it with :func:`open`."""

    def __init__(self, path: str, selection: Selection | None = None, workers: int | None = None,
                 ray_address: str | None = None, progress: Callable[[Progress], None] | None = None) -> None:
        self.path = path
        self.selection = selection or Selection()
        self.workers = workers
        self.ray_address = ray_address
        self.progress = progress
        self._inv: Investigation | None = None
        self._findings: list[Finding] | None = None

    @property
    def investigation(self) -> Investigation:
        """The one read (made on first use): the typed records and what each file told."""
        if self._inv is None:
            run = analyze.read_with_snapshots(self.path, PARTS, self.selection, self.workers, self.ray_address,
                                              self.progress)
            self._inv = analyze.investigation(run)
        return self._inv

    def summary(self) -> SummaryResult:
        """Kernels, ops, phases, categories over all ranks; per rank its breakdowns (``distprof summary``)."""
        return self.investigation.summary

    def steps(self) -> StepsResult:
        """Per step and rank: duration, waits, phases, breakdowns; the RL step view (``distprof steps``)."""
        return self.investigation.steps

    def stragglers(self) -> StragglersResult:
        """Collectives matched across ranks; who arrives last, who waits how long (``distprof stragglers``)."""
        return self.investigation.stragglers

    def diagnose(self) -> list[Finding]:
        """What is wrong, in words: findings ranked by the step time they cost (``distprof diagnose``)."""
        if self._findings is None:
            self._findings = diagnose_mod.diagnose(self.investigation)
        return self._findings

    def diagnosis(self) -> DiagnoseResult:
        """All of ``distprof diagnose`` as a record: findings, what was analysed, thresholds, the shared keys
        (``to_json`` of it is ``distprof diagnose --json``'s object)."""
        return analyze.diagnosis_result(self.investigation)

    def report(self, out: str, compare: str | None = None) -> str:
        """Write the HTML report (``distprof report``) to ``out`` and return ``out``. ``compare``: another run to
        compare with (read once, for what ``diff`` reads)."""
        # report/ sits above analysis/ and imports plotly: loaded only when a report is asked for, so
        # `import distprof.analysis` (and the analysis CLI) stays free of plotly.
        from distprof.report import report_of

        inv = self.investigation
        check_output(out, [r.info.path for r in inv.run.files], "report", "report.html")
        report_of(inv, out, compare, self.selection, self.workers, self.ray_address, self.progress)
        return out


def open(path: str, ranks: str | Iterable[int] | None = None, steps: str | Iterable[int] | None = None,
         roles: str | Iterable[str] | None = None, workers: int | None = None, steps_only: bool = False,
         ray_address: str | None = None, progress: Callable[[Progress], None] | None = None) -> Analysis:
    """The traces under ``path`` (a run directory, a folder of traces, one file; local or fsspec URL) as one
    :class:`Analysis`. ``ranks``, ``steps``, ``roles``: the selection, as the CLI's ``--ranks 0-3``, ``--steps
    10,11``, ``--roles actor`` (text or collections); ``workers``: processes reading files (default: the CPUs)."""
    sel = Selection.of(ranks=ranks, roles=roles, steps=steps, steps_only=steps_only)
    return Analysis(path, sel, workers, ray_address, progress)
