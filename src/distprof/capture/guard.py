"""Memory guardrails for an open capture window: sampled at step boundaries, never on a timer.

torch.profiler buffers every event of a window in the process until the window ends; with
``profile_memory``, ``record_shapes`` and ``with_stack`` on a loop of many small ops that buffer grows by
megabytes per step (measured: 35 MB of heap for 60 steps of 450 small torch calls), and all-rank capture with heavy
flags has taken hosts down (slime's lesson). The guard watches
three figures while a window is open, each optional (``ProfilerConfig`` fields, all off by default):

- ``max_host_memory_gb``: this process's resident memory (RSS);
- ``min_available_memory_gb``: the host's available memory (MemAvailable);
- ``max_trace_mb``: the window's trace size, estimated before export as the growth of the C heap in use
  (glibc ``mallinfo2``) since the window's first recorded step began, times :data:`TRACE_BYTES_PER_HEAP_BYTE`.
  torch buffers the window's events on the C heap until export. RSS growth is no proxy: once an earlier window
  freed its buffers, the next one reuses that memory and RSS does not move (measured: 0 MB of RSS growth for
  a window that exported 47 MB). Without glibc (macOS, musl) RSS growth is used, and says so in the numbers.

The profiler asks :meth:`MemoryGuard.check` at each step boundary of an open window; psutil is read at
most every ``interval_s`` (a monotonic clock), so a loop of tiny steps pays one clock read per step. The step
that ends a window is always sampled (:meth:`MemoryGuard.sample`), before its trace is exported.
When a limit is crossed, ``check`` returns the numbers; the profiler closes the window early through its
normal path and opens no more windows.

What the guard can promise: it looks at step ends only, so one step may grow the trace far past
``max_trace_mb`` before the guard sees it. It cannot stop that growth (torch holds the events until the window
ends), but it refuses the export, which costs far more than the buffers (measured: a 367 MB trace for a 20 MB
budget took 429 s and 7.3 GB of RSS to export): a window whose estimated trace is over
:data:`REFUSE_FACTOR` x ``max_trace_mb`` when the guard sees it is dropped unexported, and its manifest line
(``stopped_by: memory_guard``, no files, ``guard: {..., exported: false, reason}``) says so. A window the guard
closed is always recorded in the manifest: exported, refused, closed in its warm-up (nothing recorded) or whose
export failed (``guard.export_error``).

The export budget (:mod:`.budget`, ``max_export_share``) reuses this estimate (a :class:`MemoryGuard` without
limits) and this early close (:class:`MemoryWatch`), with ``stopped_by: export_budget``; it does not end profiling.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from distprof.capture.backends.base import WindowFiles
from distprof.capture.budget import BUDGET_LIMIT, BUDGET_STOP, ExportBudget
from distprof.config.plan import Window

logger = logging.getLogger(__name__)

__all__ = [
    "GUARD_STOP",
    "REFUSE_FACTOR",
    "TRACE_BYTES_PER_HEAP_BYTE",
    "MemoryGuard",
    "MemoryWatch",
    "describe",
    "finish_closed",
    "heap_in_use",
]

GUARD_STOP = "memory_guard"  # the manifest's stopped_by for a window the guard closed
# A window whose estimated trace is over this many times max_trace_mb when the guard sees it is not exported: a
# budget of 20 MB exports at most about 80 MB (the estimate errs high), never the 367 MB one step can grow to.
REFUSE_FACTOR = 4.0

# Exported chrome-trace JSON bytes per byte of heap growth during a window, measured with torch 2.13 / glibc 2.36
# on a CPU loop of many small ops (benchmarks/bench_capture.py prints it): 1.27-1.41 over windows of 20-60 steps,
# with and without profile_memory + record_shapes + with_stack, first window of the process or later. The top of
# that range is used, so the estimate errs high (and memory the training code itself keeps during the window
# adds to it): the guard stops early, not late.
TRACE_BYTES_PER_HEAP_BYTE = 1.4


def _mallinfo2() -> Any:
    """glibc's mallinfo2 (2.33+), or None where there is none."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                    "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2: Any = False  # resolved on first use


def heap_in_use() -> int | None:
    """Bytes of the C heap in use (malloc'd and not freed, mmapped blocks included), or None without glibc."""
    global _MALLINFO2
    if _MALLINFO2 is False:
        _MALLINFO2 = _mallinfo2()
    if _MALLINFO2 is None:
        return None
    m = _MALLINFO2()
    return m.uordblks + m.hblkhd  # about 1.4 µs a call (glibc 2.36)


DEFAULT_INTERVAL_S = 0.01  # psutil at most every 10 ms: reading /proc/meminfo costs tens of µs


class MemoryGuard:
    """Limits for one profiler's windows; ``None`` limits are off. Use :meth:`from_config`."""

    def __init__(self, max_rss_bytes: float | None = None, min_available_bytes: float | None = None,
                 max_trace_bytes: float | None = None, interval_s: float = DEFAULT_INTERVAL_S,
                 trace_per_byte: float = TRACE_BYTES_PER_HEAP_BYTE):
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        self.max_rss = max_rss_bytes
        self.min_available = min_available_bytes
        self.max_trace = max_trace_bytes
        self.interval_s = interval_s
        self.trace_per_byte = trace_per_byte
        self._rss0 = 0
        self._heap0 = 0
        self.trace_basis = "heap" if heap_in_use() is not None else "rss"  # what the trace estimate grows with
        self._due = 0.0
        self.samples = 0

    @classmethod
    def from_config(cls, config: Any) -> MemoryGuard | None:
        """The guard a config asks for, or None when every limit is off (then the profiler pays nothing)."""
        gb, mb = 1e9, 1e6
        limits = (config.max_host_memory_gb, config.min_available_memory_gb, config.max_trace_mb)
        if all(v is None for v in limits):
            return None
        rss, avail, trace = limits
        return cls(None if rss is None else rss * gb, None if avail is None else avail * gb,
                   None if trace is None else trace * mb)

    def open(self) -> None:
        """A window has just opened: sample from its first step end on; the trace estimate counts from now."""
        self.rebase()
        self._due = 0.0
        self.samples = 0

    def rebase(self) -> None:
        """The window's first recorded step begins: torch drops what warm-up collected (and warm-up pays
        one-time costs, several MB with with_stack), so the trace estimate counts RSS growth from here."""
        self._rss0 = self._proc.memory_info().rss
        self._heap0 = self._heap_or(self._rss0)

    def check(self, recording: bool = True) -> dict[str, Any] | None:
        """At a step boundary: None while every limit holds (or no sample is due), else what was crossed.
        ``recording``: the step that ended was recorded (False in warm-up: only the host limits apply)."""
        now = time.monotonic()
        if now < self._due:
            return None
        self._due = now + self.interval_s
        return self.sample(recording)

    def sample(self, recording: bool = True) -> dict[str, Any] | None:
        """Read psutil now and compare with the limits (the first limit crossed is reported)."""
        self.samples += 1
        rss = self._proc.memory_info().rss
        if self.max_rss is not None and rss > self.max_rss:
            return self._numbers("max_host_memory_gb", rss / 1e9, self.max_rss / 1e9, rss)
        if self.min_available is not None:
            avail = self._psutil.virtual_memory().available
            if avail < self.min_available:
                return self._numbers("min_available_memory_gb", avail / 1e9, self.min_available / 1e9, rss,
                                     available_gb=round(avail / 1e9, 3))
        if self.max_trace is not None and recording:
            est = self.trace_estimate(rss)
            if est > self.max_trace:
                return self._numbers("max_trace_mb", est / 1e6, self.max_trace / 1e6, rss)
        return None

    def estimate_now(self) -> float:
        """:meth:`trace_estimate` now, reading RSS only where the estimate grows with it (no glibc)."""
        return self.trace_estimate(self._proc.memory_info().rss if self.trace_basis == "rss" else 0)

    def trace_estimate(self, rss: int) -> float:
        """Estimated trace bytes of the open window: heap (else RSS) growth since it began recording."""
        return max(self._heap_or(rss) - self._heap0, 0) * self.trace_per_byte

    def _heap_or(self, rss: int) -> int:
        """What the trace estimate grows with: the C heap in use, or ``rss`` without glibc."""
        heap = heap_in_use() if self.trace_basis == "heap" else None
        return rss if heap is None else heap

    def _numbers(self, limit: str, measured: float, value: float, rss: int, **more: Any) -> dict[str, Any]:
        est = self.trace_estimate(rss)
        out = {"limit": limit, "measured": round(measured, 3), "limit_value": round(value, 3),
               "rss_gb": round(rss / 1e9, 3), "rss_at_open_gb": round(self._rss0 / 1e9, 3),
               "trace_estimate_mb": round(est / 1e6, 1), "trace_basis": self.trace_basis,
               "samples": self.samples, **more}
        if self.max_trace is not None and est > REFUSE_FACTOR * self.max_trace:
            out["exported"] = False
            out["reason"] = (f"estimated trace {est / 1e6:.1f} MB is over {REFUSE_FACTOR:g}x max_trace_mb="
                             f"{self.max_trace / 1e6:g}: not exported (exporting it would cost far more memory "
                             "and time than the budget allows)")
        return out


def finish_closed(backend: Any, first: int, last: int, numbers: dict[str, Any]) -> tuple[Any, Exception | None]:
    """``backend.finish`` for a window the guard closed after step ``last``: (its files, the export's error).

    Refused (``numbers["exported"]`` false), the window is ended without export; in its warm-up (``last <
    first``) nothing was recorded. An export that fails (``std::bad_alloc``, a full disk) is caught: ``numbers``
    gets ``exported: false`` and ``export_error``, so the caller writes the window's line before re-raising."""
    if last < first:
        numbers["exported"] = False
        numbers["reason"] = f"closed in its warm-up (after step {last}): nothing recorded yet"
    if numbers.get("exported") is False:
        return backend.finish(first, first - 1), None  # torch stops and drops its buffers; nothing is written
    try:
        return backend.finish(first, last), None
    except Exception as e:
        numbers["exported"] = False
        numbers["export_error"] = f"{type(e).__name__}: {e}"[:300]
        return WindowFiles(), e


def describe(numbers: dict[str, Any]) -> str:
    """The numbers of a crossed limit, in words, for the one warning."""
    what = {"max_host_memory_gb": ("process RSS", "GB", "above"),
            "min_available_memory_gb": ("host available memory", "GB", "below"),
            "max_trace_mb": ("estimated trace size", "MB", "above")}[numbers["limit"]]
    name, unit, side = what
    return (f"{name} {numbers['measured']:g} {unit} is {side} {numbers['limit']}={numbers['limit_value']:g} "
            f"(RSS {numbers['rss_gb']:g} GB, {numbers['rss_at_open_gb']:g} GB when the window opened; "
            f"trace estimate {numbers['trace_estimate_mb']:g} MB)"
            + (f"; {numbers['reason']}" if numbers.get("exported") is False and "reason" in numbers else ""))


class MemoryWatch:
    """The memory guard and the export budget (:mod:`.budget`) as one Profiler sees them: sampled at the step ends
    of an open window. Once a memory limit is crossed, the Profiler closes that window early through its normal path
    (with :attr:`numbers` in its manifest line), and no more windows open in this run; the export budget closes a
    window early the same way, but later windows still open. Use :meth:`from_config` (None when no limit is set
    and the budget is off: no cost)."""

    __slots__ = ("budget", "guard", "numbers", "tripped")

    def __init__(self, guard: MemoryGuard | None, budget: ExportBudget | None = None) -> None:
        self.guard: MemoryGuard | None = guard  # None once tripped: nothing more is sampled
        self.budget = budget  # checked in windows whose collective timeout is known
        self.tripped = False  # a limit was crossed earlier in this run: no more windows
        self.numbers: dict[str, Any] | None = None  # set while the guard closes a window (its manifest line's guard)

    @classmethod
    def from_config(cls, config: Any) -> MemoryWatch | None:
        guard = MemoryGuard.from_config(config)
        budget = ExportBudget.from_config(config, MemoryGuard)  # its estimator: a MemoryGuard without limits
        return None if guard is None and budget is None else cls(guard, budget)

    def opened(self, backend: Any = None, background: bool = False) -> None:
        """A window opened (after the backend's begin(): torch's own start-up memory is not the trace's) on
        ``backend``; ``background``: it will be written beside training when it runs to its end."""
        if self.guard is not None:
            self.guard.open()
        if self.budget is not None:
            self.budget.opened(backend, background)

    def last_step(self) -> dict[str, Any] | None:
        """The step that ends a window ended: always sampled, before its export (one step may have grown it a lot).
        Not the budget: the window closes here anyway."""
        return None if self.guard is None else self.guard.sample()

    def step_ended(self, w: Window, step: int) -> dict[str, Any] | None:
        """Step ``step - 1`` of open window ``w`` ended: the crossed limit, if a sample is due and one is."""
        guard, budget, crossed = self.guard, self.budget, None
        if guard is not None:
            crossed = guard.check(recording=step > w.start)
            if crossed is None and step == w.start:
                guard.rebase()  # the window's first recorded step begins
        if crossed is None and budget is not None and budget.active:
            crossed = budget.step_ended(step > w.start, step == w.start)
        return crossed

    def trip(self, who: str, w: Window, last: int, crossed: dict[str, Any]) -> str:
        """A limit was crossed at the end of step ``last``: warn once, keep the numbers for the manifest line of the
        window the Profiler now closes (it clears :attr:`numbers` after); a memory limit also ends sampling and
        capturing. Returns the line's ``stopped_by``."""
        self.numbers = {**crossed, "step": last}
        if crossed.get("limit") == BUDGET_LIMIT and self.budget is not None:
            self.budget.trip(who, w.start, w.end, last, crossed)
            return BUDGET_STOP
        kept = f"keeping steps {w.start}-{last}" if last >= w.start else "in its warm-up: nothing recorded yet"
        if crossed.get("exported") is False and last >= w.start:
            kept = f"dropping steps {w.start}-{last} unexported; its manifest line says why"
        logger.warning("distprof: %s: %s at step %d; closing window %d-%d early (%s) and capturing no more "
                       "windows in this run", who, describe(crossed), last, w.start, w.end, kept)
        self.tripped = True
        self.guard = self.budget = None
        return GUARD_STOP

    def finish(self, backend: Any, first: int, last: int) -> tuple[Any, Exception | None]:
        """``backend.finish`` of the window being closed: refused or guarded (:func:`finish_closed`) while the
        guard closes it, else as usual. (its files, the export's error)."""
        if self.numbers is None:
            return backend.finish(first, last), None
        return finish_closed(backend, first, last, self.numbers)
