"""Which ranks, roles and global steps are captured: pure functions, no torch.

Everything here works on *global* step numbers (the trainer's own counter), so a
job resumed at step 100 captures exactly the steps a fresh job would.

A capture *window* records the consecutive global steps ``start..end``
(inclusive). It may warm up on the steps just before ``start`` (torch.profiler
needs one step to set up before it records cleanly); ``warmup_start`` is the
first of those, equal to ``start`` when there is no warm-up.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "Plan",
    "Window",
    "rank_selected",
    "role_selected",
    "steps_to_windows",
]


FOREVER = 2**62  # the end step of a window that only stop() closes


@dataclass(frozen=True)
class Window:
    """Global steps ``start..end`` (inclusive) recorded, warmed up from ``warmup_start``."""

    start: int
    end: int
    warmup_start: int

    @property
    def steps(self) -> range:
        return range(self.start, self.end + 1)

    def clipped(self, first_step: int) -> Window:
        """The window as seen by a process whose first step is ``first_step``.

        Warm-up steps before the process existed cannot run, and recorded steps
        before it cannot be captured (a job resumed in the middle of a window).
        """
        start = max(self.start, first_step)
        return Window(start=start, end=self.end, warmup_start=min(start, max(self.warmup_start, first_step)))


def steps_to_windows(steps: Iterable[int], warmup: int = 1) -> list[Window]:
    """Sorted windows from explicit steps; consecutive steps merge into one window.

    Each window warms up on the ``warmup`` steps before it, but never on a step
    that the previous window records (it then starts recording directly).
    """
    ordered = sorted(set(steps))
    windows: list[tuple[int, int]] = []
    run_start: int | None = None
    prev: int | None = None
    for s in ordered:
        if prev is not None and s == prev + 1:
            prev = s
            continue
        if run_start is not None and prev is not None:
            windows.append((run_start, prev))
        run_start = prev = s
    if run_start is not None and prev is not None:
        windows.append((run_start, prev))

    out: list[Window] = []
    last_end = -1
    for start, end in windows:
        warm = max(start - warmup, last_end + 1, 0)
        out.append(Window(start=start, end=end, warmup_start=warm))
        last_end = end
    return out


@dataclass(frozen=True)
class Schedule:
    """torch.profiler.schedule's meaning, evaluated on global step numbers."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 1
    active: int = 1
    repeat: int = 1  # 0 = repeat forever

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def window(self, k: int) -> Window | None:
        """The k-th window (0-based), or None when the schedule has no k-th."""
        if k < 0 or (self.repeat > 0 and k >= self.repeat):
            return None
        base = self.skip_first + k * self.cycle
        start = base + self.wait + self.warmup
        return Window(start=start, end=start + self.active - 1, warmup_start=base + self.wait)


@dataclass(frozen=True)
class Plan:
    """The capture windows of one config: explicit steps or a schedule."""

    windows: tuple[Window, ...] = ()
    schedule: Schedule | None = None

    @classmethod
    def from_steps(cls, steps: Iterable[int]) -> Plan:
        return cls(windows=tuple(steps_to_windows(steps)))

    @classmethod
    def from_schedule(cls, schedule: Schedule) -> Plan:
        return cls(schedule=schedule)

    @classmethod
    def forever(cls) -> Plan:
        """One window from step 0 that never closes (a process backend's whole-lifetime capture)."""
        return cls(windows=(Window(start=0, end=FOREVER, warmup_start=0),))

    def next_window(self, step: int) -> Window | None:
        """The first window that still records a step >= ``step``, as seen from ``step``.

        ``step`` is the first step this process will run from now on, so the
        returned window is clipped to it (no warm-up or recording in the past).
        """
        if self.schedule is None:
            for w in self.windows:
                if w.end >= step:
                    return w.clipped(step)
            return None
        sch = self.schedule
        # Index of the cycle that contains `step` (or the first one after it).
        k = 0 if step <= sch.skip_first else (step - sch.skip_first) // sch.cycle
        for cand in (k, k + 1):
            found = sch.window(cand)
            if found is None:
                return None
            if found.end >= step:
                return found.clipped(step)
        return None  # pragma: no cover - one of two consecutive cycles always qualifies

    def recorded(self, step: int) -> bool:
        """Is global step ``step`` recorded by some window (for a process that ran it)?"""
        if self.schedule is None:
            return any(w.start <= step <= w.end for w in self.windows)
        w = self.next_window(step)
        return w is not None and w.start <= step

    def windows_until(self, last_step: int, first_step: int = 0) -> list[Window]:
        """Every window a process running steps ``first_step..last_step`` closes completely."""
        out: list[Window] = []
        step = first_step
        while True:
            w = self.next_window(step)
            if w is None or w.end > last_step:
                return out
            out.append(w)
            step = w.end + 1

    def describe(self) -> str:
        if not self.windows and self.schedule is None:
            return "on demand only (trigger)"
        if self.windows and self.windows[-1].end == FOREVER:
            return "whole lifetime"
        if self.schedule is None:
            return ", ".join(f"{w.start}" if w.start == w.end else f"{w.start}-{w.end}" for w in self.windows)
        s = self.schedule
        return (
            f"schedule(skip_first={s.skip_first}, wait={s.wait}, warmup={s.warmup}, "
            f"active={s.active}, repeat={s.repeat})"
        )


def rank_selected(ranks: Sequence[int] | str, rank: int) -> bool:
    """``ranks`` is "all" or a list of global ranks."""
    return ranks == "all" or rank in ranks


def role_selected(roles: Sequence[str] | None, role: str) -> bool:
    """``roles`` None selects every role; otherwise exact names or shell-style globs (``actor*``)."""
    if roles is None:
        return True
    return any(role == r or fnmatch.fnmatchcase(role, r) for r in roles)
