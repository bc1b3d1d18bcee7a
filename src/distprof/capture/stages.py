"""Discrete mode (``discrete: true``, verl's): every outermost annotated stage of a planned step is its own window.

The Profiler hands its steps to :class:`Stages`: during a planned step the profiler listens to
:func:`~distprof.annotate` (it is "armed"), and the outermost range entered on a thread opens a window on the
profiler's backend, labelled with the stage and its run in the step (``rundir.layout.stage_label``); the range's
exit closes it through the Profiler's normal path (``Profiler._close``, with ``stage`` in the manifest line). A stage
still open when its step ends is closed with ``stopped_by: step_end``; one left by an exception, with the cause.
Ranges nested in a stage, on its thread, are part of its trace; ranges on other threads meanwhile open nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from distprof.capture import shutdown
from distprof.capture.annotate import refresh_emitters, window_closed, window_opened
from distprof.capture.owner import Owner
from distprof.config.plan import Window
from distprof.rundir.layout import stage_label

__all__ = ["Stages"]


class _Stage:
    """The stage window open now."""

    __slots__ = ("depth", "name", "thread")

    def __init__(self, name: str, thread: int) -> None:
        self.name, self.thread = name, thread
        self.depth = 1  # ranges open on its thread, itself included


class Stages:
    """The discrete-mode state of one Profiler: whether this step is planned (armed), the open stage, and how
    many times each stage ran in this step."""

    __slots__ = ("_prof", "armed", "runs", "stage")

    def __init__(self, prof: Owner) -> None:
        self._prof = prof
        self.armed = False  # this step is planned, so annotate() reports stages to the profiler
        self.stage: _Stage | None = None
        self.runs: dict[str, int] = {}  # stage name -> runs in the current step

    def arm(self) -> None:
        """Listen to annotate() during planned steps only; elsewhere the inert fast path stays inert."""
        p = self._prof
        w = p._plan.next_window(p.global_step)
        armed = w is not None and w.start <= p.global_step <= w.end
        if armed and not self.armed:
            window_opened(p)
        elif self.armed and not armed:
            window_closed(p)
        self.armed = armed
        self.runs = {}

    def step(self) -> None:
        """The Profiler's step() in discrete mode."""
        if self.stage is not None:  # a stage still open at the step's end: it ends with the step
            self.close(stopped_by="step_end")
        self._prof.global_step += 1
        self.arm()

    def enter(self, name: str) -> None:
        """annotate() entered ``name`` while armed: open its window if it is the outermost range."""
        tid = threading.get_ident()
        st = self.stage
        if st is not None:
            if st.thread == tid:
                st.depth += 1  # a range nested in the stage: part of its trace
            return
        p = self._prof
        g = p.global_step
        runs = self.runs[name] = self.runs.get(name, 0) + 1
        label = stage_label(name, runs)
        p._annotations = {}
        w = Window(start=g, end=g, warmup_start=g)
        self.stage = _Stage(name, tid)
        p._open = w
        p._window_t0 = time.time()
        p._backend.begin(w, g, p._context(label))
        refresh_emitters()  # the backend may have imported torch just now: the stage's own range must show

    def exit(self, name: str, exc_type: Any = None) -> None:
        st = self.stage
        if st is None or st.thread != threading.get_ident():
            return
        st.depth -= 1
        if st.depth == 0:  # a stage left by an exception (or SystemExit) is cut short: say why
            self.close(stopped_by=None if exc_type is None else shutdown.cause_of(exc_type))

    def close(self, stopped_by: str | None = None) -> None:
        st, self.stage = self.stage, None
        p = self._prof
        w = p._open
        if st is None or w is None:
            return
        p._close(w, last=w.end, stopped_by=stopped_by, stage=st.name)
        if self.armed:
            window_opened(p)  # _close() stopped the listening; the step goes on

    def stop(self, cause: str) -> None:
        """The Profiler stops: the open stage is cut short by ``cause``; stop listening."""
        if self.stage is not None:
            self.close(stopped_by=cause)
        if self.armed:
            window_closed(self._prof)
            self.armed = False
