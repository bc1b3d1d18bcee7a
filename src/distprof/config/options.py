"""The option sections of a profiler config: the schedule, torch.profiler's flags, the CUDA memory snapshot and
the process-wrapping tools (nsys, rocprof-sys, py-spy, memray). ``ProfilerConfig`` (:mod:`.model`) holds one of
each; the capture backends read them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from distprof.config.errors import show
from distprof.config.names import ACTIVITIES, AUTO_ACTIVITIES
from distprof.config.plan import Schedule
from distprof.config.validation import StrictModel, non_negative_int

__all__ = ["DEFAULT_SCHEDULE", "CudaMemoryOptions", "MemrayOptions", "NsysOptions", "ProcessOptions",
           "PySpyOptions", "RocprofSysOptions", "ScheduleConfig", "TorchOptions"]


class ScheduleConfig(StrictModel):
    """torch.profiler.schedule's fields, applied to global step numbers."""

    skip_first: int = 0
    """Global steps before the first cycle starts (torch.profiler's skip_first, counted in global step numbers)."""
    wait: int = 0
    """Steps at the start of each cycle that are neither warmed up nor recorded."""
    warmup: int = 1
    """Steps each cycle traces but throws away before recording (torch.profiler's warm-up)."""
    active: int = 1
    """Steps each cycle records, as one window (at least 1)."""
    repeat: int = 1
    """Cycles to run; 0 means forever."""

    @field_validator("skip_first", "wait", "warmup", "active", "repeat", mode="before")
    @classmethod
    def _whole(cls, v: Any, info: ValidationInfo) -> int:
        fix = "use an integer >= 0 (repeat=0 means forever)"
        if v is None:
            raise ValueError(f"schedule.{info.field_name} must be an integer, got null; {fix}")
        return non_negative_int(f"schedule.{info.field_name}", v, fix)

    @field_validator("active")
    @classmethod
    def _active(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"schedule.active must be >= 1, got {v}; a window has to record at least one step")
        return v

    def to_plan(self) -> Schedule:
        return Schedule(**self.model_dump())


class TorchOptions(StrictModel):
    """torch.profiler's capture surface. Every memory-amplifying flag is off by default."""

    activities: list[str] = Field(default_factory=lambda: [AUTO_ACTIVITIES])
    """What torch.profiler records: ``[auto]`` (default) is cpu plus the accelerator present (CUDA, ROCm, XPU),
    found when a window opens and silent on a CPU-only machine; or a list of ``cpu``, ``cuda``, ``xpu`` (one
    named but missing logs one warning and is skipped)."""
    record_shapes: bool = False
    """Record operator input shapes (torch.profiler's record_shapes; grows memory and trace size)."""
    profile_memory: bool = False
    """Record tensor allocations and frees (torch.profiler's profile_memory; grows memory and trace size)."""
    with_stack: bool = False
    """Record Python source locations of ops (torch.profiler's with_stack; needed by export_stacks)."""
    with_flops: bool = False
    """Estimate FLOPs of matrix multiplications and convolutions (torch.profiler's with_flops)."""
    with_modules: bool = False
    """Record the nn.Module hierarchy of ops (torch.profiler's with_modules)."""
    gzip: bool = True
    """Write traces gzipped (``.pt.trace.json.gz``); false writes plain ``.pt.trace.json``."""
    export_chrome_trace: bool = True
    """Write each window's Chrome/Kineto trace (the file the analysis verbs read)."""
    export_stacks: bool = False
    """Also write a stacks file per window (flame-graph input); needs with_stack."""
    stacks_metric: Literal["self_cpu_time_total", "self_cuda_time_total"] = "self_cpu_time_total"
    """The metric export_stacks weighs stacks by: self_cpu_time_total or self_cuda_time_total."""
    summary_top: int = 20
    """How many ops the window's short summary keeps (at least 1)."""
    background_export: bool = True
    """Write a window's files beside training: the step that closes a window only stops torch's tracing and forks
    a child process that writes them (torch's JSON writer holds the GIL), a thread waits for it and publishes; the
    next window waits for it, stop() and the process's end too. false writes them inside the closing step
    (docs/capture.md, "The closing step")."""
    post_processing_timeout_s: float | None = None
    """Seconds torch may spend post-processing a trace, passed on only where the installed torch accepts it;
    null = torch's default."""

    @field_validator("summary_top")
    @classmethod
    def _top(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"torch.summary_top must be >= 1, got {v}; it is how many ops summary() keeps")
        return v

    @field_validator("post_processing_timeout_s")
    @classmethod
    def _pp_timeout(cls, v: float | None) -> float | None:
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ValueError(f"torch.post_processing_timeout_s must be a finite number of seconds > 0, got {v}")
        return v

    @field_validator("activities", mode="before")
    @classmethod
    def _activities(cls, v: Any) -> list[str]:
        fix = f"list one or more of {', '.join(ACTIVITIES)}, or 'auto' (cpu + the accelerator present)"
        if v is None:
            raise ValueError(f"torch.activities must be a list, got null; {fix}")
        if isinstance(v, str):
            v = [p for p in re.split(r"[,\s]+", v) if p]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"torch.activities must be a non-empty list, got {show(v)}; {fix}")
        out = []
        for a in v:
            name = a.strip().lower() if isinstance(a, str) else None
            if name not in (*ACTIVITIES, AUTO_ACTIVITIES):
                raise ValueError(f"torch.activities has unknown activity {show(a)}; {fix}")
            if name not in out:
                out.append(name)
        if AUTO_ACTIVITIES in out and len(out) > 1:
            raise ValueError(f"torch.activities {show(v)} mixes 'auto' with named activities; 'auto' already means "
                             "cpu + the accelerator present: give 'auto' alone, or name every activity")
        return out

    @model_validator(mode="after")
    def _exports(self) -> TorchOptions:
        if self.export_stacks and not self.with_stack:
            raise ValueError(
                "torch.export_stacks=True needs torch.with_stack=True (stacks are only recorded with it); "
                "set with_stack: true or drop export_stacks"
            )
        if not (self.export_chrome_trace or self.export_stacks):
            raise ValueError(
                "torch.export_chrome_trace=False with export_stacks=False would write nothing; enable one of them"
            )
        return self


_OPTION_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class ProcessOptions(StrictModel):
    """A process-wrapping tool's command line, rendered as RLinf does.

    ``options`` with one-letter keys render as ``-k v``, longer keys as ``--key=v``; ``flags``
    render as bare ``--flag`` (``-f`` for one letter); ``env`` is added to the wrapped worker's
    environment. Options are passed through to the tool untouched after validation.
    """

    executable: str | None = None
    """The tool's command or path; null = the backend's default (nsys, rocprof-sys-python, py-spy; memray runs
    as ``python -m memray``)."""
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    """The tool's options: a one-letter key renders as ``-k v``, a longer one as ``--key=v``."""
    flags: list[str] = Field(default_factory=list)
    """The tool's bare switches, rendered as ``--flag`` (``-f`` for one letter)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Variables added to the wrapped worker's environment."""
    finalize_timeout_s: float = 120.0
    """Seconds ``collect()`` waits for this tool's outputs still being written."""

    @field_validator("finalize_timeout_s")
    @classmethod
    def _timeout(cls, v: float) -> float:
        if not (math.isfinite(v) and v > 0):
            raise ValueError(f"finalize_timeout_s must be a finite number of seconds > 0, got {v}")
        return v

    @field_validator("executable")
    @classmethod
    def _executable(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or not v.isprintable()):
            raise ValueError(f"executable {v!r} must be a command name or path, without control characters")
        return v

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError(f"options must be a mapping of option name to value, got {show(v)}; e.g. {{t: cuda,nvtx}}")
        for k, val in v.items():
            if not isinstance(k, str) or not _OPTION_KEY.fullmatch(k):
                raise ValueError(
                    f"options key {show(k)} is not an option name; write it without dashes, e.g. 't' or 'capture-range'"
                )
            if val is None or isinstance(val, (list, dict)):
                raise ValueError(f"options[{show(k)}] = {show(val)} must be a single value; put bare switches in flags")
        return dict(v)

    @field_validator("flags", mode="before")
    @classmethod
    def _flags(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"flags must be a list of flag names, got {show(v)}; e.g. flags: [python-backtrace]")
        out = []
        for f in v:
            name = str(f).lstrip("-") if isinstance(f, (str, int)) and not isinstance(f, bool) else ""
            if not _OPTION_KEY.fullmatch(name):
                raise ValueError(f"flags entry {show(f)} "
                                 "is not a flag name; write e.g. 'python-backtrace' (no '=' or spaces)")
            out.append(name)
        return out

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError(f"env must be a mapping of variable name to value, got {show(v)}")
        for k in v:
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"env variable name {show(k)} is not valid; use letters, digits and '_'")
        return {k: str(val) for k, val in v.items()}


_NSYS_DEFAULT: dict[str, str | int | float | bool] = {"t": "cuda,cudnn,cublas,nvtx"}


class NsysOptions(ProcessOptions):
    """Nsight Systems (``nsys profile``) wrapping each worker."""

    options: dict[str, str | int | float | bool] = Field(default_factory=lambda: _NSYS_DEFAULT.copy())
    """nsys profile's options (``-k v`` / ``--key=v``); default ``{t: cuda,cudnn,cublas,nvtx}``, the APIs traced."""


class RocprofSysOptions(ProcessOptions):
    """rocprof-sys (ROCm Systems Profiler) wrapping each worker; reports go where distprof points it."""


class PySpyOptions(ProcessOptions):
    """py-spy sampling each wrapped worker (``py-spy record``)."""

    rate: int = 100
    """Samples per second (py-spy's ``-r``), from 1 to 10,000."""

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: int) -> int:
        if not 1 <= v <= 10_000:
            raise ValueError(f"py_spy.rate must be between 1 and 10000 samples per second, got {v}")
        return v

    format: Literal["speedscope", "chrometrace", "raw", "flamegraph"] = "speedscope"
    """Output format (py-spy's ``-f``): speedscope, chrometrace, raw or flamegraph."""
    native: bool = False
    """Also sample native (C/C++) frames (py-spy's ``--native``)."""
    subprocesses: bool = False
    """Also sample the worker's child processes (py-spy's ``--subprocesses``)."""


class MemrayOptions(ProcessOptions):
    """memray tracking each wrapped worker's allocations (``python -m memray run``)."""

    native: bool = False
    """Also record native (C/C++) stacks of allocations (memray's ``--native``)."""


class CudaMemoryOptions(StrictModel):
    """torch.cuda.memory._record_memory_history during a window; a snapshot at its end and on OOM."""

    stacks: Literal["python", "all"] = "python"
    """Stack frames kept per allocation: ``python``, or ``all`` (adds C++ frames: dumps slow down by 100x on big
    models)."""
    max_entries: int = 100_000
    """Allocator events kept in memory (1 to 100,000,000); older ones are dropped."""
    dump_on_oom: bool = True
    """Also write a snapshot when CUDA runs out of memory."""

    @field_validator("max_entries")
    @classmethod
    def _max(cls, v: int) -> int:
        if not 1 <= v <= 100_000_000:
            raise ValueError(f"cuda_memory.max_entries must be between 1 and 100,000,000, got {v}; it bounds the "
                             "allocator history kept in memory")
        return v


DEFAULT_SCHEDULE = ScheduleConfig(skip_first=10, wait=0, warmup=1, active=2, repeat=1)
