"""Profiling's own cost, as the manifest recorded it: how much slower a rank's profiled steps ran than its
steady-state unprofiled steps, whether that figure can be trusted, and how long closing its windows held the
training thread.

The profiler (``capture/steptime.py``) times up to ``BASELINE_STEPS`` unprofiled steps before each window's warm-up,
never one of the process's first ``SETTLING_STEPS`` steps nor the step right after a window closed. Per
(role, rank), over its windows:

- ``profiled_s`` / ``baseline_s``: the median of the recorded steps / of the baseline steps (windows pooled);
  ``inflation`` = profiled / baseline - 1 (0.04 is "4% slower").
- ``reliable``: at least ``MIN_BASELINE`` baseline steps whose spread is at most ``MAX_SPREAD``. The spread is
  slowest / fastest, with the single slowest set aside when there are 5 or more (one garbage collection or
  checkpoint does not void the figure, two do). Otherwise ``inflation`` is None and ``reason`` says why, in
  words a user can act on; when reliable, ``reason`` says what the baseline is.
- ``export_s``: the longest time closing one window held the training thread (torch's stop, export, gzip
  check, publication; with a held export, ``Profiler.export()`` too); ``export_total_s`` over its windows. No
  step time includes it.

A window from an older distprof (no step numbers for its baseline) gives no figure: its baseline could be
warm-up. Traces without a manifest line give no entry at all.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from distprof.analysis.records import ProfilingCost
from distprof.rundir.manifest import BASELINE_STEPS, SETTLING_STEPS
from distprof.trace.table import TraceTable
from distprof.util.intervals import ranges_text

__all__ = ["MAX_SPREAD", "MIN_BASELINE", "profiling_cost", "window_cost"]

MIN_BASELINE = 3  # steady-state unprofiled steps a figure needs
MAX_SPREAD = 1.5  # slowest / fastest of them (the single slowest set aside from 5 on)


def _seconds(v: Any) -> float | None:
    """A duration from an untrusted manifest: finite and non-negative, else None."""
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 else None


def window_cost(tb: TraceTable) -> dict[str, Any] | None:
    """What the manifest line of this file's window says about profiling's own cost (None: no line, or one
    with no timing). Runs in the worker that read the file: small and plain."""
    w = getattr(tb, "window_record", None)
    if w is None:
        return None
    profiled = [t for t in map(_seconds, w.step_times_s) if t is not None]
    pairs = list(zip(w.baseline_step_numbers, w.baseline_times_s, strict=False))  # lengths checked next
    new = w.first_step is not None and len(w.baseline_step_numbers) == len(w.baseline_times_s)
    if not new:  # an older distprof: times without step numbers
        pairs = [(None, t) for t in w.baseline_times_s]
    pairs = [(n, s) for n, s in ((n, _seconds(t)) for n, t in pairs) if s is not None]
    export = _seconds(w.export_s)
    if not profiled and not pairs and export is None:
        return None
    return {"steps": list(w.steps), "profiled_s": profiled, "baseline_s": [s for _, s in pairs],
            "baseline_at": [n for n, _ in pairs] if new else None, "first_step": w.first_step if new else None,
            "export_s": export, "pid": w.pid}


def profiling_cost(files: Iterable[tuple[Any, dict[str, Any] | None]]) -> list[ProfilingCost]:
    """Per (role, rank) whose manifest timed its windows: the figures and the verdict (see the module's doc)."""
    return [_cost_row(role, rank, wins) for (role, rank), wins in sorted(_windows_by_rank(files).items())]


def _windows_by_rank(files: Iterable[tuple[Any, dict[str, Any] | None]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Each file's window cost under its (role, rank): role "" and rank -1 when the file names none."""
    acc: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for info, cost in files:
        if cost:
            acc[(info.role or "", -1 if info.rank is None else info.rank)].append(cost)
    return acc


def _cost_row(role: str, rank: int, wins: list[dict[str, Any]]) -> ProfilingCost:
    """One (role, rank)'s figures and verdict over its windows (sorted here by their steps)."""
    wins.sort(key=lambda c: c["steps"])
    prof = [t for c in wins for t in c["profiled_s"]]
    new = [c for c in wins if c["first_step"] is not None]
    base = [t for c in new for t in c["baseline_s"]]
    shown = base or [t for c in wins for t in c["baseline_s"]]  # an older distprof's, shown but not judged
    b = statistics.median(shown) if shown else None
    p = statistics.median(prof) if prof else None
    spread = _spread(base)
    reliable, reason = _verdict(wins, new, base, prof, spread)
    exports = [c["export_s"] for c in wins if c["export_s"] is not None]
    return ProfilingCost(role=role or None, rank=None if rank < 0 else rank, baseline_s=b, profiled_s=p,
                         inflation=(p / b - 1.0) if reliable and b else None, baseline_steps=len(shown),
                         profiled_steps=len(prof), windows=len(wins), reliable=reliable, reason=reason,
                         baseline_spread=spread[0] if spread else None,
                         export_s=max(exports) if exports else None,
                         export_total_s=sum(exports) if exports else None, export_windows=len(exports))


def _spread(base: list[float]) -> tuple[float, float, float] | None:
    """(slowest / fastest, fastest, slowest) of the baseline, the single slowest set aside from 5 steps on."""
    if len(base) < 2:
        return None
    judged = sorted(base)[:-1] if len(base) >= 5 else sorted(base)
    lo, hi = judged[0], judged[-1]
    return (hi / lo if lo > 0 else math.inf), lo, hi


def _verdict(wins: list[dict[str, Any]], new: list[dict[str, Any]], base: list[float], prof: list[float],
             spread: tuple[float, float, float] | None) -> tuple[bool, str]:
    if not prof:
        return False, "no whole profiled step was timed (stage windows, or windows cut short in their first step)"
    if not new:
        return False, ("recorded by an older distprof, whose baseline included warm-up steps; profile again with "
                       "this version for a figure")
    if len(base) < MIN_BASELINE:
        return False, _too_few(wins, new, len(base))
    if spread is None:  # MIN_BASELINE >= 2 baseline steps always have one
        raise RuntimeError("a baseline of enough steps without a spread")
    ratio, lo, hi = spread
    if ratio > MAX_SPREAD:
        return False, f"unprofiled steps vary {ratio:.1f}x ({_secs(lo)}-{_secs(hi)}): too noisy to compare"
    at = sorted(n for c in new for n in c["baseline_at"])
    return True, (f"median of {len(base)} unprofiled steps in steady state (steps {ranges_text(at)}), which vary "
                  f"{ratio:.2f}x")


def _too_few(wins: list[dict[str, Any]], new: list[dict[str, Any]], n: int) -> str:
    """Why fewer than MIN_BASELINE steady-state steps were timed. Every window is short then, the first of them
    too, and what came before it in its process is the process's own start: its warm-up is the reason, or the
    steps ran but were not timed (a requested window times the steps from when it was accepted)."""
    c = new[0]
    start, last = c["steps"]
    first = c["first_step"]
    end = start - 2 if start - 1 >= first else start - 1  # the last step before the window's warm-up
    ran = max(0, end - first + 1)  # unprofiled steps this process ran before the warm-up
    steps = "step" if ran == 1 else "steps"
    head = ("" if len(wins) == 1
            else f"only {n} steady-state unprofiled steps before its {len(wins)} windows; the first: ")
    suggest = (f"profile later steps, e.g. steps: "
               f"{_steps_setting(first + SETTLING_STEPS + BASELINE_STEPS + 1, last - start + 1)}")
    if ran == 0:
        how = f"warms up on its first step, {first}" if end < start - 1 else f"starts at its first step, {first}"
        return f"{head}no unprofiled step ran before the window in this process (it {how}); {suggest}"
    if ran <= SETTLING_STEPS:
        return (f"{head}the {'' if ran == 1 else f'{ran} '}unprofiled {steps} before the window ({steps} "
                f"{ranges_text(range(first, end + 1))}) {'is' if ran == 1 else 'are'} the process's first {steps} "
                f"(warm-up); {suggest}")
    if ran - SETTLING_STEPS >= MIN_BASELINE:
        return (f"{head}only {n} unprofiled {'step was' if n == 1 else 'steps were'} timed before the window "
                f"({MIN_BASELINE} needed): a requested window times the steps after it is accepted; ask earlier")
    return (f"{head}only {ran - SETTLING_STEPS} of the {ran} unprofiled steps before the window came after the "
            f"process's first {SETTLING_STEPS} (warm-up); {suggest}")


def _steps_setting(start: int, length: int) -> str:
    if length <= 3:
        return "[" + ", ".join(str(start + i) for i in range(length)) + "]"
    return f'"{start}-{start + length - 1}"'



def _secs(s: float) -> str:
    """Seconds for a sentence, three significant digits in the unit that reads best."""
    if s >= 1:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    return f"{s * 1e6:.3g} us"
