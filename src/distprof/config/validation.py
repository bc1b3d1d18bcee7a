"""How a config is validated: every problem found at once, as one ``ConfigError``.

:class:`StrictModel` is the base of ``ProfilerConfig`` and of every option section: unknown keys are refused,
values are frozen, and a pydantic ``ValidationError`` becomes one ConfigError whose lines name the field (or the
``DISTPROF_*`` variable or flag the value came from), the value and the fix. The value parsers shared by the
models (whole numbers, step lists, role names) are here too. Input is bounded (:func:`.load.check_bounded`)
before pydantic walks it.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError

from distprof.config.errors import ConfigError, ConfigProblem, from_pydantic, show
from distprof.config.limits import MAX_DIGITS, MAX_STEPS
from distprof.config.load import check_bounded
from distprof.util.safetext import control_char

__all__ = ["RUN", "Run", "StrictModel", "check_role_name", "non_negative_int", "parse_steps", "validated"]


class Run(NamedTuple):
    """The validation running in this context: where values came from ({field path: "DISTPROF_X=v" or "--flag
    v"}, so a message names what the person typed; env_overrides() and from_args() fill it), the problems found
    outside pydantic's own checks (unknown DISTPROF_* variables), and whether DISTPROF_* variables apply (not for
    a config recorded in run.json). Set by validated() for the outermost validation; nested ones (per_role)
    inherit no_env."""

    sources: dict[tuple[str, ...], str]
    problems: list[ConfigProblem]
    no_env: bool


RUN: contextvars.ContextVar[Run | None] = contextvars.ContextVar("distprof_config_run", default=None)


def validated(call: Callable[[], Any], data: Any, root: Any, sources: Mapping[tuple[str, ...], str] | None = None,
              no_env: bool = False) -> Any:
    """Run a pydantic validation of ``data`` (a ``root`` model); every problem becomes one ConfigError."""
    check_bounded(data, "the config")
    outer = RUN.get()
    run = Run(dict(sources or {}), [], no_env or (outer is not None and outer.no_env))
    token = RUN.set(run)
    try:
        out = call()
    except ValidationError as e:
        raise ConfigError(run.problems + from_pydantic(e.errors(include_url=False), run.sources, root)) from None
    finally:
        RUN.reset(token)
    if run.problems:
        raise ConfigError(run.problems)
    return out


class StrictModel(BaseModel):
    """Unknown keys are refused (pydantic's extra="forbid": each one, with its path); every error is a
    ConfigError. Each field's docstring is its description (docs/configuration.md is generated from them)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, use_attribute_docstrings=True)

    def __init__(self, /, **data: Any) -> None:
        # Only a direct call (ProfilerConfig(...)) comes here: pydantic validates nested sections itself (see
        # below), so their errors reach the outer validation with their full path. A default_factory inside a
        # validation builds its section plainly.
        if RUN.get() is not None:
            super().__init__(**data)
        else:
            validated(lambda: super(StrictModel, self).__init__(**data), data, type(self))

    # pydantic would call a custom __init__ for every nested section and for model_validate, losing the validation
    # context and refusing non-string keys with a TypeError; marked as its own, it validates them itself.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        no_env = bool((kwargs.get("context") or {}).get("no_env"))
        return validated(lambda: super(StrictModel, cls).model_validate(obj, *args, **kwargs), obj, cls, None, no_env)

    @classmethod
    def validate_with_sources(cls, data: Any, sources: Mapping[tuple[str, ...], str]) -> Any:
        """Validate ``data``, naming each field in ``sources`` by the flag or variable that set it."""
        return validated(lambda: super(StrictModel, cls).model_validate(data), data, cls, sources)


def non_negative_int(field: str, value: Any, fix: str) -> int:
    """``value`` as a whole number >= 0 (a string of digits or a whole float accepted); ValueError otherwise."""
    # bool is an int subclass; True as a step or rank is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and re.fullmatch(rf"\s*-?[0-9]{{1,{MAX_DIGITS}}}\s*", value):
            value = int(value.strip())
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{field} must hold whole numbers, got {show(value)}; {fix}")
    if value < 0:
        raise ValueError(f"{field} must not be negative, got {show(value)}; {fix}")
    if value >= 10**MAX_DIGITS:
        raise ValueError(f"{field} {show(value)} is too large (more than {MAX_DIGITS} digits); {fix}")
    return value


_RANGE = re.compile(rf"\s*([0-9]{{1,{MAX_DIGITS}}})\s*-\s*([0-9]{{1,{MAX_DIGITS}}})\s*")


def parse_steps(v: Any) -> list[int]:
    """Steps from ints, "A-B" ranges, or one string such as "3,10,20-25"."""
    fix = "give global step numbers >= 0, e.g. [3, 10] or '20-25'"
    if isinstance(v, str):
        v = [p for p in re.split(r"[,\s]+", v.strip()) if p]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        v = [v]
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"steps must be a list of global steps, got {show(v)}; {fix}")
    if len(v) > MAX_STEPS:
        raise ValueError(f"steps lists more than {MAX_STEPS:,} steps; {fix} (use schedule for periodic capture)")
    spans: list[tuple[int, int]] = []
    total = 0  # steps named, overlaps counted twice: the whole list is measured before any range is built
    for item in v:
        m = _RANGE.fullmatch(item) if isinstance(item, str) else None
        if m:
            a, b = int(m.group(1)), int(m.group(2))
            if b < a:
                raise ValueError(f"steps range {show(item)} ends before it starts; write it as 'START-END' with "
                                 "START <= END")
        else:
            a = b = non_negative_int("steps", item, fix)
        spans.append((a, b))
        total += b - a + 1
        if total > MAX_STEPS:
            raise ValueError(f"steps {show(item)} brings the steps listed past {MAX_STEPS:,}; {fix} "
                             "(use schedule for periodic capture)")
    out: set[int] = set()
    for a, b in spans:
        out.update(range(a, b + 1))
    if not out:
        raise ValueError(f"steps is empty, so nothing would be captured; {fix}, or remove steps to use a schedule")
    return sorted(out)


def check_role_name(field: str, role: Any) -> str:
    """``role`` when it is a usable role name: a short printable string that stays inside save_path."""
    if not isinstance(role, str) or not role.strip():
        raise ValueError(f"{field} has an empty or non-string role name {show(role)}; use names such as 'actor' "
                         "or 'rollout'")
    if len(role) > 200 or control_char(role):
        raise ValueError(f"{field} role {show(role)} is over 200 characters or holds control characters; "
                         "use a short printable name such as 'actor/micro_step'")
    p = PurePosixPath(role.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or role.startswith("~"):
        raise ValueError(
            f"{field} role {show(role)} would write outside save_path; use a relative name without '..', such as "
            "'actor/micro_step'"
        )
    return role
