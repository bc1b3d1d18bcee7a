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

import fnmatch
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from distprof.config.args import flag_values
from distprof.config.dialects import to_config
from distprof.config.engine import EngineConfig
from distprof.config.env import ENV_PREFIX, env_fields
from distprof.config.env import env_overrides as _apply_env_overrides
from distprof.config.errors import ConfigError, ConfigProblem, Problems, error, nest, problem, show, suggest
from distprof.config.errors import cut as _cut
from distprof.config.hang import HangOptions
from distprof.config.limits import check_roles
from distprof.config.load import is_omegaconf, load_mapping, select, to_plain
from distprof.config.mesh import (
    RankMesh,
    check_against_mesh,
    mesh_selected,
    node_selected,
    parse_coordinate_selection,
)
from distprof.config.names import ACTIVITIES, AUTO_ACTIVITIES, BACKENDS
from distprof.config.options import (
    DEFAULT_SCHEDULE,
    CudaMemoryOptions,
    MemrayOptions,
    NsysOptions,
    PySpyOptions,
    RocprofSysOptions,
    ScheduleConfig,
    TorchOptions,
)
from distprof.config.plan import Plan
from distprof.config.validation import RUN, StrictModel, check_role_name, non_negative_int, parse_steps
from distprof.config.watch import DetectOptions, TelemetryOptions
from distprof.rundir.layout import PROCESS_BACKENDS, is_url
from distprof.util.safetext import control_char

__all__ = [
    "ACTIVITIES",
    "AUTO_ACTIVITIES",
    "BACKENDS",
    "ENV_PREFIX",
    "ConfigError",
    "ConfigProblem",
    "CudaMemoryOptions",
    "ProfilerConfig",
    "ScheduleConfig",
    "TorchOptions",
    "env_overrides",
    "parse_steps",
]

_parse_steps = parse_steps  # the name capture/trigger.py imports today; new code imports parse_steps


def _positive_or_none(field: str, v: Any, fix: str, at_most: float | None = None) -> float | None:
    """A limit setting: null (off), or a finite number > 0 (and <= ``at_most``), also given as text."""
    if v is None:
        return None
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            raise ValueError(f"{field} must be a number, got {show(v)}; {fix}") from None
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0
            or (at_most is not None and v > at_most)):
        bound = "a finite number > 0" if at_most is None else f"> 0 and <= {at_most:g}"
        raise ValueError(f"{field} must be {bound}, got {show(v)}; {fix}")
    return float(v)


class ProfilerConfig(StrictModel):
    """Everything a Profiler needs. See the README's configuration table."""

    enable: bool = False
    """Capture at all. Off by default; ``trigger: true`` also turns profiling on, for requested windows."""
    backend: str = "torch"
    """The capture tool: ``torch`` or ``cuda_memory`` run in the process; ``nsys``, ``rocprof_sys``, ``py_spy``
    and ``memray`` wrap whole Ray worker processes."""
    save_path: str | None = None
    """Where the run directory goes: a local path or an fsspec URL (``s3://``, ``gs://``, ``memory://``).
    Required when enabled; checked writable when the Profiler is built."""
    ranks: list[int] | Literal["all"] | dict[str, Any] = Field(default_factory=lambda: [0])
    """The global ranks that capture: ``[0]`` (default), ``all``, a list, or mesh coordinates such as ``{pp: "*",
    tp: 0, dp: 0}`` (the Profiler is then given the job's mesh; see distprof.config.mesh)."""
    per_node: int | None = None
    """Keep only the first N local ranks of every node (``LOCAL_RANK``, or rank % ``LOCAL_WORLD_SIZE``);
    ``per_node: 1`` is rank 0 of every node. Combined with ranks; null = no limit."""
    roles: list[str] | None = None
    """Role names or globs that capture (at most 64); null = every role."""
    steps: list[int] | None = None
    """Explicit global steps to capture, e.g. ``[3, 10]`` or ``"20-25"``; consecutive steps form one window.
    Exclusive with schedule; null = the schedule decides."""
    schedule: ScheduleConfig | None = None
    """A torch.profiler schedule evaluated on global step numbers; null with no steps uses skip_first 10,
    warmup 1, active 2, repeat 1."""
    torch: TorchOptions = Field(default_factory=TorchOptions)
    """torch.profiler's options, for backend torch."""
    cuda_memory: CudaMemoryOptions = Field(default_factory=CudaMemoryOptions)
    """The CUDA memory snapshot's options, for backend cuda_memory."""
    nsys: NsysOptions = Field(default_factory=NsysOptions)
    """Nsight Systems' command line, for backend nsys."""
    rocprof_sys: RocprofSysOptions = Field(default_factory=RocprofSysOptions)
    """rocprof-sys's command line, for backend rocprof_sys."""
    py_spy: PySpyOptions = Field(default_factory=PySpyOptions)
    """py-spy's command line, for backend py_spy."""
    memray: MemrayOptions = Field(default_factory=MemrayOptions)
    """memray's command line, for backend memray."""
    on_error: str = "disable"
    """What a fault inside the profiler does: ``disable`` (log it once, profile no more, keep training) or
    ``raise`` (for tests)."""
    discrete: bool = False
    """verl's discrete mode: during the planned steps every outermost ``annotate`` range of a selected role is
    its own window, so each stage run is one small trace. In-process backends only (torch, cuda_memory)."""
    per_role: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Settings per role over the top level, e.g. ``{actor: {ranks: all}, rollout: {enable: false}}``. Keys are
    role names or globs (first match wins; at most 64); any field but save_path, on_error, roles and per_role.
    ``DISTPROF_*`` variables still win."""
    # Guardrails (distprof.capture.guard), sampled at step boundaries while a window is open. Off by default: a limit
    # that fires by default would make which steps get captured depend on the host's load, and the heavy flags
    # that grow memory are off by default too. When one is crossed the window closes early, keeps what it
    # recorded (manifest: complete false, stopped_by memory_guard, guard: the numbers), one warning is logged,
    # and this profiler opens no more windows. Windows that end at step boundaries only (not discrete mode's stage
    # windows, not the process backends, whose tools hold their own buffers). The export budget (max_export_share,
    # distprof.capture.budget) is on by default: it fires only when closing a window would hold a large share of
    # the job's collective timeout, where the job itself is at risk, and then shortens the window only.
    max_host_memory_gb: float | None = None
    """Limit on this process's resident memory (RSS, GB = 1e9 bytes) while a window is open; crossing it closes
    the window early and stops profiling. null = off."""
    min_available_memory_gb: float | None = None
    """Floor on the host's available memory (MemAvailable, GB = 1e9 bytes) while a window is open; crossing it
    closes the window early and stops profiling. null = off."""
    max_trace_mb: float | None = None
    """Limit on one window's trace size (uncompressed JSON, MB = 1e6 bytes), estimated from the C heap's growth
    since the window's first recorded step (times 1.4): a proxy that errs towards stopping early. null = off."""
    max_export_share: float | None = 0.25
    """The share (0 < x <= 1) of the job's collective timeout that closing a window may hold the training thread,
    estimated at each step end of an open window from its estimated trace size (as ``max_trace_mb``) times
    50 ns per byte (written in the background) or 300 ns (inline); when over, the window is shortened (closed at
    once, ``stopped_by: export_budget``, one warning) and later windows still open. Backend torch only; the timeout
    is the default process group's, else ``collective_timeout_s``, else unknown (then off). null = off."""
    collective_timeout_s: float | None = None
    """The job's collective timeout in seconds, for ``max_export_share`` where torch.distributed's default process
    group is not initialized in this process (its own timeout wins when it is). null = unknown."""
    # On-demand capture (`distprof trigger RUN_DIR --steps N`, distprof.trigger()): the profiler also looks for
    # capture requests in save_path/.requests, at most every trigger_poll_s seconds (monotonic clock, checked at
    # step() ends). trigger: true turns profiling on like enable; with neither steps nor schedule, nothing is
    # captured until a request comes. DISTPROF_TRIGGER=1 opts a job in without editing it.
    trigger: bool = False
    """On-demand capture: look for requests sent with ``distprof trigger RUN_DIR`` in save_path; with neither
    steps nor schedule nothing is captured until one comes. Backend torch or cuda_memory, not discrete."""
    trigger_poll_s: float = 2.0
    """Seconds between looks for capture requests (0 to 3600), checked when ``step()`` ends."""
    trigger_max_steps: int = 20
    """The most steps one capture request may record (1 to 10,000); a request for more is refused."""
    engine: EngineConfig | None = None
    """The rollout engine (vLLM, SGLang) whose own profiler this role drives at its windows; null = none."""
    # Always-on step telemetry and the watcher (docs/telemetry.md): every rank of every role, selected for capture
    # or not, keeps its step times without torch.profiler; the watcher finds the slow rank and asks for a capture.
    telemetry: bool = False
    """Keep every rank's step wall time and time per outermost ``annotate`` phase in a small rotating stream in the
    run directory ({role}/rank{R}/telemetry.jsonl), on every rank, profiled or not. Needs save_path."""
    telemetry_options: TelemetryOptions = Field(default_factory=TelemetryOptions)
    """How often the telemetry stream is written and its size bound."""
    detect: bool = False
    """Run the watcher in the job (a process started by the lowest rank of each role that keeps telemetry): it
    reads every rank's telemetry, records detections in detections.jsonl and, with ``trigger: true``, captures
    the slow rank and a healthy peer and diagnoses them. Needs telemetry."""
    detection: DetectOptions = Field(default_factory=DetectOptions)
    """The watcher's rules, thresholds and capture limits."""
    hang: HangOptions = Field(default_factory=HangOptions)
    """Hang evidence (docs/hang.md): every rank's collective history and a watchdog that, after ``timeout_s``
    without a step ending, writes the history, all threads' stacks and the open window into the run directory."""

    # ---- field checks ---------------------------------------------------------------
    @field_validator("hang", mode="before")
    @classmethod
    def _hang(cls, v: Any) -> Any:
        return {"enabled": v} if isinstance(v, bool) else v  # hang: true

    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, v: Any) -> str:
        if v not in BACKENDS:
            tip = suggest(v, BACKENDS)
            raise ValueError(f"backend {show(v)} is unknown; {tip + ' ' if tip else ''}"
                             f"choose one of {', '.join(BACKENDS)}")
        return v

    @field_validator("on_error", mode="before")
    @classmethod
    def _on_error(cls, v: Any) -> str:
        if v not in ("disable", "raise"):
            raise ValueError(f"on_error {show(v)} is unknown; use 'disable' (log once, keep training) or 'raise'")
        return v

    @field_validator("ranks", mode="before")
    @classmethod
    def _ranks(cls, v: Any) -> Any:
        fix = "use 'all', a list of global ranks such as [0, 8], or mesh coordinates such as {pp: '*', tp: 0}"
        if isinstance(v, Mapping):
            return {k: (list(x) if isinstance(x, tuple) else x) for k, x in parse_coordinate_selection(v).items()}
        if isinstance(v, str):
            if v.strip().lower() == "all":
                return "all"
            v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"ranks must be 'all' or a list, got {show(v)}; {fix}")
        if not v:
            raise ValueError(f"ranks is empty, so no rank would capture; {fix}")
        return sorted({non_negative_int("ranks", r, fix) for r in v})

    @field_validator("per_node", mode="before")
    @classmethod
    def _per_node(cls, v: Any) -> Any:
        if v is None:
            return None
        n = non_negative_int("per_node", v, "use a number of local ranks per node >= 1, e.g. per_node: 1")
        if n < 1:
            raise ValueError("per_node must be >= 1 (0 would select no rank); use per_node: 1 for rank 0 of every node")
        return n

    @field_validator("per_role", mode="before")
    @classmethod
    def _per_role(cls, v: Any) -> Any:
        if v is None:
            return {}
        v = _mapping_of(v) if isinstance(v, Mapping) else v
        if not isinstance(v, Mapping):
            raise ValueError(f"per_role must map role names to settings, got {show(v)}; "
                             f"e.g. per_role: {{actor: {{ranks: all}}}}")
        check_roles("per_role", v, "entries")
        out, problems = {}, []  # every role's problems at once
        for role, over in v.items():
            where = f"per_role.{_cut(str(role), 60)}"
            try:
                check_role_name("per_role", role)
            except ValueError as e:  # the name itself: no field of a role to name
                problems.append(problem("per_role", role, str(e)))
                continue
            over = _mapping_of(over) if isinstance(over, Mapping) else over
            bad = sorted(set(over) & _NOT_PER_ROLE) if isinstance(over, Mapping) else []
            if not isinstance(over, Mapping):
                problems.append(problem(where, over, f"{where} must be a mapping of settings, got {show(over)}; "
                                                      "e.g. {ranks: all}"))
            elif bad:
                problems.append(problem(where, over, f"{where} sets {', '.join(bad)}, which are the same for every "
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
    def _limit(cls, v: Any, info: ValidationInfo) -> Any:
        unit = "MB" if info.field_name == "max_trace_mb" else "GB"
        fix = (f"give a number of {unit} > 0 (e.g. {info.field_name}: {500 if unit == 'MB' else 8}), "
               "or null to turn it off")
        return _positive_or_none(str(info.field_name), v, fix)

    @field_validator("max_export_share", "collective_timeout_s", mode="before")
    @classmethod
    def _export_budget(cls, v: Any, info: ValidationInfo) -> Any:
        share = info.field_name == "max_export_share"
        fix = ("give a share of the collective timeout with 0 < x <= 1 (e.g. max_export_share: 0.25), or null to "
               "turn the check off" if share else "give the timeout in seconds > 0 (e.g. collective_timeout_s: 600), "
               "or null (unknown: the check then needs an initialized process group)")
        return _positive_or_none(str(info.field_name), v, fix, at_most=1.0 if share else None)

    @field_validator("roles", mode="before")
    @classmethod
    def _roles(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, str):
            v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"roles must be null (every role) or a non-empty list of role names, got {show(v)}")
        check_roles("roles", v)
        return [check_role_name("roles", r) for r in v]

    @field_validator("steps", mode="before")
    @classmethod
    def _steps(cls, v: Any) -> Any:
        return None if v is None else parse_steps(v)

    @field_validator("save_path", mode="before")
    @classmethod
    def _save_path(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, os.PathLike):
            v = os.fspath(v)
        if not isinstance(v, str):
            raise ValueError(f"save_path must be a path or URL string, got {show(v)}")
        bad = control_char(v)
        if bad is not None:
            # A NUL cuts the path short in the OS, a newline forges log lines: neither is ever meant.
            raise ValueError(f"save_path {show(v)} contains the control character {bad!r}; "
                             "give a plain directory or URL, e.g. save_path: runs/exp1/profile")
        return v.strip()

    @field_validator("trigger_poll_s")
    @classmethod
    def _trigger_poll(cls, v: float) -> float:
        if not (math.isfinite(v) and 0 <= v <= 3600):
            raise ValueError(f"trigger_poll_s must be a number of seconds from 0 to 3600, got {show(v)}; it is how "
                             "often a process looks for capture requests (default 2)")
        return v

    @field_validator("trigger_max_steps")
    @classmethod
    def _trigger_max(cls, v: int) -> int:
        if not 1 <= v <= 10_000:
            raise ValueError(f"trigger_max_steps must be from 1 to 10000, got {show(v)}; it bounds how many steps one "
                             "capture request may record")
        return v

    # ---- whole-config checks ----------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _apply_env(cls, data: Any, info: ValidationInfo) -> Any:
        if data is None:
            data = {}
        run = RUN.get()
        if isinstance(data, Mapping) and not (info.context or {}).get("no_env") and not (run and run.no_env):
            return env_overrides(dict(data), os.environ, run and run.sources, run and run.problems)
        return data

    @model_validator(mode="after")
    def _consistent(self, info: ValidationInfo) -> ProfilerConfig:
        # fields_only: a part of a config checked alone (a role's settings, a dialect's fields one by one)
        fields_only = (info.context or {}).get("fields_only")
        problems = [] if fields_only else [problem("", value, text) for value, text in self._conflicts()]
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
        out: list[tuple[Any, str]] = []
        if self.steps is not None and self.schedule is not None:
            out.append((self.steps, f"steps={show(self.steps)} and schedule are both set; they are exclusive: keep "
                                    "steps for explicit global steps or schedule for a periodic pattern"))
        if self.discrete and self.backend in PROCESS_BACKENDS:
            out.append((self.backend,
                        f"discrete=True needs an in-process backend, but backend is {self.backend!r} "
                        "(it wraps the whole "
                        "worker process); use backend torch or cuda_memory, or drop discrete"))
        if self.trigger and (self.discrete or self.backend not in ("torch", "cuda_memory")):
            out.append((self.backend,
                f"trigger=True needs backend torch or cuda_memory without discrete mode (got backend "
                f"{self.backend!r}{', discrete' if self.discrete else ''}): a requested window opens at a step "
                "boundary; use backend torch, or drop trigger"))
        if self.trigger and not self.enable and not self.save_path:
            out.append((self.save_path,
                        f"save_path is {show(self.save_path)} but trigger=True; set save_path to the directory or URL "
                        "where requests are sent and traces written (e.g. DISTPROF_SAVE_PATH=...)"))
        if (self.telemetry or self.detect) and not self.save_path:
            out.append((self.save_path, f"save_path is {show(self.save_path)} but telemetry=True; set save_path to "
                                        "a local or shared directory where every rank can write its stream"))
        if self.telemetry and self.save_path and is_url(self.save_path):
            out.append((self.save_path, f"save_path is {show(self.save_path)} but telemetry=True appends to its stream "
                                        "in place, which an object store cannot do; use a local or shared "
                                        "(mounted) directory as save_path, or drop telemetry"))
        if self.hang.enabled and (not self.save_path or is_url(self.save_path)):
            out.append((self.save_path, f"save_path is {show(self.save_path)} but hang.enabled=True writes every "
                                        "rank's evidence in place; set save_path to a local or shared (mounted) "
                                        "directory, or drop hang"))
        if self.detect and not self.telemetry:
            out.append((self.detect, "detect=True reads the ranks' telemetry, but telemetry is off; set "
                                     "telemetry: true too (or drop detect)"))
        if self.enable and not self.save_path:
            out.append((self.save_path, f"save_path is {show(self.save_path)} but enable=True; set save_path to a "
                                        "directory or URL "
                                        "(e.g. save_path: runs/exp1/profile, or DISTPROF_SAVE_PATH=...)"))
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
        if isinstance(self.ranks, dict):
            if mesh is None:
                raise ValueError(
                    f"ranks selects by mesh coordinates {show(self.ranks)}, but no mesh was given; pass the job's "
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
        data = _mapping_of(data)
        if section:
            data = select(data, section)
        return cls.model_validate(data if data is not None else {})

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> ProfilerConfig:
        """A config recorded in run.json, exactly as it was (this process's DISTPROF_* variables do not apply)."""
        return cls.model_validate(dict(data), context={"no_env": True})

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, section: str | None = None) -> ProfilerConfig:
        """From a config file: the whole file, a top-level ``distprof:`` / ``profiler:`` section, or ``section``.

        The file is untrusted: YAML is read with yaml's safe loader (no ``!!python/...`` tags), at most 4 MB, and
        refused when nesting or anchors/aliases would expand it past a config's size; every error names the file
        and line. A ``.json`` or ``.toml`` file is read as JSON or TOML (:func:`distprof.config.load.load_file`,
        as ``distprof validate`` reads it).
        """
        return cls.from_dict(*load_mapping(path, cls.model_fields, section))

    @classmethod
    def from_dialect(cls, name: str, cfg: Any, section: str | None = None) -> ProfilerConfig:
        """From the config another framework's users already write: ``name`` is one of verl, skyrl, slime, swift,
        rlinf, torchtitan, nemo_rl (see ``distprof.config.dialects``). One ConfigError lists every error; each field not
        honoured is logged by its dotted key (a key the dialect does not know as a warning), and so are warnings.
        ``distprof validate FILE --dialect NAME`` shows the mapping and what was dropped."""
        return to_config(name, cfg, section, config=cls)

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
        file, flags = flag_values(args, prefix)
        data = dict(_mapping_of(base) or {})
        if file is not None:
            over, section = load_mapping(file, cls.model_fields, None)
            data = _deep_merge(data, select(over, section) if section else over)
        sources: dict[tuple[str, ...], str] = {}
        for field, (value, label) in flags.items():
            data[field] = value
            sources[(field,)] = label
            if field == "steps":
                data["schedule"] = None
        return cls.validate_with_sources(data, sources)


_NOT_PER_ROLE = {"save_path", "on_error", "roles", "per_role"}


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top; nested sections (torch, schedule ...) merge key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


def _mapping_of(data: Any) -> Any:
    """A config given in code as plain data: a mapping as it is, an OmegaConf config resolved by OmegaConf (the
    job's own config, in its own process), a ProfilerConfig as its fields; None stays None."""
    if data is None or (isinstance(data, Mapping) and not is_omegaconf(data)):
        return data
    if is_omegaconf(data):
        return to_plain(data, resolve=True)
    if isinstance(data, ProfilerConfig):
        return data.model_dump()
    raise error(f"cannot read a profiler config from {type(data).__name__}; pass a dict, a YAML path or an "
                "OmegaConf object")


def env_overrides(data: dict[str, Any], environ: Mapping[str, str], sources: dict[tuple[str, ...], str] | None = None,
                  problems: list[ConfigProblem] | None = None) -> dict[str, Any]:
    """``data`` with every ``DISTPROF_*`` variable of ``environ`` applied on top (:func:`.env.env_overrides` for
    ProfilerConfig's fields)."""
    return _apply_env_overrides(ProfilerConfig, data, environ, sources, problems)


def _env_fields() -> dict[str, tuple[str, ...]]:
    """Every DISTPROF_* variable that is a setting, and the field it sets (tests list them)."""
    return env_fields(ProfilerConfig)
