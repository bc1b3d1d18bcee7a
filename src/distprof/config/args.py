"""Command-line flags for profiling: ``add_profiler_args(parser)`` for argparse, ``ProfilerArguments`` for
``transformers.HfArgumentParser``. Both give the same names; ``ProfilerConfig.from_args`` reads either.

The flags are the few settings people change per launch (on/off, steps, ranks, roles, where, which tool);
everything else goes in a config file (``--profile-config``). Flags default to ``None`` = "not given", so a
flag left out never overrides the file or the base config.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from distprof.config.names import BACKENDS

__all__ = ["ProfilerArguments", "add_profiler_args", "flag_values"]

_PREFIX_KEY = "_distprof_prefix"  # set on the namespace so from_args finds flags added under another prefix

# (flag suffix, config field or None for the file, metavar, help). The one list of profiling flags.
FLAGS: tuple[tuple[str, str | None, str | None, str], ...] = (
    ("", "enable", None, "capture with distprof (--no-profile turns it off)"),
    ("steps", "steps", "STEPS", "global steps to capture, e.g. 3,10-12 (replaces a schedule from the config)"),
    ("ranks", "ranks", "RANKS", "global ranks that capture: all, or a list such as 0,8 (default 0)"),
    ("roles", "roles", "ROLES", "roles that capture, e.g. actor,rollout (default every role)"),
    ("save-path", "save_path", "PATH", "directory or fsspec URL the traces go to (required when enabled)"),
    ("backend", "backend", "{" + ",".join(BACKENDS) + "}", "capture tool (default torch)"),
    ("config", None, "FILE", ("a YAML profiler config (whole file, or its distprof:/profiler: section); "
                              "flags given override it, DISTPROF_* variables override both")),
)
_DEFAULT_PREFIX = "profile"


def _flag(prefix: str, suffix: str) -> str:
    return f"--{prefix}-{suffix}" if suffix else f"--{prefix}"


def _dest(prefix: str, suffix: str) -> str:
    return _flag(prefix, suffix)[2:].replace("-", "_")


def _check_prefix(prefix: Any) -> str:
    if not isinstance(prefix, str) or not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", prefix):
        raise ValueError(f"prefix={prefix!r:.60} is not a flag name; use lowercase words joined by '-', "
                         f"e.g. prefix='profile' (flags --profile, --profile-steps ...)")
    return prefix


def add_profiler_args(parser: argparse.ArgumentParser, group_name: str | None = "profiling",
                      prefix: str = _DEFAULT_PREFIX) -> argparse.ArgumentParser:
    """Add ``--profile``, ``--profile-steps``, ``--profile-ranks``, ``--profile-roles``, ``--profile-save-path``,
    ``--profile-backend`` and ``--profile-config`` to ``parser`` (in an argument group ``group_name``; None adds
    them to the parser itself). ``prefix`` renames them all (``prefix="prof"``: ``--prof-steps`` ...) when a
    script already has a ``--profile`` flag. Returns ``parser``. Read them with ``ProfilerConfig.from_args(ns)``.
    """
    prefix = _check_prefix(prefix)
    target = parser.add_argument_group(group_name, "distprof profiling (DISTPROF_* variables override these)") \
        if group_name else parser
    for suffix, field, metavar, help_text in FLAGS:
        flag, dest = _flag(prefix, suffix), _dest(prefix, suffix)
        if field == "enable":
            target.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            target.add_argument(flag, dest=dest, default=None, metavar=metavar, help=help_text)
    parser.set_defaults(**{_PREFIX_KEY: prefix})
    return parser


def _help(suffix: str) -> str:
    return next(h for s, _, _, h in FLAGS if s == suffix)


@dataclasses.dataclass
class ProfilerArguments:
    """The same flags for ``transformers.HfArgumentParser((TrainingArguments, ProfilerArguments))``; pass the
    parsed instance to ``ProfilerConfig.from_args``. ``None`` means "not given"."""

    # nargs="?"/const=True: a bare --profile means true (HfArgumentParser passes field metadata to argparse).
    profile: bool | None = dataclasses.field(default=None, metadata={"help": _help(""), "nargs": "?", "const": True})
    profile_steps: str | None = dataclasses.field(default=None, metadata={"help": _help("steps")})
    profile_ranks: str | None = dataclasses.field(default=None, metadata={"help": _help("ranks")})
    profile_roles: str | None = dataclasses.field(default=None, metadata={"help": _help("roles")})
    profile_save_path: str | None = dataclasses.field(default=None, metadata={"help": _help("save-path")})
    profile_backend: str | None = dataclasses.field(default=None, metadata={"help": _help("backend")})
    profile_config: str | None = dataclasses.field(default=None, metadata={"help": _help("config")})


def flag_values(args: Any, prefix: str | None = None) -> tuple[str | None, dict[str, tuple[Any, str]]]:
    """The flags given in ``args``: (the --profile-config file or None, {field: (value, "--flag value")})."""
    if isinstance(args, dict):
        args = argparse.Namespace(**args)
    prefix = _check_prefix(prefix or getattr(args, _PREFIX_KEY, None) or _DEFAULT_PREFIX)
    if not any(hasattr(args, _dest(prefix, s)) for s, *_ in FLAGS):
        raise ValueError(f"{type(args).__name__} holds none of the {_flag(prefix, '')}* flags; add them with "
                         f"distprof.add_profiler_args(parser, prefix={prefix!r}) or parse ProfilerArguments")
    file, out = None, {}
    for suffix, field, _, _ in FLAGS:
        value = getattr(args, _dest(prefix, suffix), None)
        if value is None:
            continue
        if field is None:
            file = value
            continue
        if field == "enable":
            label = _flag(prefix, suffix) if value is True else f"--no-{prefix}" if value is False else \
                f"{_flag(prefix, suffix)} {value!r:.60}"
        else:
            text = str(value)
            shown = text if len(text) <= 60 and text.isprintable() and text else \
                repr(text[:57]) + ("..." if len(text) > 57 else "")
            label = f"{_flag(prefix, suffix)} {shown}"
        out[field] = (value, label)
    return file, out
