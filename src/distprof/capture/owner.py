"""What a Profiler's collaborators (:mod:`.ondemand`, :mod:`.stages`) see of the Profiler that owns them.

A Protocol rather than the class, so the collaborators import nothing of ``profiler.py`` (which imports them):
the Profiler is checked against it where it hands itself over (``Stages(self)``, ``OnDemand(self, ...)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from distprof.capture.backends.base import WindowContext
from distprof.capture.guard import MemoryWatch
from distprof.capture.steptime import StepClock
from distprof.config.model import ProfilerConfig
from distprof.config.plan import Plan, Window
from distprof.rundir.store import RunDir

__all__ = ["Owner"]


class Owner(Protocol):
    role: str
    rank: int
    world_size: int
    global_step: int
    config: ProfilerConfig
    _plan: Plan
    _run: RunDir
    _dir: str
    _open: Window | None  # the window being captured
    _backend: Any
    _window_t0: float
    _annotations: dict[str, list[int]]
    _clock: StepClock
    _memory: MemoryWatch | None

    def _who(self) -> str: ...

    def _guard(self, where: str, fn: Callable[[], Any]) -> None: ...

    def _use_full_step(self, if_idle: bool = False) -> None: ...

    def _context(self, label: str | None = None) -> WindowContext: ...

    def _begin_window(self, w: Window, backend: Any) -> None: ...

    def _close(self, w: Window, last: int, t1: float | None = None, stopped_by: str | None = None,
               stage: str | None = None, t0: float | None = None, spent: float = 0.0) -> None: ...
