"""The backend protocol: what a Profiler asks of a capture tool for one window."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from distprof.config.plan import Window


@dataclass
class WindowContext:
    """What a backend needs to know about where and who it captures."""

    role: str
    rank: int
    world_size: int
    tmp_path: Any  # callable(name) -> a hidden local temporary path for a file called `name`
    label: str | None = None  # discrete mode: the stage's file-name label (output.stage_label)
    # callable(tmp, name, steps, stopped_by): publish a file now, outside the window's close, with its own manifest
    # line (``complete: false``): what a backend writes on the spot because the process may not survive (an OOM).
    publish_now: Any = None


@dataclass
class WindowFiles:
    """The outcome of a closed window: temporary files to publish (final name -> temp path)."""

    files: dict[str, str] = field(default_factory=dict)
    summary: dict[str, Any] | None = None

    def short_summary(self, top: int = 10) -> dict[str, Any] | None:
        """The summary as the window's manifest line keeps it: the totals and the ``top`` ops."""
        s = self.summary
        if not s:
            return None
        return {
            **({"activities": s["activities"]} if "activities" in s else {}),  # what "auto" became here
            "device_busy_us": s["device_busy_us"],
            "self_device_us": s["self_device_us"],
            "self_cpu_us": s["self_cpu_us"],
            "top": s["ops"][:top],
        }


class Backend(Protocol):
    name: str

    def begin(self, window: Window, step: int, ctx: WindowContext) -> None:
        """Start capturing for ``window``; ``step`` is the global step about to run (warm-up or first recorded)."""

    def advance(self, step: int) -> None:
        """The step before ``step`` ended, inside the open window."""

    def finish(self, first: int, last: int) -> WindowFiles:
        """End the window after global steps ``first..last`` were recorded (last < first: nothing recorded)."""

    def abort(self) -> None:
        """Best-effort teardown after a fault; must never raise."""


class NullBackend:
    """Captures nothing itself: the process is profiled from outside (py-spy, memray, rocprof-sys, nsys)."""

    name = "null"

    def begin(self, window: Window, step: int, ctx: WindowContext) -> None:
        pass

    def advance(self, step: int) -> None:
        pass

    def finish(self, first: int, last: int) -> WindowFiles:
        return WindowFiles()

    def abort(self) -> None:
        pass
