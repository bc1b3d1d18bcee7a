"""ProfilerConfig: every capture setting, validated once, loadable from anywhere.

Sources, weakest first: defaults < dict / YAML / OmegaConf < ``DISTPROF_*``
environment variables. The environment wins so that a job can be profiled
without editing its code or its config (``DISTPROF_ENABLE=1
DISTPROF_SAVE_PATH=/tmp/p python train.py``).

Every unusable setting raises ``ConfigError`` (a ``ValueError``) listing every
problem at once, each naming the field (or the ``DISTPROF_*`` variable or
command-line flag it came from), the value and the fix. Config is untrusted
input: shown values are cut short, YAML is read with the safe loader and
refused when its anchors/aliases would expand past a small bound, and step
ranges are measured before they are built.
"""

from __future__ import annotations

import contextvars
import fnmatch
import math
import os
import re
import typing
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any, Literal, NamedTuple

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from distprof.config.engine import EngineConfig
from distprof.config.errors import MAX_SHOWN as _MAX_SHOWN
from distprof.config.errors import README_TABLE, ConfigError, ConfigProblem, Problems, from_pydantic, nest, suggest
from distprof.config.errors import cut as _cut
from distprof.config.errors import error as _error
from distprof.config.errors import problem as _problem
from distprof.config.errors import show as _show
from distprof.config.limits import check_roles
from distprof.config.plan import Plan, Schedule
from distprof.rundir.layout import PROCESS_BACKENDS
from distprof.util.envvars import NOT_SETTINGS as _ENV_NOT_SETTINGS
from distprof.util.envvars import PREFIX as ENV_PREFIX
from distprof.util.safetext import control_char as _control_char

__all__ = [
    "BACKENDS",
    "ENV_PREFIX",
    "ConfigError",
    "ConfigProblem",
    "ProfilerConfig",
    "ScheduleConfig",
    "TorchOptions",
]

BACKENDS = ("torch", "cuda_memory", "nsys", "rocprof_sys", "py_spy", "memray")
ACTIVITIES = ("cpu", "cuda", "xpu")
AUTO_ACTIVITIES = "auto"  # cpu plus the accelerator present, resolved when a window opens (backends/torch_backend)
_MAX_STEPS = 1_000_000  # an explicit step list longer than this is a typo, not a plan
_MAX_DIGITS = 18  # a step or rank with more digits is a typo (and int() of 4,300+ digits raises)
# Untrusted input bounds: a profiler config is a few dozen values. Past these it is a mistake or an attack
# (a YAML "billion laughs" is 358 bytes that expand to 10^9 values), refused before anything walks it.
_MAX_VALUES = 2 * _MAX_STEPS  # values visited, counting every alias expansion
_MAX_DEPTH = 32  # nesting of mappings and lists
_MAX_YAML_BYTES = 4 << 20


# The validation running in this context: where values came from ({field path: "DISTPROF_X=v" or "--flag v"}, so a
# message names what the person typed; env_overrides() and from_args() fill it), the problems found outside
# pydantic's own checks (unknown DISTPROF_* variables), and whether DISTPROF_* variables apply (not for a config
# recorded in run.json). Set by _validated() for the outermost validation; nested ones (per_role) inherit no_env.
class _Run(NamedTuple):
    sources: dict[tuple[str, ...], str]
    problems: list[ConfigProblem]
    no_env: bool


_RUN: contextvars.ContextVar[_Run | None] = contextvars.ContextVar("distprof_config_run", default=None)


_CONTAINERS = (Mapping, list, tuple, set, frozenset)


def _check_bounded(data: Any, what: str) -> None:
    """Refuse input too deep or too big to be a config before anything walks it.

    Size counts shared parts (YAML aliases, or one list put in twice) as often as they are referred to, but
    each distinct container is visited once, so a "billion laughs" costs as little to refuse as to hold.
    """
    if not isinstance(data, _CONTAINERS):
        return
    size: dict[int, int] = {}  # id -> values inside, expanded
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = [c for c in ((*node.keys(), *node.values()) if isinstance(node, Mapping) else node)
                if isinstance(c, _CONTAINERS)]
        if done:
            on_path.discard(key)
            size[key] = len(node) + sum(size[id(c)] for c in kids)
            if size[key] > _MAX_VALUES:
                raise _error(f"{what} holds more than {_MAX_VALUES:,} values (shared parts counted each time they "
                             "are used, e.g. YAML aliases: a 'billion laughs'?); a profiler config is a few dozen "
                             "values: write it without nested anchors/aliases")
            continue
        if key in size:
            continue
        if key in on_path or len(on_path) >= _MAX_DEPTH:
            raise _error(f"{what} nests mappings/lists more than {_MAX_DEPTH} deep (or contains itself); "
                         "a profiler config is flat: write its values out")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in kids if id(c) not in size)


def _validated(call: Any, data: Any, root: Any, sources: Mapping[tuple[str, ...], str] | None = None,
               no_env: bool = False) -> Any:
    """Run a pydantic validation of ``data`` (a ``root`` model); every problem becomes one ConfigError."""
    _check_bounded(data, "the config")
    outer = _RUN.get()
    run = _Run(dict(sources or {}), [], no_env or (outer is not None and outer.no_env))
    token = _RUN.set(run)
    try:
        out = call()
    except ValidationError as e:
        raise ConfigError(run.problems + from_pydantic(e.errors(include_url=False), run.sources, root)) from None
    finally:
        _RUN.reset(token)
    if run.problems:
        raise ConfigError(run.problems)
    return out


class _Strict(BaseModel):
    """Unknown keys are refused (pydantic's extra="forbid": each one, with its path); every error is a
    ConfigError."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    def __init__(self, /, **data: Any) -> None:
        # Only a direct call (ProfilerConfig(...)) comes here: pydantic validates nested sections itself (see
        # below), so their errors reach the outer validation with their full path. A default_factory inside a
        # validation builds its section plainly.
        if _RUN.get() is not None:
            super().__init__(**data)
        else:
            _validated(lambda: super(_Strict, self).__init__(**data), data, type(self))

    # pydantic would call a custom __init__ for every nested section and for model_validate, losing the validation
    # context and refusing non-string keys with a TypeError; marked as its own, it validates them itself.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        no_env = bool((kwargs.get("context") or {}).get("no_env"))
        return _validated(lambda: super(_Strict, cls).model_validate(obj, *args, **kwargs), obj, cls, None, no_env)


def _non_negative_int(field: str, value: Any, fix: str) -> int:
    # bool is an int subclass; True as a step or rank is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and re.fullmatch(rf"\s*-?[0-9]{{1,{_MAX_DIGITS}}}\s*", value):
            value = int(value.strip())
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{field} must hold whole numbers, got {_show(value)}; {fix}")
    if value < 0:
        raise ValueError(f"{field} must not be negative, got {_show(value)}; {fix}")
    if value >= 10**_MAX_DIGITS:
        raise ValueError(f"{field} {_show(value)} is too large (more than {_MAX_DIGITS} digits); {fix}")
    return value


class ScheduleConfig(_Strict):
    """torch.profiler.schedule's fields, applied to global step numbers."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 1
    active: int = 1
    repeat: int = 1

    @field_validator("skip_first", "wait", "warmup", "active", "repeat", mode="before")
    @classmethod
    def _whole(cls, v: Any, info) -> int:
        fix = "use an integer >= 0 (repeat=0 means forever)"
        if v is None:
            raise ValueError(f"schedule.{info.field_name} must be an integer, got null; {fix}")
        return _non_negative_int(f"schedule.{info.field_name}", v, fix)

    @field_validator("active")
    @classmethod
    def _active(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"schedule.active must be >= 1, got {v}; a window has to record at least one step")
        return v

    def to_plan(self) -> Schedule:
        return Schedule(**self.model_dump())


class TorchOptions(_Strict):
    """torch.profiler's capture surface. Every memory-amplifying flag is off by default."""

    # ["auto"]: cpu plus the accelerator present (CUDA, ROCm, XPU), found when a window opens (so building a config
    # never imports torch) and silent on a CPU-only machine. Activities named explicitly warn once when missing.
    activities: list[str] = Field(default_factory=lambda: [AUTO_ACTIVITIES])
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    gzip: bool = True
    export_chrome_trace: bool = True
    export_stacks: bool = False
    stacks_metric: Literal["self_cpu_time_total", "self_cuda_time_total"] = "self_cpu_time_total"
    summary_top: int = 20
    post_processing_timeout_s: float | None = None  # passed on only where the installed torch accepts it

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
            raise ValueError(f"torch.activities must be a non-empty list, got {_show(v)}; {fix}")
        out = []
        for a in v:
            name = a.strip().lower() if isinstance(a, str) else None
            if name not in (*ACTIVITIES, AUTO_ACTIVITIES):
                raise ValueError(f"torch.activities has unknown activity {_show(a)}; {fix}")
            if name not in out:
                out.append(name)
        if AUTO_ACTIVITIES in out and len(out) > 1:
            raise ValueError(f"torch.activities {_show(v)} mixes 'auto' with named activities; 'auto' already means "
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


class ProcessOptions(_Strict):
    """A process-wrapping tool's command line, rendered as RLinf does.

    ``options`` with one-letter keys render as ``-k v``, longer keys as ``--key=v``; ``flags``
    render as bare ``--flag`` (``-f`` for one letter); ``env`` is added to the wrapped worker's
    environment. Options are passed through to the tool untouched after validation.
    """

    executable: str | None = None  # the tool's command; None = the backend's default
    options: dict[str, str | int | float | bool] = Field(default_factory=dict)
    flags: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    finalize_timeout_s: float = 120.0  # how long collect() waits for this tool's outputs still being written

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
            raise ValueError(f"options must be a mapping of option name to value, got {_show(v)}; e.g. {{t: cuda,nvtx}}")
        for k, val in v.items():
            if not isinstance(k, str) or not _OPTION_KEY.fullmatch(k):
                raise ValueError(
                    f"options key {_show(k)} is not an option name; write it without dashes, e.g. 't' or 'capture-range'"
                )
            if val is None or isinstance(val, (list, dict)):
                raise ValueError(f"options[{_show(k)}] = {_show(val)} must be a single value; put bare switches in flags")
        return dict(v)

    @field_validator("flags", mode="before")
    @classmethod
    def _flags(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"flags must be a list of flag names, got {_show(v)}; e.g. flags: [python-backtrace]")
        out = []
        for f in v:
            name = str(f).lstrip("-") if isinstance(f, (str, int)) and not isinstance(f, bool) else ""
            if not _OPTION_KEY.fullmatch(name):
                raise ValueError(f"flags entry {_show(f)} is not a flag name; write e.g. 'python-backtrace' (no '=' or spaces)")
            out.append(name)
        return out

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError(f"env must be a mapping of variable name to value, got {_show(v)}")
        for k in v:
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"env variable name {_show(k)} is not valid; use letters, digits and '_'")
        return {k: str(val) for k, val in v.items()}


class NsysOptions(ProcessOptions):
    options: dict[str, str | int | float | bool] = Field(default_factory=lambda: {"t": "cuda,cudnn,cublas,nvtx"})


class RocprofSysOptions(ProcessOptions):
    pass


class PySpyOptions(ProcessOptions):
    rate: int = 100

    @field_validator("rate")
    @classmethod
    def _rate(cls, v: int) -> int:
        if not 1 <= v <= 10_000:
            raise ValueError(f"py_spy.rate must be between 1 and 10000 samples per second, got {v}")
        return v

    format: Literal["speedscope", "chrometrace", "raw", "flamegraph"] = "speedscope"
    native: bool = False
    subprocesses: bool = False


class MemrayOptions(ProcessOptions):
    native: bool = False


class CudaMemoryOptions(_Strict):
    """torch.cuda.memory._record_memory_history during a window; a snapshot at its end and on OOM."""

    stacks: Literal["python", "all"] = "python"  # "all" adds C++ frames: dumps slow down by 100x on big models
    max_entries: int = 100_000
    dump_on_oom: bool = True

    @field_validator("max_entries")
    @classmethod
    def _max(cls, v: int) -> int:
        if not 1 <= v <= 100_000_000:
            raise ValueError(f"cuda_memory.max_entries must be between 1 and 100,000,000, got {v}; it bounds the "
                             "allocator history kept in memory")
        return v




_RANGE = re.compile(rf"\s*([0-9]{{1,{_MAX_DIGITS}}})\s*-\s*([0-9]{{1,{_MAX_DIGITS}}})\s*")


def _parse_steps(v: Any) -> list[int]:
    """Steps from ints, "A-B" ranges, or one string such as "3,10,20-25"."""
    fix = "give global step numbers >= 0, e.g. [3, 10] or '20-25'"
    if isinstance(v, str):
        v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"steps must be a list of global steps, got {_show(v)}; {fix}")
    if len(v) > _MAX_STEPS:
        raise ValueError(f"steps lists more than {_MAX_STEPS:,} steps; {fix} (use schedule for periodic capture)")
    spans: list[tuple[int, int]] = []
    total = 0  # steps named, overlaps counted twice: the whole list is measured before any range is built
    for item in v:
        m = _RANGE.fullmatch(item) if isinstance(item, str) else None
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if b < a:
                raise ValueError(f"steps range {_show(item)} ends before it starts; write it as 'START-END' with START <= END")
        else:
            a = b = _non_negative_int("steps", item, fix)
        spans.append((a, b))
        total += b - a + 1
        if total > _MAX_STEPS:
            raise ValueError(f"steps {_show(item)} brings the steps listed past {_MAX_STEPS:,}; {fix} "
                             "(use schedule for periodic capture)")
    out: set[int] = set()
    for a, b in spans:
        out.update(range(a, b + 1))
    if not out:
        raise ValueError(f"steps is empty, so nothing would be captured; {fix}, or remove steps to use a schedule")
    return sorted(out)


def _check_role_name(field: str, role: Any) -> str:
    if not isinstance(role, str) or not role.strip():
        raise ValueError(f"{field} has an empty or non-string role name {_show(role)}; use names such as 'actor' or 'rollout'")
    if len(role) > 200 or _control_char(role):
        raise ValueError(f"{field} role {_show(role)} is over 200 characters or holds control characters; "
                         "use a short printable name such as 'actor/micro_step'")
    p = PurePosixPath(role.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or role.startswith("~"):
        raise ValueError(
            f"{field} role {_show(role)} would write outside save_path; use a relative name without '..', such as 'actor/micro_step'"
        )
    return role


class ProfilerConfig(_Strict):
    """Everything a Profiler needs. See the README's configuration table."""

    enable: bool = False
    backend: str = "torch"
    save_path: str | None = None
    # Global ranks: [0] (default), "all", a list, or mesh coordinates {pp: "*", tp: 0, dp: 0} (the Profiler is
    # then given the job's mesh: a torch DeviceMesh, or {dim: size} outermost first; see distprof.config.mesh).
    ranks: list[int] | Literal["all"] | dict[str, Any] = Field(default_factory=lambda: [0])
    # Keep only the first N local ranks of every node (LOCAL_RANK, or rank % LOCAL_WORLD_SIZE): per_node: 1 is
    # "rank 0 of every node". Combined with ranks (both must select).
    per_node: int | None = None
    roles: list[str] | None = None
    steps: list[int] | None = None
    schedule: ScheduleConfig | None = None
    torch: TorchOptions = Field(default_factory=TorchOptions)
    cuda_memory: CudaMemoryOptions = Field(default_factory=CudaMemoryOptions)
    nsys: NsysOptions = Field(default_factory=NsysOptions)
    rocprof_sys: RocprofSysOptions = Field(default_factory=RocprofSysOptions)
    py_spy: PySpyOptions = Field(default_factory=PySpyOptions)
    memray: MemrayOptions = Field(default_factory=MemrayOptions)
    on_error: str = "disable"
    # verl's discrete mode: during the planned steps, every outermost annotate() range of a selected role opens
    # and closes its own window (one trace per stage run, e.g. rollout/generate at step 3), so traces of big
    # jobs stay small and openable. In-process backends only (torch, cuda_memory).
    discrete: bool = False
    # Per-role settings over the ones above, for frameworks that choose ranks, steps and tools per role (verl,
    # RLinf): {actor: {ranks: all, torch: {record_shapes: true}}, rollout: {enable: false}}. Keys are role names or
    # globs (the first that matches wins); a value may set any field but save_path, on_error, roles and per_role.
    # DISTPROF_* variables still win over them.
    per_role: dict[str, dict[str, Any]] = Field(default_factory=dict)
    # Guardrails (distprof.capture.guard), sampled at step boundaries while a window is open. Off by default: a limit
    # that fires by default would make which steps get captured depend on the host's load, and the heavy flags
    # that grow memory are off by default too. When one is crossed the window closes early, keeps what it
    # recorded (manifest: complete false, stopped_by memory_guard, guard: the numbers), one warning is logged,
    # and this profiler opens no more windows. Windows that end at step boundaries only (not discrete mode's stage
    # windows, not the process backends, whose tools hold their own buffers).
    max_host_memory_gb: float | None = None
    """Limit on this process's resident memory (RSS, GB = 1e9 bytes) while a window is open; None = off."""
    min_available_memory_gb: float | None = None
    """Floor on the host's available memory (MemAvailable, GB = 1e9 bytes) while a window is open; None = off."""
    max_trace_mb: float | None = None
    """Limit on one window's trace size (uncompressed JSON, MB = 1e6 bytes); None = off. Estimated before export:
    the growth of the C heap in use (glibc mallinfo2; RSS growth elsewhere) since the window's first recorded
    step, times ``guard.TRACE_BYTES_PER_HEAP_BYTE`` (1.4; JSON bytes per heap byte measured 1.27-1.41 on CPU loops
    with and without the heavy flags). A proxy, not a count: memory the training code itself keeps during the
    window counts too, so it errs towards stopping early."""
    # On-demand capture (`distprof trigger RUN_DIR --steps N`, distprof.trigger()): the profiler also looks for
    # capture requests in save_path/.requests, at most every trigger_poll_s seconds (monotonic clock, checked at
    # step() ends). trigger: true turns profiling on like enable; with neither steps nor schedule, nothing is
    # captured until a request comes. DISTPROF_TRIGGER=1 opts a job in without editing it.
    trigger: bool = False
    trigger_poll_s: float = 2.0
    trigger_max_steps: int = 20  # a request for more steps is refused (acknowledged "refused")
    engine: EngineConfig | None = None
    """The rollout engine (vLLM, SGLang) whose own profiler this role drives at its windows (config/engine.py)."""

    # ---- field checks ---------------------------------------------------------------
    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, v: Any) -> str:
        if v not in BACKENDS:
            tip = suggest(v, BACKENDS)
            raise ValueError(f"backend {_show(v)} is unknown; {tip + ' ' if tip else ''}choose one of {', '.join(BACKENDS)}")
        return v

    @field_validator("on_error", mode="before")
    @classmethod
    def _on_error(cls, v: Any) -> str:
        if v not in ("disable", "raise"):
            raise ValueError(f"on_error {_show(v)} is unknown; use 'disable' (log once, keep training) or 'raise'")
        return v

    @field_validator("ranks", mode="before")
    @classmethod
    def _ranks(cls, v: Any) -> Any:
        fix = "use 'all', a list of global ranks such as [0, 8], or mesh coordinates such as {pp: '*', tp: 0}"
        if isinstance(v, Mapping):
            from distprof.config.mesh import parse_coordinate_selection

            return {k: (list(x) if isinstance(x, tuple) else x) for k, x in parse_coordinate_selection(v).items()}
        if isinstance(v, str):
            if v.strip().lower() == "all":
                return "all"
            v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"ranks must be 'all' or a list, got {_show(v)}; {fix}")
        if not v:
            raise ValueError(f"ranks is empty, so no rank would capture; {fix}")
        return sorted({_non_negative_int("ranks", r, fix) for r in v})

    @field_validator("per_node", mode="before")
    @classmethod
    def _per_node(cls, v: Any) -> Any:
        if v is None:
            return None
        n = _non_negative_int("per_node", v, "use a number of local ranks per node >= 1, e.g. per_node: 1")
        if n < 1:
            raise ValueError("per_node must be >= 1 (0 would select no rank); use per_node: 1 for rank 0 of every node")
        return n

    @field_validator("per_role", mode="before")
    @classmethod
    def _per_role(cls, v: Any) -> Any:
        if v is None:
            return {}
        v = _to_plain(v)
        if not isinstance(v, Mapping):
            raise ValueError(f"per_role must map role names to settings, got {_show(v)}; e.g. per_role: {{actor: {{ranks: all}}}}")
        check_roles("per_role", v, "entries")
        out, problems = {}, []  # every role's problems at once
        for role, over in v.items():
            where = f"per_role.{_cut(str(role), 60)}"
            try:
                _check_role_name("per_role", role)
            except ValueError as e:  # the name itself: no field of a role to name
                problems.append(_problem("per_role", role, str(e)))
                continue
            over = _to_plain(over) if isinstance(over, Mapping) else over
            bad = sorted(set(over) & _NOT_PER_ROLE) if isinstance(over, Mapping) else []
            if not isinstance(over, Mapping):
                problems.append(_problem(where, over, f"{where} must be a mapping of settings, got {_show(over)}; "
                                                      "e.g. {ranks: all}"))
            elif bad:
                problems.append(_problem(where, over, f"{where} sets {', '.join(bad)}, which are the same for every "
                                                      "role; set them at the top level"))
            else:
                out[role] = dict(over)
                try:  # the role's own settings, checked alone: together with the top level in _consistent
                    ProfilerConfig.model_validate(out[role], context={"no_env": True, "fields_only": True})
                except ConfigError as e:
                    problems += [nest(p, where) for p in e.problems]
        if problems:
            raise Problems(problems)
        return out

    @field_validator("max_host_memory_gb", "min_available_memory_gb", "max_trace_mb", mode="before")
    @classmethod
    def _limit(cls, v: Any, info) -> Any:
        unit = "MB" if info.field_name == "max_trace_mb" else "GB"
        fix = f"give a number of {unit} > 0 (e.g. {info.field_name}: {500 if unit == 'MB' else 8}), or null to turn it off"
        if v is None:
            return None
        if isinstance(v, str):
            try:
                v = float(v.strip())
            except ValueError:
                raise ValueError(f"{info.field_name} must be a number, got {_show(v)}; {fix}") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"{info.field_name} must be a finite number > 0, got {_show(v)}; {fix}")
        return float(v)

    @field_validator("roles", mode="before")
    @classmethod
    def _roles(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, str):
            v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"roles must be null (every role) or a non-empty list of role names, got {_show(v)}")
        check_roles("roles", v)
        return [_check_role_name("roles", r) for r in v]

    @field_validator("steps", mode="before")
    @classmethod
    def _steps(cls, v: Any) -> Any:
        return None if v is None else _parse_steps(v)

    @field_validator("save_path", mode="before")
    @classmethod
    def _save_path(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if not isinstance(v, str):
            raise ValueError(f"save_path must be a path or URL string, got {_show(v)}")
        bad = _control_char(v)
        if bad is not None:
            # A NUL cuts the path short in the OS, a newline forges log lines: neither is ever meant.
            raise ValueError(f"save_path {_show(v)} contains the control character {bad!r}; "
                             "give a plain directory or URL, e.g. save_path: runs/exp1/profile")
        return v.strip()

    @field_validator("trigger_poll_s")
    @classmethod
    def _trigger_poll(cls, v: float) -> float:
        if not (math.isfinite(v) and 0 <= v <= 3600):
            raise ValueError(f"trigger_poll_s must be a number of seconds from 0 to 3600, got {_show(v)}; it is how "
                             "often a process looks for capture requests (default 2)")
        return v

    @field_validator("trigger_max_steps")
    @classmethod
    def _trigger_max(cls, v: int) -> int:
        if not 1 <= v <= 10_000:
            raise ValueError(f"trigger_max_steps must be from 1 to 10000, got {_show(v)}; it bounds how many steps one "
                             "capture request may record")
        return v

    # ---- whole-config checks ----------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _apply_env(cls, data: Any, info) -> Any:
        if data is None:
            data = {}
        run = _RUN.get()
        if isinstance(data, Mapping) and not (info.context or {}).get("no_env") and not (run and run.no_env):
            return env_overrides(dict(data), os.environ, run and run.sources, run and run.problems)
        return data

    @model_validator(mode="after")
    def _consistent(self, info) -> ProfilerConfig:
        # fields_only: a part of a config checked alone (a role's settings, a dialect's fields one by one)
        fields_only = (info.context or {}).get("fields_only")
        problems = [] if fields_only else [_problem("", value, text) for value, text in self._conflicts()]
        for role in self.per_role:  # every role's problems, each with its full path
            try:
                self._merged(role)
            except ConfigError as e:
                problems += [nest(p, f"per_role.{_cut(role, 60)}") for p in e.problems]
        if problems:
            raise Problems(problems)
        return self

    def _conflicts(self) -> list[tuple[Any, str]]:
        """Settings that are fine alone but not together: (the value at fault, what is wrong and the fix)."""
        out = []
        if self.steps is not None and self.schedule is not None:
            out.append((self.steps, f"steps={_show(self.steps)} and schedule are both set; they are exclusive: keep "
                                    "steps for explicit global steps or schedule for a periodic pattern"))
        if self.discrete and self.backend in PROCESS_BACKENDS:
            out.append((self.backend,
                        f"discrete=True needs an in-process backend, but backend is {self.backend!r} (it wraps the whole "
                        "worker process); use backend torch or cuda_memory, or drop discrete"))
        if self.trigger and (self.discrete or self.backend not in ("torch", "cuda_memory")):
            out.append((self.backend,
                f"trigger=True needs backend torch or cuda_memory without discrete mode (got backend "
                f"{self.backend!r}{', discrete' if self.discrete else ''}): a requested window opens at a step "
                "boundary; use backend torch, or drop trigger"))
        if self.trigger and not self.enable and not self.save_path:
            out.append((self.save_path,
                        f"save_path is {_show(self.save_path)} but trigger=True; set save_path to the directory or URL "
                        "where requests are sent and traces written (e.g. DISTPROF_SAVE_PATH=...)"))
        if self.enable and not self.save_path:
            out.append((self.save_path, f"save_path is {_show(self.save_path)} but enable=True; set save_path to a "
                                        "directory or URL (e.g. save_path: runs/exp1/profile, or DISTPROF_SAVE_PATH=...)"))
        return out

    # ---- per role -----------------------------------------------------------------------
    def for_role(self, role: str) -> ProfilerConfig:
        """The config ``role`` runs with: this one with the first matching ``per_role`` entry applied."""
        for pattern in self.per_role:
            if role == pattern or fnmatch.fnmatchcase(role, pattern):
                return self._merged(pattern)
        return self

    def _merged(self, pattern: str) -> ProfilerConfig:
        base = self.model_dump(exclude={"per_role"})
        return ProfilerConfig.model_validate(_deep_merge(base, self.per_role[pattern]))

    # ---- derived ------------------------------------------------------------------------
    @property
    def effective_schedule(self) -> ScheduleConfig:
        """The schedule in force: the configured one, or the default when no steps are given."""
        return self.schedule if self.schedule is not None else DEFAULT_SCHEDULE

    @property
    def is_process_backend(self) -> bool:
        """True for backends that wrap the whole worker process (nsys, rocprof_sys, py_spy, memray)."""
        return self.backend in PROCESS_BACKENDS

    @property
    def whole_lifetime(self) -> bool:
        """A process backend with neither steps nor schedule profiles the worker's whole life."""
        return self.is_process_backend and self.steps is None and self.schedule is None

    @property
    def on_demand_only(self) -> bool:
        """trigger: true with neither steps nor schedule: no window but the ones requested."""
        return self.trigger and self.steps is None and self.schedule is None

    def plan(self) -> Plan:
        if self.on_demand_only:
            return Plan()
        if self.steps is not None:
            return Plan.from_steps(self.steps)
        if self.whole_lifetime:
            return Plan.forever()
        return Plan.from_schedule(self.effective_schedule.to_plan())

    def window_count(self) -> int | None:
        """How many windows the plan has (None: unbounded, e.g. schedule repeat=0 or whole lifetime)."""
        if self.steps is not None or self.on_demand_only:
            return len(self.plan().windows)
        if self.whole_lifetime or self.effective_schedule.repeat == 0:
            return None
        return self.effective_schedule.repeat

    def selects_rank(self, rank: int, world_size: int, mesh: Any = None, local_rank: int | None = None) -> bool:
        """Does this config capture on ``rank``? ``mesh`` is needed for coordinate selections; ``local_rank`` for
        ``per_node``. Raises ValueError when the selection cannot be judged (no mesh, a dimension it lacks)."""
        from distprof.config.mesh import RankMesh, check_against_mesh, mesh_selected, node_selected

        if isinstance(self.ranks, dict):
            if mesh is None:
                raise ValueError(
                    f"ranks selects by mesh coordinates {_show(self.ranks)}, but no mesh was given; pass the job's "
                    "DeviceMesh (Profiler(..., mesh=device_mesh)) or its dims outermost first, e.g. "
                    "mesh={'pp': 4, 'dp': 2, 'tp': 2}")
            m = RankMesh.of(mesh)
            if m.world_size != world_size:
                raise ValueError(f"the mesh holds {m.world_size} ranks but world_size is {world_size}; pass the whole "
                                 "job's mesh")
            sel = {k: (v if v == "*" else tuple(v)) for k, v in self.ranks.items()}
            check_against_mesh(sel, m)
            chosen = mesh_selected(sel, m, rank)
        else:
            chosen = self.ranks == "all" or rank in self.ranks
        return chosen and node_selected(self.per_node, local_rank)

    def check_world_size(self, world_size: int) -> None:
        """Refuse ranks beyond the world size, as soon as it is known."""
        if isinstance(self.ranks, list):
            bad = [r for r in self.ranks if r >= world_size]
            if bad:
                raise ValueError(
                    f"ranks {bad} do not exist: world size is {world_size} (ranks 0..{world_size - 1}); "
                    "remove them or use ranks: all"
                )

    # ---- loading --------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Any, section: str | None = None) -> ProfilerConfig:
        """From a mapping or an OmegaConf DictConfig; ``section`` is a dotted path to a nested part."""
        data = _to_plain(data)
        if section:
            data = _select(data, section)
        return cls.model_validate(data if data is not None else {})

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> ProfilerConfig:
        """A config recorded in run.json, exactly as it was (this process's DISTPROF_* variables do not apply)."""
        return cls.model_validate(dict(data), context={"no_env": True})

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, section: str | None = None) -> ProfilerConfig:
        """From a YAML file: the whole file, a top-level ``distprof:`` / ``profiler:`` section, or ``section``.

        The file is untrusted: read with yaml's safe loader (no ``!!python/...`` tags), at most 4 MB, and refused
        when nesting or anchors/aliases would expand it past a config's size; every error names the file and line.
        """
        return cls.from_dict(*_yaml_config(path, section))

    @classmethod
    def from_dialect(cls, name: str, cfg: Any, section: str | None = None) -> ProfilerConfig:
        """From the config another framework's users already write: ``name`` is one of verl, skyrl, slime, swift,
        rlinf, torchtitan, nemo_rl (see ``distprof.config.dialects``). One ConfigError lists every error; each field not
        honoured is logged by its dotted key (a key the dialect does not know as a warning), and so are warnings.
        ``distprof validate FILE --dialect NAME`` shows the mapping and what was dropped."""
        from distprof.config.dialects import to_config

        return to_config(name, cfg, section)

    @classmethod
    def from_args(cls, args: Any, base: ProfilerConfig | Mapping[str, Any] | None = None,
                  prefix: str | None = None) -> ProfilerConfig:
        """From command-line flags: an argparse namespace from ``distprof.add_profiler_args`` or a
        ``distprof.config.args.ProfilerArguments`` (``HfArgumentParser``).

        Precedence, weakest first: defaults < ``base`` (a config or mapping) < the ``--profile-config`` YAML file <
        the flags given < ``DISTPROF_*`` environment variables. The environment wins over flags as it wins over
        files (DESIGN.md: "env overrides both"), so a job is re-profiled without editing its launch command. A flag
        not given leaves the value below it; ``--profile-steps`` replaces a schedule from below. An error in a flag
        names it (``--profile-steps x: ...``). ``prefix`` is ``add_profiler_args``'s, found on the namespace.
        """
        from distprof.config.args import flag_values

        file, flags = flag_values(args, prefix)
        data = dict(_to_plain(base) or {})
        if file is not None:
            over, section = _yaml_config(file, None)
            data = _deep_merge(data, _select(over, section) if section else over)
        sources = {}
        for field, (value, label) in flags.items():
            data[field] = value
            sources[(field,)] = label
            if field == "steps":
                data["schedule"] = None
        return _validated(lambda: super(_Strict, cls).model_validate(data), data, cls, sources)


_NOT_PER_ROLE = {"save_path", "on_error", "roles", "per_role"}


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top; nested sections (torch, schedule ...) merge key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


DEFAULT_SCHEDULE = ScheduleConfig(skip_first=10, wait=0, warmup=1, active=2, repeat=1)


def _to_plain(data: Any) -> Any:
    if data is None or (isinstance(data, Mapping) and not _is_omegaconf(data)):
        return data
    if _is_omegaconf(data):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(data, resolve=True)
    if isinstance(data, ProfilerConfig):
        return data.model_dump()
    raise _error(f"cannot read a profiler config from {type(data).__name__}; pass a dict, a YAML path or an OmegaConf object")


def _yaml_config(path: str | os.PathLike, section: str | None) -> tuple[dict[str, Any], str | None]:
    """A YAML config file's mapping, and the section to read (``distprof:``/``profiler:`` found when not given)."""
    data = _load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise _error(f"{os.fspath(path)}: expected a mapping at the top of the YAML file, got {type(data).__name__}; "
                     "write settings as 'key: value' lines")
    if section is None and not (set(data) & set(ProfilerConfig.model_fields)):
        section = next((key for key in ("distprof", "profiler") if key in data), None)
    return dict(data), section


def read_config_text(path: str | os.PathLike) -> str:
    """A config file's text, read as untrusted input: a regular file (a FIFO or device would block or never
    end), at most 4 MB, UTF-8 (a BOM is dropped). Every refusal is one ConfigError naming the file."""
    import stat

    name = os.fspath(path)
    try:
        st = os.stat(name)
        if stat.S_ISDIR(st.st_mode):
            raise _error(f"{name}: is a directory; give the config file itself")
        if not stat.S_ISREG(st.st_mode):
            raise _error(f"{name}: not a regular file; give the path of a config file")
        with open(name, "rb") as f:
            raw = f.read(_MAX_YAML_BYTES + 1)  # the file may grow between stat and read
    except OSError as e:
        raise _error(f"{name}: cannot read the config file ({e.strerror or e}); check the path") from None
    if len(raw) > _MAX_YAML_BYTES:
        raise _error(f"{name}: larger than {_MAX_YAML_BYTES >> 20} MB; a profiler config is a few lines")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise _error(f"{name}: not UTF-8 text (byte {e.start}); save the config as UTF-8") from None


def _load_yaml(path: str | os.PathLike) -> Any:
    import yaml

    name = os.fspath(path)
    text = read_config_text(name)
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: same rules, faster
    try:
        _check_yaml_shape(loader_cls, text, name)
        loader = loader_cls(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise _yaml_error(name, e) from None


def _check_yaml_shape(loader_cls: Any, text: str, name: str) -> None:
    """Walk the YAML's events (no objects built) and refuse deep nesting or an alias blow-up before loading.

    Each anchor's size is its values counted with aliases expanded; an alias adds that size. A 358-byte
    "billion laughs" is refused at its first big alias, and libyaml is never asked to build deep nesting
    (it recurses in C, and its scanner slows down quadratically with depth: both stop at the first bad event).
    """
    import yaml

    sizes: dict[str, int] = {}
    stack: list[list[Any]] = [[None, 0]]  # open collections: [anchor, values so far]
    loader = loader_cls(text)
    try:
        while loader.check_event():
            ev = loader.get_event()
            if isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                stack.append([ev.anchor, 1])
                if len(stack) - 1 > _MAX_DEPTH:
                    raise _error(f"{name}:{ev.start_mark.line + 1}: nests mappings/lists more than {_MAX_DEPTH} deep; "
                                 "a profiler config is flat: write its values out")
            elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                anchor, n = stack.pop()
                if anchor is not None:
                    sizes[anchor] = n
                stack[-1][1] += n
            elif isinstance(ev, yaml.ScalarEvent):
                if ev.anchor is not None:
                    sizes[ev.anchor] = 1
                stack[-1][1] += 1
            elif isinstance(ev, yaml.AliasEvent):
                stack[-1][1] += sizes.get(ev.anchor, 1)
                if sum(n for _, n in stack) > _MAX_VALUES:
                    raise _error(f"{name}:{ev.start_mark.line + 1}: anchors/aliases expand the file past "
                                 f"{_MAX_VALUES:,} values (a 'billion laughs'?); a profiler config is a few dozen "
                                 "values: refer to anchors less, or write the values out")
    except yaml.YAMLError as e:
        # libyaml as bundled with PyYAML 6.0.4 stops deep flow nesting in its scanner, before any of the events
        # above (its own bound, about 1,000 levels); older releases leave it to the walk. Same answer either way.
        if "nesting depth" not in str(e):
            raise
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise _error(f"{name}{line}: nests mappings/lists more than {_MAX_DEPTH} deep; "
                     "a profiler config is flat: write its values out") from None
    finally:
        loader.dispose()


def _yaml_error(name: str, e: Exception) -> ConfigError:
    import yaml

    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{name}:{mark.line + 1}" if mark is not None else name
    problem = getattr(e, "problem", None) or (str(e).splitlines() or ["unreadable YAML"])[0]
    text = f"{where}: not a valid YAML config ({_cut(str(problem), 160)})"
    if isinstance(e, yaml.constructor.ConstructorError) and "tag" in str(problem):
        text += ("; tags such as !!python/object are not allowed: config files are read with yaml's safe loader, "
                 "which builds only mappings, lists, strings and numbers")
    else:
        text += "; fix the YAML at that line"
    return _error(text)


def _is_omegaconf(obj: Any) -> bool:
    return type(obj).__module__.startswith("omegaconf")


def _select(data: Any, section: str) -> Any:
    cur = data
    for part in section.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise _error(f"config section {_show(section)} not found (missing {_show(part)}); check the dotted path")
        cur = cur[part]
    return cur


# ---- environment overrides -------------------------------------------------------------------

def _env_fields() -> dict[str, tuple[str, ...]]:
    """DISTPROF_<FIELD> and DISTPROF_<SECTION>_<FIELD> for every scalar or list field."""
    out: dict[str, tuple[str, ...]] = {}
    for name in ProfilerConfig.model_fields:
        out[f"{ENV_PREFIX}{name.upper()}"] = (name,)
    for section, field in ProfilerConfig.model_fields.items():
        model = field.annotation
        if section == "schedule":
            model = ScheduleConfig
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            continue
        if section != "schedule":  # DISTPROF_SCHEDULE=null removes a file's schedule (then steps can replace it)
            out.pop(f"{ENV_PREFIX}{section.upper()}", None)
        for name, sub in model.model_fields.items():
            if typing.get_origin(sub.annotation) is dict:
                continue  # mappings (options, env) are set in config files, not one variable
            out[f"{ENV_PREFIX}{section.upper()}_{name.upper()}"] = (section, name)
    return out


def _typed(raw: str) -> str:
    """A variable's value as the person typed it (unquoted), unless quoting is needed to see it."""
    return raw if len(raw) <= 60 and raw.isprintable() and raw.strip() == raw and raw else _show(raw, 60)


def env_overrides(data: dict[str, Any], environ: Mapping[str, str], sources: dict[tuple[str, ...], str] | None = None,
                  problems: list[ConfigProblem] | None = None) -> dict[str, Any]:
    """Return ``data`` with every ``DISTPROF_*`` variable applied on top; ``sources`` learns which field each set.
    A variable that is no setting is a problem added to ``problems`` (raised at once when it is None)."""
    fields = None
    found: list[ConfigProblem] = [] if problems is None else problems
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in _ENV_NOT_SETTINGS:
            continue
        fields = fields or _env_fields()
        name = _cut(key, _MAX_SHOWN)
        if key not in fields:
            tip = suggest(name, fields, ENV_PREFIX) or (f"a variable is DISTPROF_<FIELD> or DISTPROF_<SECTION>_<FIELD> "
                                            f"(e.g. DISTPROF_TORCH_RECORD_SHAPES); {README_TABLE}")
            found.append(_problem(name, raw, f"{name}={_typed(raw)}: not a distprof setting; {tip}"))
            continue
        if sources is not None:
            sources[fields[key]] = f"{key}={_typed(raw)}"
        value: Any = raw
        if raw.strip().lower() in ("null", "none", ""):
            value = None
        path = fields[key]
        if path == ("schedule",) and value is not None:
            found.append(_problem(key, raw, f"{key}={_typed(raw)}: only null is accepted (it removes the schedule); "
                                            "set its fields with DISTPROF_SCHEDULE_ACTIVE=... and so on"))
            continue
        if path == ("steps",) and value is not None and not any(k.startswith(f"{ENV_PREFIX}SCHEDULE") for k in environ):
            data.pop("schedule", None)  # explicit steps from the environment replace a file's schedule, as flags do
        if len(path) == 1:
            data[path[0]] = value
        else:
            section = data.get(path[0])
            section = dict(_to_plain(section) or {}) if not isinstance(section, BaseModel) else section.model_dump()
            section[path[1]] = value
            data[path[0]] = section
    if found and problems is None:
        raise ConfigError(found)
    return data
