"""Environment overrides: every ``DISTPROF_<FIELD>`` / ``DISTPROF_<SECTION>_<FIELD>`` variable sets that field,
over whatever the code, a file or a flag said (README "Configuration": the environment wins, so a job is profiled
without editing its code or its config). ``ProfilerConfig`` applies them when it validates.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from distprof.config.errors import MAX_SHOWN, README_TABLE, ConfigError, ConfigProblem, cut, problem, show, suggest
from distprof.config.load import is_omegaconf, to_plain
from distprof.config.options import ScheduleConfig
from distprof.util.envvars import NOT_SETTINGS
from distprof.util.envvars import PREFIX as ENV_PREFIX

__all__ = ["ENV_PREFIX", "env_fields", "env_overrides"]


def env_fields(model: type[BaseModel]) -> dict[str, tuple[str, ...]]:
    """DISTPROF_<FIELD> and DISTPROF_<SECTION>_<FIELD> for every scalar or list field of ``model`` (the
    ProfilerConfig class)."""
    out: dict[str, tuple[str, ...]] = {}
    for name in model.model_fields:
        out[f"{ENV_PREFIX}{name.upper()}"] = (name,)
    for section, field in model.model_fields.items():
        sub_model = ScheduleConfig if section == "schedule" else field.annotation
        if not (isinstance(sub_model, type) and issubclass(sub_model, BaseModel)):
            continue
        if section != "schedule":  # DISTPROF_SCHEDULE=null removes a file's schedule (then steps can replace it)
            out.pop(f"{ENV_PREFIX}{section.upper()}", None)
        for name, sub in sub_model.model_fields.items():
            if typing.get_origin(sub.annotation) is dict:
                continue  # mappings (options, env) are set in config files, not one variable
            out[f"{ENV_PREFIX}{section.upper()}_{name.upper()}"] = (section, name)
    return out


def _typed(raw: str) -> str:
    """A variable's value as the person typed it (unquoted), unless quoting is needed to see it."""
    return raw if len(raw) <= 60 and raw.isprintable() and raw.strip() == raw and raw else show(raw, 60)


def _set(data: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Set ``path`` (a field, or a section's field) of ``data``; a section that is not a mapping is left for the
    validation to refuse by its own name."""
    if len(path) == 1:
        data[path[0]] = value
        return
    section = data.get(path[0])
    if isinstance(section, BaseModel):
        section = section.model_dump()
    elif section is None or isinstance(section, Mapping) or is_omegaconf(section):
        section = dict(to_plain(section, resolve=True))
    else:
        return
    section[path[1]] = value
    data[path[0]] = section


def env_overrides(model: type[BaseModel], data: dict[str, Any], environ: Mapping[str, str],
                  sources: dict[tuple[str, ...], str] | None = None,
                  problems: list[ConfigProblem] | None = None) -> dict[str, Any]:
    """Return ``data`` with every ``DISTPROF_*`` variable applied on top; ``sources`` learns which field each set.
    A variable that is no setting of ``model`` is a problem added to ``problems`` (raised at once when it is
    None)."""
    fields = None
    found: list[ConfigProblem] = [] if problems is None else problems
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or key in NOT_SETTINGS:
            continue
        fields = fields or env_fields(model)
        name = cut(key, MAX_SHOWN)
        if key not in fields:
            tip = suggest(name, fields, ENV_PREFIX) or (f"a variable is DISTPROF_<FIELD> or DISTPROF_<SECTION>_<FIELD> "
                                            f"(e.g. DISTPROF_TORCH_RECORD_SHAPES); {README_TABLE}")
            found.append(problem(name, raw, f"{name}={_typed(raw)}: not a distprof setting; {tip}"))
            continue
        if sources is not None:
            sources[fields[key]] = f"{key}={_typed(raw)}"
        value: Any = raw
        if raw.strip().lower() in ("null", "none", ""):
            value = None
        path = fields[key]
        if path == ("schedule",) and value is not None:
            found.append(problem(key, raw, f"{key}={_typed(raw)}: only null is accepted (it removes the schedule); "
                                            "set its fields with DISTPROF_SCHEDULE_ACTIVE=... and so on"))
            continue
        if path == ("steps",) and value is not None and not any(k.startswith(f"{ENV_PREFIX}SCHEDULE") for k in environ):
            data.pop("schedule", None)  # explicit steps from the environment replace a file's schedule, as flags do
        _set(data, path, value)
    if found and problems is None:
        raise ConfigError(found)
    return data
