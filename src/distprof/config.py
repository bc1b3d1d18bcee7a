"""ProfilerConfig: every capture setting, validated once, loadable from anywhere.

Sources, weakest first: defaults < dict / YAML / OmegaConf < ``DISTPROF_*``
environment variables. The environment wins so that a job can be profiled
without editing its code or its config (``DISTPROF_ENABLE=1
DISTPROF_SAVE_PATH=/tmp/p python train.py``).

Every unusable setting raises ``ValueError`` (pydantic's ``ValidationError`` is
one) naming the field, the value and the fix.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import typing
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .plan import Plan, Schedule

__all__ = ["ProfilerConfig", "ScheduleConfig", "TorchOptions", "BACKENDS", "ENV_PREFIX"]

ENV_PREFIX = "DISTPROF_"
BACKENDS = ("torch", "cuda_memory", "nsys", "rocprof_sys", "py_spy", "memray")
ACTIVITIES = ("cpu", "cuda", "xpu")
_MAX_STEPS = 1_000_000  # an explicit step list longer than this is a typo, not a plan


def _did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f" Did you mean {close[0]!r}?" if close else ""


class _Strict(BaseModel):
    """Unknown keys are refused, with a suggestion for the likely typo."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _reject_unknown(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            known = list(cls.model_fields)
            for key in data:
                if key not in cls.model_fields:
                    raise ValueError(
                        f"unknown setting {key!r} in {cls.__name__} (value {data[key]!r}); "
                        f"valid settings are {', '.join(known)}.{_did_you_mean(str(key), known)}"
                    )
        return data


def _non_negative_int(field: str, value: Any, fix: str) -> int:
    # bool is an int subclass; True as a step or rank is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value.strip())
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{field} must hold whole numbers, got {value!r}; {fix}")
    if value < 0:
        raise ValueError(f"{field} must not be negative, got {value!r}; {fix}")
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

    activities: list[str] = Field(default_factory=lambda: ["cpu", "cuda"])
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

    @field_validator("activities", mode="before")
    @classmethod
    def _activities(cls, v: Any) -> list[str]:
        fix = f"list one or more of {', '.join(ACTIVITIES)}"
        if v is None:
            raise ValueError(f"torch.activities must be a list, got null; {fix}")
        if isinstance(v, str):
            v = [p for p in re.split(r"[,\s]+", v) if p]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"torch.activities must be a non-empty list, got {v!r}; {fix}")
        out = []
        for a in v:
            name = str(a).lower()
            if name not in ACTIVITIES:
                raise ValueError(f"torch.activities has unknown activity {a!r}; {fix}")
            if name not in out:
                out.append(name)
        return out

    @model_validator(mode="after")
    def _exports(self) -> "TorchOptions":
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
    finalize_timeout_s: float = 120.0  # how long collect() waits for the tool to finish writing after a worker ends

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError(f"options must be a mapping of option name to value, got {v!r}; e.g. {{t: cuda,nvtx}}")
        for k, val in v.items():
            if not isinstance(k, str) or not _OPTION_KEY.fullmatch(k):
                raise ValueError(
                    f"options key {k!r} is not an option name; write it without dashes, e.g. 't' or 'capture-range'"
                )
            if val is None or isinstance(val, (list, dict)):
                raise ValueError(f"options[{k!r}] = {val!r} must be a single value; put bare switches in flags")
        return dict(v)

    @field_validator("flags", mode="before")
    @classmethod
    def _flags(cls, v: Any) -> Any:
        if v is None:
            return []
        if isinstance(v, str):
            v = [v]
        out = []
        for f in v:
            name = str(f).lstrip("-")
            if not _OPTION_KEY.fullmatch(name):
                raise ValueError(f"flags entry {f!r} is not a flag name; write e.g. 'python-backtrace' (no '=' or spaces)")
            out.append(name)
        return out

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, Mapping):
            raise ValueError(f"env must be a mapping of variable name to value, got {v!r}")
        for k in v:
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"env variable name {k!r} is not valid; use letters, digits and '_'")
        return {k: str(val) for k, val in v.items()}


class NsysOptions(ProcessOptions):
    options: dict[str, str | int | float | bool] = Field(default_factory=lambda: {"t": "cuda,cudnn,cublas,nvtx"})


class RocprofSysOptions(ProcessOptions):
    pass


class PySpyOptions(ProcessOptions):
    rate: int = 100
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
        if v < 1:
            raise ValueError(f"cuda_memory.max_entries must be >= 1, got {v}; it bounds the allocator history kept")
        return v


PROCESS_BACKENDS = ("nsys", "rocprof_sys", "py_spy", "memray")


def _parse_steps(v: Any) -> list[int]:
    """Steps from ints, "A-B" ranges, or one string such as "3,10,20-25"."""
    fix = "give global step numbers >= 0, e.g. [3, 10] or '20-25'"
    if isinstance(v, str):
        v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"steps must be a list of global steps, got {v!r}; {fix}")
    out: set[int] = set()
    for item in v:
        m = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", item) if isinstance(item, str) else None
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if b < a:
                raise ValueError(f"steps range {item!r} ends before it starts; write it as 'START-END' with START <= END")
            out.update(range(a, b + 1))
        else:
            out.add(_non_negative_int("steps", item, fix))
        if len(out) > _MAX_STEPS:
            raise ValueError(f"steps lists more than {_MAX_STEPS} steps; {fix} (use schedule for periodic capture)")
    if not out:
        raise ValueError(f"steps is empty, so nothing would be captured; {fix}, or remove steps to use a schedule")
    return sorted(out)


def _check_role_name(field: str, role: Any) -> str:
    if not isinstance(role, str) or not role.strip():
        raise ValueError(f"{field} has an empty or non-string role name {role!r}; use names such as 'actor' or 'rollout'")
    p = PurePosixPath(role.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or role.startswith("~"):
        raise ValueError(
            f"{field} role {role!r} would write outside save_path; use a relative name without '..', such as 'actor/micro_step'"
        )
    return role


class ProfilerConfig(_Strict):
    """Everything a Profiler needs. See the README's configuration table."""

    enable: bool = False
    backend: str = "torch"
    save_path: str | None = None
    # Global ranks: [0] (default), "all", a list, or mesh coordinates {pp: "*", tp: 0, dp: 0} (the Profiler is
    # then given the job's mesh: a torch DeviceMesh, or {dim: size} outermost first; see distprof.mesh).
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

    # ---- field checks ---------------------------------------------------------------
    @field_validator("backend", mode="before")
    @classmethod
    def _backend(cls, v: Any) -> str:
        if v not in BACKENDS:
            raise ValueError(f"backend {v!r} is unknown; choose one of {', '.join(BACKENDS)}.{_did_you_mean(str(v), list(BACKENDS))}")
        return v

    @field_validator("on_error", mode="before")
    @classmethod
    def _on_error(cls, v: Any) -> str:
        if v not in ("disable", "raise"):
            raise ValueError(f"on_error {v!r} is unknown; use 'disable' (log once, keep training) or 'raise'")
        return v

    @field_validator("ranks", mode="before")
    @classmethod
    def _ranks(cls, v: Any) -> Any:
        fix = "use 'all', a list of global ranks such as [0, 8], or mesh coordinates such as {pp: '*', tp: 0}"
        if isinstance(v, Mapping):
            from .mesh import parse_coordinate_selection

            return {k: (list(x) if isinstance(x, tuple) else x) for k, x in parse_coordinate_selection(v).items()}
        if isinstance(v, str):
            if v.strip().lower() == "all":
                return "all"
            v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"ranks must be 'all' or a list, got {v!r}; {fix}")
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
            raise ValueError(f"per_role must map role names to settings, got {v!r}; e.g. per_role: {{actor: {{ranks: all}}}}")
        out = {}
        for role, over in v.items():
            _check_role_name("per_role", role)
            over = _to_plain(over)
            if not isinstance(over, Mapping):
                raise ValueError(f"per_role.{role} must be a mapping of settings, got {over!r}; e.g. {{ranks: all}}")
            bad = sorted(set(over) & _NOT_PER_ROLE)
            if bad:
                raise ValueError(f"per_role.{role} sets {', '.join(bad)}, which are the same for every role; "
                                 "set them at the top level")
            out[role] = dict(over)
        return out

    @field_validator("roles", mode="before")
    @classmethod
    def _roles(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, str):
            v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
        if not isinstance(v, (list, tuple)) or not v:
            raise ValueError(f"roles must be null (every role) or a non-empty list of role names, got {v!r}")
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
            raise ValueError(f"save_path must be a path or URL string, got {v!r}")
        return v.strip()

    # ---- whole-config checks ----------------------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _apply_env(cls, data: Any, info) -> Any:
        if data is None:
            data = {}
        if isinstance(data, Mapping) and not (info.context or {}).get("no_env"):
            return env_overrides(dict(data), os.environ)
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "ProfilerConfig":
        if self.steps is not None and self.schedule is not None:
            raise ValueError(
                f"steps={self.steps} and schedule are both set; they are exclusive: keep steps for explicit "
                "global steps or schedule for a periodic pattern"
            )
        if self.discrete and self.backend in PROCESS_BACKENDS:
            raise ValueError(
                f"discrete=True needs an in-process backend, but backend is {self.backend!r} (it wraps the whole "
                "worker process); use backend torch or cuda_memory, or drop discrete"
            )
        for role in self.per_role:
            try:
                self._merged(role)
            except ValidationError as e:
                inner = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'config'}: {x['msg'].removeprefix('Value error, ')}"
                                  for x in e.errors())
                raise ValueError(f"per_role.{role}: {inner}") from None
        if self.enable and not self.save_path:
            raise ValueError(
                f"save_path is {self.save_path!r} but enable=True; set save_path to a directory or URL "
                "(e.g. save_path: runs/exp1/profile, or DISTPROF_SAVE_PATH=...)"
            )
        return self

    # ---- per role -----------------------------------------------------------------------
    def for_role(self, role: str) -> "ProfilerConfig":
        """The config ``role`` runs with: this one with the first matching ``per_role`` entry applied."""
        for pattern in self.per_role:
            if role == pattern or fnmatch.fnmatchcase(role, pattern):
                return self._merged(pattern)
        return self

    def _merged(self, pattern: str) -> "ProfilerConfig":
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

    def plan(self) -> Plan:
        if self.steps is not None:
            return Plan.from_steps(self.steps)
        if self.whole_lifetime:
            return Plan.forever()
        return Plan.from_schedule(self.effective_schedule.to_plan())

    def window_count(self) -> int | None:
        """How many windows the plan has (None: unbounded, e.g. schedule repeat=0 or whole lifetime)."""
        if self.steps is not None:
            return len(self.plan().windows)
        if self.whole_lifetime or self.effective_schedule.repeat == 0:
            return None
        return self.effective_schedule.repeat

    def selects_rank(self, rank: int, world_size: int, mesh: Any = None, local_rank: int | None = None) -> bool:
        """Does this config capture on ``rank``? ``mesh`` is needed for coordinate selections; ``local_rank`` for
        ``per_node``. Raises ValueError when the selection cannot be judged (no mesh, a dimension it lacks)."""
        from .mesh import RankMesh, check_against_mesh, mesh_selected, node_selected

        if isinstance(self.ranks, dict):
            if mesh is None:
                raise ValueError(
                    f"ranks selects by mesh coordinates {self.ranks}, but no mesh was given; pass the job's "
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
    def from_dict(cls, data: Any, section: str | None = None) -> "ProfilerConfig":
        """From a mapping or an OmegaConf DictConfig; ``section`` is a dotted path to a nested part."""
        data = _to_plain(data)
        if section:
            data = _select(data, section)
        return cls.model_validate(data if data is not None else {})

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> "ProfilerConfig":
        """A config recorded in run.json, exactly as it was (this process's DISTPROF_* variables do not apply)."""
        return cls.model_validate(dict(data), context={"no_env": True})

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, section: str | None = None) -> "ProfilerConfig":
        """From a YAML file: the whole file, a top-level ``distprof:`` / ``profiler:`` section, or ``section``."""
        import yaml

        text = Path(path).read_text()
        data = yaml.safe_load(text) or {}
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: expected a mapping at the top of the YAML file, got {type(data).__name__}")
        if section is None and not (set(data) & set(cls.model_fields)):
            for key in ("distprof", "profiler"):
                if key in data:
                    section = key
                    break
        return cls.from_dict(data, section=section)


_NOT_PER_ROLE = {"save_path", "on_error", "roles", "per_role"}


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over`` on top; nested sections (torch, schedule ...) merge key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else v
    return out


DEFAULT_SCHEDULE = ScheduleConfig(skip_first=10, wait=0, warmup=1, active=2, repeat=1)


def _to_plain(data: Any) -> Any:
    if data is None or isinstance(data, Mapping) and not _is_omegaconf(data):
        return data
    if _is_omegaconf(data):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(data, resolve=True)
    if isinstance(data, ProfilerConfig):
        return data.model_dump()
    raise ValueError(f"cannot read a profiler config from {type(data).__name__}; pass a dict, a YAML path or an OmegaConf object")


def _is_omegaconf(obj: Any) -> bool:
    return type(obj).__module__.startswith("omegaconf")


def _select(data: Any, section: str) -> Any:
    cur = data
    for part in section.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            raise ValueError(f"config section {section!r} not found (missing {part!r}); check the dotted path")
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
        out.pop(f"{ENV_PREFIX}{section.upper()}", None)
        for name, sub in model.model_fields.items():
            if typing.get_origin(sub.annotation) is dict:
                continue  # mappings (options, env) are set in config files, not one variable
            out[f"{ENV_PREFIX}{section.upper()}_{name.upper()}"] = (section, name)
    return out


# Variables with this prefix that are not config fields but are ours too.
_ENV_OTHER = {f"{ENV_PREFIX}LOG_LEVEL"}


def env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """Return ``data`` with every ``DISTPROF_*`` variable applied on top."""
    fields = None
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in _ENV_OTHER:
            continue
        fields = fields or _env_fields()
        if key not in fields:
            raise ValueError(
                f"environment variable {key}={raw!r} is not a distprof setting; "
                f"valid ones include {', '.join(sorted(fields)[:6])}, ...{_did_you_mean(key, list(fields))}"
            )
        value: Any = raw
        if raw.strip().lower() in ("null", "none", ""):
            value = None
        path = fields[key]
        if len(path) == 1:
            data[path[0]] = value
        else:
            section = data.get(path[0])
            section = dict(_to_plain(section) or {}) if not isinstance(section, BaseModel) else section.model_dump()
            section[path[1]] = value
            data[path[0]] = section
    return data
