"""What one read of a path gives every verb, typed: the :class:`Investigation` that diagnose and the report read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from distprof.analysis import timeline as timeline_mod
from distprof.analysis.records import FileFacts, StepsResult, StragglersResult, SummaryResult
from distprof.analysis.timeline import StepTimeline

__all__ = ["Investigation"]


@dataclass
class Investigation:
    """What one read of a path gives every verb, typed: ``summary``, ``steps`` and ``stragglers`` are the records
    those verbs' ``--json`` encode (``stragglers.worst`` uncapped), made from one decode of each file; ``files``
    what diagnose and the report know of each file. ``diagnose`` and ``report`` read these, so nothing is read or
    computed twice; the report's worst-step timelines come from :meth:`step_timeline` (``run`` keeps the per-file
    parts they are made of: read them through this class, not directly)."""
    path: str
    run: Any  # analyze.Run: the files read, their errors and per-file parts
    summary: SummaryResult
    steps: StepsResult
    stragglers: StragglersResult
    files: list[FileFacts] = field(default_factory=list)

    def envelope(self) -> dict[str, Any]:
        """The keys every verb shares (errors, salvaged, conflicts, warnings, skipped, scope, files_read)."""
        keys = ("scope", "errors", "salvaged", "conflicts", "warnings", "skipped", "files_read")
        return {k: getattr(self.steps, k) for k in keys}

    def device_names(self) -> list[str]:
        """The devices the files' traces name (``deviceProperties``), once each, in file order."""
        names: dict[str, None] = {}
        for r in getattr(self.run, "files", []):
            for d in (r.parts.get("mfu") or {}).get("devices") or []:
                names[str(d)] = None
        return list(names)

    @property
    def has_timelines(self) -> bool:
        """Whether the files were read with the ``timeline`` extract (``investigate(..., parts=("timeline",))``),
        which :meth:`step_timeline` needs."""
        return any("timeline" in r.parts for r in self.run.files)

    def step_timeline(self, role: str | None, step: Any, ranks: list[int]) -> StepTimeline | None:
        """``step`` (a step number, or a capture window ``[first, last]``) of ``role`` (a role label as the steps
        rows name it) for ``ranks``, in that order: each rank's phases, compute, collectives and its waiting for a
        later rank (:func:`.timeline.combine`). None without timelines or when no asked rank has that step."""
        if not self.has_timelines:
            return None
        return timeline_mod.combine([(r.info, r.parts) for r in self.run.files], role, step, ranks)
