"""The export budget: a window is closed before its closing would hold the training thread too long.

Closing a torch.profiler window holds the training thread, and with ``ranks: [0]`` every other rank waits that
long in its next collective; past the job's collective timeout (NCCL's watchdog, gloo's timeout) the job dies
(Megatron-LM PR 3273, NeMo-RL issue 3517). At each step end of an open window the budget estimates what closing
it now would cost the training thread: the window's trace size as the memory guard estimates it (C heap growth x
``TRACE_BYTES_PER_HEAP_BYTE``, :class:`~.guard.MemoryGuard`; no second estimator) times
:data:`SECONDS_PER_TRACE_BYTE` for the way this window will be written. When that is over ``max_export_share`` x
the collective timeout, the window is closed at once (shortened: it keeps the steps it recorded) through the
memory guard's early-close path; its manifest line says ``stopped_by: export_budget`` and ``guard: {the
numbers}``, and one warning per profiler gives the numbers (later ones are logged at info level).

Unlike a memory limit, the budget does not stop profiling: the next windows open as planned and each is checked
again (shortened where it must be), since a shorter window is all it takes to keep the job safe.

The collective timeout is read when a window opens: the default process group's, when ``torch.distributed`` is
imported and initialized (the smallest of its backends' timeouts: gloo's and NCCL's can differ), else
``collective_timeout_s`` from the config, else unknown, and then this window is not checked. torch is never
imported here: a process that did not import ``torch.distributed`` has no process group.

What it can promise: it looks at step ends (after the window's first recorded step, at most every
:data:`INTERVAL_S`; the step that ends a window is closed anyway), so one step can grow the window past the budget
before it is seen; such a window is still written, except an inline one whose estimate is over the whole timeout:
its buffers are dropped unexported (``guard.exported: false``, as the memory guard refuses a window), because
writing it would cost the job more than any trace is worth.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from distprof.rundir.manifest import EXPORT_BUDGET

logger = logging.getLogger(__name__)

__all__ = ["BUDGET_LIMIT", "BUDGET_STOP", "INTERVAL_S", "SECONDS_PER_TRACE_BYTE", "ExportBudget",
           "collective_timeout_s"]

BUDGET_STOP = EXPORT_BUDGET  # the manifest's stopped_by for a window the budget shortened
BUDGET_LIMIT = "max_export_share"  # the ``limit`` of its numbers (the memory guard's name its own limits)
INTERVAL_S = 0.01  # the heap is read at most every 10 ms (glibc mallinfo2: about 1.4 µs a call)

# Seconds the training thread spends closing a window, per byte of its estimated trace (the memory guard's
# estimate, read just before the closing step), measured with torch 2.13 CPU / glibc 2.36 on a 2-core VM shared
# with other work: `python benchmarks/bench_closing_cost.py`, two runs (windows of 1, 3 and 5 steps of 1,000 small
# ops with stacks, shapes and memory: estimates of 8.7-43.7 MB, traces of 8.3-41.7 MB of JSON). background (the
# default): torch's stop(), freeing its results and forking the writing child, 27-47 ns per estimated byte (0.4 s
# for 8.7 MB, 1.1-1.4 s for 43.7 MB); inline: the whole export (JSON, gzip check, op summary, publication),
# 198-266 ns (1.9-2.1 s for 8.7 MB, 10.5-11.7 s for 43.7 MB). Above the tops of those ranges, so the estimate errs
# high (as the trace estimate does): the budget closes a window early, not late.
SECONDS_PER_TRACE_BYTE = {"background": 50e-9, "inline": 300e-9}


def collective_timeout_s() -> float | None:
    """The default process group's collective timeout in seconds, or None where there is none to read (torch
    not imported, no process group, or an API this torch lacks). The smallest of its backends' (``cpu:gloo,
    cuda:nccl`` has two): the first collective to time out ends the job."""
    dist = sys.modules.get("torch.distributed")
    torch = sys.modules.get("torch")
    if dist is None or torch is None:
        return None
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return None
        c10d = dist.distributed_c10d
        pg = c10d._get_default_group()
        # Each device type's backend (torch 2.13: gloo's for cpu and cuda tensors, or gloo's and NCCL's); their
        # options hold the timeout in force (torch's _set_pg_timeout updates it).
        devices = getattr(pg, "_device_types", None) or [torch.device("cpu"), torch.device("cuda")]
        found = []
        for device in devices:
            try:
                timeout = pg._get_backend(device).options._timeout
            except Exception:  # no backend for this device type in this group
                continue
            found.append(timeout.total_seconds())
        older = getattr(getattr(pg, "options", None), "_timeout", None)  # torch before backends per device
        if older is not None:
            found.append(older.total_seconds())
        found = [t for t in found if t > 0]
        return min(found) if found else None
    except Exception:  # a private API that moved: the timeout is unknown, the check is off
        logger.debug("distprof: the process group's timeout could not be read", exc_info=True)
        return None


class ExportBudget:
    """One profiler's export budget (``max_export_share``); :meth:`from_config` gives None when it is off.

    ``estimator``: makes the trace estimator (a limit-less :class:`~.guard.MemoryGuard`), on the first window
    whose timeout is known."""

    __slots__ = ("_due", "_estimator", "_make_estimator", "active", "override_s", "share", "source", "timeout_s",
                 "warned", "way")

    def __init__(self, share: float, override_s: float | None, estimator: Callable[[], Any]) -> None:
        self.share = share
        self.override_s = override_s
        self._make_estimator = estimator
        self._estimator: Any = None
        self.active = False  # the open window is checked (its timeout is known)
        self.timeout_s: float | None = None
        self.source: str | None = None  # where timeout_s came from: process_group or collective_timeout_s
        self.way = "background"  # how the open window will be written: background or inline
        self.warned = False
        self._due = 0.0

    @classmethod
    def from_config(cls, config: Any, estimator: Callable[[], Any]) -> ExportBudget | None:
        """The budget of a torch-backend config with ``max_export_share`` set; else None (no cost at all)."""
        if config.max_export_share is None or config.backend != "torch":
            return None
        return cls(config.max_export_share, config.collective_timeout_s, estimator)

    def opened(self, backend: Any, background: bool) -> None:
        """A window opened on ``backend`` (written in the background or not): read the collective timeout; the
        window is checked only when it is known and the backend is torch's (a request may bring another)."""
        timeout, source = collective_timeout_s(), "process_group"
        if timeout is None and self.override_s is not None:
            timeout, source = self.override_s, "collective_timeout_s"
        self.active = timeout is not None and getattr(backend, "name", None) == "torch"
        self.timeout_s, self.source = (timeout, source) if self.active else (None, None)
        self.way = "background" if background else "inline"
        if self.active:
            if self._estimator is None:
                self._estimator = self._make_estimator()
            self._estimator.open()
            self._due = 0.0

    def step_ended(self, recorded: bool, first: bool) -> dict[str, Any] | None:
        """A step of the open (active) window ended; ``recorded``: it was recorded; ``first``: the window's first
        recorded step begins. The numbers when closing now would cost more than the budget, else None."""
        est = self._estimator
        if first:
            est.rebase()  # the trace counts from the first recorded step, as the memory guard's
        if not recorded:
            return None
        now = time.monotonic()
        if now < self._due:
            return None
        self._due = now + INTERVAL_S
        trace = est.estimate_now()
        per_byte = SECONDS_PER_TRACE_BYTE[self.way]
        seconds, timeout = trace * per_byte, float(self.timeout_s or 0.0)
        allowed = self.share * timeout
        if seconds <= allowed:
            return None
        out: dict[str, Any] = {
            "limit": BUDGET_LIMIT, "measured": round(seconds, 3), "limit_value": round(allowed, 3),
            "trace_estimate_mb": round(trace / 1e6, 1), "trace_basis": est.trace_basis, "export": self.way,
            "seconds_per_mb": round(per_byte * 1e6, 6), "collective_timeout_s": round(timeout, 3),
            "timeout_source": self.source, "max_export_share": self.share}
        if self.way == "inline" and seconds > timeout:
            out["exported"] = False
            out["reason"] = (f"closing estimated {seconds:.1f} s, over the whole collective timeout {timeout:g} s: "
                             "not exported (writing it would stall the other ranks past their timeout)")
        return out

    def trip(self, who: str, first: int, end: int, last: int, numbers: dict[str, Any]) -> None:
        """The window ``first``-``end`` closes after step ``last`` because of ``numbers``: say so, with the
        numbers (a warning the first time, info after); later windows are checked again."""
        kept = (f"dropping steps {first}-{last} unexported" if numbers.get("exported") is False
                else f"keeping steps {first}-{last}")
        log = logger.info if self.warned else logger.warning
        self.warned = True
        log("distprof: %s: closing window %d-%d after step %d would hold the training thread an estimated %g s "
            "(trace estimate %g MB x %g s/MB, %s export), over max_export_share=%g of the collective timeout %g s "
            "(%s) = %g s; closing it now (%s). Later windows open as planned, each checked again%s",
            who, first, end, last, numbers["measured"], numbers["trace_estimate_mb"], numbers["seconds_per_mb"],
            numbers["export"], self.share, numbers["collective_timeout_s"], numbers["timeout_source"],
            numbers["limit_value"], kept, "" if log is logger.info else " (this warning is not repeated)")
