"""What part of a run an analysis looks at: which ranks, roles and steps, and whether work outside the
profiled steps counts.

The selection is applied as early as what is known allows: a run directory's manifest names each file's
rank, role and window before anything is read, so unselected files are never opened; a trace's own
``distributedInfo`` is known after its first batch, so an unselected rank stops reading there; steps
are applied per event (an event belongs to the step in which it starts; device work to the step that
launched it).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Selection", "parse_int_set"]

_PART = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*)?$")


def parse_int_set(text: str | Iterable[int] | None, what: str = "value") -> frozenset[int] | None:
    """``"0,3-5"`` -> {0, 3, 4, 5}; None stays None. A bad part raises ValueError naming it."""
    if text is None:
        return None
    if not isinstance(text, str):
        return frozenset(int(x) for x in text)
    out: set[int] = set()
    for part in text.split(","):
        if not part.strip():
            continue
        m = _PART.match(part)
        if not m:
            raise ValueError(f"{what}: {part.strip()!r} is not a number or a range such as 3-5")
        a, b = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if b < a:
            raise ValueError(f"{what}: range {part.strip()!r} ends before it starts")
        if b - a > 1_000_000:
            raise ValueError(f"{what}: range {part.strip()!r} is too long (over a million values)")
        out.update(range(a, b + 1))
    if not out:
        raise ValueError(f"{what}: {text!r} selects nothing")
    return frozenset(out)


@dataclass(frozen=True)
class Selection:
    """Ranks, roles and steps to analyse (None = all), and whether only work inside steps counts."""

    ranks: frozenset[int] | None = None
    """Global ranks to read; files of other ranks are skipped (not errors)."""
    roles: tuple[str, ...] | None = None
    """Role names or globs (``rollout*``); a file without a role matches only when roles is None."""
    steps: frozenset[int] | None = None
    """Global steps (``ProfilerStep#N``); only events of these steps count. Implies ``steps_only``."""
    steps_only: bool = False
    """Count only work inside ``ProfilerStep`` ranges (HolisticTraceAnalysis's rule); default: the whole trace."""

    @classmethod
    def of(cls, ranks: str | Iterable[int] | None = None, roles: str | Iterable[str] | None = None,
           steps: str | Iterable[int] | None = None, steps_only: bool = False) -> Selection:
        """From CLI-style text (``"0,3-5"``, ``"actor,rollout*"``) or collections."""
        if isinstance(roles, str):
            roles = [r.strip() for r in roles.split(",") if r.strip()]
        return cls(ranks=parse_int_set(ranks, "--ranks"), roles=tuple(roles) if roles else None,
                   steps=parse_int_set(steps, "--steps"), steps_only=steps_only or steps is not None)

    @property
    def by_step(self) -> bool:
        return self.steps_only or self.steps is not None

    def rank_ok(self, rank: int | None) -> bool:
        return self.ranks is None or (rank is not None and rank in self.ranks)

    def role_ok(self, role: str | None) -> bool:
        if self.roles is None:
            return True
        return role is not None and any(fnmatch.fnmatchcase(role, pat) for pat in self.roles)

    def window_ok(self, window: Iterable[int] | None) -> bool:
        """A manifest window ``[first, last]`` that may hold a selected step (unknown: maybe)."""
        if self.steps is None or window is None:
            return True
        try:
            a, b = (int(x) for x in window)
        except (TypeError, ValueError):
            return True
        return any(a <= s <= b for s in self.steps)

    def step_ok(self, step: int) -> bool:
        return self.steps is None or step in self.steps

    def to_dict(self) -> dict:
        return {"ranks": sorted(self.ranks) if self.ranks is not None else None,
                "roles": list(self.roles) if self.roles is not None else None,
                "steps": sorted(self.steps) if self.steps is not None else None,
                "steps_only": self.by_step}
