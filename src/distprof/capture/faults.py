"""The one fault guard of the training side: the Profiler's state changes and the HF / Lightning glue use it.

A fault inside profiling code is logged once, with its traceback, then profiling is switched off for the rest of
the run (``on_error="disable"``, the default) or the exception is re-raised (``on_error="raise"``). Training code
never sees a profiler exception otherwise. Each user says what the fault is called in its log line (``describe``)
and how it switches off (``off``): the Profiler turns inert (:meth:`.Profiler._fault`), the Lightning profiler
stops its Profiler and arms no more stages.

A config that does not fit the job (``Profiler(...)`` raises ``ValueError``: a rank beyond the world size, an
unwritable ``save_path``) is no fault of the code: :func:`misfit` logs its message without a traceback (it says
what to fix) and profiling is off, or it is raised.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

__all__ = ["FaultGuard", "misfit"]


class FaultGuard:
    """Log once, switch off, or re-raise. ``describe(where)``: the error line; ``off(where)``: switch off (called
    after every fault, logged or not); ``log``: the caller's logger, so the line names its module. Picklable when
    ``describe`` and ``off`` are (bound methods of a picklable object are)."""

    __slots__ = ("_describe", "_log", "_off", "faulted", "on_error")

    def __init__(self, on_error: str, describe: Callable[[str], str], off: Callable[[str], None],
                 log: logging.Logger = logger) -> None:
        self.on_error = on_error
        self.faulted = False  # a fault was logged: later ones are not
        self._describe = describe
        self._off = off
        self._log = log

    def call(self, where: str, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; on a fault: None (switched off), or the exception re-raised with ``on_error="raise"``."""
        try:
            return fn(*args)
        except Exception:
            if self.fault(where):
                raise
            return None

    def fault(self, where: str) -> bool:
        """Handle the exception being handled (call it in an ``except`` block): log it once with its traceback,
        switch off; True when the caller must re-raise it."""
        if not self.faulted:
            self.faulted = True
            self._log.error(self._describe(where), exc_info=True)
        self._off(where)
        return self.on_error == "raise"


def misfit(on_error: str, error: ValueError, log: logging.Logger = logger) -> bool:
    """A config that does not fit this job (``error`` from ``Profiler(...)``): True when the caller must re-raise
    it (``on_error="raise"``), else its message is logged (no traceback) and profiling is off for this run."""
    if on_error == "raise":
        return True
    log.error("distprof: profiling is off for this run: %s", error)
    return False
