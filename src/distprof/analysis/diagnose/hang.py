"""The ``hang`` finding: a run directory holding hang evidence of a stalled job (:mod:`distprof.analysis.hang`)
says which ranks the others wait for. Unlike the other rules it reads no trace (a hung window is never
exported), so :func:`with_hang` adds it beside the traces' findings (``diagnose`` and the report), first when
the job hangs: its cost is the longest stall (the job made no progress for that long)."""

from __future__ import annotations

import os

from distprof.analysis.hang import analyse, read_evidence
from distprof.analysis.records_diag import Finding, FindingEvidence

__all__ = ["hang_finding", "with_hang"]


def hang_finding(path: str) -> Finding | None:
    """The finding of the hang evidence under ``path`` (a local or mounted run directory); None without a hang."""
    if not os.path.isdir(path):
        return None
    data = read_evidence(path)
    if not data.ranks:
        return None
    res = analyse(data)
    if not res.hung:
        return None
    stuck = {r.rank: r for r in res.ranks if r.rank in res.stuck_ranks and r.role == res.role}
    stalled = max((r.stalled_s or 0.0 for r in res.ranks), default=0.0)
    c = res.collective
    names = ([f"{c.name} #{c.seq} (group {c.group})"] if c is not None else []) + sorted(
        {x for r in stuck.values() for x in (r.frame, r.phase) if x})
    steps = sorted({r.step for r in stuck.values() if r.step is not None})
    return Finding(
        id="hang", claim=res.verdict, cost_us=stalled * 1e6, evidence=FindingEvidence(
            role=res.role, ranks=list(res.stuck_ranks), steps=list(steps), names=names,
            figures={"collective": None if c is None else {"group": c.group, "seq": c.seq, "name": c.name,
                                                           "waiting": c.waiting, "since": c.since},
                     "states": {str(r.rank): r.state for r in res.ranks if r.role == res.role},
                     "stalled_s": stalled}),
        fix=f"look at where rank(s) {', '.join(map(str, res.stuck_ranks)) or '?'} stand (distprof hang {path}): "
            "a data loader, a lock or a C call that never returns, or a branch that skips a collective on some "
            "ranks; every rank must issue a group's collectives in the same order")


def with_hang(findings: list[Finding], hang: Finding | None) -> list[Finding]:
    """``findings`` with the ``hang`` finding ranked in by the step time it costs (as every finding is), for
    ``diagnose`` and the report alike."""
    if hang is None:
        return findings
    return sorted([hang, *findings], key=lambda f: (-f.cost_us, f.id, str(f.evidence.role)))
