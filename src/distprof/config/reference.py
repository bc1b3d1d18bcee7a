"""docs/configuration.md, generated from the config's field docstrings (one source of truth for what each setting
does). tests/unit/config/test_config_reference.py fails when the file differs from what :func:`markdown`
produces; rewrite it with ``python -m distprof.config.reference docs/configuration.md``.
"""

from __future__ import annotations

import json
import sys
import textwrap
import typing

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from distprof.config.env import env_fields
from distprof.config.model import ProfilerConfig

__all__ = ["REGENERATE", "markdown", "undocumented"]

REGENERATE = "PYTHONPATH=src python -m distprof.config.reference docs/configuration.md"
WIDTH = 100

_INTRO = f"""\
# Configuration reference

<!-- Generated from the field docstrings in src/distprof/config/ by distprof.config.reference; do not edit.
     Regenerate: {REGENERATE} -->

Every setting of `distprof.ProfilerConfig`, its default, and the `DISTPROF_*` variable that overrides it
(the environment wins over code, files and flags; mappings such as `options` and `env` are set in files only).
Load a config with `ProfilerConfig(...)`, `.from_yaml(path)`, `.from_dict(d)`, `.from_args(ns)` or
`.from_dialect(name, cfg)`; the README's "Configuration" section shows how.
"""


def _sections() -> list[tuple[str, type[BaseModel]]]:
    """("" for the top level, or the section's field name) and its model, in field order."""
    out: list[tuple[str, type[BaseModel]]] = [("", ProfilerConfig)]
    for name, field in ProfilerConfig.model_fields.items():
        model = _model_of(field)
        if model is not None:
            out.append((name, model))
    return out


def _model_of(field: FieldInfo) -> type[BaseModel] | None:
    for t in (field.annotation, *typing.get_args(field.annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def undocumented() -> list[str]:
    """Every field without a description (docstring), as ``section.field``."""
    return [f"{section + '.' if section else ''}{name}" for section, model in _sections()
            for name, field in model.model_fields.items() if not (field.description or "").strip()]


def _default(section: str, name: str, field: FieldInfo) -> str:
    if not section and _model_of(field) is not None and field.default_factory is not None:
        return f"[see below](#{name})"
    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default  # type: ignore[call-arg]
    if isinstance(value, BaseModel):
        value = value.model_dump()
    return f"`{json.dumps(value)}`"


def _variables() -> dict[tuple[str, ...], str]:
    return {path: var for var, path in env_fields(ProfilerConfig).items()}


def _words(text: str) -> str:
    """A docstring as one Markdown paragraph (reST's ``code`` as Markdown's `code`)."""
    return " ".join(text.split()).replace("``", "`")


def _section(section: str, model: type[BaseModel], variables: dict[tuple[str, ...], str]) -> list[str]:
    title = "Top level" if not section else f"`{section}`"
    lines = [f"## {title}", ""]
    if section:
        lines += [textwrap.fill(_words((model.__doc__ or "").split("\n\n")[0]), WIDTH), ""]
    lines += ["| field | default | variable |", "| --- | --- | --- |"]
    for name, field in model.model_fields.items():
        path = (section, name) if section else (name,)
        var = variables.get(path)
        lines.append(f"| `{name}` | {_default(section, name, field)} | {f'`{var}`' if var else 'files only'} |")
    lines.append("")
    for name, field in model.model_fields.items():
        text = _words(field.description or "")
        lines.append(textwrap.fill(f"- **`{name}`**: {text}", WIDTH, subsequent_indent="  ",
                                   break_on_hyphens=False, break_long_words=False))
    lines.append("")
    return lines


def markdown() -> str:
    """docs/configuration.md's text."""
    variables = _variables()
    lines = [_INTRO]
    for section, model in _sections():
        lines += _section(section, model, variables)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    text = markdown()
    if len(argv) > 1:
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
