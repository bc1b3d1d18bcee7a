"""Profiling's own cost, capture side: which steps a Profiler times, and what a window's manifest line says of them.

A window's baseline is up to ``BASELINE_STEPS`` unprofiled steps just before its warm-up, in steady state: never
one of the first ``SETTLING_STEPS`` steps this process's profiler ran (cuBLAS / cuDNN set-up, DDP bucket building,
HF's first step) and never the step right after a window closed (it follows the export). The plan knows these
steps in advance, so the timed steps are one contiguous range, from :meth:`StepClock.first_timed` to the window's
end; the Profiler keeps that bound in ``_time_from`` and every other step pays one comparison. The analysis
(``analysis/summary.py``) judges and explains what is recorded here.
"""

from __future__ import annotations

from distprof.config.plan import Window
from distprof.rundir.manifest import BASELINE_STEPS, SETTLING_STEPS

__all__ = ["BASELINE_STEPS", "SETTLING_STEPS", "StepClock"]


class StepClock:
    """The timed steps of one Profiler: the baseline gathered for the next window, and the open window's steps."""

    __slots__ = ("baseline", "first_step", "resume_at", "window_baseline", "window_steps")

    def __init__(self) -> None:
        self.first_step: int | None = None  # the first step this process's profiler ran (start())
        self.resume_at = 0  # the first step that may be a baseline again after a window closed
        # Filled by Profiler._time_step: a step ended with no window open is a baseline step, one inside a window
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

    def record(self) -> dict:
        """The manifest fields of the window being closed."""
        return {"step_times_s": self.window_steps, "baseline_times_s": [t for _, t in self.window_baseline],
                "baseline_step_numbers": [s for s, _ in self.window_baseline], "first_step": self.first_step}
