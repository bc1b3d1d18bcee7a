"""The settings of always-on step telemetry and of the watcher that reads it (``telemetry: true``,
``detect: true``): ``ProfilerConfig.telemetry_options`` and ``ProfilerConfig.detection``.

Telemetry (:mod:`distprof.capture.telemetry`) keeps, per rank and step, the step's wall time and the time in each
outermost ``annotate`` range, without torch.profiler, and appends it to a small per-rank stream in the run
directory. The watcher (:mod:`distprof.analysis.watch`) reads every rank's stream and applies the rules below;
their thresholds are these fields, documented once here and in docs/telemetry.md.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from distprof.config.validation import StrictModel

__all__ = ["WAIT_WORDS", "DetectOptions", "TelemetryOptions"]

# Words in a phase's name that say it holds a collective (all_reduce, gloo or NCCL, a barrier): waiting time.
WAIT_WORDS = ("allreduce", "all_reduce", "allgather", "all_gather", "reduce_scatter", "alltoall", "all_to_all",
              "barrier", "collective", "comm", "sync", "wait", "nccl", "gloo")


def _within(field: str, v: float, lo: float, hi: float, fix: str) -> float:
    if not lo <= v <= hi:
        raise ValueError(f"{field} is {v!r}; it must be between {lo:g} and {hi:g}; {fix}")
    return v


class TelemetryOptions(StrictModel):
    """Always-on step telemetry (``telemetry: true``): how often the stream is written and how big it may grow."""

    flush_s: float = 1.0
    """Seconds between writes of the buffered steps to the stream (0.05 to 300): what a kill -9 can lose at most."""
    max_mb: float = 64.0
    """Bound on one rank's stream on disk (MB = 1e6 bytes, 0.01 to 100,000): the stream rotates at half of it and
    keeps one older segment, so the newest steps are always there."""
    buffer_steps: int = 100_000
    """Steps held in memory between writes (1,000 to 10,000,000); when the filesystem stalls, the oldest are
    dropped, never the job's memory."""

    @field_validator("flush_s")
    @classmethod
    def _flush(cls, v: float) -> float:
        return _within("telemetry_options.flush_s", v, 0.05, 300, "e.g. flush_s: 1")

    @field_validator("max_mb")
    @classmethod
    def _max(cls, v: float) -> float:
        return _within("telemetry_options.max_mb", v, 0.01, 100_000, "e.g. max_mb: 64")

    @field_validator("buffer_steps")
    @classmethod
    def _buffer(cls, v: int) -> int:
        return int(_within("telemetry_options.buffer_steps", v, 1000, 10_000_000, "e.g. buffer_steps: 100000"))


class DetectOptions(StrictModel):
    """The watcher's rules and limits (``detect: true``; ``distprof watch RUN_DIR`` reads the same fields from
    the run's config). A rule fires once per episode: it is armed again after the condition clears."""

    slow_factor: float = 1.25
    """Rule ``slow_rank``: a rank whose step time, or time in one outermost ``annotate`` phase, stays above
    slow_factor x the median over the role's ranks (1.01 to 100)."""
    slow_steps: int = 5
    """How many consecutive steps a rule's condition must hold before it fires (1 to 10,000)."""
    wait_phases: list[str] = Field(default_factory=lambda: list(WAIT_WORDS))
    """Phases whose name contains one of these (case-insensitive) hold a collective: a rank long in one is waiting
    for a slower peer, not slow itself, so ``slow_rank`` never names it (the waiting rank and the slow one look
    alike in phase times alone). [] judges every phase."""
    min_phase_ms: float = 1.0
    """Phases and steps shorter than this (ms) never count as slow: noise, not a straggler (0 to 1e6)."""
    min_share: float = 0.1
    """``slow_rank`` counts a phase (or step) only when its excess over the median rank's is at least this share
    of the role's median step time (0 to 1): a 0.5 ms phase taking 2 ms on a busy host is 4x, and no straggler."""
    slowdown_factor: float = 1.3
    """Rule ``slowdown``: the role's median step time rose above slowdown_factor x its own baseline (1.01 to
    100)."""
    baseline_steps: int = 50
    """Steps in the baseline of ``slowdown`` and ``bounding_role`` (the steps before the ones judged; 5 to
    100,000)."""
    capture: bool = True
    """On a detection, request a capture of the named rank(s) and one healthy peer (needs ``trigger: true`` in
    the job); false only reports."""
    capture_steps: int = 2
    """Steps each detection's capture records (1 to 100)."""
    lead_steps: int = 3
    """Steps between the detection and the capture's first step (the ranks must see the request; 1 to 1,000)."""
    max_captures_per_hour: int = 4
    """At most this many detection captures per rolling hour (0 to 1,000; 0 = report only)."""
    max_capture_mb: float = 2000.0
    """Stop requesting captures once the traces detections caused add up to this (MB on disk, 0 to 1e7)."""
    poll_s: float = 2.0
    """Seconds between the watcher's reads of the streams (0.05 to 3600)."""
    prometheus_port: int | None = None
    """Serve the live numbers as Prometheus text on 127.0.0.1:PORT/metrics (1 to 65535; 0 = any free port);
    null = off."""

    @field_validator("slow_factor", "slowdown_factor")
    @classmethod
    def _factor(cls, v: float, info: Any) -> float:
        return _within(f"detection.{info.field_name}", v, 1.01, 100, "e.g. 1.25 (25% slower)")

    @field_validator("slow_steps", "baseline_steps", "capture_steps", "lead_steps", "max_captures_per_hour")
    @classmethod
    def _counts(cls, v: int, info: Any) -> int:
        lo, hi = {"slow_steps": (1, 10_000), "baseline_steps": (5, 100_000), "capture_steps": (1, 100),
                  "lead_steps": (1, 1000), "max_captures_per_hour": (0, 1000)}[info.field_name]
        return int(_within(f"detection.{info.field_name}", v, lo, hi, f"use a whole number from {lo} to {hi}"))

    @field_validator("min_phase_ms", "min_share", "max_capture_mb", "poll_s")
    @classmethod
    def _positive(cls, v: float, info: Any) -> float:
        lo, hi = {"min_phase_ms": (0, 1e6), "min_share": (0, 1), "max_capture_mb": (0, 1e7),
                  "poll_s": (0.05, 3600)}[info.field_name]
        return _within(f"detection.{info.field_name}", v, lo, hi, f"use a number from {lo:g} to {hi:g}")

    @field_validator("wait_phases", mode="before")
    @classmethod
    def _words(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)) or not all(isinstance(w, str) and w.strip() for w in v) or len(v) > 256:
            raise ValueError(f"detection.wait_phases must be a list of at most 256 non-empty words, got {v!r:.80}; "
                             "e.g. [allreduce, sync]")
        return [w.strip().lower() for w in v]

    @field_validator("prometheus_port")
    @classmethod
    def _port(cls, v: int | None) -> int | None:
        if v is None:
            return None
        return int(_within("detection.prometheus_port", v, 0, 65535, "use a free port such as 9464, 0 for any, "
                           "or null to turn the endpoint off"))
