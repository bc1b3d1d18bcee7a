"""How a config problem reads: :class:`ConfigError` and the helpers that write its lines.

One line per problem, always in the same order: where (the dotted field, ``per_role.actor.torch.record_shape``,
or the ``DISTPROF_*`` variable / command-line flag the value came from), the wrong value, what is wrong, then the
suggestion (``did you mean 'record_shapes'?``) and only then, if at all, a short hint. A line never lists every
valid setting: at most three close matches, the section's few settings when nothing is close, or a pointer to
the README's Configuration table. The same problem is never listed twice.

Config is untrusted input, so values are shown cut short and a line is at most 400 characters. Pure: no pydantic
model is imported here (config/model.py hands in the model class to look setting names up). The record itself,
:class:`~distprof.util.problem.Problem` (with ``MISSING``, ``Unresolved``, ``show``, ``cut``, ``clip``, ``short``),
lives on the ground floor in ``distprof.util.problem``, the one problem record of every layer; it is re-exported here.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from distprof.util.problem import MAX_SHOWN, MISSING, Problem, Unresolved, clip, cut, short, show

__all__ = [
    "MAX_SHOWN",
    "MISSING",
    "README_TABLE",
    "ConfigError",
    "ConfigFileError",
    "ConfigProblem",
    "FieldError",
    "Problem",
    "Problems",
    "Unresolved",
    "clip",
    "cut",
    "error",
    "file_error",
    "from_pydantic",
    "label_of",
    "nest",
    "short",
    "show",
    "suggest",
    "unknown",
]

MAX_MESSAGE = 400  # characters of one problem's line
MAX_LINES = 20  # lines spelled out in str(ConfigError); .problems holds all
MAX_TEXT = 1800  # characters of str(ConfigError) before the rest is only counted
MAX_LISTED_KEYS = 6  # a section with at most this many settings is listed when no name is close
README_TABLE = "see the Configuration table in the README"

ConfigProblem = Problem  # the name ConfigError's problems have always had


class ConfigError(ValueError):
    """Every problem of a config at once. ``str()`` is one line per problem (a ``title`` line first when given),
    readable without pydantic; past 20 lines or about 1,800 characters the rest is counted, ``.problems`` holds
    them all. A problem met twice (the same line) is kept once."""

    def __init__(self, problems: Iterable[Problem], title: str | None = None):
        self.problems = list({p.message: p if isinstance(p, Problem) else Problem(*p) for p in problems}.values())
        self.title = title
        lines = [title] if title else []
        size = sum(map(len, lines))
        for i, p in enumerate(self.problems):
            if i >= MAX_LINES or size + len(p.message) > MAX_TEXT:
                lines.append(f"... and {len(self.problems) - i} more problems")
                break
            lines.append(p.message)
            size += len(p.message) + 1
        super().__init__("\n".join(lines))

    @property
    def errors(self) -> list[Problem]:
        return self.problems

    def __reduce__(self) -> tuple[Any, ...]:
        # Ray and multiprocessing pickle a worker's exception; the default would rebuild it from the message.
        return (type(self), (self.problems, self.title))


class ConfigFileError(ConfigError):
    """A config file (or object) that cannot be read as a config: one problem, whose line names the file and
    says why (missing, not a regular file, too big, not UTF-8, not valid YAML/JSON/TOML, too deep, too many
    values once aliases are expanded)."""


def file_error(message: str) -> ConfigFileError:
    return ConfigFileError([problem("", None, message)])


class FieldError(ValueError):
    """A whole-config check's error that knows which field it is about (pydantic files those under no field)."""

    def __init__(self, field: str, value: Any, message: str):
        super().__init__(message)
        self.field, self.value = field, value


class Problems(ValueError):
    """Several problems found by one validator (every role of per_role, every whole-config rule), each already a
    line with its field relative to the model that raised it."""

    def __init__(self, problems: Sequence[Problem]):
        super().__init__("; ".join(p.message for p in problems))
        self.problems = list(problems)


def error(message: str, field: str = "", value: Any = None) -> ConfigError:
    return ConfigError([problem(field, value, message)])


def problem(field: str, value: Any, message: str) -> Problem:
    """A validation's problem: ``value`` shown short, the line cut to 400 characters."""
    return Problem(field, show(value), cut(message, MAX_MESSAGE))


def suggest(name: Any, choices: Iterable[str], prefix: str = "") -> str:
    """``did you mean 'x'?``: the closest names (up to three, as close as the best), or "" when none is close.
    ``prefix`` (e.g. ``DISTPROF_``) is left out of the comparison, so that names are not close for sharing it."""
    name = str(name)
    if len(name) > 100:  # difflib indexes every character: a huge name would cost hundreds of MB
        return ""
    tails = {c[len(prefix):]: c for c in choices if c.startswith(prefix)}
    close = difflib.get_close_matches(name[len(prefix):] if name.startswith(prefix) else name, list(tails), n=3)
    if not close:
        return ""
    best = difflib.SequenceMatcher(None, name, tails[close[0]]).ratio()
    names = [repr(tails[c]) for c in close if difflib.SequenceMatcher(None, name, tails[c]).ratio() >= best - 0.05]
    return f"did you mean {' or '.join(names) if len(names) < 3 else ', '.join(names[:-1]) + ' or ' + names[-1]}?"


def _key(key: Any) -> str:
    text = str(key) if isinstance(key, str) else show(key, 40)
    return text if re.fullmatch(r"[\w.-]{1,80}", text) else show(key, 40)


def unknown(path: str, key: Any, value: Any, known: Sequence[str], what: str = "setting",
            hint: str | None = None) -> Problem:
    """``path.key=value: unknown setting; did you mean ...?`` (or the few settings of a small section, or
    ``hint``, or the README's table when nothing is close)."""
    field = f"{path}.{_key(key)}" if path else _key(key)
    tip = suggest(key, known)
    if not tip:
        tip = hint or (f"{path or 'the config'} takes {', '.join(known)}" if 0 < len(known) <= MAX_LISTED_KEYS
                       else README_TABLE)
    return problem(field, value, f"{field}={show(value)}: unknown {what}; {tip}")


_LABEL = re.compile(r"(DISTPROF_[A-Z0-9_]+=|--[a-z][a-z0-9-]*[ :])")


def label_of(p: Problem) -> str | None:
    """The ``DISTPROF_*`` variable or flag a problem's value came from (its line starts with it), else None."""
    if not _LABEL.match(p.message):
        return None
    return re.split(r"[= :]", p.message, maxsplit=1)[0]


def nest(p: Problem, prefix: str) -> Problem:
    """``p`` found in a part of the config that sits at ``prefix`` (``per_role.actor``): its field and its line
    name the full dotted path. A problem that names the variable or flag it came from stays as it is."""
    if label_of(p):
        return p
    field = f"{prefix}.{p.field}" if p.field else prefix
    text = f"{prefix}.{p.message}" if p.field and p.message.startswith(p.field) else f"{prefix}: {p.message}"
    return Problem(field, p.value, cut(text, MAX_MESSAGE))


# ---- pydantic's errors, in these words ---------------------------------------------------------------------
_PYDANTIC_TYPES = {
    "bool_parsing": "expected 0/1/true/false", "bool_type": "expected 0/1/true/false",
    "int_parsing": "expected a whole number", "int_type": "expected a whole number",
    "int_from_float": "expected a whole number", "float_parsing": "expected a number",
    "float_type": "expected a number", "finite_number": "expected a finite number",
    "string_type": "expected a string", "list_type": "expected a list",
    "dict_type": "expected a mapping", "model_type": "expected a mapping of settings",
    "model_attributes_type": "expected a mapping of settings",
}


_TAG = re.compile(r"[a-z_]+\[.*\]")  # a union member's tag in an error's location


def _model_at(root: Any, names: Sequence[str]) -> Any:
    """The pydantic model class at ``names`` below ``root`` (through Optional / unions), or None."""
    cls = root
    for name in names:
        field = getattr(cls, "model_fields", {}).get(name)
        if field is None:
            return None
        cls = next((t for t in (field.annotation, *typing.get_args(field.annotation))
                    if isinstance(t, type) and hasattr(t, "model_fields")), None)
    return cls


def _one(err: Mapping[str, Any], sources: Mapping[tuple[str, ...], str], root: Any) -> list[Problem]:
    # Union member tags (e.g. "list[int]", "literal['all']") are pydantic's, not the user's: keep only the path
    # the user wrote. The last part of an unknown or non-string key is the key itself, whatever it looks like.
    loc = list(err["loc"])
    last = loc.pop() if err["type"] in ("extra_forbidden", "invalid_key") and loc else None
    parts = [p for p in loc if isinstance(p, int) or not _TAG.fullmatch(p)] + ([last] if last is not None else [])
    if err["type"] == "invalid_key":
        return [_invalid_key(parts, err.get("input"))]
    field = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).lstrip(".")
    names = tuple(p for p in parts if isinstance(p, str))
    value = err.get("input")
    if err["type"] == "extra_forbidden":
        model = _model_at(root, names[:-1])
        known = list(getattr(model, "model_fields", {}))
        return [unknown(".".join(names[:-1]), names[-1], value, known)]
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, Problems):
        return cause.problems
    if isinstance(cause, FieldError):
        field, value = f"{field}.{cause.field}" if field else cause.field, cause.value
    label = next((lab for path, lab in sorted(sources.items(), key=lambda kv: -len(kv[0]))
                  if names[: len(path)] == path), None)
    if err["type"] == "value_error":
        text = _value_error_line(err, cause, field, label)
    else:
        text = _type_error_line(err, field, value, label)
    return [problem(field, value, text)]


def _invalid_key(parts: list[Any], key: Any) -> Problem:
    """A mapping key that is not a string: named as a key, not a list index."""
    path = ".".join(str(p) for p in parts[:-1] if isinstance(p, str))
    field = f"{path}.{show(key, 40)}" if path else show(key, 40)
    return problem(field, key, f"{field}: setting names are strings, got {show(key, 40)}; {README_TABLE}")


def _value_error_line(err: Mapping[str, Any], cause: Any, field: str, label: str | None) -> str:
    """A validator's own message, led by the flag or variable the value came from, or by the field's path when
    the message does not name it already."""
    text = str(cause) if cause is not None else str(err["msg"]).removeprefix("Value error, ")
    leaf = field.rsplit(".", 1)[-1].split("[")[0]
    if label:
        return f"{label}: {text}"
    if field and not text.startswith(field):
        if "." in field and text.startswith(leaf):  # "options key ..." -> "nsys.options key ..."
            return field.rsplit(".", 1)[0] + "." + text
        if leaf not in text:
            return f"{field}: {text}"
    return text


def _type_error_line(err: Mapping[str, Any], field: str, value: Any, label: str | None) -> str:
    """pydantic's type errors in these words: ``field=value: expected ...``."""
    why = _PYDANTIC_TYPES.get(err["type"])
    if err["type"] == "literal_error":
        why = f"expected one of {(err.get('ctx') or {}).get('expected', '')}"
    why = why or str(err["msg"]).lower()
    return f"{label}: {why}" if label else f"{field or 'config'}={show(value)}: {why}"


def from_pydantic(errors: Iterable[Mapping[str, Any]], sources: Mapping[tuple[str, ...], str],
                  root: Any) -> list[Problem]:
    """pydantic's errors (``ValidationError.errors()``) as problems; ``root`` is the model validated (for the
    names a typo is compared with), ``sources`` the variable or flag that set each field."""
    seen: dict[str, Problem] = {}
    for err in errors:
        several = isinstance((err.get("ctx") or {}).get("error"), Problems)
        for p in _one(err, sources, root):
            # a union reports once per member: one problem per field (per line for a validator's several)
            seen.setdefault(p.message if several or not p.field else p.field, p)
    return list(seen.values())
