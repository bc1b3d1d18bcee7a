"""Profiling's own cost, capture side: which steps a Profiler times, and what a window's manifest line says of them.

A window's baseline is up to ``BASELINE_STEPS`` unprofiled steps just before its warm-up, in steady state: never
one of the first ``SETTLING_STEPS`` steps this process's profiler ran (cuBLAS / cuDNN set-up, DDP bucket building,
HF's first step) and never the step right after a window closed (it follows the export). The plan knows these
steps in advance, so the timed steps are one contiguous range, from :meth:`StepClock.first_timed` to the window's
end; the clock keeps that bound in ``time_from`` and every other step pays one comparison in ``Profiler.step``.
The analysis (``analysis/summary.py``) judges and explains what is recorded here.
"""

from __future__ import annotations

import time

from distprof.config.plan import Window
from distprof.rundir.manifest import BASELINE_STEPS, SETTLING_STEPS

__all__ = ["BASELINE_STEPS", "NEVER", "SETTLING_STEPS", "StepClock"]

NEVER = 1 << 62  # a step number no run reaches: nothing is timed


class StepClock:
    """The timed steps of one Profiler: the baseline gathered for the next window, and the open window's steps.

    The Profiler reads ``time_from`` at every step end (``step >= clock.time_from``: time it, :meth:`ended`) and
    stamps ``mark`` when a timed step begins; :meth:`plan` and :meth:`plan_request` move the bound when a window
    is planned or a request accepted."""

    __slots__ = ("baseline", "first_step", "mark", "resume_at", "time_from", "window_baseline", "window_steps")

    def __init__(self) -> None:
        self.first_step: int | None = None  # the first step this process's profiler ran (start())
        self.resume_at = 0  # the first step that may be a baseline again after a window closed
        self.time_from = NEVER  # steps from here on are timed (the next window's baseline, then its own steps)
        self.mark: tuple[int, float] | None = None  # (step, perf_counter) when that step began
        # Filled by ended(): a step ended with no window open is a baseline step, one inside a window
        # from its first recorded step is the window's (warm-up steps are neither).
        self.baseline: list[tuple[int, float]] = []  # (step, seconds) of unprofiled steps timed for the next window
        self.window_baseline: list[tuple[int, float]] = []  # the open window's baseline
        self.window_steps: list[float] = []  # the open window's recorded steps, in order

    def started(self, step: int) -> None:
        self.first_step = step
        self.resume_at = step + SETTLING_STEPS

    def first_timed(self, w: Window) -> int:
        """The first step to time for window ``w``: its baseline's first step, or its own first step when no
        steady-state unprofiled step comes before its warm-up."""
        start = max(w.warmup_start - BASELINE_STEPS, self.resume_at)
        return start if start < w.warmup_start else w.start

    def reset(self) -> None:
        """The bound moved (a window planned or requested): steps timed so far are not its baseline."""
        self.baseline = []

    def closed(self, last: int) -> None:
        """A window closed after step ``last``: step ``last + 1`` follows its export, so it is no baseline."""
        self.resume_at = max(self.resume_at, last + 2)
        self.window_baseline, self.window_steps = [], []

    def opened(self) -> None:
        """A window opens: the baseline timed so far is its own."""
        self.window_baseline, self.window_steps = self.baseline[-BASELINE_STEPS:], []
        self.baseline = []

    def plan(self, w: Window | None, step: int) -> None:
        """The next planned window is ``w`` (None: none), seen at ``step``: time the steady-state steps before its
        warm-up and its own steps; the plan knows them in advance, so no other step is timed."""
        self.time_from = NEVER if w is None else self.first_timed(w)
        self.reset()
        if step >= self.time_from:
            self.mark = (step, time.perf_counter())

    def plan_request(self, w: Window, step: int) -> None:
        """An accepted request is timed like a planned window (profiling's own cost in its manifest line): its
        baseline steps from now on, its recorded steps. The planned next window comes after it (no overlap)."""
        start = self.first_timed(w)
        if start < self.time_from:
            self.time_from = start
            self.reset()
            if step >= start:
                self.mark = (step, time.perf_counter())

    def ended(self, step: int, w: Window | None) -> None:
        """Step ``step`` just ended (``w``: the open window, if any): its wall time joins the baseline (no window
        open) or the window's recorded steps (warm-up steps are neither)."""
        t = time.perf_counter()
        mark = self.mark
        if mark is None or mark[0] != step:
            return  # its start was not stamped (a late start, a held export): not a whole step
        if w is None:
            self.baseline.append((step, t - mark[1]))
        elif step >= w.start:
            self.window_steps.append(t - mark[1])

    def record(self) -> dict:
        """The manifest fields of the window being closed."""
        return {"step_times_s": self.window_steps, "baseline_times_s": [t for _, t in self.window_baseline],
                "baseline_step_numbers": [s for s, _ in self.window_baseline], "first_step": self.first_step}
