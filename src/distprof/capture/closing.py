"""Closing a window: end the backend's capture, then publish the window's files and its manifest line.

The Profiler's state machine decides *when* a window closes; this module does the closing. A window that ran to
its planned end at a step boundary (not cut short, not a trigger's, not closed by the memory guard, not a
discrete stage, not closed by ``stop()`` or the process's exit), or one the export budget shortened
(:mod:`.budget`), on a backend that can hand its writing over (the torch backend's ``detach``) is closed in two
parts when ``torch.background_export`` is on: the closing step ends torch's tracing and builds the manifest line,
and the :class:`~.exporter.Exporter` writes and publishes it beside training. Every other window is written in
the call that closes it, as a window cut short by ``stop()`` or a crash must be: the process may end next.

``export_s`` in the manifest line is what the closing took from the training thread: for a window written in the
background, the closing step's own part.
"""

from __future__ import annotations

import os
import time
from typing import Any

from distprof.capture import shutdown
from distprof.capture.annotate import window_closed
from distprof.capture.budget import BUDGET_STOP
from distprof.config.plan import Window
from distprof.rundir.publish import publish
from distprof.util import logs
from distprof.util.runtime import host_name, torch_version

__all__ = ["close", "in_background"]


def close(p: Any, w: Window, last: int, t1: float | None = None, stopped_by: str | None = None,
          stage: str | None = None, t0: float | None = None, spent: float = 0.0) -> None:
    """Close window ``w`` of Profiler ``p`` after step ``last`` (see ``Profiler._close``)."""
    t0 = time.perf_counter() if t0 is None else t0
    p._open = None
    window_closed(p)
    t1 = time.time() if t1 is None else t1
    od, mem, backend = p._ondemand, p._memory, p._backend
    requested = None if od is None else od.closing()  # (request, the plan's backend)
    numbers = None if mem is None else mem.numbers  # set while the memory guard (or the export budget) closes it
    result = write = failed = None
    try:
        if requested is None and stage is None and _writes_later(p, backend, stopped_by, numbers):
            write = backend.detach(w.start, last, fork=True)  # torch stops tracing here, on the training thread
        elif mem is None:
            result = backend.finish(w.start, last)
        else:
            result, failed = mem.finish(backend, w.start, last)
    finally:
        if requested is not None:
            p._backend = requested[1]
    stopped_by = shutdown.held(stopped_by)  # a signal came during the export: it is what ends the process
    fields = dict(
        role=p.role, rank=p.rank, world_size=p.world_size,
        steps=[w.start, last] if last >= w.start else [w.start, w.end],  # in warm-up: the planned steps
        complete=stopped_by is None and last >= w.end, stopped_by=stopped_by,
        start_time=p._window_t0, end_time=t1,
        host=host_name(), pid=os.getpid(), torch=torch_version(),
        backend=requested[0].backend if requested is not None else p.config.backend,
        stage=stage, annotations=p.annotation_times(), **p._clock.record(), guard=numbers,
        trigger=requested[0].id if requested is not None else None,
    )
    if write is not None:
        fields["export_s"] = round(time.perf_counter() - t0 + spent, 6)  # what the closing step held
        p._exporter.submit(lambda: _publish(p, w, last, write(), fields, None, None, None))
    elif result is not None:
        _publish(p, w, last, result, fields, requested, numbers, t0 - spent)
    p._clock.closed(last)
    p._next = _next_window(p, w, stopped_by, requested)
    p._plan_timing()
    if failed is not None:
        raise failed  # recorded above; now the usual fault path (logged, profiling off)


def _writes_later(p: Any, backend: Any, stopped_by: str | None, numbers: dict[str, Any] | None) -> bool:
    """The window being closed (neither requested nor a stage) is written in the background: it ran to its end, or
    the export budget shortened it (written as it would have been at its end: its estimate assumed so)."""
    budget = stopped_by == BUDGET_STOP and numbers is not None and numbers.get("exported") is not False
    return ((budget or (numbers is None and stopped_by is None)) and not p._stopping
            and in_background(p, backend))


def _next_window(p: Any, w: Window, stopped_by: str | None, requested: Any) -> Window | None:
    """The window to open next, after ``w`` closed: none after a memory limit; after a window the export budget
    shortened, the plan's next one (not the rest of ``w``)."""
    mem = p._memory
    if mem is not None and mem.tripped:
        return None
    after = w.end + 1 if stopped_by == BUDGET_STOP and requested is None else p.global_step
    return p._plan.next_window(max(p.global_step, after))


def in_background(p: Any, backend: Any) -> bool:
    """A window of Profiler ``p`` on ``backend`` that runs to its end is written in the background (requested
    windows and backends that cannot hand their writing over are written in the closing call)."""
    od = p._ondemand
    return (p.config.torch.background_export and hasattr(backend, "detach")
            and (od is None or od.open_trigger is None))


def _publish(p: Any, w: Window, last: int, result: Any, fields: dict[str, Any], requested: Any,
             numbers: dict[str, Any] | None, t0: float | None) -> None:
    """Publish ``result``'s files with their manifest line (``fields`` and the summary); count the window."""
    od = p._ondemand
    p._last_summary = result.summary
    staged = [(tmp, name) for name, tmp in sorted(result.files.items())]
    if staged or (numbers is not None and requested is None):  # every window the guard closed gets its line
        fields["summary"] = result.short_summary()
        # A requested window is acknowledged once its files are where they stay (from the upload thread).
        done = None if requested is None or od is None else od.uploaded(requested[0], fields["stopped_by"])
        publish(p._run, p._dir, staged, fields, p._who(), done, t0=t0)
        if staged:
            p._windows_closed += 1
            logs.announce_where(p._who(), p._run.url(p._dir), p._run.save_path if p._run.remote else p._run.root)
    elif requested is not None and od is not None:
        od.unrecorded(requested[0], w, last, fields["stopped_by"], numbers)
