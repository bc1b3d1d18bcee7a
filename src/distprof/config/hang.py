"""The settings of hang evidence (``hang: {enabled: true, timeout_s: N}``): ``ProfilerConfig.hang``.

With ``enabled``, every rank of every role (profiled or not) records its collective history and runs a watchdog
(:mod:`distprof.capture.hang`); a rank that sees no step progress for ``timeout_s`` writes its evidence into the
run directory, which ``distprof hang RUN_DIR`` reads (docs/hang.md). Off by default, and free when off: no thread,
no wrapper, nothing imported.
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator

from distprof.config.validation import StrictModel

__all__ = ["HangOptions"]


class HangOptions(StrictModel):
    """Hang evidence (``hang: {enabled: true, timeout_s: 600}``; ``hang: true`` is ``{enabled: true}``)."""

    enabled: bool = False
    """Record every rank's collective history and watch its step progress; needs save_path (a local or mounted
    directory every rank can write)."""
    timeout_s: float = 600.0
    """Seconds without a step ending before a rank writes its hang evidence (1 to 604,800). Set it below the
    collective timeout (gloo / NCCL ``timeout``, default 30 min), so the evidence is written before the job is
    killed, and above the slowest step (a slow rank that still ends steps is never called hung)."""
    flight_recorder: bool = True
    """Dump torch's Flight Recorder (its ring buffer of each process group's collectives) into the evidence when
    the installed torch has it; false: distprof's own record only."""
    c_watchdog: bool = True
    """Also arm Python's faulthandler C watchdog, which writes every thread's stack to ``hang-stacks.txt`` even
    when the training thread is stuck in C code holding the GIL (where no Python thread can run)."""
    history: int = 32
    """Collectives kept per process group in the evidence (most recent; 1 to 10,000)."""

    @field_validator("enabled", mode="before")
    @classmethod
    def _enabled(cls, v: Any) -> Any:
        if not isinstance(v, bool):
            raise ValueError(f"hang.enabled is {v!r:.80}; it must be true or false; e.g. hang: {{enabled: true}}")
        return v

    @field_validator("timeout_s")
    @classmethod
    def _timeout(cls, v: float) -> float:
        if not 1 <= v <= 604_800:
            raise ValueError(f"hang.timeout_s is {v!r}; it must be between 1 and 604800 seconds; e.g. timeout_s: "
                             "600 (below the collective timeout, above the slowest step)")
        return v

    @field_validator("history")
    @classmethod
    def _history(cls, v: int) -> int:
        if not 1 <= v <= 10_000:
            raise ValueError(f"hang.history is {v!r}; it must be a whole number from 1 to 10000; e.g. history: 32")
        return v

    @property
    def tick_s(self) -> float:
        """How often the watchdog thread looks at the step count: a quarter of the timeout, at most 5 s."""
        return min(self.timeout_s / 4, 5.0)
